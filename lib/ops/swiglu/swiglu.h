#pragma once
// SwiGLU's gating, SiLU(g) * u, as the MLP calls it on its fused gate-and-up projection: the fused kernel
// (silu_mul.cu) where it applies, else the tensor-op form, which is the reference. Both return gu's dtype;
// the kernel computes in fp32 and rounds once.
#include <torch/torch.h>

#include <string>

#include "ops/kernels.h"

namespace memlab {

// gu [..., 2I]: the gate in the first I columns, the up projection in the last I. Returns [..., I].
torch::Tensor swiglu(const torch::Tensor& gu, Kernels kernels);
torch::Tensor swiglu_reference(const torch::Tensor& gu);

// Whether `swiglu` would run the fused kernel on gu, and if not, why.
bool swiglu_kernel_applies(const torch::Tensor& gu, Kernels kernels, std::string* why = nullptr);

}  // namespace memlab
