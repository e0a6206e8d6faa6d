#pragma once
// Episode replay (the reference's full-episode sampling, sampled_seq_len = -1): whole episodes in a ring of
// fixed slots of max_len transitions on the training device, so a sampled batch is one gather with static
// shapes. When the transitions held would pass the capacity, the oldest episodes go first.
//
// A checkpoint holds each episode as its env seed and actions, with a checksum of its observations and rewards,
// rather than the observations and rewards: an episode is a pure function of its seed and actions, so loading plays
// them again. At the paper's size that is about 1 MB in place of 88 MB, so a run's checkpoint can travel between
// machines.
#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "core/rng.h"
#include "rl/sac.h"

namespace memlab {

class EpisodeReplay {
 public:
  // capacity_transitions: the most transitions held (at least one episode's worth of slots is kept).
  EpisodeReplay(int64_t capacity_transitions, int64_t max_len, int64_t obs_size, const torch::Device& device);

  // One episode of T transitions: obs [T+1, obs_size] uint8, actions [T] long, rewards [T] float, played by the
  // env from `seed`.
  void add(const torch::Tensor& obs, const torch::Tensor& actions, const torch::Tensor& rewards, uint64_t seed);
  int64_t episodes() const { return count_; }
  int64_t transitions() const;
  int64_t slots() const { return slots_; }
  int64_t max_len() const { return max_len_; }

  // B episodes drawn uniformly with replacement, padded to max_len (done on each episode's last transition:
  // the episodes end at a terminal state or at the fixed horizon, which the reference also treats as terminal).
  SacBatch sample(int64_t batch, Rng& rng) const;

  // Plays episodes again: env i from seeds[i] with the actions actions[i] (long [T_i], CPU); fills obs[i] and
  // rewards[i] as add() takes them. Throws when an episode does not end with its actions.
  using Replay = std::function<void(const std::vector<uint64_t>& seeds, const std::vector<torch::Tensor>& actions,
                                    std::vector<torch::Tensor>& obs, std::vector<torch::Tensor>& rewards)>;
  void save(torch::serialize::OutputArchive& ar) const;
  // UserError when the stored shapes differ, or an episode played again does not end with its actions or differs from
  // its checksum (the env's config or the reward scale changed). Checkpoints of memlab before 2026-12-08 hold the
  // observations and rewards themselves, and load without playing; save() writes such episodes whole until the ring
  // has replaced them all.
  void load(torch::serialize::InputArchive& ar, const Replay& replay);

 private:
  int64_t slots_, max_len_, obs_size_;
  torch::Device device_;
  torch::Tensor obs_, actions_, rewards_, lengths_;  // [S, max_len+1, obs], [S, max_len], [S, max_len], [S] (cpu)
  std::vector<uint64_t> seeds_;                      // [S]
  std::vector<uint8_t> known_;                       // [S]: 0 for an episode of an older checkpoint (seed unknown)
  int64_t next_ = 0, count_ = 0;
};

}  // namespace memlab
