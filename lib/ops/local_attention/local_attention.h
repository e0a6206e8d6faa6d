#pragma once
// Causal softmax attention over a local window, as HQLT's KV-memory and the windowed Transformer read it: each
// query t reads the keys of a sliding window (t-S < j <= t), or with `chunked`, of its own block of S
// (j <= t, j / S = t / S). Three forms:
//   window     memlab's kernel (window.cu), forward and backward: on CUDA where the attention computes in bf16
//              or fp32 (autocast's dtype, else the inputs'), windows up to 64 and head dims up to 128 as far as a
//              block's shared memory holds them (on an H200 every d up to 128 for windows up to 32, d up to 64 at
//              64); it computes the window's scores only, where flash computes tiles of 128 rows, on CUDA cores;
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
// Torch runs the blocked form; Auto and Cuda the window kernel for windows up to 32 (where it is faster than flash),
// else the flash form where it applies, else the window kernel where it applies (fp32), else the blocked form (Cuda
// demands no kernel here: the flash form is as fused).
torch::Tensor local_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t S,
                              bool chunked, Kernels kernels);

// The forms themselves, for tests and benchmarks (`local_attention` picks among them). The window and flash forms
// take only calls their `_applies` accepts.
// tensor_cores false keeps bf16 on the CUDA-core form (fp32 always runs there).
torch::Tensor local_attention_window(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t S,
                                     bool chunked, bool tensor_cores = true);
torch::Tensor local_attention_flash(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t S,
                                    bool chunked);
torch::Tensor local_attention_blocked(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                      int64_t S, bool chunked);

// Whether `local_attention` would run the window kernel on these inputs, and if not, why.
bool local_attention_kernel_applies(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t S,
                                    Kernels kernels, std::string* why = nullptr);

// Whether the flash form takes these inputs (local_attention runs it where the window kernel does not), and if not,
// why.
bool local_attention_flash_applies(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                   Kernels kernels, std::string* why = nullptr);

}  // namespace memlab
