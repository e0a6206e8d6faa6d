#pragma once
// Causal softmax attention over a short local window on CUDA, torch-free: the launch interface of window.cu.
//
// Query t of a (batch row, head) reads the keys j with first(t) <= j <= t, where first(t) = t - S + 1 (sliding)
// or t - t % S (chunked: its own block of S), and j >= 0:
//   o_t = Σ_j p_tj v_j,  p_tj = exp(scale q_t·k_j - lse_t),  lse_t = log Σ_j exp(scale q_t·k_j).
// A block takes kWindowQueries (or 64, for windows over 32) consecutive queries of one (b, h), with the keys they
// read in shared memory, and computes every score of the tile directly: a window of S costs S scores a query,
// where a flash tile of 128 rows costs 128 (ATen's flash kernels on 8- and 16-token windows ran 10x the work).
// The backward owns a tile of keys and queries alike: it computes dq of its queries and dk, dv of its keys, from
// the scores of the queries that read them (recomputed from lse, a few rows past the tile), so each gradient is
// written once, with no atomics.
// q, k, v: [B, T, H, d] with each head's d channels dense; their token rows may lie further apart than H d (column
// slices of a fused projection). o, dout, dq, dk, dv are dense [B, T, H, d]; lse is fp32 [B, H, T].
#include <cstddef>
#include <cstdint>
#include <string>

namespace memlab::kernels {

struct WindowAttentionProblem {
  int B = 0, T = 0, H = 0, d = 0, S = 0;
  bool chunked = false;
  bool bf16 = false;  // q, k, v, o, dout, dq, dk, dv in bf16, else fp32; lse always fp32
  int64_t q_row = 0, k_row = 0, v_row = 0;  // elements from token t's row to t + 1's (0 = H d)
  float scale = 0.f;
  // bf16 only: the scores and products as bf16 mma tiles (a block of 64 positions against its keys, masked to the
  // window), where the CUDA-core form computes each window score apart.
  bool tensor_cores = false;
};

struct WindowAttentionForwardArgs {
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;
};

struct WindowAttentionBackwardArgs {
  const void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *dout = nullptr;
  const float* lse = nullptr;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
};

constexpr int kWindowMaxS = 64;
constexpr int kWindowMaxDim = 128;

// Shared memory a block needs (bytes): callers check it against the device's opt-in limit.
size_t window_attention_forward_smem(const WindowAttentionProblem& p);
size_t window_attention_backward_smem(const WindowAttentionProblem& p);

// Return an empty string on success, else the error. stream is a cudaStream_t.
std::string window_attention_forward(const WindowAttentionProblem& p, const WindowAttentionForwardArgs& a,
                                     void* stream);
std::string window_attention_backward(const WindowAttentionProblem& p, const WindowAttentionBackwardArgs& a,
                                      void* stream);

// The same per-block code run on the CPU, one block after another (fp32 only), for the CPU tests.
std::string window_attention_forward_host(const WindowAttentionProblem& p, const WindowAttentionForwardArgs& a);
std::string window_attention_backward_host(const WindowAttentionProblem& p, const WindowAttentionBackwardArgs& a);

}  // namespace memlab::kernels
