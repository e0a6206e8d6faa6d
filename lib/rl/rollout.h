#pragma once
// Playing episodes: a batch of environments stepped in lock-step, one action each per step, the agent
// acting through its O(1) step() form, until every env's episode has ended.
#include <torch/torch.h>

#include <vector>

#include "core/rng.h"
#include "envs/visual_match.h"
#include "models/agent.h"
#include "rl/policy_step.h"
#include "rl/replay_buffer.h"

namespace memlab {

// Finished episodes, one per env, on the CPU: episode i has lengths[i] transitions, obs[i] [T+1, 75] uint8
// (o_0..o_T), actions[i] [T] long, rewards[i] [T] float.
struct Episodes {
  std::vector<uint64_t> seeds;  // the env seed of each episode
  std::vector<torch::Tensor> obs, actions, rewards;
  std::vector<int64_t> lengths;
  std::vector<double> returns;
  std::vector<bool> success;
  int64_t steps = 0;  // env steps over all episodes
  double mean_return() const;
  double success_rate() const;
};

struct RolloutOptions {
  ActMode mode = ActMode::Sample;
  bool dropout = true;  // the agent in training mode while acting (the reference keeps dropout on)
  bool bf16 = false;
  bool record = true;  // keep obs/actions/rewards (evaluation needs only returns and success)
  // Act through these fixed-shape steps (graphed on CUDA), kept across rollouts; null: the agent's dynamic step.
  PolicySteps* fixed = nullptr;
  // Play these actions again instead of acting: env i takes (*script)[i][t] (long, CPU) at its step t, with no agent.
  // std::runtime_error when an episode ends before its actions do, or outlasts them.
  const std::vector<torch::Tensor>* script = nullptr;
};

// Resets env i with seeds[i] and plays until all are done. The agent's train/eval mode is restored after.
Episodes play_episodes(VisualMatch& env, const std::vector<uint64_t>& seeds, Agent* agent, const torch::Device& device,
                       const RolloutOptions& opts, Rng& rng);

// How a checkpoint's replay plays its episodes again (EpisodeReplay::load): each from its seed with its recorded
// actions, in fresh envs of `env`, the rewards scaled as the run scaled them when it collected them.
EpisodeReplay::Replay replay_in(const VisualMatchConfig& env, double reward_scale);

}  // namespace memlab
