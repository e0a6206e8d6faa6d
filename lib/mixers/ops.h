#pragma once
// Small building blocks shared by mixers: norms, rotary embeddings, the short causal convolution.
#include <torch/torch.h>

#include "ops/kernels.h"

namespace memlab {

// The dtype sensitive mixer arithmetic runs in: fp32, or fp64 when the inputs are fp64 (tests check exactness there).
inline torch::ScalarType compute_type(torch::ScalarType t) { return t == torch::kDouble ? torch::kDouble : torch::kFloat; }
inline torch::ScalarType compute_type(const torch::Tensor& t) { return compute_type(t.scalar_type()); }
inline torch::ScalarType compute_type(caffe2::TypeMeta t) { return compute_type(torch::typeMetaToScalarType(t)); }

// Rotary embedding (rotate-half layout) on x [B, T, H, d] for positions offset..offset+T-1.
torch::Tensor apply_rope(const torch::Tensor& x, int64_t offset, double theta);

// Depthwise causal convolution over time (kernel K, no bias), as in Mamba/DeltaNet short convs; the op and its
// fused kernel are in lib/ops/short_conv.
class ShortConvImpl : public torch::nn::Module {
 public:
  ShortConvImpl(int64_t channels, int64_t kernel, double init_std, Kernels kernels);
  torch::Tensor forward(const torch::Tensor& x, bool silu);  // [B, T, C] -> [B, T, C], SiLU after it when asked
  // One token: x_t [B, C]; tail [B, C, K-1] holds the previous inputs and is updated.
  torch::Tensor step(const torch::Tensor& x_t, torch::Tensor& tail);
  torch::Tensor init_tail(int64_t batch, const torch::TensorOptions& opts) const;
  int64_t kernel() const { return kernel_; }

  torch::Tensor weight;  // [C, 1, K]

 private:
  int64_t channels_, kernel_;
  Kernels kernels_;
};
TORCH_MODULE(ShortConv);

// SiLU(conv(x)), or SiLU(x) where the mixer has no conv (`conv` empty): one fused kernel where it applies.
torch::Tensor silu_after(ShortConv& conv, const torch::Tensor& x);

// Several linear layers reading the same x as one matmul on their concatenated weights (all with biases or
// none): one read of x and, in the backward, one matmul for dx rounded once rather than a sum of rounded parts.
// linear_stack returns the outputs side by side along the last dimension (then zero columns up to a multiple
// of 8, for aligned matmuls); fused_linear as column views, in the order of `layers`.
torch::Tensor linear_stack(const torch::Tensor& x, const std::vector<torch::nn::Linear>& layers);
std::vector<torch::Tensor> fused_linear(const torch::Tensor& x, const std::vector<torch::nn::Linear>& layers);

// The dtype a block's norm should hand to layers that only project its output: the autocast dtype where CUDA
// autocast is on (the projections would cast to it anyway), else x's own.
torch::ScalarType projection_input_type(const torch::Tensor& x);

// Scoped: CUDA autocast to bf16 when `on` (a training or evaluation forward on a GPU), off again with its cast
// cache cleared at the end of the scope. Off: does nothing.
class Bf16Autocast {
 public:
  explicit Bf16Autocast(bool on);
  ~Bf16Autocast();

 private:
  bool on_;
};

// Scoped: autocast off, so a numerically sensitive region runs in the dtype it casts to.
class AutocastOff {
 public:
  AutocastOff();
  ~AutocastOff();

 private:
  bool cuda_, cpu_;
};

}  // namespace memlab
