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
// The same from an offset held in a tensor (int64 [1], on x's device): no host read, so CUDA graphs can hold it.
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& offset, double theta);

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

// A linear layer, or the same layer of K members of a packed run side by side (SequenceModel's members): the
// input's last dimension holds K groups of in/K channels, the output K groups of out/K, member k's group only
// reading member k's. The weight is [out, in] for one member, [K, out/K, in/K] for K; the bias [out].
class LinearImpl : public torch::nn::Module {
 public:
  LinearImpl(int64_t in, int64_t out, int64_t members = 1, bool bias = false);
  torch::Tensor forward(const torch::Tensor& x);
  int64_t members() const { return members_; }
  int64_t out_per_member() const { return weight.size(-2); }

  torch::Tensor weight, bias;

 private:
  int64_t members_;
};
TORCH_MODULE(Linear);

// x [..., K * in] times per-member weights w [K, out, in] (K = 1: w [out, in] too) -> [..., K, out].
torch::Tensor member_matmul(const torch::Tensor& x, const torch::Tensor& w);

// Per-member weight gradients dw[k] = dy[k]ᵀ x[k] for dy [K, N, out] and x [K, N, in] (strided views welcome) ->
// [K, out, in]: one matmul per member, not one batched matmul. With N = B T rows the reduction is long and the
// output small, and cuBLAS runs a batched product of that shape without split-K (a 32x32 fp32 SIMT kernel took
// 1.4 ms of a 6-member DeltaNet step on an H100), where a single product gets split-K.
torch::Tensor member_weight_grad(const torch::Tensor& dy, const torch::Tensor& x);

// Several linear layers reading the same x as one matmul on their concatenated weights (all with biases or
// none): one read of x and, in the backward, one matmul for dx rounded once rather than a sum of rounded parts.
// linear_stack returns the outputs side by side along the last dimension (then zero columns up to a multiple
// of 8, for aligned matmuls), per member: [..., rows] for one member, [..., K, rows] for K. fused_linear
// returns each layer's output [..., K * out_i] in the order of `layers` (column views for one member).
torch::Tensor linear_stack(const torch::Tensor& x, const std::vector<Linear>& layers);
std::vector<torch::Tensor> fused_linear(const torch::Tensor& x, const std::vector<Linear>& layers);

// A parameter that one member shares across its heads (a per-head norm's weight, [K * d] for K members) as one
// weight row per head of the packed layer's K * heads_per_member heads: [K * heads, d]; K = 1: unchanged.
torch::Tensor rows_per_head(const torch::Tensor& w, int64_t members, int64_t heads_per_member);

// The dtype CUDA autocast casts x to for its lower-precision ops (matmuls, attention) where it is on, else x's own
// (fp64 stays fp64): what a block's norm should hand to layers that only project its output.
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
