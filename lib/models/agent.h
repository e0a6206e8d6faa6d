#pragma once
// The SAC-discrete agent of Ni et al. (2023) as the HQLT paper uses it (Sec. 4.4, App. A.3): one shared
// encoder serves the actor and both critics.
//   observation uint8 [3,5,5] / 255 -> Conv(3->8, k2) ReLU Conv(8->16, k2) ReLU -> 144 -> Linear(144 -> D)
//   (the convolutions run as dense matrices built from their weights: cuDNN's kernels for these 5x5 inputs took
//   2 ms of a 17 ms SAC update on an H200)
//   -> dropout(rl.obs_dropout) -> the model.* blocks (residual dropout rl.dropout) -> RMSNorm -> h [D]
//   actor: MLP D -> 256 -> 256 -> 4 logits;  critics Q1, Q2: MLPs D -> 256 -> 256 -> 4.
// Previous action and reward are not inputs (the reference's embedders have width 0). forward() runs whole
// episodes (training form); step() one observation per env with the mixers' O(1) step (rollouts).
#include <torch/torch.h>

#include <utility>
#include <vector>

#include "models/sequence_model.h"

namespace memlab {

class Config;
class Schema;

// Linear(in, hidden) ReLU Linear(hidden, hidden) ReLU Linear(hidden, out).
class MlpHeadImpl : public torch::nn::Module {
 public:
  MlpHeadImpl(int64_t in, int64_t hidden, int64_t out);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, out{nullptr};
};
TORCH_MODULE(MlpHead);

// The two critics; the learner keeps a second, soft-updated copy as the target.
class TwinQImpl : public torch::nn::Module {
 public:
  TwinQImpl(int64_t in, int64_t hidden, int64_t actions);
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& h);
  MlpHead q1{nullptr}, q2{nullptr};
};
TORCH_MODULE(TwinQ);

class AgentImpl : public torch::nn::Module {
 public:
  explicit AgentImpl(const Config& cfg);
  torch::Tensor encode(const torch::Tensor& obs);             // uint8 [..., 75] -> [..., D] (before dropout)
  torch::Tensor forward(const torch::Tensor& obs);            // uint8 [B, T, 75] -> h [B, T, D]
  torch::Tensor forward_reference(const torch::Tensor& obs);  // the same through the mixers' recurrences
  std::vector<MixerState> init_state(int64_t batch, const torch::TensorOptions& opts) const;
  // The mixers' fixed-shape states for episodes of up to `capacity` steps (MixerImpl::init_fixed_state).
  std::vector<MixerState> init_fixed_state(int64_t batch, const torch::TensorOptions& opts, int64_t capacity) const;
  torch::Tensor step(const torch::Tensor& obs_t, std::vector<MixerState>& state);  // uint8 [B, 75] -> [B, D]
  int64_t num_params() const;

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  // Where each conv weight goes in its dense matrix (agent.cpp, conv_as_matmul), on the weights' device once
  // used there.
  struct ConvPlacement {
    torch::Tensor dest, src;  // flat index into the [rows, cols] matrix, flat index into the weight
    int64_t rows = 0, cols = 0, positions = 0;  // positions: output pixels per channel
  };
  ConvPlacement place1, place2;
  torch::nn::Linear embed{nullptr};
  std::vector<Block> blocks;
  RMSNorm norm{nullptr};
  MlpHead actor{nullptr};
  TwinQ critic{nullptr};
  double obs_dropout = 0.0;
};
TORCH_MODULE(Agent);

// rl.obs_dropout, rl.dropout, rl.head_hidden.
void register_agent_keys(Schema& schema);

}  // namespace memlab
