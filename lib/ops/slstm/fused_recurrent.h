#pragma once
// The sLSTM recurrence (ops/slstm/slstm.h) on CUDA, torch-free: the launch interface of fused_recurrent.cu.
//
// One block keeps one head's recurrent block R_h [dh, 4 dh] in shared memory and walks every time step of a
// few batch rows inside one launch; thread (row, unit j) owns unit j's cell (c, n, m in registers) and its four
// gate pre-activations, pre + Σ_k h_{t-1}[k] R_h[k, g dh + j]. h_{t-1} is shared through shared memory, one
// barrier per step. Everything is fp32.
//
// The backward walks back through time from the stored gate pre-activations and cell states, thread (row, j)
// carrying dc_j and dn_j, and writes dpre (the gradient of the gate pre-activations, which is also pre's
// gradient); the recurrent part of dh_{t-1}, Rᵀ dpre_t, comes from a transposed copy of R_h in shared memory.
// R's gradient, Σ_t h_{t-1}ᵀ dpre_t, is one batched matmul the caller does. The stabiliser m is treated as a
// constant: h depends on the inputs only through c / n, so every path through m cancels (see slstm.h).
#include <cstdint>
#include <string>

namespace memlab::kernels {

constexpr int kSLstmMaxHeadDim = 64;  // R_h and its transpose fit in shared memory up to here

struct SLstmProblem {
  int B = 0, T = 0, H = 0, dh = 0;
};

// Layouts (all fp32, dense): pre and gates [B, T, H, 4, dh] (gates i, f, z, o); R [H, dh, 4 dh];
// h [B, T, H, dh]; cells [B, T, H, 3, dh] (c, n, m after each step); states [B, H, dh].
struct SLstmForwardArgs {
  const float *pre = nullptr, *R = nullptr;
  const float *h0 = nullptr, *c0 = nullptr, *n0 = nullptr, *m0 = nullptr;  // null: the zero state
  float* h = nullptr;                                                        // null: not written (a step)
  float *gates = nullptr, *cells = nullptr;                                  // for the backward; null: not kept
  float *hT = nullptr, *cT = nullptr, *nT = nullptr, *mT = nullptr;          // final state; may alias the initial
};

struct SLstmBackwardArgs {
  const float *R = nullptr, *gates = nullptr, *cells = nullptr, *dh = nullptr;  // dh = the gradient of h
  const float *c0 = nullptr, *n0 = nullptr, *m0 = nullptr;                      // null: the zero state
  const float *dhT = nullptr, *dcT = nullptr, *dnT = nullptr;                   // final state's gradients; null: 0
  float* dpre = nullptr;
  float *dh0 = nullptr, *dc0 = nullptr, *dn0 = nullptr, *dm0 = nullptr;         // null: not wanted
};

// Return an empty string on success, else the error. stream is a cudaStream_t.
std::string slstm_forward(const SLstmProblem& p, const SLstmForwardArgs& a, void* stream);
std::string slstm_backward(const SLstmProblem& p, const SLstmBackwardArgs& a, void* stream);

// The same per-thread code run on the CPU, thread by thread between the barriers: lets the CPU tests check the
// kernels' arithmetic and indexing against the tensor-op form on machines without a GPU.
std::string slstm_forward_host(const SLstmProblem& p, const SLstmForwardArgs& a);
std::string slstm_backward_host(const SLstmProblem& p, const SLstmBackwardArgs& a);

}  // namespace memlab::kernels
