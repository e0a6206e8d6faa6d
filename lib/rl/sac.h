#pragma once
// Discrete soft actor-critic (Christodoulou 2019) with a shared sequence encoder, as in Ni et al. (2023):
//   critic target  y_t = r_t + (1 - d_t) gamma sum_a pi(a|h_{t+1}) [min(Q1', Q2')(h_{t+1}, a) - alpha log pi(a|h_{t+1})]
//   critic loss    1/2 (mean_t (Q1(h_t, a_t) - y_t)^2 + mean_t (Q2(h_t, a_t) - y_t)^2) over the valid steps
//   actor loss     mean_t sum_a pi(a|h_t) [alpha log pi(a|h_t) - min(Q1, Q2)(h_t, a)]
// with log pi = log(max(softmax, 1e-8)), a fixed temperature alpha, h from the online encoder (no target
// encoder; the target holds soft copies of the critic heads only). freeze_critic: the actor loss reads a
// detached h and treats the critics' values as constants, so only the critic loss trains the encoder.
// One Adam step on the sum of both losses, then the target heads move by tau towards the online ones.
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>

#include "models/agent.h"
#include "train/cuda_graph.h"
#include "train/optimizer.h"

namespace memlab {

// Episodes padded to one length T: obs [B, T+1, 75] uint8 (o_0..o_T), actions [B, T] long, rewards [B, T],
// done [B, T] (1 on an episode's last transition) and mask [B, T] (1 on its transitions), all on one device.
struct SacBatch {
  torch::Tensor obs, actions, rewards, done, mask;
};

// The pieces of the losses, on [..., A] tensors; tests check them against hand computation.
torch::Tensor policy_log_probs(const torch::Tensor& logits);
torch::Tensor soft_value(const torch::Tensor& logits, const torch::Tensor& q1, const torch::Tensor& q2, double alpha);
torch::Tensor critic_target(const torch::Tensor& next_logits, const torch::Tensor& next_q1, const torch::Tensor& next_q2,
                            const torch::Tensor& reward, const torch::Tensor& done, double gamma, double alpha);
torch::Tensor critic_loss(const torch::Tensor& q1, const torch::Tensor& q2, const torch::Tensor& actions,
                          const torch::Tensor& target, const torch::Tensor& mask);
torch::Tensor actor_loss(const torch::Tensor& logits, const torch::Tensor& q1, const torch::Tensor& q2, double alpha,
                         const torch::Tensor& mask);

struct SacOptions {
  double gamma = 0.99, alpha = 0.1, tau = 0.005, lr = 3e-4, clip = 0.0;
  bool freeze_critic = true;
  bool bf16 = false;
  bool cuda_graph = false;  // honoured on CUDA only
  bool tf32 = false;        // the heads' fp32 matmuls on TF32 tensor cores (CUDA)
};

// The learner: the online agent, the target critics and one Adam over every agent parameter.
class Sac {
 public:
  Sac(Agent agent, const torch::Device& device, SacOptions opts);
  ~Sac();
  void update(const SacBatch& batch);  // one gradient step; never waits for the device
  void reset_stats();
  const std::string& mode() const { return graph_->mode(); }
  bool captured() const { return graph_->captured(); }

  Agent agent;
  TwinQ target{nullptr};
  std::unique_ptr<AdamW> opt;
  // Sums since reset_stats(): critic loss, actor loss, policy entropy, mean Q of the taken actions, gradient
  // norm, and the number of updates whose loss or gradient was not finite (those were skipped).
  torch::Tensor critic_sum, actor_sum, entropy_sum, q_sum, gnorm_sum, bad_updates;
  // Called with each phase's name as an update enters it, and "end" after the last (memlab bench rl times
  // the phases of an eager update by CUDA events between the calls).
  std::function<void(const char*)> on_phase;

 private:
  void compute();

  torch::Device device_;
  SacOptions opts_;
  std::vector<torch::Tensor> params_;
  SacBatch in_;  // the inputs the (captured) step reads
  torch::Tensor lr_;
  std::unique_ptr<GraphedStep> graph_;
};

}  // namespace memlab
