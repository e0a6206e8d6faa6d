#pragma once
// Fused causal depthwise convolution over time (the short conv of DeltaNet, Mamba-2, xLSTM, Mesa), with the
// SiLU after it when asked, on CUDA, torch-free: the launch interface of causal_conv.cu.
//
// y[b, t, c] = act(z), z = Σ_j w[c, j] x[b, t - (K-1) + j, c] (x is zero before t = 0), act = SiLU or identity.
// Layout [B, T, C] with C contiguous, as the projections give it: consecutive threads take consecutive
// channels, so every load is coalesced and no transpose is needed (ATen's depthwise conv wants [B, C, T]).
// x's rows may be further apart than C (x_row), as in a column slice of a fused projection; y, dy and dx are
// dense.
// One thread walks kConvTile steps of one channel with the tile's inputs in registers. The backward recomputes z,
// walks the tile over a slice of the batch, and writes per-thread partial sums of dw for the caller to sum.
#include <cstdint>
#include <string>

namespace memlab::kernels {

struct CausalConvProblem {
  int B = 0, T = 0, C = 0, K = 0;
  int64_t x_row = 0;  // elements from x[b, t, c] to x[b, t + 1, c]; x[b + 1] starts T * x_row later; 0 = C
  bool silu = false;
  bool bf16 = false;  // x, y, dy, dx in bf16; w and dw always fp32
  int slices = 0;     // backward: batch slices, each thread walking its tile over one (0: enough to fill a GPU)
};

struct CausalConvForwardArgs {
  const void* x = nullptr;
  const float* w = nullptr;  // [C, K]
  void* y = nullptr;
};

struct CausalConvBackwardArgs {
  const void *x = nullptr, *dy = nullptr;
  const float* w = nullptr;
  void* dx = nullptr;
  float* dw_partial = nullptr;  // [causal_conv_partial_rows(p), C, K]
};

constexpr int kConvTile = 16;  // time steps per thread
constexpr int kConvMaxKernel = 16;

int causal_conv_tiles(int T);
int64_t causal_conv_partial_rows(const CausalConvProblem& p);  // of the backward's dw partial sums

// Return an empty string on success, else the error. stream is a cudaStream_t.
std::string causal_conv_forward(const CausalConvProblem& p, const CausalConvForwardArgs& a, void* stream);
std::string causal_conv_backward(const CausalConvProblem& p, const CausalConvBackwardArgs& a, void* stream);

// The same per-thread code run on the CPU over every thread's work (fp32 only): lets the CPU tests check the
// kernels' arithmetic and indexing against the tensor-op form on machines without a GPU.
std::string causal_conv_forward_host(const CausalConvProblem& p, const CausalConvForwardArgs& a);
std::string causal_conv_backward_host(const CausalConvProblem& p, const CausalConvBackwardArgs& a);

}  // namespace memlab::kernels
