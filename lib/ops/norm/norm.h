#pragma once
// The norms over the last dimension that every block and mixer calls: RMS norm (with weight, optionally gated
// by SiLU), LayerNorm without bias (per-head weights) and L2 normalisation. The fused kernel (row_norm.cu) where it applies, else the tensor-op form,
// which is the reference. Both compute in fp32 (fp64 for fp64 inputs).
#include <torch/torch.h>

#include <string>

#include "ops/kernels.h"

namespace memlab {

// x * rsqrt(mean(x²) + eps) * weight [* SiLU(gate)], returned in `out` (x's dtype when Undefined). gate
// (optional) has x's shape. The weight is [D] or [R, D], row r of x taking weight row r mod R (as layer_norm's).
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps, Kernels kernels,
                       const torch::Tensor& gate = {}, torch::ScalarType out = torch::ScalarType::Undefined);
torch::Tensor rms_norm_reference(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                                 const torch::Tensor& gate = {});

// LayerNorm without bias: (x - mean) * rsqrt(var + eps) * weight over the last dim, D. The weight is [D] or [R, D]:
// row r of x takes weight row r mod R, so x [.., R, D] gets one weight row per head (xLSTM's multi-head norm).
// With a skip term, s ⊙ r is added after the weight (s shaped as the weight, r as x), and with a gate the sum is
// multiplied by SiLU(gate) (gate shaped as x): (LN(x) w + s ⊙ r) SiLU(gate), the mLSTM layer's output in one pass.
// Returned in `out` (x's dtype when Undefined).
struct NormSkip {
  torch::Tensor s, r;
  bool defined() const { return s.defined(); }
};
torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps, Kernels kernels,
                         torch::ScalarType out = torch::ScalarType::Undefined, const torch::Tensor& gate = {},
                         const NormSkip& skip = {});
torch::Tensor layer_norm_reference(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                                   const torch::Tensor& gate = {}, const NormSkip& skip = {});

// x * rsqrt(Σ x² + eps) (fla's l2norm convention), computed and returned in dtype `out`: the tensor-op form is
// l2_normalize_reference(x.to(out)), which computes in x's dtype.
constexpr double kL2NormEps = 1e-6;
torch::Tensor l2_normalize(const torch::Tensor& x, torch::ScalarType out, Kernels kernels, double eps = kL2NormEps);
torch::Tensor l2_normalize_reference(const torch::Tensor& x, double eps = kL2NormEps);

// Whether the norms would run the fused kernel on x, and if not, why.
bool norm_kernel_applies(const torch::Tensor& x, Kernels kernels, std::string* why = nullptr);

}  // namespace memlab
