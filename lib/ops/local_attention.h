#pragma once
// Causal softmax attention over a local window, as HQLT's KV-memory and the windowed Transformer read it: each
// query t reads the keys of a sliding window (t-S < j <= t), or with `chunked`, of its own block of S
// (j <= t, j / S = t / S). Two forms:
//   flash      ATen's flash-attention kernels with their window (sliding) or one short sequence per block
//              (chunked, variable-length), forward and backward: on CUDA where the attention computes in bf16 or
//              fp16 (autocast's dtype, else the inputs'), for head dims up to 256;
//   blocked    the reference: queries in blocks of S, each reading the keys of its own block and, sliding, of the
//              block before through a [S, 2S] mask, by scaled_dot_product_attention.
#include <torch/torch.h>

#include <string>

#include "ops/kernels.h"

namespace memlab {

// q, k, v [B, T, H, d]; scale 1/sqrt(d). Returns [B, T, H, d] in the dtype the attention computed in. kernels:
// Torch runs the blocked form; Auto and Cuda the flash form where it applies (it is ATen's, not a memlab kernel,
// so Cuda does not demand it), else the blocked form.
torch::Tensor local_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t S,
                              bool chunked, Kernels kernels);

// Whether `local_attention` would run the flash form on these inputs, and if not, why.
bool local_attention_flash_applies(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                   Kernels kernels, std::string* why = nullptr);

}  // namespace memlab
