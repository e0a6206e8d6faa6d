#include "rl/replay_buffer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/errors.h"

namespace memlab {

EpisodeReplay::EpisodeReplay(int64_t capacity_transitions, int64_t max_len, int64_t obs_size,
                             const torch::Device& device)
    : slots_(std::max<int64_t>(1, capacity_transitions / max_len)),
      max_len_(max_len),
      obs_size_(obs_size),
      device_(device) {
  const auto on = torch::TensorOptions().device(device_);
  obs_ = torch::zeros({slots_, max_len_ + 1, obs_size_}, on.dtype(torch::kUInt8));
  actions_ = torch::zeros({slots_, max_len_}, on.dtype(torch::kLong));
  rewards_ = torch::zeros({slots_, max_len_}, on.dtype(torch::kFloat));
  lengths_ = torch::zeros({slots_}, torch::kLong);
}

int64_t EpisodeReplay::transitions() const { return lengths_.sum().item<int64_t>(); }

void EpisodeReplay::add(const torch::Tensor& obs, const torch::Tensor& actions, const torch::Tensor& rewards) {
  const int64_t T = actions.size(0);
  if (T < 1 || T > max_len_ || obs.size(0) != T + 1 || rewards.size(0) != T || obs.size(1) != obs_size_)
    throw std::invalid_argument(fmt::format("EpisodeReplay::add: an episode of {} transitions (max {})", T, max_len_));
  const int64_t s = next_;
  obs_[s].zero_();
  actions_[s].zero_();
  rewards_[s].zero_();
  obs_[s].narrow(0, 0, T + 1).copy_(obs);
  actions_[s].narrow(0, 0, T).copy_(actions);
  rewards_[s].narrow(0, 0, T).copy_(rewards);
  lengths_[s] = T;
  next_ = (next_ + 1) % slots_;
  count_ = std::min(count_ + 1, slots_);
}

SacBatch EpisodeReplay::sample(int64_t batch, Rng& rng) const {
  if (count_ == 0) throw std::logic_error("EpisodeReplay::sample: the buffer is empty");
  std::vector<int64_t> idx(static_cast<size_t>(batch));
  for (auto& i : idx) i = uniform_int(rng, 0, count_ - 1);
  // Pinned and asynchronous on CUDA: a pageable copy would make the host wait for the update before it.
  const bool cuda = device_.is_cuda();
  auto cpu_idx = torch::tensor(idx, torch::kLong);
  auto cpu_len = lengths_.index_select(0, cpu_idx);
  if (cuda) cpu_idx = cpu_idx.pin_memory(), cpu_len = cpu_len.pin_memory();
  const auto dev_idx = cpu_idx.to(device_, /*non_blocking=*/cuda);
  const auto len = cpu_len.to(device_, /*non_blocking=*/cuda).unsqueeze(1);  // [B, 1]
  const auto t = torch::arange(max_len_, torch::TensorOptions().dtype(torch::kLong).device(device_)).unsqueeze(0);
  SacBatch b;
  b.obs = obs_.index_select(0, dev_idx);
  b.actions = actions_.index_select(0, dev_idx);
  b.rewards = rewards_.index_select(0, dev_idx);
  b.mask = t.lt(len).to(torch::kFloat);
  b.done = t.eq(len - 1).to(torch::kFloat);
  return b;
}

void EpisodeReplay::save(torch::serialize::OutputArchive& ar) const {
  ar.write("replay.obs", obs_);
  ar.write("replay.actions", actions_);
  ar.write("replay.rewards", rewards_);
  ar.write("replay.lengths", lengths_);
  ar.write("replay.cursor", torch::tensor({next_, count_}, torch::kLong));
}

void EpisodeReplay::load(torch::serialize::InputArchive& ar) {
  torch::Tensor o, a, r, l, c;
  ar.read("replay.obs", o);
  ar.read("replay.actions", a);
  ar.read("replay.rewards", r);
  ar.read("replay.lengths", l);
  ar.read("replay.cursor", c);
  if (o.sizes() != obs_.sizes())
    throw UserError(fmt::format("the checkpoint's replay buffer has shape {} where this run needs {}",
                                fmt::join(o.sizes(), "x"), fmt::join(obs_.sizes(), "x")));
  obs_.copy_(o);
  actions_.copy_(a);
  rewards_.copy_(r);
  lengths_.copy_(l);
  next_ = c[0].item<int64_t>();
  count_ = c[1].item<int64_t>();
}

}  // namespace memlab
