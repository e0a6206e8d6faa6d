#pragma once
// The mLSTM's gate pre-activations on CUDA, torch-free: the launch interface of gates.cu.
//
// Per row r (a token): g[r, o] = b[o] + Σ_i [q | k | v][r, i] W[o, i], o < O = 2H (the H input gates, then the H
// forget gates), over the 3I columns of q, k and v read where they lie (no concatenation), in fp32 whatever the
// inputs' dtype: the pre-activations feed exponentials. A tensor-op form concatenates q, k, v, casts them to fp32
// and runs one fp32 product, 50 times the bytes of the inputs and as slow in the backward (about 0.6 ms of an
// xLSTM[1:0] step at B256 T128 on an H200).
// Forward: a warp per 32 / O rows (O rounded up to a power of two), each lane 16-byte loads of a strided share of
// the columns, then one reduce-scatter of the warp's 32 sums.
// Backward: a thread per pair of columns over a slice of rows: dx[r, i] = Σ_o dg[r, o] W[o, i], and one partial
// sum per row slice of dW[o, i] = Σ_r dg[r, o] x[r, i] and of db[o] = Σ_r dg[r, o] ([slices, O, 3I + 1], dW then
// db, for the caller to sum).
#include <cstdint>
#include <string>

namespace memlab::kernels {

constexpr int kMLstmGatesMax = 32;           // O = 2H at most: 16 heads
constexpr int kMLstmGatesWidthMultiple = 8;  // I: 16-byte loads of bf16 rows

struct MLstmGatesProblem {
  int64_t rows = 0;  // B T
  int I = 0;         // columns of each of q, k, v
  int H = 0;         // heads: O = 2H gates per row
  bool bf16 = false;  // q, k, v (and dq, dk, dv) in bf16, else fp32
};

struct MLstmGatesForwardArgs {
  const void *q = nullptr, *k = nullptr, *v = nullptr;  // [rows, I] each
  const float *W = nullptr, *b = nullptr;               // [2H, 3I], [2H]
  float *ig = nullptr, *fg = nullptr;                   // [rows, H] each
};

struct MLstmGatesBackwardArgs {
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  const float* W = nullptr;
  const float *dig = nullptr, *dfg = nullptr;  // [rows, H] each
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
  float* dW_partial = nullptr;  // [mlstm_gates_slices(p), 2H, 3I + 1]
};

int mlstm_gates_slices(const MLstmGatesProblem& p);

// Return an empty string on success, else the error. stream is a cudaStream_t.
std::string mlstm_gates_forward(const MLstmGatesProblem& p, const MLstmGatesForwardArgs& a, void* stream);
std::string mlstm_gates_backward(const MLstmGatesProblem& p, const MLstmGatesBackwardArgs& a, void* stream);

}  // namespace memlab::kernels
