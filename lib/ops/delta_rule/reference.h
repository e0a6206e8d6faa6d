#pragma once
// The tensor-op forms of the delta rule: the reference that the fused kernels (fused_recurrent.cu) are tested
// against and the form that runs on the CPU. Layers call delta_rule.h, not these.
// The (gated) delta rule S_t = a_t (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T, o_t = S_t^T (scale q_t),
// S ∈ R^{d_k×d_v}, a_t = exp(g_t). Without g (undefined tensor) a_t = 1: the plain delta rule.
// Layout as fla: q, k [B, T, H, dk]; v [B, T, H, dv]; beta, g [B, T, H]; state [B, H, dk, dv].
// Keys and queries arrive L2-normalised (fla's naive functions do not normalise either).
// Correspondence: g undefined = fla/ops/delta_rule/naive.py delta_rule_recurrence / delta_rule_chunkwise;
// g defined = fla/ops/gated_delta_rule/naive.py naive_recurrent_gated_delta_rule / naive_chunk_gated_delta_rule
// (decay first, then the delta update, then the read of the updated state; scale applied to q).
// g is a log-decay and must be <= 0 (Gated DeltaNet's -exp(A_log) softplus(.)): the chunked form relies on
// it so that every exponent it evaluates is <= 0.
// Everything runs in fp32, or fp64 for fp64 inputs (the triangular solve is sensitive); outputs come back in
// v's dtype, states in the compute type.
#include <torch/torch.h>

namespace memlab {

struct DeltaRuleOut {
  torch::Tensor o;      // [B, T, H, dv]
  torch::Tensor state;  // [B, H, dk, dv] after the last token
};

// Chunkwise-parallel (WY/UT) form: per chunk of C tokens with in-chunk cumulative log-decay G_i = Σ_{j<=i} g_j,
// T = (I + tril(diag(β) K K^T ⊙ exp(G_i - G_j), -1))^{-1}, W = T (K_β ⊙ exp(G)), U = T V_β; then a loop over
// chunks (not time steps): u = U - W S, O = (Q ⊙ exp(G)) S + (Q K^T ⊙ exp(G_i - G_j) ⊙ M) u,
// S <- exp(G_C) S + (K ⊙ exp(G_C - G))^T u.
// with_intra = false returns only the inter-chunk read (q_t ⊙ exp(G_t)) S_{start of t's chunk}
// (Delayed-Chunk HQLT); the returned state is the full one either way.
DeltaRuleOut delta_rule_chunked(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const torch::Tensor& beta, int64_t chunk, double scale,
                                const torch::Tensor& initial_state = {}, bool with_intra = true,
                                const torch::Tensor& g = {});

// Plain recurrence over time steps; tests only.
DeltaRuleOut delta_rule_recurrent(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const torch::Tensor& beta, double scale, const torch::Tensor& initial_state = {},
                                  const torch::Tensor& g = {});

// One token: q_t, k_t [B, H, dk], v_t [B, H, dv], beta_t, g_t [B, H]; updates S [B, H, dk, dv] in place of the
// handle.
torch::Tensor delta_rule_step_reference(const torch::Tensor& q_t, const torch::Tensor& k_t, const torch::Tensor& v_t,
                              const torch::Tensor& beta_t, double scale, torch::Tensor& state,
                              const torch::Tensor& g_t = {});

}  // namespace memlab
