#pragma once
// The short causal depthwise convolution over time, with the SiLU after it when asked, as mixers call it:
// the fused kernel (causal_conv.cu) where it applies, else the tensor-op form, which is the reference.
// Dtypes: the kernel computes in fp32 and returns x's dtype (fp32 or bf16); the tensor-op form returns what
// conv1d gives (bf16 under autocast).
#include <torch/torch.h>

#include <string>

#include "ops/kernels.h"

namespace memlab {

// x [B, T, C]; weight [C, 1, K] (a depthwise conv1d's weight). Returns [B, T, C]. Differentiable in both.
torch::Tensor short_conv(const torch::Tensor& x, const torch::Tensor& weight, bool silu, Kernels kernels);

// conv1d on the [B, C, T] view with K-1 zeros of left padding, then SiLU when asked.
torch::Tensor short_conv_reference(const torch::Tensor& x, const torch::Tensor& weight, bool silu);

// Whether `short_conv` would run the fused kernel for these inputs, and if not, why.
bool short_conv_kernel_applies(const torch::Tensor& x, const torch::Tensor& weight, Kernels kernels,
                               std::string* why = nullptr);

}  // namespace memlab
