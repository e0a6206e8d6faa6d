#pragma once
// HQLT's dynamic vector mixing of its two memories' outputs, o = σ(m) ⊙ a + (1 − σ(m)) ⊙ b (Irie et al. 2025,
// Sec. 3.3: a the FW-memory's read, b the KV-memory's, m = W_mix x): the fused kernel (sigmoid_blend.cu) where
// it applies, else the tensor-op form, which is the reference. Both return o in the compute type (fp32, fp64 for
// fp64 inputs) and the gradients in each input's dtype.
#include <torch/torch.h>

#include <string>

#include "ops/kernels.h"

namespace memlab {

// a, b, m of one shape (m is viewed as a's shape where only its last dims differ, e.g. [B, T, D] for [B, T, H, d]).
torch::Tensor vector_mix(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& m, Kernels kernels);
torch::Tensor vector_mix_reference(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& m);

// Whether `vector_mix` would run the fused kernel, and if not, why.
bool vector_mix_kernel_applies(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& m,
                               Kernels kernels, std::string* why = nullptr);

}  // namespace memlab
