#include "rl/rollout.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <stdexcept>

#include "mixers/ops.h"

namespace memlab {

double Episodes::mean_return() const {
  return returns.empty() ? 0.0 : std::accumulate(returns.begin(), returns.end(), 0.0) / double(returns.size());
}

double Episodes::success_rate() const {
  if (success.empty()) return 0.0;
  return double(std::count(success.begin(), success.end(), true)) / double(success.size());
}

Episodes play_episodes(VisualMatch& env, const std::vector<uint64_t>& seeds, Agent* agent, const torch::Device& device,
                       const RolloutOptions& opts, Rng& rng) {
  const int64_t n = env.size();
  if (static_cast<int64_t>(seeds.size()) != n) throw std::invalid_argument("play_episodes: one seed per env");
  if (opts.mode != ActMode::Random && !agent && !opts.script) throw std::invalid_argument("play_episodes: no agent to act");
  if (opts.script && static_cast<int64_t>(opts.script->size()) != n)
    throw std::invalid_argument("play_episodes: one scripted episode per env");
  const int64_t T = env.config().max_episode_len();
  env.reset(seeds);
  torch::Tensor obs_rec, act_rec, rew_rec;
  if (opts.record) {
    obs_rec = torch::zeros({n, T + 1, kObsSize}, torch::kUInt8);
    act_rec = torch::zeros({n, T}, torch::kLong);
    rew_rec = torch::zeros({n, T}, torch::kFloat);
  }
  std::vector<int64_t> len(static_cast<size_t>(n), 0);
  std::vector<int64_t> actions(static_cast<size_t>(n), 0);
  Episodes out;

  // Inference mode: no autograd or version-counter bookkeeping in the per-step ops, which are launch-bound
  // (one env: 130-330 small kernels per step, the GPU busy about a tenth of the time on an H200).
  c10::InferenceMode inference;
  if (opts.script) agent = nullptr;
  bool was_training = agent ? (*agent)->is_training() : false;
  std::vector<MixerState> state;
  PolicyStep* fixed = nullptr;
  if (agent && opts.mode != ActMode::Random && opts.fixed) {
    if (opts.fixed->agent().get() != agent->get()) throw std::invalid_argument("play_episodes: steps of another agent");
    if (opts.fixed->bf16() != opts.bf16 || opts.fixed->device() != device)
      throw std::invalid_argument("play_episodes: the fixed-shape steps were made for another precision or device");
    fixed = &opts.fixed->get(n, T, opts.mode, opts.dropout);
    fixed->reset();
  } else if (agent) {
    (*agent)->train(opts.dropout);
    const auto dtype = (*agent)->norm->weight.scalar_type();
    state = (*agent)->init_state(n, torch::TensorOptions().dtype(dtype).device(device));
  }
  for (int64_t t = 0;; ++t) {
    const auto obs = torch::from_blob(const_cast<uint8_t*>(env.obs()), {n, kObsSize}, torch::kUInt8);
    if (opts.record)
      for (int64_t i = 0; i < n; ++i)
        if (t == len[static_cast<size_t>(i)])
          std::memcpy(obs_rec.data_ptr<uint8_t>() + (i * (T + 1) + t) * kObsSize, env.obs(i), kObsSize);
    bool all_done = true;
    for (int64_t i = 0; i < n; ++i) all_done = all_done && env.done()[i];
    if (all_done) break;
    if (opts.script) {
      for (int64_t i = 0; i < n; ++i) {
        if (env.done()[i]) continue;
        const torch::Tensor& s = (*opts.script)[static_cast<size_t>(i)];
        const int64_t L = len[static_cast<size_t>(i)];
        if (L >= s.size(0))
          throw std::runtime_error(fmt::format("episode {} (seed {}) goes on past its {} actions", i, seeds[i], s.size(0)));
        actions[static_cast<size_t>(i)] = s.data_ptr<int64_t>()[L];
      }
    } else if (opts.mode == ActMode::Random) {
      for (auto& a : actions) a = uniform_int(rng, 0, kNumActions - 1);
    } else if (fixed) {
      const int64_t* a = fixed->act(env.obs());
      std::copy(a, a + n, actions.begin());
    } else {
      torch::Tensor h;
      {
        Bf16Autocast autocast(opts.bf16);
        h = (*agent)->step(obs.to(device), state);
      }
      const auto a_cpu = choose_actions((*agent)->actor(h.to(torch::kFloat)), opts.mode).to(torch::kCPU).contiguous();
      std::copy(a_cpu.data_ptr<int64_t>(), a_cpu.data_ptr<int64_t>() + n, actions.begin());
    }
    std::vector<uint8_t> was_done(env.done(), env.done() + n);
    env.step(actions.data());
    for (int64_t i = 0; i < n; ++i) {
      if (was_done[static_cast<size_t>(i)]) continue;
      auto& L = len[static_cast<size_t>(i)];
      if (opts.record) {
        act_rec.data_ptr<int64_t>()[i * T + L] = actions[static_cast<size_t>(i)];
        rew_rec.data_ptr<float>()[i * T + L] = env.rewards()[i];
      }
      ++L;
      ++out.steps;
    }
  }
  if (agent) (*agent)->train(was_training);
  out.seeds = seeds;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t L = len[static_cast<size_t>(i)];
    if (opts.script && L != (*opts.script)[static_cast<size_t>(i)].size(0))
      throw std::runtime_error(fmt::format("episode {} (seed {}) ends after {} of its {} actions", i, seeds[i], L,
                                           (*opts.script)[static_cast<size_t>(i)].size(0)));
    out.lengths.push_back(L);
    out.returns.push_back(env.state(i).episode_return);
    out.success.push_back(env.state(i).success);
    if (opts.record) {
      out.obs.push_back(obs_rec[i].narrow(0, 0, L + 1).clone());
      out.actions.push_back(act_rec[i].narrow(0, 0, L).clone());
      out.rewards.push_back(rew_rec[i].narrow(0, 0, L).clone());
    }
  }
  return out;
}

EpisodeReplay::Replay replay_in(const VisualMatchConfig& env, double reward_scale) {
  return [env, reward_scale](const std::vector<uint64_t>& seeds, const std::vector<torch::Tensor>& actions,
                             std::vector<torch::Tensor>& obs, std::vector<torch::Tensor>& rewards) {
    VisualMatch e(static_cast<int64_t>(seeds.size()), env);
    RolloutOptions ro;
    ro.mode = ActMode::Random;
    ro.script = &actions;
    Rng unused = make_rng(0, 0, 0);
    Episodes eps = play_episodes(e, seeds, nullptr, torch::kCPU, ro, unused);
    obs = std::move(eps.obs);
    for (auto& r : eps.rewards) rewards.push_back(r * reward_scale);  // as RlRun::collect scales them
  };
}

}  // namespace memlab
