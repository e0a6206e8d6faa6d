#pragma once
// The sLSTM recurrence (Beck et al. 2024, xLSTM): a scalar memory cell per unit with recurrent ("memory
// mixing") weights R, block-diagonal with one block per head. Per unit, with gate pre-activations from the input
// (W x + b) plus R h_{t-1}:  ĩ, f̃, z̃, õ;  log f = logsigmoid(f̃)
//   m_t = max(ĩ_t, log f_t + m_{t-1})  (m_t = ĩ_t while n_{t-1} = 0, i.e. at the first token of a zero state)
//   i' = exp(ĩ_t - m_t), f' = exp(log f_t + m_{t-1} - m_t)
//   c_t = f' c_{t-1} + i' tanh(z̃_t),  n_t = f' n_{t-1} + i',  h_t = sigmoid(õ_t) c_t / n_t
// The stabiliser cancels exactly in c_t / n_t: c_t = C_t e^{-m_t} with C_t the unstabilised cell, for any m.
// The zero-state rule is xlstm's vanilla backend (xlstm/blocks/slstm/src/vanilla/slstm.py: m = ĩ when n == 0),
// applied per unit: it keeps n_t >= 1, and the all-zero state stays a valid fresh state (resets by zeroing work).
//
// Layout: pre [B, T, H, 4, dh] (gates in the order i, f, z, o; input part and bias only), R [H, dh, 4 dh]
// (row = unit of h_{t-1} in the head, column = gate * dh + unit). fla has no sLSTM. Everything runs in fp32
// (fp64 for fp64 inputs); h comes back in pre's dtype, states in fp32 (fp64).
//
// Forms: the fused kernel (fused_recurrent.cu: one launch walks all time steps, forward and backward), the
// tensor-op form (slstm_forward: a loop over time of one batched matmul and the pointwise update) and the plain
// per-head reference the tests hold both to. `slstm` and `slstm_step` pick the form (model.kernels).
#include <torch/torch.h>

#include <string>

#include "ops/kernels.h"

namespace memlab {

struct SLstmState {
  torch::Tensor h, c, n, m;  // [B, H, dh] each
};

struct SLstmOut {
  torch::Tensor h;  // [B, T, H, dh]
  SLstmState state;
};

SLstmState slstm_zero_state(int64_t B, int64_t H, int64_t dh, const torch::TensorOptions& opts);

// The sequence, differentiable in pre, R and the initial state. The kernel's backward treats m as a constant
// (every path through it cancels) and gives the final state's m no gradient: a consumer of the final state
// that continues the recurrence (a later call from it) gets exact gradients; one that reads m itself does not.
SLstmOut slstm(const torch::Tensor& pre, const torch::Tensor& R, const SLstmState& init, Kernels kernels);
// One token: pre_t [B, H, 4, dh]; updates the state, returns h_t [B, H, dh].
torch::Tensor slstm_step(const torch::Tensor& pre_t, const torch::Tensor& R, SLstmState& state, Kernels kernels);
// Whether `slstm` would run the fused kernel, and if not, why.
bool slstm_kernel_applies(const torch::Tensor& pre, Kernels kernels, std::string* why = nullptr);

// The tensor-op training form: per step one batched matmul over heads with R and the pointwise cell update.
SLstmOut slstm_forward(const torch::Tensor& pre, const torch::Tensor& R, const SLstmState& init = {});
// Independent plain implementation of the same equations (per time step, per head); tests only.
SLstmOut slstm_reference(const torch::Tensor& pre, const torch::Tensor& R, const SLstmState& init = {});

}  // namespace memlab
