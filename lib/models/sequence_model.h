#pragma once
// Token embedding -> N pre-norm blocks (h = x + mixer(norm(x)); out = h + mlp(norm(h))) -> norm -> head.
#include <torch/torch.h>

#include "mixers/mixer.h"

namespace memlab {

class Config;
class Schema;

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// SwiGLU MLP: down(SiLU(gate(x)) * up(x)).
class SwiGLUImpl : public torch::nn::Module {
 public:
  SwiGLUImpl(int64_t dim, int64_t inner);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear gate{nullptr}, up{nullptr}, down{nullptr};
};
TORCH_MODULE(SwiGLU);

class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(std::shared_ptr<MixerImpl> mixer, int64_t dim, int64_t mlp_inner, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor forward_reference(const torch::Tensor& x);
  torch::Tensor step(const torch::Tensor& x_t, MixerState& state);

  std::shared_ptr<MixerImpl> mixer;
  RMSNorm norm1{nullptr}, norm2{nullptr};
  SwiGLU mlp{nullptr};  // null when the block has no MLP
};
TORCH_MODULE(Block);

class SequenceModelImpl : public torch::nn::Module {
 public:
  SequenceModelImpl(const Config& cfg, int64_t vocab);
  torch::Tensor forward(const torch::Tensor& tokens);  // [B, T] -> logits [B, T, V]
  torch::Tensor forward_reference(const torch::Tensor& tokens);
  std::vector<MixerState> init_state(int64_t batch, const torch::TensorOptions& opts) const;
  torch::Tensor step(const torch::Tensor& token_t, std::vector<MixerState>& state);  // [B] -> [B, V]
  int64_t num_params() const;

  torch::nn::Embedding embed{nullptr};
  std::vector<Block> blocks;
  RMSNorm norm{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(SequenceModel);

void register_model_keys(Schema& schema);
// The SwiGLU width fla uses: 256 * ceil(int(hidden * ratio * 2/3) / 256).
int64_t default_mlp_inner(int64_t hidden, int64_t ratio);

}  // namespace memlab
