#include "mixers/mesa.h"

#include <fmt/format.h>

#include "core/config.h"
#include "core/errors.h"
#include "ops/kernel_call.h"
#include "ops/norm/norm.h"

#include <cmath>

#ifdef MEMLAB_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>

#include "ops/mesa/cg.h"
#include "ops/mesa/chunk.h"
#endif

namespace memlab {

namespace {

using torch::Tensor;
namespace F = torch::nn::functional;

// Conjugate gradient on the rows (last dim) of b, all rows at once: A(p) applies the SPD system row-wise, diag is the
// diagonal of the system (Jacobi guess only). A fixed number of steps: no data-dependent control flow, no host sync.
template <class MatVec>
Tensor cg_solve(const MatVec& A, const Tensor& b_in, const Tensor& diag, const MesaCG& cg) {
  Tensor b = b_in, scale;
  if (cg.normalize_rhs) {  // linear system: solve for b/|b|, scale back (eps becomes relative)
    scale = b_in.pow(2).sum(-1, true).sqrt();
    b = b_in / (scale + 1e-30);
  }
  Tensor x, r;
  switch (cg.init) {
    case MesaCGInit::Zero:
      x = torch::zeros_like(b);
      r = b;
      break;
    case MesaCGInit::Query:
      x = b;
      r = b - A(x);
      break;
    case MesaCGInit::Jacobi:
      x = b / diag;
      r = b - A(x);
      break;
  }
  auto p = r;
  auto delta = (r * r).sum(-1, true);
  for (int64_t i = 0; i < cg.steps; ++i) {
    auto u = A(p);
    auto alpha = delta / ((p * u).sum(-1, true) + cg.eps);
    x = x + alpha * p;
    r = r - alpha * u;
    auto delta_new = (r * r).sum(-1, true);
    p = r + (delta_new / (delta + cg.eps)) * p;
    delta = delta_new;
  }
  return cg.normalize_rhs ? x * scale : x;
}

// ---- chunked layout [B, T, H, d] <-> [B, H, N, C, d]; the tail zero-padded (zero q, k, v, β, g: no-op tokens) ----

struct Chunks {
  int64_t B = 0, T = 0, H = 0, N = 0, C = 0;
  Tensor E;     // [B, H, N, C, C] exp(b_r - b_s) for s <= r, else 0 (b: within-chunk cumulative log decay)
  Tensor D;     // E * β_s
  Tensor gam;   // [B, H, N, C, 1] exp(b_r): decay from the chunk start
  Tensor wend;  // [B, H, N, C, 1] exp(b_C - b_s): decay to the chunk end
  Tensor beta;  // [B, H, N, C, 1]
  Tensor b;     // [B, H, N, C] the within-chunk cumulative log decay
  Tensor a;     // [B, H, N] each chunk's whole log decay b_{C-1}
  // the tensors, in this order, for save_for_backward
  std::vector<Tensor> tensors() const { return {E, D, gam, wend, beta, b, a}; }
  static Chunks from(const std::vector<Tensor>& t, size_t at) {
    Chunks c;
    c.E = t[at], c.D = t[at + 1], c.gam = t[at + 2], c.wend = t[at + 3], c.beta = t[at + 4], c.b = t[at + 5];
    c.a = t[at + 6];
    c.B = c.b.size(0), c.H = c.b.size(1), c.N = c.b.size(2), c.C = c.b.size(3);
    return c;
  }
};

Tensor to_chunks(const Tensor& x, const Chunks& c) {  // [B, T, H, d] -> [B, H, N, C, d]
  auto y = x.transpose(1, 2);
  if (c.N * c.C != c.T) y = F::pad(y, F::PadFuncOptions({0, 0, 0, c.N * c.C - c.T}));
  return y.reshape({c.B, c.H, c.N, c.C, x.size(3)});
}

Tensor gate_to_chunks(const Tensor& x, const Chunks& c) {  // [B, T, H] -> [B, H, N, C]
  auto y = x.transpose(1, 2);
  if (c.N * c.C != c.T) y = F::pad(y, F::PadFuncOptions({0, c.N * c.C - c.T}));
  return y.reshape({c.B, c.H, c.N, c.C});
}

Tensor from_chunks(const Tensor& x, const Chunks& c) {  // [B, H, N, C, d] -> [B, T, H, d]
  return x.reshape({c.B, c.H, c.N * c.C, x.size(-1)}).narrow(2, 0, c.T).transpose(1, 2);
}

// decays: also E, D, γ and the decays to the chunk end (the tensor-op form's; the kernels form them inside).
Chunks make_chunks(const Tensor& g, const Tensor& beta, int64_t chunk, bool decays = true) {
  Chunks c;
  c.B = g.size(0), c.T = g.size(1), c.H = g.size(2);
  c.C = std::max<int64_t>(1, std::min<int64_t>(chunk, c.T));
  c.N = (c.T + c.C - 1) / c.C;
  auto b = gate_to_chunks(g, c).cumsum(-1);  // [B, H, N, C]
  c.b = b;
  c.beta = gate_to_chunks(beta, c).unsqueeze(-1);
  auto last = b.narrow(-1, c.C - 1, 1);  // [B, H, N, 1]
  c.a = last.squeeze(-1);
  if (!decays) return c;
  auto causal = torch::ones({c.C, c.C}, b.options().dtype(torch::kBool)).tril();
  // mask before exp: above the diagonal b_r - b_s >= 0 may overflow
  c.E = (b.unsqueeze(-1) - b.unsqueeze(-2)).masked_fill(causal.logical_not(), -INFINITY).exp();
  c.D = c.E * c.beta.transpose(-1, -2);
  c.gam = b.exp().unsqueeze(-1);
  c.wend = (last - b).exp().unsqueeze(-1);
  return c;
}

// The scan over chunks S_{n+1} = exp(a_n) S_n + X_n from S_0 = S0, every S_n: [B, H, N + 1, dk, du] from X [B, H,
// N, dk, du] and a [B, H, N]. Below 8 chunks as N multiply-adds; from 8 as one product with L_nm = exp(A_n -
// A_{m+1}) for m < n (A_n = Σ_{m<n} a_m, the decay from the end of chunk m to the start of chunk n), where N
// launches would cost more than a product (at 2 chunks the thin product is the slower).
Tensor chunk_scan(const Tensor& a, const Tensor& X, const Tensor& S0) {
  const int64_t B = X.size(0), H = X.size(1), N = X.size(2), dk = X.size(3), du = X.size(4);
  if (N < 8) {
    auto dec = a.exp().unsqueeze(-1).unsqueeze(-1);  // [B, H, N, 1, 1]
    std::vector<Tensor> S{S0};
    for (int64_t n = 0; n < N; ++n) S.push_back(dec.select(2, n) * S.back() + X.select(2, n));
    return torch::stack(S, 2);
  }
  auto A = F::pad(a.cumsum(-1), F::PadFuncOptions({1, 0}));  // [B, H, N + 1]
  auto before = torch::ones({N + 1, N}, a.options().dtype(torch::kBool)).tril(-1);  // m < n
  auto L = (A.unsqueeze(-1) - A.narrow(-1, 1, N).unsqueeze(-2)).masked_fill(before.logical_not(), -INFINITY).exp();
  return torch::matmul(L, X.reshape({B, H, N, dk * du})).view({B, H, N + 1, dk, du}) +
         A.exp().unsqueeze(-1).unsqueeze(-1) * S0.unsqueeze(2);
}

// Boundary states of M_t = Σ_{s<=t} ζ_{t,s} β_s k_s u_s^T: the state entering each chunk [B, H, N, dk, du], and
// the final one.
std::pair<Tensor, Tensor> chunk_states(const Tensor& K, const Tensor& U, const Chunks& c, const Tensor& S0) {
  auto contrib = torch::matmul((K * (c.wend * c.beta)).transpose(-1, -2), U);  // [B, H, N, dk, du]
  auto all = chunk_scan(c.a, contrib, S0);
  return {all.narrow(2, 0, c.N), all.select(2, c.N)};
}

// GLA-form read M_t^T x_t for every row of X: (X ⊙ Γ) S + ((X K^T) ⊙ D) U.
Tensor chunk_read(const Tensor& X, const Tensor& K, const Tensor& U, const Tensor& S, const Chunks& c) {
  return torch::matmul(X * c.gam, S) + torch::matmul(torch::matmul(X, K.transpose(-1, -2)) * c.D, U);
}

// diag(H_t) + λ for every token (Jacobi guess), without materialising H_t.
Tensor chunk_diag(const Tensor& K, const Tensor& SH, const Tensor& lam, const Chunks& c) {
  return c.gam * torch::diagonal(SH, 0, -2, -1).unsqueeze(-2) + torch::matmul(c.D, K * K) + lam;
}

// Adjoint of F = Σ_t a_t · M_t^T b_t (+ <dS_end, M_T>) with respect to k, u, β and the cumulative log decay, for
// M_t = Σ_{s<=t} ζ_{t,s} β_s k_s u_s^T (+ ζ_{t,0} S_0). a_t, b_t are constants (§1.8: for G, a = do, b = q*;
// for H, a = q*, b = -q~). dc_t = ∂F/∂c_t with c_t = Σ_{j<=t} g_j taken as independent; dg = reverse cumsum of dc.
struct GlaAdjoint {
  Tensor dk, du, dbeta, dc, dS0;  // dk: key side only (β_s P_s); du; dbeta [B, H, N, C]; dc [B, H, N, C]
};

GlaAdjoint gla_adjoint(const Tensor& A, const Tensor& Bq, const Tensor& K, const Tensor& U, const Tensor& S,
                       const Tensor& dS_end, const Chunks& c) {
  auto contrib = torch::matmul((Bq * c.gam).transpose(-1, -2), A);  // ∂F/∂(state entering chunk n) from its reads
  // the adjoint of the state after chunk n runs the scan backwards from dS_end: after_{n-1} = exp(a_n) after_n +
  // contrib_n, and the adjoint of S_0 is one step past after_0
  auto back = chunk_scan(c.a.flip(-1), contrib.flip(2), dS_end);  // [B, H, N + 1, dk, du]
  auto R = back.narrow(2, 0, c.N).flip(2);                        // [B, H, N, dk, du]
  GlaAdjoint g;
  g.dS0 = back.select(2, c.N);
  // P_s = Σ_{t>=s} ζ_{t,s} (u_s·a_t) b_t (intra-chunk part + through the state after the chunk)
  auto P = torch::matmul((torch::matmul(A, U.transpose(-1, -2)) * c.E).transpose(-1, -2), Bq) +
           c.wend * torch::matmul(U, R.transpose(-1, -2));
  g.du = torch::matmul((torch::matmul(Bq, K.transpose(-1, -2)) * c.D).transpose(-1, -2), A) +
         (c.wend * c.beta) * torch::matmul(K, R);
  g.dk = c.beta * P;
  g.dbeta = (K * P).sum(-1);
  // query side Σ_{s<=t} P_ts = a_t·o_t, key side Σ_{t'>=t} P_t't = β_t k_t·P_t
  g.dc = (A * chunk_read(Bq, K, U, S, c)).sum(-1) - c.beta.squeeze(-1) * g.dbeta;
  return g;
}

Tensor reverse_cumsum(const Tensor& x, int64_t dim) { return x.flip(dim).cumsum(dim).flip(dim); }

// (H_t + Λ) X = R for every token, R [B, H, N, C, dk], by cg_solve on the chunked mat-vec. lam [H, dk].
Tensor chunk_cg(const Tensor& R, const Tensor& K, const Tensor& SH, const Chunks& c, const Tensor& lam,
                const MesaCG& cg) {
  auto lamc = lam.view({1, c.H, 1, 1, lam.size(1)});
  auto Amv = [&](const Tensor& p) { return chunk_read(p, K, K, SH, c) + lamc * p; };
  return cg_solve(Amv, R, cg.init == MesaCGInit::Jacobi ? chunk_diag(K, SH, lamc, c) : Tensor(), cg);
}

// Why the op cannot run in the fused kernels (ops/mesa/cg.h, chunk.h), or "" if it can.
std::string fused_unavailable(const Tensor& q, const Tensor& v, int64_t chunk, Kernels kernels) {
  if (auto why = kernels_unavailable(q, kernels); !why.empty()) return why;
  if (compute_type(v) != torch::kFloat) return "the op runs in " + std::string(c10::toString(compute_type(v)));
  if (q.numel() == 0 || v.numel() == 0) return "no tokens";
#ifndef MEMLAB_CUDA_KERNELS
  return "memlab was built without nvcc";
#else
  const int C = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(chunk, q.size(1))));
  const int d = static_cast<int>(std::max(q.size(3), v.size(3)));
  if (!kernels::mesa_chunk_supported(d, C))
    return fmt::format("head dims {} and {} or chunk {}: the kernels take up to 64", q.size(3), v.size(3), C);
  const size_t need = kernels::mesa_chunk_shared_bytes(d, C), have = max_shared_bytes_per_block(q);
  if (need > have)
    return fmt::format("chunk {} needs {} KB of shared memory per block, this GPU gives {}", C, need / 1024,
                       have / 1024);
  return "";
#endif
}

#ifdef MEMLAB_CUDA_KERNELS
// The fused form: the chunk kernels (ops/mesa/chunk.h) and the CG kernel (ops/mesa/cg.h). They read q, k, v and the
// output's gradient as they are ([B, T, H, d], fp32 or bf16) and write the output and the inputs' gradients so;
// their own intermediates (the solves, the right-hand side) are dense chunked fp32 [B, H, N, C, d], the states of
// every chunk boundary [B, H, N + 1, d, d]. exact: fp32-accurate products, else TF32 and fp16 (bf16 inputs).
struct Fused {
  const Chunks& c;
  bool exact;
  void* stream;

  kernels::MesaChunkProblem problem() const {
    kernels::MesaChunkProblem p;
    p.chunks = static_cast<int>(c.B * c.H * c.N);
    p.N = static_cast<int>(c.N);
    p.C = static_cast<int>(c.C);
    p.T = static_cast<int>(c.T);
    p.H = static_cast<int>(c.H);
    p.exact = exact;
    return p;
  }
  static bool bf16(const Tensor& t) { return t.scalar_type() == torch::kBFloat16; }
  // a [B, T, H, d] tensor as it is, or a chunked fp32 intermediate
  static kernels::MesaRows rows(const Tensor& t) {
    return {t.data_ptr(), static_cast<int>(t.size(-1)), t.dim() == 4, bf16(t)};
  }
  static kernels::MesaRowsOut out(Tensor& t, bool accumulate = false) {
    return {t.data_ptr(), static_cast<int>(t.size(-1)), t.dim() == 4, bf16(t), accumulate};
  }
  Tensor chunked(int64_t d) const { return torch::empty({c.B, c.H, c.N, c.C, d}, c.b.options()); }
  // The scan over chunks of (L ⊙ s)ᵀ R from S0 (forward: s the decay to the chunk end times β; reverse: s = γ
  // times scale, from the final state's adjoint S0). An undefined or empty S0 is zero.
  Tensor scan(const Tensor& L, const Tensor& R, const Tensor& S0, bool reverse, float scale = 1.f) const {
    const int64_t dl = L.size(-1), dr = R.size(-1);
    kernels::MesaContribArgs a;
    a.L = rows(L);
    a.R = rows(R);
    a.logdecay = ptr(c.b);
    a.beta = reverse ? nullptr : ptr(c.beta);
    a.to_end = !reverse;
    a.scale = scale;
    auto out = torch::empty({c.B, c.H, c.N + 1, dl, dr}, c.b.options());
    Tensor S0c;
    if (S0.defined() && S0.numel()) S0c = S0.expand({c.B, c.H, dl, dr}).contiguous();  // it may broadcast
    kernels::MesaScanArgs s;
    s.logdecay = ptr(c.b);
    s.S0 = ptr(S0c);
    s.BH = static_cast<int>(c.B * c.H);
    s.dd = static_cast<int>(dl * dr);
    s.reverse = reverse;
    s.out = mut(out);
    if (kernels::mesa_chunk_walk_pays(problem(), static_cast<int>(dl), static_cast<int>(dr))) {
      check_launch(kernels::mesa_chunk_walk(problem(), a, s, stream));  // no contribution tensor
      return out;
    }
    auto X = torch::empty({c.B, c.H, c.N, dl, dr}, c.b.options());
    a.X = mut(X);
    check_launch(kernels::mesa_chunk_contrib(problem(), a, stream));
    s.X = ptr(X);
    check_launch(kernels::mesa_chunk_scan(problem(), s, stream));
    return out;
  }
  static kernels::MesaStates states(const Tensor& all, int offset) {
    return {ptr(all), static_cast<int>(all.size(2)), offset};
  }
  // The solve for the rows R, chunked; also written into x_rows where that is defined.
  Tensor cg(const Tensor& R, const Tensor& K, const Tensor& SH, const Tensor& lam, const MesaCG& cg,
            Tensor x_rows = {}) const {
    auto X = chunked(R.size(-1));
    kernels::MesaCgProblem p;
    p.chunks = static_cast<int>(c.B * c.H * c.N);
    p.H = static_cast<int>(c.H);
    p.N = static_cast<int>(c.N);
    p.C = static_cast<int>(c.C);
    p.T = static_cast<int>(c.T);
    p.dk = static_cast<int>(R.size(-1));
    p.steps = static_cast<int>(cg.steps);
    p.eps = static_cast<float>(cg.eps);
    p.init = static_cast<int>(cg.init);
    p.normalize = cg.normalize_rhs;
    p.exact = exact;
    kernels::MesaCgArgs a;
    a.rhs = rows(R);
    a.K = rows(K);
    a.S = ptr(SH);
    a.Ns = static_cast<int>(SH.size(2));
    a.beta = ptr(c.beta);
    a.logdecay = ptr(c.b);
    a.lam = ptr(lam);
    a.x = mut(X);
    if (x_rows.defined()) a.x_rows = out(x_rows);
    check_launch(kernels::mesa_cg_solve(p, a, stream));
    return X;
  }
  // Y = (A ⊙ γ) S + ((A Bᵀ) ⊙ D) U, S the states entering the chunks (transposed: read as Sᵀ).
  void read(const Tensor& A, const Tensor& B, const Tensor& U, const Tensor& S, bool transposed, Tensor& Y) const {
    kernels::MesaReadArgs a;
    a.A = rows(A);
    a.B = rows(B);
    a.U = rows(U);
    a.logdecay = ptr(c.b);
    a.beta = ptr(c.beta);
    a.S = states(S, 0);
    a.S_transposed = transposed;
    a.Y = out(Y);
    check_launch(kernels::mesa_chunk_read(problem(), a, stream));
  }
  // gla_adjoint's chunk parts from the states entering the chunks S and the reverse scan's output Rall (its entry
  // n + 1: the adjoint of the state after chunk n; entry 0: of the initial state), into dkey and du (U = K: du added
  // to dkey, du unused), dbeta and dc [B, H, N, C] (added to with accumulate); with rowdot (U = K), each chunk's
  // Σ_t A_t ⊙ (bq_scale Bq_t) into it [B, H, N, dk].
  void adjoint(const Tensor& A, const Tensor& Bq, float bq_scale, const Tensor& K, const Tensor& U, const Tensor& S,
               const Tensor& Rall, Tensor& dkey, Tensor* du, bool accumulate, Tensor& dbeta, Tensor& dc,
               Tensor* rowdot = nullptr) const {
    kernels::MesaAdjointArgs a;
    a.A = rows(A);
    a.Bq = rows(Bq);
    a.bq_scale = bq_scale;
    a.K = rows(K);
    a.U = rows(U);
    a.logdecay = ptr(c.b);
    a.beta = ptr(c.beta);
    a.S = states(S, 0);
    a.R = states(Rall, 1);
    a.dkey = out(dkey, accumulate);
    if (du)
      a.du = out(*du);
    else
      a.du_into_dkey = true;
    a.accumulate = accumulate;
    a.dbeta = mut(dbeta);
    a.dc = mut(dc);
    if (rowdot) a.rowdot = mut(*rowdot);
    check_launch(kernels::mesa_chunk_adjoint(problem(), a, stream));
  }
};
#endif

// Solve + read with implicit differentiation. Inputs in [B, T, H, d] layout: in the compute dtype for the tensor-op
// form; for the kernels' form (fused: fused_unavailable said yes) q, k, v fp32 or bf16 and contiguous (the output in
// v's dtype), the rest fp32, and h0, g0 may be empty (zero: an autograd function takes no undefined input). exact:
// the kernels' products to fp32 accuracy.
class MesaSolveRead : public torch::autograd::Function<MesaSolveRead> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const Tensor& q,
                                                const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                                                const Tensor& lam, const Tensor& h0, const Tensor& g0,
                                                const MesaCG& cg, int64_t chunk, bool fused, bool exact) {
    AutocastOff no_autocast;
    auto c = make_chunks(g, beta, chunk, !fused);
    ctx->saved_data["T"] = c.T;
    ctx->saved_data["steps"] = cg.steps;
    ctx->saved_data["eps"] = cg.eps;
    ctx->saved_data["init"] = static_cast<int64_t>(cg.init);
    ctx->saved_data["normalize"] = cg.normalize_rhs;
    ctx->saved_data["fused"] = fused;
    ctx->saved_data["exact"] = exact;
    if (fused) {
#ifdef MEMLAB_CUDA_KERNELS
      c10::cuda::CUDAGuard guard(q.device());
      c.b = c.b.contiguous(), c.beta = c.beta.contiguous();
      const Fused f{c, exact, stream_of(q)};
      auto SH = f.scan(k, k, h0, false), SG = f.scan(k, v, g0, false);  // [B, H, N + 1, dk, d]
      auto lamc = lam.contiguous();
      auto X = f.cg(q, k, SH, lamc, cg);
      auto O = torch::empty(v.sizes(), v.options());
      f.read(X, k, v, SG, false, O);
      ctx->save_for_backward({lamc, X, k, v, SH, SG, c.b, c.beta});
      ctx->saved_data["q_dtype"] = static_cast<int64_t>(q.scalar_type());
      ctx->saved_data["h0"] = h0.numel() > 0;
      ctx->saved_data["g0"] = g0.numel() > 0;
      return {O, SH.select(2, c.N).clone(), SG.select(2, c.N).clone()};
#endif
    }
    auto Q = to_chunks(q, c), K = to_chunks(k, c), V = to_chunks(v, c);
    auto sh = chunk_states(K, K, c, h0), sg = chunk_states(K, V, c, g0);
    const Tensor &SH = sh.first, &Hf = sh.second, &SG = sg.first, &Gf = sg.second;
    auto X = chunk_cg(Q, K, SH, c, lam, cg);
    auto O = chunk_read(X, K, V, SG, c);
    // the chunked inputs, decays and boundary states are kept for the backward rather than formed again
    std::vector<Tensor> saved{lam, X, K, V, SH, Hf, SG, Gf};
    for (auto& t : c.tensors()) saved.push_back(t);
    ctx->save_for_backward(saved);
    return {from_chunks(O, c), Hf, Gf};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    AutocastOff no_autocast;
    auto s = ctx->get_saved_variables();
    MesaCG cg;
    cg.steps = ctx->saved_data["steps"].toInt();
    cg.eps = ctx->saved_data["eps"].toDouble();
    cg.init = static_cast<MesaCGInit>(ctx->saved_data["init"].toInt());
    cg.normalize_rhs = ctx->saved_data["normalize"].toBool();
    const int64_t T = ctx->saved_data["T"].toInt();
    if (ctx->saved_data["fused"].toBool()) return fused_backward(ctx, s, grads, cg, T);
    const auto &lam = s[0], &X = s[1], &K = s[2], &V = s[3], &SH = s[4], &Hf = s[5], &SG = s[6], &Gf = s[7];
    auto c = Chunks::from(s, 8);
    c.T = T;
    auto dO = grads[0].defined() ? to_chunks(grads[0], c) : torch::zeros(V.sizes(), V.options());
    auto dHf = grads[1].defined() ? grads[1] : torch::zeros_like(Hf);
    auto dGf = grads[2].defined() ? grads[2] : torch::zeros_like(Gf);
    // q~_t = (H_t + Λ)^{-1} G_t do_t: the second (adjoint) solve of the same symmetric system
    auto rhs = chunk_read(dO, V, K, SG.transpose(-1, -2), c);
    auto Qt = chunk_cg(rhs, K, SH, c, lam, cg);
    auto aG = gla_adjoint(dO, X, K, V, SG, dGf, c);
    auto aH = gla_adjoint(X, -Qt, K, K, SH, dHf, c);  // Σ (-q~)^T H_t q*: dH = -q~ q*^T, as for a general H
    return gradients(c, Qt, X, lam, aG, aH, Hf, Gf, dHf, dGf);
  }

 private:
  // The inputs' gradients from the two adjoints (one per state) and the adjoint solve Qt.
  static torch::autograd::variable_list gradients(const Chunks& c, const Tensor& Qt, const Tensor& X,
                                                  const Tensor& lam, const GlaAdjoint& aG, const GlaAdjoint& aH,
                                                  const Tensor& Hf, const Tensor& Gf, const Tensor& dHf,
                                                  const Tensor& dGf) {
    auto dlam = -(Qt * X).sum({0, 2, 3});  // [H, dk]
    auto dk = aG.dk + aH.dk + aH.du;
    auto dc = aG.dc + aH.dc;
    // the final states scale with exp(c_T): put their term at the last (possibly padded) position
    auto fin = (dGf * Gf).sum({-1, -2}) + (dHf * Hf).sum({-1, -2});  // [B, H]
    dc = dc.reshape({c.B, c.H, c.N * c.C});
    dc.select(-1, c.N * c.C - 1).add_(fin);
    auto dg = reverse_cumsum(dc, -1).narrow(-1, 0, c.T).transpose(1, 2);
    auto dbeta = (aG.dbeta + aH.dbeta).reshape({c.B, c.H, c.N * c.C}).narrow(-1, 0, c.T).transpose(1, 2);
    return {from_chunks(Qt, c), from_chunks(dk, c), from_chunks(aG.du, c), dg, dbeta, dlam,
            aH.dS0, aG.dS0, Tensor(), Tensor(), Tensor(), Tensor()};
  }

  static torch::autograd::variable_list fused_backward(torch::autograd::AutogradContext* ctx,
                                                       const std::vector<Tensor>& s,
                                                       const torch::autograd::variable_list& grads, const MesaCG& cg,
                                                       int64_t T) {
#ifdef MEMLAB_CUDA_KERNELS
    const auto &lam = s[0], &X = s[1], &k = s[2], &v = s[3], &SH = s[4], &SG = s[5];
    Chunks c;
    c.b = s[6], c.beta = s[7];
    c.B = c.b.size(0), c.H = c.b.size(1), c.N = c.b.size(2), c.C = c.b.size(3), c.T = T;
    c10::cuda::CUDAGuard guard(X.device());
    const Fused f{c, ctx->saved_data["exact"].toBool(), stream_of(X)};
    const Tensor &dHf = grads[1], &dGf = grads[2];  // undefined: zero
    auto dO = grads[0].defined() ? grads[0].to(v.scalar_type()).contiguous() : torch::zeros_like(v);
    // q~_t = (H_t + Λ)^{-1} G_t do_t: the second (adjoint) solve of the same symmetric system; q's gradient
    auto rhs = f.chunked(k.size(-1));
    f.read(dO, v, k, SG, true, rhs);
    auto dq = torch::empty(k.sizes(), k.options().dtype(static_cast<c10::ScalarType>(ctx->saved_data["q_dtype"].toInt())));
    auto Qt = f.cg(rhs, k, SH, lam, cg, dq);
    // the two adjoints (gla_adjoint: for G, a = do, b = q*; for H, a = q*, b = -q~), k's gradient summed in fp32
    auto dk = torch::empty(k.sizes(), k.options().dtype(torch::kFloat));
    auto dv = torch::empty_like(v);
    auto dbeta = torch::empty({c.B, c.H, c.N, c.C}, c.b.options()), dc = torch::empty_like(dbeta);
    auto RG = f.scan(X, dO, dGf, true);
    f.adjoint(dO, X, 1.f, k, v, SG, RG, dk, &dv, false, dbeta, dc);
    auto RH = f.scan(Qt, X, dHf, true, -1.f);
    auto dlam_chunks = torch::empty({c.B, c.H, c.N, k.size(-1)}, c.b.options());  // Σ_t -q~_t ⊙ q*_t per chunk
    f.adjoint(X, Qt, -1.f, k, k, SH, RH, dk, nullptr, true, dbeta, dc, &dlam_chunks);
    auto dlam = dlam_chunks.sum(std::vector<int64_t>{0, 2});  // [H, dk]
    // the final states scale with exp(c_T): put their term at the last (possibly padded) position
    auto dcs = dc.view({c.B, c.H, c.N * c.C});
    if (dGf.defined()) dcs.select(-1, c.N * c.C - 1).add_((dGf * SG.select(2, c.N)).sum({-1, -2}));
    if (dHf.defined()) dcs.select(-1, c.N * c.C - 1).add_((dHf * SH.select(2, c.N)).sum({-1, -2}));
    auto dg = reverse_cumsum(dcs, -1).narrow(-1, 0, c.T).transpose(1, 2);
    auto dbeta_t = dbeta.view({c.B, c.H, c.N * c.C}).narrow(-1, 0, c.T).transpose(1, 2);
    return {dq,
            dk.to(k.scalar_type()),
            dv,
            dg,
            dbeta_t,
            dlam,
            ctx->saved_data["h0"].toBool() ? RH.select(2, 0) : Tensor(),
            ctx->saved_data["g0"].toBool() ? RG.select(2, 0) : Tensor(),
            Tensor(),
            Tensor(),
            Tensor(),
            Tensor()};
#else
    throw std::logic_error("Mesa: the fused form without kernels");
#endif
  }
};

struct Prepared {
  torch::ScalarType ct;
  Tensor q, k, v, g, beta, lam, h0, g0;
};

Prepared prepare(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                 const Tensor& lambda, const Tensor& h_kk_init, const Tensor& h_kv_init) {
  Prepared p;
  p.ct = compute_type(v);
  p.q = q.to(p.ct), p.k = k.to(p.ct), p.v = v.to(p.ct), p.g = g.to(p.ct), p.beta = beta.to(p.ct);
  p.lam = lambda.to(p.ct);
  const int64_t B = q.size(0), H = q.size(2), dk = q.size(3), dv = v.size(3);
  auto opts = p.q.options();
  p.h0 = h_kk_init.defined() ? h_kk_init.to(p.ct) : torch::zeros({B, H, dk, dk}, opts);
  p.g0 = h_kv_init.defined() ? h_kv_init.to(p.ct) : torch::zeros({B, H, dk, dv}, opts);
  return p;
}

// One token of the plain recurrence: state update, then solve on the materialised H_t + Λ.
Tensor token_update(const Tensor& qt, const Tensor& kt, const Tensor& vt, const Tensor& gt, const Tensor& bt,
                    const Tensor& lam, Tensor& H, Tensor& G, const MesaCG* cg) {
  auto decay = gt.exp().unsqueeze(-1).unsqueeze(-1);  // [B, H, 1, 1]
  auto kb = kt * bt.unsqueeze(-1);
  H = decay * H + kb.unsqueeze(-1) * kt.unsqueeze(-2);
  G = decay * G + kb.unsqueeze(-1) * vt.unsqueeze(-2);
  Tensor x;
  if (cg) {
    auto Amv = [&](const Tensor& p) { return torch::matmul(H, p.unsqueeze(-1)).squeeze(-1) + lam * p; };
    x = cg_solve(Amv, qt, cg->init == MesaCGInit::Jacobi ? torch::diagonal(H, 0, -2, -1) + lam : Tensor(), *cg);
  } else {
    x = torch::linalg_solve(H + torch::diag_embed(lam), qt.unsqueeze(-1)).squeeze(-1);
  }
  return torch::matmul(x.unsqueeze(-2), G).squeeze(-2);  // G_t^T x
}

MesaOut recurrent(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                  const Tensor& lambda, const MesaCG* cg, const Tensor& h_kk_init, const Tensor& h_kv_init) {
  AutocastOff no_autocast;
  auto p = prepare(q, k, v, g, beta, lambda, h_kk_init, h_kv_init);
  auto H = p.h0, G = p.g0;
  std::vector<Tensor> outs;
  for (int64_t t = 0; t < q.size(1); ++t)
    outs.push_back(token_update(p.q.select(1, t), p.k.select(1, t), p.v.select(1, t), p.g.select(1, t),
                                p.beta.select(1, t), p.lam, H, G, cg));
  return {torch::stack(outs, 1).to(v.scalar_type()), H, G};
}

}  // namespace

MesaOut mesa_chunked(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                     const Tensor& lambda, const MesaCG& cg, int64_t chunk, const Tensor& h_kk_init,
                     const Tensor& h_kv_init, Kernels kernels) {
  MEMLAB_PROFILED_OP("memlab::mesa");
  AutocastOff no_autocast;
  const std::string why = fused_unavailable(q, v, chunk, kernels);
  if (kernels == Kernels::Cuda && !why.empty() && q.numel() > 0)
    throw UserError("model.kernels=cuda: no Mesa kernel for this call: " + why);
  // bf16 inputs: the kernels multiply on scaled fp16 operands (some chunk shapes in TF32); fp32 ones: to fp32 accuracy
  const bool exact = q.scalar_type() != torch::kBFloat16 && k.scalar_type() != torch::kBFloat16 &&
                     v.scalar_type() != torch::kBFloat16;
  if (why.empty()) {  // the kernels read q, k, v as they are (fp32 or bf16) and write o in v's dtype
    auto rows = [](const Tensor& t) {
      const auto st = t.scalar_type();
      return (st == torch::kFloat || st == torch::kBFloat16 ? t : t.to(torch::kFloat)).contiguous();
    };
    auto state = [&](const Tensor& t) {
      return t.defined() ? t.to(torch::kFloat) : torch::empty({0}, q.options().dtype(torch::kFloat));
    };
    auto r = MesaSolveRead::apply(rows(q), rows(k), rows(v), g.to(torch::kFloat), beta.to(torch::kFloat),
                                  lambda.to(torch::kFloat), state(h_kk_init), state(h_kv_init), cg, chunk, true, exact);
    return {r[0].to(v.scalar_type()), r[1], r[2]};
  }
  auto p = prepare(q, k, v, g, beta, lambda, h_kk_init, h_kv_init);
  auto r = MesaSolveRead::apply(p.q, p.k, p.v, p.g, p.beta, p.lam, p.h0, p.g0, cg, chunk, false, exact);
  return {r[0].to(v.scalar_type()), r[1], r[2]};
}

MesaOut mesa_recurrent(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                       const Tensor& lambda, const MesaCG& cg, const Tensor& h_kk_init, const Tensor& h_kv_init) {
  return recurrent(q, k, v, g, beta, lambda, &cg, h_kk_init, h_kv_init);
}

MesaOut mesa_exact(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                   const Tensor& lambda, const Tensor& h_kk_init, const Tensor& h_kv_init) {
  return recurrent(q, k, v, g, beta, lambda, nullptr, h_kk_init, h_kv_init);
}

Tensor mesa_step(const Tensor& q_t, const Tensor& k_t, const Tensor& v_t, const Tensor& g_t, const Tensor& beta_t,
                 const Tensor& lambda, const MesaCG& cg, Tensor& h_kk, Tensor& h_kv) {
  AutocastOff no_autocast;
  const auto ct = compute_type(v_t);
  auto o = token_update(q_t.to(ct), k_t.to(ct), v_t.to(ct), g_t.to(ct), beta_t.to(ct), lambda.to(ct), h_kk, h_kv,
                        &cg);
  return o.to(v_t.scalar_type());
}

// ---- layer ----

MesaImpl::MesaImpl(const MixerShape& shape, const MesaOptions& opts)
    : shape_(shape), opts_(opts), head_dim_(shape.hidden / shape.heads) {
  const int64_t D = shape.hidden, H = shape.heads;
  auto lin = [&](const char* name, int64_t out, bool bias) {
    return register_module(name, Linear(D, out, shape.members, bias));
  };
  q_proj = lin("q_proj", D, false);
  k_proj = lin("k_proj", D, false);
  v_proj = lin("v_proj", D, false);
  a_proj = lin("a_proj", H, true);  // fla: gate projections with bias
  b_proj = lin("b_proj", H, true);
  if (opts.out_gate) g_proj = lin("g_proj", D, false);
  o_proj = lin("o_proj", D, false);
  if (opts.short_conv) {
    q_conv = register_module("q_conv", ShortConv(D, opts.conv_size, shape.init_std, opts.kernels));
    k_conv = register_module("k_conv", ShortConv(D, opts.conv_size, shape.init_std, opts.kernels));
  }
  // softplus(λ') + lambda_min = lambda_init
  const double init = std::log(std::expm1(opts.lambda_init - opts.lambda_min));
  lambda_params = register_no_decay("lambda_params", torch::full({D}, init));
  o_norm = register_parameter("o_norm", torch::ones({shape.members * head_dim_}));  // shared by a member's heads
}

torch::Tensor MesaImpl::lambda() const {
  const auto ct = compute_type(lambda_params);
  return (torch::softplus(lambda_params.to(ct)) + opts_.lambda_min).view({shape_.heads, head_dim_});
}

MesaImpl::Inputs MesaImpl::project(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), H = shape_.heads;
  Inputs in;
  const auto ct = compute_type(x);
  in.q = l2_normalize(silu_after(q_conv, q_proj(x)).view({B, T, H, head_dim_}), ct, opts_.kernels);
  in.k = l2_normalize(silu_after(k_conv, k_proj(x)).view({B, T, H, head_dim_}), ct, opts_.kernels);
  in.v = v_proj(x).view({B, T, H, head_dim_});
  in.beta = torch::sigmoid(b_proj(x).to(ct));
  in.g = torch::log_sigmoid(a_proj(x).to(ct));
  in.lambda = (torch::softplus(lambda_params.to(ct)) + opts_.lambda_min).view({H, head_dim_});
  return in;
}

torch::Tensor MesaImpl::finish(const torch::Tensor& o, const torch::Tensor& x) {
  auto y = rms_norm(o, rows_per_head(o_norm, shape_.members, shape_.heads / shape_.members), shape_.norm_eps,
                    opts_.kernels, opts_.out_gate ? g_proj(x).view(o.sizes()) : torch::Tensor());
  return o_proj(y.reshape(x.sizes()).to(x.scalar_type()));
}

torch::Tensor MesaImpl::forward(const torch::Tensor& x) {
  auto in = project(x);
  auto r = mesa_chunked(in.q, in.k, in.v, in.g, in.beta, in.lambda, opts_.cg, opts_.chunk, {}, {}, opts_.kernels);
  return finish(r.o, x);
}

torch::Tensor MesaImpl::forward_reference(const torch::Tensor& x) {
  auto in = project(x);
  // the definition, with an exact solve: forward equals it where the CG has converged (cg_steps >= head dim)
  auto r = mesa_exact(in.q, in.k, in.v, in.g, in.beta, in.lambda);
  return finish(r.o, x);
}

namespace {
// MixerState::tensors: the statistics h_kk, h_kv [B, H, d, d], then the short convs' tails where the layer has them
enum StateSlot : size_t { kKeyKey, kKeyValue, kQTail, kKTail };
}  // namespace

MixerState MesaImpl::init_state(int64_t batch, const torch::TensorOptions& opts) const {
  MixerState s;
  const auto ct = compute_type(opts.dtype());
  s.tensors.push_back(torch::zeros({batch, shape_.heads, head_dim_, head_dim_}, opts.dtype(ct)));
  s.tensors.push_back(torch::zeros({batch, shape_.heads, head_dim_, head_dim_}, opts.dtype(ct)));
  if (opts_.short_conv)
    for (auto* c : {&q_conv, &k_conv}) s.tensors.push_back((*c)->init_tail(batch, opts));
  return s;
}

torch::Tensor MesaImpl::step(const torch::Tensor& x_t, MixerState& s) {
  const int64_t B = x_t.size(0), H = shape_.heads;
  auto q = q_proj(x_t), k = k_proj(x_t), v = v_proj(x_t);
  if (opts_.short_conv) {
    q = q_conv->step(q, s.tensors[kQTail]);
    k = k_conv->step(k, s.tensors[kKTail]);
  }
  const auto ct = compute_type(x_t);
  auto qh = l2_normalize(torch::silu(q).view({B, H, head_dim_}), ct, opts_.kernels);
  auto kh = l2_normalize(torch::silu(k).view({B, H, head_dim_}), ct, opts_.kernels);
  auto vh = v.view({B, H, head_dim_});
  auto beta = torch::sigmoid(b_proj(x_t).to(ct));
  auto g = torch::log_sigmoid(a_proj(x_t).to(ct));
  auto lam = (torch::softplus(lambda_params.to(ct)) + opts_.lambda_min).view({H, head_dim_});
  auto o = mesa_step(qh, kh, vh, g, beta, lam, opts_.cg, s.tensors[kKeyKey], s.tensors[kKeyValue]);
  s.pos += 1;
  return finish(o.unsqueeze(1), x_t.unsqueeze(1)).squeeze(1);
}

void register_mesa_keys(Schema& s) {
  // Mesa (MesaNet): defaults follow fla's MesaNet layer except the CG initial guess (Jacobi, fla's decoding one) and
  // cg_eps (see lib/mixers/mesa.h).
  s.add_int("model.mesa.cg_steps", 30, "conjugate-gradient steps per solve (forward and backward)", 1, 1000);
  s.add_string("model.mesa.cg_init", "jacobi", "CG initial guess: q/(diag(H)+lambda), 0, or q",
               {"jacobi", "zero", "q"});
  s.add_float("model.mesa.cg_eps", 1e-20,
              "added to both CG denominators, relative to |rhs|^2 (fla: 1e-5, which caps the solve's accuracy)",
              1e-30, 1.0);
  s.add_float("model.mesa.lambda_min", 0.25, "lower bound of the regulariser lambda = softplus(.) + lambda_min", 0.0);
  s.add_float("model.mesa.lambda_init", 1.0, "initial lambda (must exceed lambda_min)", 0.0);
  s.add_int("model.mesa.chunk", 64, "chunk size of the chunkwise training form", 1, 1024);
  s.add_bool("model.mesa.short_conv", true, "short causal depthwise conv (then SiLU) on q, k");
  s.add_int("model.mesa.conv_size", 4, "short conv kernel size", 2, 16);
  s.add_bool("model.mesa.out_gate", false, "gate the per-head output norm with SiLU(W_g x)");
}

MesaOptions mesa_options(const Config& cfg) {
  MesaOptions o;
  o.cg.steps = cfg.get_int("model.mesa.cg_steps");
  const auto init = cfg.get_string("model.mesa.cg_init");
  o.cg.init = init == "zero" ? MesaCGInit::Zero : init == "q" ? MesaCGInit::Query : MesaCGInit::Jacobi;
  o.cg.eps = cfg.get_float("model.mesa.cg_eps");
  o.lambda_min = cfg.get_float("model.mesa.lambda_min");
  o.lambda_init = cfg.get_float("model.mesa.lambda_init");
  o.chunk = cfg.get_int("model.mesa.chunk");
  o.short_conv = cfg.get_bool("model.mesa.short_conv");
  o.conv_size = cfg.get_int("model.mesa.conv_size");
  o.out_gate = cfg.get_bool("model.mesa.out_gate");
  o.kernels = kernels_option(cfg);
  return o;
}

std::shared_ptr<MixerImpl> make_mesa(const Config& cfg, const MixerShape& shape) {
  const MesaOptions o = mesa_options(cfg);
  if (o.lambda_init <= o.lambda_min)
    cfg.fail("model.mesa.lambda_init", fmt::format("must exceed model.mesa.lambda_min ({})", o.lambda_min));
  return std::make_shared<MesaImpl>(shape, o);
}

}  // namespace memlab
