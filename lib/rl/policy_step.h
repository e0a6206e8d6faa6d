#pragma once
// The agent acting in rollouts, one env step at a time, through the mixers' fixed-shape step
// (MixerImpl::init_fixed_state): states sized for a whole episode, positions on the device. On CUDA the step
// (agent step, actor, action choice) is captured once as a CUDA graph and replayed for every later env step: one
// launch where the eager step made 140-330 (H200, the paper's agents). On CPU the same form runs eagerly;
// tests compare it with the dynamic step that play_episodes runs without it.
#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "models/agent.h"
#include "train/cuda_graph.h"

namespace memlab {

enum class ActMode {
  Random,  // uniform actions from rng (warm-up episodes); no agent needed
  Sample,  // actions drawn from the policy (training episodes)
  Greedy,  // the most probable action (evaluation)
};

// Actions [B] from the actor's logits [B, A]: the most probable one (Greedy), or one drawn from softmax(logits)
// as argmax(p / e) with e ~ Exp(1) (an exact draw; torch::multinomial's host-side check cannot run in a graph).
torch::Tensor choose_actions(const torch::Tensor& logits, ActMode mode);

class PolicyStep {
 public:
  // envs episodes of at most `capacity` steps; mode Sample or Greedy; dropout: the agent in training mode.
  PolicyStep(Agent agent, int64_t envs, int64_t capacity, ActMode mode, bool dropout, bool bf16,
             const torch::Device& device, bool graph);
  void reset();  // new episodes: every state as init_fixed_state makes it
  // Actions for observations [envs, 75] (uint8, host memory); valid until the next call.
  const int64_t* act(const uint8_t* obs);
  const std::string& mode() const { return graph_.mode(); }  // "cuda graph", "eager", or why not graphed
  bool captured() const { return graph_.captured(); }
  const std::vector<MixerState>& state() const { return state_; }

 private:
  void compute();  // the captured part: obs_dev_ -> act_dev_, the states updated in place

  Agent agent_;
  ActMode mode_;
  bool dropout_, bf16_;
  torch::Device device_;
  std::vector<MixerState> state_, initial_;
  torch::Tensor obs_host_, obs_dev_, act_dev_, act_host_;
  GraphedStep graph_;
};

// One PolicyStep per kind of rollout (envs, capacity, mode, dropout), each with its graph, kept across rollouts.
class PolicySteps {
 public:
  PolicySteps(Agent agent, bool bf16, const torch::Device& device, bool graph)
      : agent_(std::move(agent)), bf16_(bf16), device_(device), graph_(graph) {}
  PolicyStep& get(int64_t envs, int64_t capacity, ActMode mode, bool dropout);
  const Agent& agent() const { return agent_; }
  bool bf16() const { return bf16_; }
  const torch::Device& device() const { return device_; }
  // "fixed-shape, cuda graph" when every step made so far replays a graph; otherwise each distinct mode.
  std::string mode() const;

 private:
  Agent agent_;
  bool bf16_;
  torch::Device device_;
  bool graph_;
  std::map<std::tuple<int64_t, int64_t, int, bool>, std::unique_ptr<PolicyStep>> steps_;
};

}  // namespace memlab
