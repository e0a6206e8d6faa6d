#include "ops/delta_rule/reference.h"

#include <cmath>

#include "mixers/ops.h"

namespace memlab {


DeltaRuleOut delta_rule_chunked(const torch::Tensor& q_in, const torch::Tensor& k_in, const torch::Tensor& v_in,
                                const torch::Tensor& beta_in, int64_t C, double scale,
                                const torch::Tensor& initial_state, bool with_intra, const torch::Tensor& g_in) {
  AutocastOff no_autocast;
  namespace F = torch::nn::functional;
  const bool gated = g_in.defined();
  const auto out_dtype = v_in.scalar_type();
  const auto ct = compute_type(v_in);
  const int64_t B = q_in.size(0), T = q_in.size(1), H = q_in.size(2), dk = q_in.size(3), dv = v_in.size(3);
  // [B, H, T, d] in fp32
  auto q = q_in.to(ct).transpose(1, 2) * scale;
  auto k = k_in.to(ct).transpose(1, 2);
  auto v = v_in.to(ct).transpose(1, 2);
  auto beta = beta_in.to(ct).transpose(1, 2);  // [B, H, T]
  torch::Tensor g = gated ? g_in.to(ct).transpose(1, 2) : torch::Tensor();
  C = std::min<int64_t>(C, T);
  const int64_t N = (T + C - 1) / C, Tp = N * C;
  if (Tp != T) {  // zero keys and β (and zero log-decay) pad the tail: their updates are no-ops
    q = F::pad(q, F::PadFuncOptions({0, 0, 0, Tp - T}));
    k = F::pad(k, F::PadFuncOptions({0, 0, 0, Tp - T}));
    v = F::pad(v, F::PadFuncOptions({0, 0, 0, Tp - T}));
    beta = F::pad(beta, F::PadFuncOptions({0, Tp - T}));
    if (gated) g = F::pad(g, F::PadFuncOptions({0, Tp - T}));
  }
  q = q.view({B, H, N, C, dk});
  k = k.view({B, H, N, C, dk});
  v = v.view({B, H, N, C, dv});
  beta = beta.view({B, H, N, C, 1});
  auto kb = k * beta, vb = v * beta;
  auto opts = q.options();
  auto eye = torch::eye(C, opts);
  auto strict = torch::ones({C, C}, opts.dtype(torch::kBool)).tril(-1);
  auto causal = torch::ones({C, C}, opts.dtype(torch::kBool)).tril(0);
  // Gating: G = in-chunk cumulative log-decay; D_ij = exp(G_i - G_j) on and below the diagonal, 0 above. The
  // upper triangle is set to -inf BEFORE exp: there G_i - G_j >= 0 can overflow (and inf * 0 gives NaN grads).
  torch::Tensor G, D, eG;
  if (gated) {
    G = g.view({B, H, N, C}).cumsum(-1);
    eG = G.exp().unsqueeze(-1);  // [B, H, N, C, 1]
    D = (G.unsqueeze(-1) - G.unsqueeze(-2)).masked_fill(causal.logical_not(), -INFINITY).exp();  // [B,H,N,C,C]
  }
  // L = I + strictly-lower(K_β K^T ⊙ D); T_inv = L^{-1} via a unit-triangular solve
  auto KK = torch::matmul(kb, k.transpose(-1, -2));
  if (gated) KK = KK * D;
  auto L = eye + KK.masked_fill(strict.logical_not(), 0.0);
  auto Tm = torch::linalg_solve_triangular(L, eye.expand_as(L), /*upper=*/false, /*left=*/true,
                                           /*unitriangular=*/true);
  auto W = torch::matmul(Tm, gated ? kb * eG : kb);  // [B, H, N, C, dk]
  auto U = torch::matmul(Tm, vb);                                       // [B, H, N, C, dv]
  auto QK = torch::matmul(q, k.transpose(-1, -2));
  QK = gated ? QK * D : QK.masked_fill(causal.logical_not(), 0.0);  // D is already causal
  // Gated: the inter-chunk read sees q ⊙ exp(G); the state update sees k ⊙ exp(G_C - G) and decays by exp(G_C).
  torch::Tensor qr = q, kw = k, chunk_decay;
  if (gated) {
    auto G_last = G.narrow(-1, C - 1, 1);  // [B, H, N, 1]
    qr = q * eG;
    kw = k * (G_last - G).exp().unsqueeze(-1);
    chunk_decay = G_last.exp().unsqueeze(-1);  // [B, H, N, 1, 1]
  }
  auto S = initial_state.defined() ? initial_state.to(ct) : torch::zeros({B, H, dk, dv}, opts);
  std::vector<torch::Tensor> outs;
  outs.reserve(N);
  for (int64_t n = 0; n < N; ++n) {
    auto Wn = W.select(2, n), Un = U.select(2, n), qn = qr.select(2, n), kn = kw.select(2, n);
    auto u = Un - torch::matmul(Wn, S);
    outs.push_back(with_intra ? torch::matmul(qn, S) + torch::matmul(QK.select(2, n), u) : torch::matmul(qn, S));
    if (gated) S = chunk_decay.select(2, n) * S;
    S = S + torch::matmul(kn.transpose(-1, -2), u);
  }
  auto o = torch::stack(outs, 2).view({B, H, Tp, dv}).narrow(2, 0, T).transpose(1, 2);
  return {o.to(out_dtype), S};
}

DeltaRuleOut delta_rule_recurrent(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const torch::Tensor& beta, double scale, const torch::Tensor& initial_state,
                                  const torch::Tensor& g) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), dk = q.size(3), dv = v.size(3);
  const auto ct = compute_type(v);
  auto S = initial_state.defined() ? initial_state.to(ct) : torch::zeros({B, H, dk, dv}, q.options().dtype(ct));
  std::vector<torch::Tensor> outs;
  for (int64_t t = 0; t < T; ++t) {
    auto qt = q.select(1, t).to(ct) * scale;  // [B, H, dk]
    auto kt = k.select(1, t).to(ct);
    auto vt = v.select(1, t).to(ct);
    auto bt = beta.select(1, t).to(ct).unsqueeze(-1);  // [B, H, 1]
    if (g.defined()) S = S * g.select(1, t).to(ct).exp().view({B, H, 1, 1});  // decay first
    auto retrieved = torch::einsum("bhkv,bhk->bhv", {S, kt});
    auto u = bt * (vt - retrieved);
    S = S + torch::einsum("bhk,bhv->bhkv", {kt, u});
    outs.push_back(torch::einsum("bhkv,bhk->bhv", {S, qt}));
  }
  return {torch::stack(outs, 1).to(v.scalar_type()), S};
}

torch::Tensor delta_rule_step_reference(const torch::Tensor& q_t, const torch::Tensor& k_t, const torch::Tensor& v_t,
                              const torch::Tensor& beta_t, double scale, torch::Tensor& S, const torch::Tensor& g_t) {
  const auto ct = compute_type(v_t);
  if (g_t.defined()) S = S * g_t.to(ct).exp().unsqueeze(-1).unsqueeze(-1);
  auto kt = k_t.to(ct), vt = v_t.to(ct);
  auto retrieved = torch::matmul(kt.unsqueeze(-2), S).squeeze(-2);  // [B, H, dv]
  auto u = beta_t.to(ct).unsqueeze(-1) * (vt - retrieved);
  S = S + kt.unsqueeze(-1) * u.unsqueeze(-2);
  return torch::matmul((q_t.to(ct) * scale).unsqueeze(-2), S).squeeze(-2).to(v_t.scalar_type());
}

}  // namespace memlab
