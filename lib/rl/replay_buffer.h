#pragma once
// Episode replay (the reference's full-episode sampling, sampled_seq_len = -1): whole episodes in a ring of
// fixed slots of max_len transitions on the training device, so a sampled batch is one gather with static
// shapes. When the transitions held would pass the capacity, the oldest episodes go first.
#include <torch/torch.h>

#include <cstdint>

#include "core/rng.h"
#include "rl/sac.h"

namespace memlab {

class EpisodeReplay {
 public:
  // capacity_transitions: the most transitions held (at least one episode's worth of slots is kept).
  EpisodeReplay(int64_t capacity_transitions, int64_t max_len, int64_t obs_size, const torch::Device& device);

  // One episode of T transitions: obs [T+1, obs_size] uint8, actions [T] long, rewards [T] float.
  void add(const torch::Tensor& obs, const torch::Tensor& actions, const torch::Tensor& rewards);
  int64_t episodes() const { return count_; }
  int64_t transitions() const;
  int64_t slots() const { return slots_; }
  int64_t max_len() const { return max_len_; }

  // B episodes drawn uniformly with replacement, padded to max_len (done on each episode's last transition:
  // the episodes end at a terminal state or at the fixed horizon, which the reference also treats as terminal).
  SacBatch sample(int64_t batch, Rng& rng) const;

  void save(torch::serialize::OutputArchive& ar) const;
  void load(torch::serialize::InputArchive& ar);  // UserError when the stored shapes differ

 private:
  int64_t slots_, max_len_, obs_size_;
  torch::Device device_;
  torch::Tensor obs_, actions_, rewards_, lengths_;  // [S, max_len+1, obs], [S, max_len], [S, max_len], [S] (cpu)
  int64_t next_ = 0, count_ = 0;
};

}  // namespace memlab
