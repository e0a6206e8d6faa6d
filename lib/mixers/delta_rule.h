#pragma once
// The delta rule S_t = S_{t-1} + k_t β_t (v_t - S_{t-1}^T k_t)^T, o_t = S_t^T (scale q_t), S ∈ R^{d_k×d_v}.
// Layout: q, k [B, T, H, dk]; v [B, T, H, dv]; beta [B, T, H]. Keys and queries arrive L2-normalised.
// Everything runs in fp32 (the triangular solve is sensitive); outputs come back in v's dtype.
#include <torch/torch.h>

namespace memlab {

struct DeltaRuleOut {
  torch::Tensor o;      // [B, T, H, dv]
  torch::Tensor state;  // [B, H, dk, dv] after the last token
};

// Chunkwise-parallel (WY/UT) form: per chunk of C tokens, T = (I + tril(diag(β) K K^T, -1))^{-1},
// W = T K_β, U = T V_β; then a loop over chunks (not time steps) with u = U - W S.
// with_intra = false returns only the inter-chunk read q_t S_{start of t's chunk} (Delayed-Chunk HQLT).
DeltaRuleOut delta_rule_chunked(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                const torch::Tensor& beta, int64_t chunk, double scale,
                                const torch::Tensor& initial_state = {}, bool with_intra = true);

// Plain recurrence over time steps; tests only.
DeltaRuleOut delta_rule_recurrent(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const torch::Tensor& beta, double scale, const torch::Tensor& initial_state = {});

// One token: q_t, k_t [B, H, dk], v_t [B, H, dv], beta_t [B, H]; updates S [B, H, dk, dv] in place of the handle.
torch::Tensor delta_rule_step(const torch::Tensor& q_t, const torch::Tensor& k_t, const torch::Tensor& v_t,
                              const torch::Tensor& beta_t, double scale, torch::Tensor& state);

}  // namespace memlab
