#include "rl/replay_buffer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/crc.h"
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
  seeds_.assign(static_cast<size_t>(slots_), 0);
  known_.assign(static_cast<size_t>(slots_), 1);
}

int64_t EpisodeReplay::transitions() const { return lengths_.sum().item<int64_t>(); }

void EpisodeReplay::add(const torch::Tensor& obs, const torch::Tensor& actions, const torch::Tensor& rewards,
                        uint64_t seed) {
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
  seeds_[static_cast<size_t>(s)] = seed;
  known_[static_cast<size_t>(s)] = 1;
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

namespace {

// One episode's checksum: CRC-32 of its observations' bytes, then of its rewards' (CPU, contiguous).
int64_t episode_crc(const torch::Tensor& obs, const torch::Tensor& rewards) {
  const uint32_t c = crc32_ieee(obs.data_ptr<uint8_t>(), static_cast<size_t>(obs.numel()));
  return crc32_ieee(rewards.data_ptr<float>(), static_cast<size_t>(rewards.numel()) * sizeof(float), c);
}

}  // namespace

void EpisodeReplay::save(torch::serialize::OutputArchive& ar) const {
  if (std::any_of(known_.begin(), known_.begin() + count_, [](uint8_t k) { return !k; })) {
    // Episodes loaded from an older checkpoint, whose seeds are not known: the observations and rewards themselves,
    // with the seeds that are known, so that a later session can still go compact once the ring has replaced them.
    ar.write("replay.obs", obs_);
    ar.write("replay.actions", actions_);
    ar.write("replay.rewards", rewards_);
    ar.write("replay.lengths", lengths_);
    ar.write("replay.cursor", torch::tensor({next_, count_}, torch::kLong));
    std::vector<int64_t> seeds(seeds_.begin(), seeds_.end()), known(known_.begin(), known_.end());
    ar.write("replay.seeds", torch::tensor(seeds, torch::kLong));
    ar.write("replay.known", torch::tensor(known, torch::kLong));
    return;
  }
  // Slots fill in order, so the episodes held are slots [0, count_).
  const auto obs = obs_.narrow(0, 0, count_).cpu(), rewards = rewards_.narrow(0, 0, count_).cpu();
  std::vector<int64_t> crc, seeds;
  for (int64_t s = 0; s < count_; ++s) {
    const int64_t T = lengths_[s].item<int64_t>();
    crc.push_back(episode_crc(obs[s].narrow(0, 0, T + 1).contiguous(), rewards[s].narrow(0, 0, T).contiguous()));
    seeds.push_back(static_cast<int64_t>(seeds_[static_cast<size_t>(s)]));
  }
  ar.write("replay.seeds", torch::tensor(seeds, torch::kLong));
  ar.write("replay.episode_actions", actions_.narrow(0, 0, count_).to(torch::kCPU, torch::kUInt8));
  ar.write("replay.checksums", torch::tensor(crc, torch::kLong));
  ar.write("replay.lengths", lengths_);
  ar.write("replay.cursor", torch::tensor({next_, count_, slots_, max_len_}, torch::kLong));
}

void EpisodeReplay::load(torch::serialize::InputArchive& ar, const Replay& replay) {
  torch::Tensor o, a, r, l, c;
  if (ar.try_read("replay.obs", o)) {  // the observations and rewards themselves
    ar.read("replay.actions", a);
    ar.read("replay.rewards", r);
    ar.read("replay.lengths", l);
    ar.read("replay.cursor", c);
    if (o.sizes() != obs_.sizes())
      throw UserError(fmt::format("the checkpoint's replay buffer has shape {} where this run needs {}",
                                  fmt::join(o.sizes(), "x"), fmt::join(obs_.sizes(), "x")));
    c = c.cpu();
    if (c.numel() < 2 || c[0].item<int64_t>() < 0 || c[0].item<int64_t>() >= slots_ || c[1].item<int64_t>() < 0 ||
        c[1].item<int64_t>() > slots_)
      throw UserError("the checkpoint's replay buffer is malformed (its cursor lies outside its slots)");
    obs_.copy_(o);
    actions_.copy_(a);
    rewards_.copy_(r);
    lengths_.copy_(l);
    next_ = c[0].item<int64_t>();
    count_ = c[1].item<int64_t>();
    std::fill(known_.begin(), known_.end(), 0);  // until add() replaces them, these episodes are saved whole
    torch::Tensor seeds, known;
    if (ar.try_read("replay.seeds", seeds) && ar.try_read("replay.known", known)) {  // whole, with the seeds known
      seeds = seeds.cpu();
      known = known.cpu();
      if (seeds.numel() != slots_ || known.numel() != slots_)
        throw UserError("the checkpoint's replay buffer is malformed (its seeds do not match its slots)");
      for (int64_t i = 0; i < slots_; ++i) {
        seeds_[static_cast<size_t>(i)] = static_cast<uint64_t>(seeds[i].item<int64_t>());
        known_[static_cast<size_t>(i)] = known[i].item<int64_t>() != 0;
      }
    }
    return;
  }
  torch::Tensor seeds, crc;
  ar.read("replay.seeds", seeds);
  ar.read("replay.episode_actions", a);
  ar.read("replay.checksums", crc);
  ar.read("replay.lengths", l);
  ar.read("replay.cursor", c);
  c = c.cpu();
  if (c.numel() != 4) throw UserError("the checkpoint's replay buffer is malformed (its cursor)");
  if (c[2].item<int64_t>() != slots_ || c[3].item<int64_t>() != max_len_)
    throw UserError(fmt::format("the checkpoint's replay buffer has {} slots of {} steps where this run needs {} of {}",
                                c[2].item<int64_t>(), c[3].item<int64_t>(), slots_, max_len_));
  const int64_t count = c[1].item<int64_t>();
  seeds = seeds.cpu();
  a = a.cpu().to(torch::kLong);
  l = l.cpu();
  crc = crc.cpu();
  const int64_t next = c[0].item<int64_t>();
  if (count < 0 || count > slots_ || next < 0 || next >= slots_ || seeds.numel() != count || crc.numel() != count ||
      l.numel() != slots_ || a.dim() != 2 || a.size(0) != count || a.size(1) != max_len_)
    throw UserError("the checkpoint's replay buffer is malformed (its parts disagree on how many episodes it holds)");
  for (int64_t s = 0; s < count; ++s)
    if (l[s].item<int64_t>() < 1 || l[s].item<int64_t>() > max_len_)
      throw UserError(fmt::format("the checkpoint's replay buffer is malformed (episode {} has length {})", s,
                                  l[s].item<int64_t>()));
  std::vector<uint64_t> ep_seeds;
  std::vector<torch::Tensor> ep_actions, ep_obs, ep_rewards;
  for (int64_t s = 0; s < count; ++s) {
    ep_seeds.push_back(static_cast<uint64_t>(seeds[s].item<int64_t>()));
    ep_actions.push_back(a[s].narrow(0, 0, l[s].item<int64_t>()).contiguous());
  }
  try {
    if (count > 0) replay(ep_seeds, ep_actions, ep_obs, ep_rewards);
  } catch (const std::runtime_error& e) {
    throw UserError(fmt::format("the checkpoint's replay buffer does not play again in this run's environment ({}); "
                                "was an env.* key changed, or the environment's code since the run began?",
                                e.what()));
  }
  if (ep_obs.size() != static_cast<size_t>(count) || ep_rewards.size() != static_cast<size_t>(count))
    throw std::logic_error("EpisodeReplay::load: the replay returned another number of episodes");
  for (int64_t s = 0; s < count; ++s)
    if (episode_crc(ep_obs[s].contiguous(), ep_rewards[s].contiguous()) != crc[s].item<int64_t>())
      throw UserError(fmt::format("episode {} of the checkpoint's replay buffer (seed {}) plays again differently: were "
                                  "env.* keys or rl.reward_scale changed, or the environment's code since the run began?",
                                  s, ep_seeds[static_cast<size_t>(s)]));
  lengths_.zero_();
  next_ = count_ = 0;
  for (int64_t s = 0; s < count; ++s) add(ep_obs[s], ep_actions[s], ep_rewards[s], ep_seeds[static_cast<size_t>(s)]);
  next_ = next;
  count_ = count;
}

}  // namespace memlab
