#pragma once
// The SSD of Mamba-2 (Dao & Gu 2024), the sequence mixing inside the Mamba-2 layer (mixers/mamba2.h).
//
// SSD recurrence per head h (state h_t ∈ R^{P×N}, mamba's [headdim, d_state] layout):
//   alpha_t = exp(dt_t A)            or  2 exp(dt_t A) - 1 with neg_eigval
//   h_t = alpha_t h_{t-1} + dt_t x_t B_t^T,    y_t = h_t C_t        (+ D x_t, the layer's skip, where `ssd` gets D)
// Layout (fla/mamba): x [B, T, H, P], dt [B, T, H] (already softplus'ed, > 0), A [H] (< 0),
// Bm, Cm [B, T, G, N] with G groups shared by H/G consecutive heads (head h reads group h / (H/G));
// states [B, H, P, N].
// Correspondence (without neg_eigval):
//   - mamba_ssm ssd_minimal_discrete(X = x*dt, A = dt*A, B, C, block_len) returns (y, final_state) with the
//     same y and the same [b, h, p, n] state (B, C expanded to heads).
//   - fla naive_chunk_simple_gla(q = C, k = B, v = x*dt, g = dt*A, scale = 1.0) gives the same y; fla's state
//     there is [B, H, K=N, V=P], the transpose of ours. fla has no separate naive Mamba-2 op; its layer's
//     torch_forward uses the same SSD and the [b, h, p, n] state.
// All of it computes in fp32 (fp64 for fp64 inputs) with autocast off, and y comes back in that compute type (the
// layer goes on in it).
//
// Forms: the chunkwise kernels (chunk.cu, forward and backward), the tensor-op chunkwise form (ssd_chunked) and
// the recurrence the tests hold both to. `ssd` picks the form (model.kernels).
#include <torch/torch.h>

#include <string>

#include "ops/kernels.h"

namespace memlab {

struct SsdOut {
  torch::Tensor y;      // [B, T, H, P]
  torch::Tensor state;  // [B, H, P, N] after the last token
};

// With neg_eigval the transition's magnitude is at least this: alpha = sign(a) max(|a|, floor), a = 2 exp(dt A) - 1,
// straight-through (gradient 1 w.r.t. a). d log|alpha| / d alpha = 1 / |alpha| multiplies the rounding error of the
// kernel's d log|alpha| (a running sum of differences, ~1e-7 of its terms): at a = 0 exactly in fp32 (exp(dt A) =
// 0.5) the old floor of 1e-30 made that error ~1e23. At 1e-4 it stays below 1e-3 of the terms, and a state passes
// a zero transition with weight 1e-4.
constexpr double kSsdAbsAlphaFloor = 1e-4;

// log|alpha_t| and, with neg_eigval, sign(alpha_t) ∈ {±1} (undefined without: all +1), differentiable in dt
// and A through the log (the floor above is straight-through).
struct SsdLogTransition {
  torch::Tensor log_abs, sign;
};
SsdLogTransition ssd_log_transition(const torch::Tensor& dt, const torch::Tensor& A, bool neg_eigval);

// Per-step transition alpha_t [B, T, H] (or [B, H]) from dt and A, in dt's dtype (floored as above).
torch::Tensor ssd_transition(const torch::Tensor& dt, const torch::Tensor& A, bool neg_eigval);

// Chunkwise SSD (Mamba-2 paper, Listing 1), exact for signed transitions: the product of alphas over a
// segment (j, i] is S_i S_j exp(sum_{j<k<=i} log|alpha_k|), S_t = prod_{k<=t} sign(alpha_k) ∈ {±1} (a rank-1
// sign pattern), log|alpha| = dt A without neg_eigval. Segment sums use the stable masked cumsum (no
// differences of cumsums, so strong decays lose no precision). Within a chunk: L = exp(segsum) masked, states
// at chunk ends; across chunks the same segsum over chunk totals (no loop); then the off-diagonal read.
SsdOut ssd_chunked(const torch::Tensor& x, const torch::Tensor& dt, const torch::Tensor& A, const torch::Tensor& Bm,
                   const torch::Tensor& Cm, int64_t chunk, bool neg_eigval, const torch::Tensor& initial_state = {});

// Plain recurrence over time steps, written from the equations above; tests only.
SsdOut ssd_recurrent(const torch::Tensor& x, const torch::Tensor& dt, const torch::Tensor& A, const torch::Tensor& Bm,
                     const torch::Tensor& Cm, bool neg_eigval, const torch::Tensor& initial_state = {});

// One token: x_t [B, H, P], dt_t [B, H], B_t, C_t [B, G, N]; updates state [B, H, P, N]; returns y_t [B, H, P].
torch::Tensor ssd_step(const torch::Tensor& x_t, const torch::Tensor& dt_t, const torch::Tensor& A,
                       const torch::Tensor& B_t, const torch::Tensor& C_t, bool neg_eigval, torch::Tensor& state);

// The sequence, differentiable in x, dt, A, Bm, Cm, the initial state and D: the kernels where they apply
// (model.kernels), else ssd_chunked. With D [H] defined, y_t += D x_t (the layer's skip, fused in the kernels).
// The kernels read x, Bm, Cm in fp32 or bf16 (as column slices of one projection, without copies) and
// compute in fp32.
SsdOut ssd(const torch::Tensor& x, const torch::Tensor& dt, const torch::Tensor& A, const torch::Tensor& Bm,
           const torch::Tensor& Cm, int64_t chunk, bool neg_eigval, const torch::Tensor& initial_state,
           Kernels kernels, const torch::Tensor& D = {});
// Whether `ssd` would run the kernels, and if not, why.
bool ssd_kernel_applies(const torch::Tensor& x, const torch::Tensor& Bm, Kernels kernels, std::string* why = nullptr);

}  // namespace memlab
