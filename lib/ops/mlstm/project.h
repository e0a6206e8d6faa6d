#pragma once
// The mLSTM layer's input side on CUDA, torch-free: the launch interface of project.cu. Two ops:
// - the gate pre-activations from q, k, v (mlstm_gates_*);
// - the whole projection (mlstm_project_*): q, k, v from the conv's output c and the up-projection's x by
//   block-diagonal weights, and the gates from them, in one pass forward and one backward.
//
// The gates. Per row r (a token): g[r, o] = b[o] + Σ_i [q | k | v][r, i] W[o, i], o < O = 2H (the H input gates, then the H
// forget gates), over the 3I columns of q, k and v read where they lie (no concatenation), in fp32 whatever the
// inputs' dtype: the pre-activations feed exponentials. A tensor-op form concatenates q, k, v, casts them to fp32
// and runs one fp32 product, 50 times the bytes of the inputs and as slow in the backward (about 0.6 ms of an
// xLSTM[1:0] step at B256 T128 on an H200).
// Forward: a warp per 32 / O rows (O rounded up to a power of two), each lane 16-byte loads of a strided share of
// the columns, then one reduce-scatter of the warp's 32 sums.
// Backward: a thread per pair of columns over a slice of rows: dx[r, i] = Σ_o dg[r, o] W[o, i], and one partial
// sum per row slice of dW[o, i] = Σ_r dg[r, o] x[r, i] and of db[o] = Σ_r dg[r, o] ([slices, O, 3I + 1], dW then
// db, for the caller to sum; not written where there are no rows or columns).
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

// The projection. Per row r, with c and x [rows, I] and W_q, W_k, W_v [I/4, 4, 4] (blocks of 4, (out, in)):
//   q[r, 4b+i] = Σ_j W_q[b, i, j] c[r, 4b+j],  k likewise from c,  v from x by W_v,
// each rounded to the inputs' dtype, then the gates as above from the rounded q, k, v. The tensor-op form (three
// dense products with the block-diagonal matrices, then the gates) spent about 0.5 ms of an xLSTM[1:0] step at B256
// T128 on an H200 in products, weight casts, gradient adds and sums.
// Forward: a warp per 32 / O' rows (O' = O rounded up to a power of two), each lane whole blocks of q, k and v.
// Backward: a thread per (block of 4 columns, one of q, k, v) over a slice of rows. It adds the gates' share to the
// incoming dq (dk, dv), forms dc (the q and k threads of a block are neighbouring lanes, and add theirs by a
// shuffle) and dx, and sums its weights' gradients over the slice: [slices, 12 I + 2H (3I + 1)] partial sums of
// dW_q, dW_k, dW_v (4I each, [I/4, 4, 4]), then dW_g [2H, 3I], then db [2H], for the caller to sum (not written
// where there are no rows).
constexpr int kMLstmProjectBlock = 4;      // the block-diagonal weights' blocks
constexpr int kMLstmProjectMaxGates = 16;  // O = 2H at most: 8 heads (each backward thread keeps O x 4 weights)
constexpr int kMLstmProjectMaxWidth = 1024;  // I: the forward stages the block weights, 48 I bytes, in shared memory

using MLstmProjectProblem = MLstmGatesProblem;  // rows, I (c, x, q, k, v each), H, bf16: the same sizes

struct MLstmProjectForwardArgs {
  const void *c = nullptr, *x = nullptr;                           // [rows, I] each
  const float *Wq = nullptr, *Wk = nullptr, *Wv = nullptr;         // [I/4, 4, 4] each
  const float *Wg = nullptr, *bg = nullptr;                        // [2H, 3I], [2H]
  void *q = nullptr, *k = nullptr, *v = nullptr;                   // [rows, I] each
  float *ig = nullptr, *fg = nullptr;                              // [rows, H] each
};

struct MLstmProjectBackwardArgs {
  const void *c = nullptr, *x = nullptr;
  const float *Wq = nullptr, *Wk = nullptr, *Wv = nullptr, *Wg = nullptr;
  const void *dq = nullptr, *dk = nullptr, *dv = nullptr;  // [rows, I] each; null = zero
  const float *dig = nullptr, *dfg = nullptr;              // [rows, H] each
  void *dc = nullptr, *dx = nullptr;                       // [rows, I] each
  float* partial = nullptr;  // [mlstm_project_slices(p), mlstm_project_partial_width(p)]
};

int mlstm_project_slices(const MLstmProjectProblem& p);
int64_t mlstm_project_partial_width(const MLstmProjectProblem& p);

std::string mlstm_project_forward(const MLstmProjectProblem& p, const MLstmProjectForwardArgs& a, void* stream);
std::string mlstm_project_backward(const MLstmProjectProblem& p, const MLstmProjectBackwardArgs& a, void* stream);

}  // namespace memlab::kernels
