#pragma once
// The chunkwise mLSTM (ops/mlstm/mlstm.h) on CUDA, torch-free: the launch interface of chunk.cu.
//
// One block per (batch row, head) walks the chunks of 32 tokens in order and keeps the stabilised state C [D, D],
// n [D] and m in shared memory. Per chunk, with b_t the chunk's running Σ log f and p_t = max_{j<=t} (ĩ_j - b_j):
//   m_t = b_t + max(m_prev, p_t)                     (the recurrent stabiliser, from two warp scans)
//   S = (Q Kᵀ) ⊙ exp(b_t - b_j + ĩ_j - m_t) [j <= t],  w_t = exp(m_prev + b_t - m_t)
//   num = S V + w ⊙ (Q C),  den = S 1 + w ⊙ (Q n),  h = num / (max(|den|, exp(-m_t)) + eps)
//   C <- exp(b_L + m_prev - m_L) C + Σ_j exp(b_L - b_j + ĩ_j - m_L) k_j v_jᵀ  (n likewise with 1 for v)
// as products of shared-memory tiles on tensor cores (TF32 for bf16 q, k, v; 3xTF32 for fp32), with the row scales
// and pair weights applied between them.
//
// The backward walks the chunks in reverse with dC, dn in shared memory. It treats every m as a constant: h is
// independent of the stabiliser but for eps, so the only path through m that counts is the final state's
// (C_T, n_T are exp(-m_T) times the unstabilised memory, and m_T is an output), which the caller passes as
// pend = dm_T - (C_T·dC_T + n_T·dn_T) and the kernel routes to the ĩ_j, log f or m_0 that set m_T. The gates'
// gradients follow from the pairwise terms: dĩ_j = k_j·dk_j and d log f_l = Σ_{t>=l} (q_t·dq_t - k_t·dk_t),
// with dm_T added at the last token (the final state's pairs and pend's share cancel there).
#include <cstddef>
#include <cstdint>
#include <string>

namespace memlab::kernels {

constexpr int kMLstmChunk = 32;  // tokens per chunk: one warp scans a chunk's gates

// Head dims the kernels are built for (dk = dv).
inline bool mlstm_head_dim_supported(int d) { return d == 16 || d == 32 || d == 64 || d == 128; }
// Shared memory the backward needs per block at head dim d (the forward needs less): 107 KB at d = 64, 197 KB at
// d = 128, more than some GPUs give a block (A100: 163 KB).
size_t mlstm_backward_shared_bytes(int d);

struct MLstmProblem {
  int B = 0, T = 0, H = 0, D = 0;
  bool bf16 = false;  // q, k, v (and dq, dk, dv) in bf16, else fp32
  float eps = 1e-6f;
  int chunks() const { return (T + kMLstmChunk - 1) / kMLstmChunk; }
};

// Layouts (dense): q, k, v, h [B, T, H, D]; ig, fg (gate pre-activations) and den [B, T, H]; states C [B, H, D, D],
// n [B, H, D], m [B, H]; the states at each chunk's start Cs [B, H, N, D, D], ns [B, H, N, D], ms [B, H, N].
// Everything but q, k, v and their gradients is fp32. k is scaled by 1/sqrt(D) inside.
struct MLstmForwardArgs {
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  const float *ig = nullptr, *fg = nullptr;
  const float *C0 = nullptr, *n0 = nullptr, *m0 = nullptr;  // null: the zero state (m = 0)
  float* h = nullptr;
  float *den = nullptr, *Cs = nullptr, *ns = nullptr, *ms = nullptr;  // for the backward; null: not kept
  float *CT = nullptr, *nT = nullptr, *mT = nullptr;                  // final state; may alias the initial
};

struct MLstmBackwardArgs {
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  const float *ig = nullptr, *fg = nullptr, *h = nullptr, *den = nullptr, *Cs = nullptr, *ns = nullptr,
              *ms = nullptr;
  const float* dh = nullptr;                                      // h's gradient, fp32
  const float *dCT = nullptr, *dnT = nullptr, *dmT = nullptr;  // final state's gradients; null: 0
  const float* pend = nullptr;                                  // [B, H], see above; null: 0
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
  float *dig = nullptr, *dfg = nullptr;
  float *dC0 = nullptr, *dn0 = nullptr;  // null: not wanted
  float* dm0 = nullptr;                  // pend's share that reached m_0 (the caller adds C_0·dC_0 + n_0·dn_0)
};

// Return an empty string on success, else the error. stream is a cudaStream_t.
std::string mlstm_forward(const MLstmProblem& p, const MLstmForwardArgs& a, void* stream);
std::string mlstm_backward(const MLstmProblem& p, const MLstmBackwardArgs& a, void* stream);

}  // namespace memlab::kernels
