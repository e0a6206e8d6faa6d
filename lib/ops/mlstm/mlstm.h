#pragma once
// mLSTM (Beck et al. 2024, xLSTM): matrix memory with an exponential input gate and a sigmoid forget gate,
// stabilised in log space. Per head, with ĩ_t, f̃_t the gate pre-activations and log f_t = logsigmoid(f̃_t):
//   m_t = max(log f_t + m_{t-1}, ĩ_t),   f'_t = exp(log f_t + m_{t-1} - m_t),   i'_t = exp(ĩ_t - m_t)
//   C_t = f'_t C_{t-1} + i'_t (k_t / sqrt(d)) v_t^T,   n_t = f'_t n_{t-1} + i'_t k_t / sqrt(d)
//   h_t = C_t^T q_t / (max(|n_t^T q_t|, exp(-m_t)) + eps)
// In closed form m_t = max(m_0 + Σ_{l<=t} log f_l, max_{j<=t} (ĩ_j + Σ_{l=j+1..t} log f_l)), and with
// C̃_t = exp(m_t) C_t, ñ_t = exp(m_t) n_t (the unstabilised memory) h_t = C̃_t^T q / (max(|ñ_t^T q|, 1) +
// eps exp(m_t)): the stabiliser cancels except in the eps term, so every form must produce the same m_t.
// Initial state: C = 0, n = 0, m_0 = 0, as in xlstm's recurrent_step_stabilized_simple and chunkwise_simple
// (xlstm's parallel_stabilized_simple uses m_0 = -inf; the two differ only through eps, relative <= eps).
//
// Layout as in fla: q, k [B, T, H, dk], v [B, T, H, dv], gate pre-activations [B, T, H]. fla has no mLSTM;
// the reference is xlstm/blocks/mlstm/backends.py (same equations and eps, keys scaled by 1/sqrt(dk) inside).
// Everything runs in fp32 (fp64 for fp64 inputs); h comes back in v's dtype, the state in the compute type.
//
// Forms: the chunkwise kernels (chunk.cu, forward and backward), the tensor-op chunkwise form (mlstm_chunked)
// and the stabilised recurrence the tests hold both to. `mlstm` picks the form (model.kernels).
#include <torch/torch.h>

#include <string>

#include "ops/kernels.h"

namespace memlab {

struct MLstmState {
  torch::Tensor C;  // [B, H, dk, dv]
  torch::Tensor n;  // [B, H, dk]
  torch::Tensor m;  // [B, H]
};

struct MLstmOut {
  torch::Tensor h;  // [B, T, H, dv]
  MLstmState state;  // after the last token
};

// Zero state (m_0 = 0) in the compute type of `opts` (fp64 stays fp64, anything else becomes fp32).
MLstmState mlstm_zero_state(int64_t B, int64_t H, int64_t dk, int64_t dv, const torch::TensorOptions& opts);

// Chunkwise form: inside a chunk the stabilised parallel form, across chunks (a loop over chunks) the
// stabilised states (C, n, m); each position's stabiliser is max(m_{chunk start} + Σ log f, row max of the
// intra-chunk log weights), which is exactly the recurrent m_t. `init` undefined tensors = zero state.
MLstmOut mlstm_chunked(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& igate, const torch::Tensor& fgate, int64_t chunk, double eps = 1e-6,
                       const MLstmState& init = {});

// The stabilised recurrence, one time step after the other (tests only).
MLstmOut mlstm_recurrent(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         const torch::Tensor& igate, const torch::Tensor& fgate, double eps = 1e-6,
                         const MLstmState& init = {});

// One token: q_t, k_t [B, H, dk], v_t [B, H, dv], gates [B, H]; updates the state; returns h_t [B, H, dv].
torch::Tensor mlstm_step(const torch::Tensor& q_t, const torch::Tensor& k_t, const torch::Tensor& v_t,
                         const torch::Tensor& igate_t, const torch::Tensor& fgate_t, MLstmState& state,
                         double eps = 1e-6);

// The sequence, differentiable in q, k, v, the gates and the initial state (C, n and m). h comes back in `out`
// (v's dtype when Undefined): the layer takes it in fp32 into its norm. The kernel's backward
// treats the stabiliser as a constant inside (h depends on it only through eps) and routes the final m_T's
// gradient, its own and C_T's and n_T's (exp(-m_T) times the unstabilised memory), to whatever set m_T.
MLstmOut mlstm(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& igate,
               const torch::Tensor& fgate, int64_t chunk, const MLstmState& init, Kernels kernels, double eps = 1e-6,
               torch::ScalarType out = torch::ScalarType::Undefined);
// Whether `mlstm` would run the kernels, and if not, why.
bool mlstm_kernel_applies(const torch::Tensor& q, const torch::Tensor& v, Kernels kernels, std::string* why = nullptr);

// The gate pre-activations of the mLSTM layer from its q, k, v [.., I] (xlstm: a linear map of their
// concatenation), each [.., H] in the compute type: [q | k | v] [w_i; w_f]ᵀ + [b_i; b_f], with w_i, w_f [H, 3I].
// The kernel (project.cu) reads q, k, v where they lie and computes in fp32; the tensor-op form is the reference.
// A packed layer of K members (SequenceModel's members) passes w_i, w_f [H, 3I/K]: member m's H/K heads read only
// its I/K columns of each of q, k and v. Such gates, and the projection below, run tensor ops one product per
// member, whatever `kernels` says (the kernels read every column).
struct MLstmGates {
  torch::Tensor ig, fg;
};
MLstmGates mlstm_gates(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& w_i,
                       const torch::Tensor& w_f, const torch::Tensor& b_i, const torch::Tensor& b_f, Kernels kernels);
MLstmGates mlstm_gates_reference(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 const torch::Tensor& w_i, const torch::Tensor& w_f, const torch::Tensor& b_i,
                                 const torch::Tensor& b_f);
bool mlstm_gates_kernel_applies(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t heads,
                                Kernels kernels, std::string* why = nullptr);

// The layer's whole input projection: q = c W_qᵀ, k = c W_kᵀ, v = x W_vᵀ with block-diagonal W_* given by their
// blocks [I / bs, bs, bs] (out, in), in c's dtype, then their gates as mlstm_gates. One kernel each way (project.cu)
// where the blocks are 4 wide, c and x share a dtype and the layer has at most 8 heads; else three dense products
// with the block-diagonal matrices and mlstm_gates. mlstm_project_reference: tensor ops throughout.
struct MLstmProjection {
  torch::Tensor q, k, v;  // [.., I] in c's dtype (x's under the tensor-op form's autocast)
  torch::Tensor ig, fg;   // [.., H] in the compute type
};
MLstmProjection mlstm_project(const torch::Tensor& c, const torch::Tensor& x, const torch::Tensor& w_q,
                              const torch::Tensor& w_k, const torch::Tensor& w_v, const torch::Tensor& w_i,
                              const torch::Tensor& w_f, const torch::Tensor& b_i, const torch::Tensor& b_f,
                              Kernels kernels);
MLstmProjection mlstm_project_reference(const torch::Tensor& c, const torch::Tensor& x, const torch::Tensor& w_q,
                                        const torch::Tensor& w_k, const torch::Tensor& w_v, const torch::Tensor& w_i,
                                        const torch::Tensor& w_f, const torch::Tensor& b_i, const torch::Tensor& b_f);
bool mlstm_project_kernel_applies(const torch::Tensor& c, const torch::Tensor& x, const torch::Tensor& w_q,
                                  int64_t heads, Kernels kernels, std::string* why = nullptr);

}  // namespace memlab
