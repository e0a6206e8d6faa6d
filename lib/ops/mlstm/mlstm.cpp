#include "ops/mlstm/mlstm.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/errors.h"
#include "mixers/ops.h"
#include "ops/kernel_call.h"

#ifdef MEMLAB_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>

#include "ops/mlstm/chunk.h"
#include "ops/mlstm/project.h"
#endif

namespace memlab {

namespace {

MLstmState defaults(const MLstmState& init, int64_t B, int64_t H, int64_t dk, int64_t dv, torch::ScalarType ct,
                    const torch::Device& dev) {
  auto z = mlstm_zero_state(B, H, dk, dv, torch::TensorOptions().dtype(ct).device(dev));
  return {init.C.defined() ? init.C.to(ct) : z.C, init.n.defined() ? init.n.to(ct) : z.n,
          init.m.defined() ? init.m.to(ct) : z.m};
}
}  // namespace

MLstmState mlstm_zero_state(int64_t B, int64_t H, int64_t dk, int64_t dv, const torch::TensorOptions& opts) {
  auto o = opts.dtype(compute_type(opts.dtype().toScalarType()));
  return {torch::zeros({B, H, dk, dv}, o), torch::zeros({B, H, dk}, o), torch::zeros({B, H}, o)};
}

MLstmOut mlstm_chunked(const torch::Tensor& q_in, const torch::Tensor& k_in, const torch::Tensor& v_in,
                       const torch::Tensor& ig_in, const torch::Tensor& fg_in, int64_t L, double eps,
                       const MLstmState& init) {
  AutocastOff no_autocast;
  namespace F = torch::nn::functional;
  const auto ct = compute_type(v_in.scalar_type());
  const int64_t B = q_in.size(0), T = q_in.size(1), H = q_in.size(2), dk = q_in.size(3), dv = v_in.size(3);
  const double inf = std::numeric_limits<double>::infinity();
  L = std::max<int64_t>(1, std::min<int64_t>(L, T));
  const int64_t N = (T + L - 1) / L, Tp = N * L;
  // [B, H, T, .] in the compute type
  auto q = q_in.to(ct).transpose(1, 2);
  auto k = k_in.to(ct).transpose(1, 2) / std::sqrt(static_cast<double>(dk));
  auto v = v_in.to(ct).transpose(1, 2);
  auto logf = F::logsigmoid(fg_in.to(ct)).transpose(1, 2);  // [B, H, T]
  auto ig = ig_in.to(ct).transpose(1, 2);
  if (Tp != T) {  // padded tokens neither forget (log f = 0) nor write (ĩ = -inf): the final state is exact
    q = F::pad(q, F::PadFuncOptions({0, 0, 0, Tp - T}));
    k = F::pad(k, F::PadFuncOptions({0, 0, 0, Tp - T}));
    v = F::pad(v, F::PadFuncOptions({0, 0, 0, Tp - T}));
    logf = F::pad(logf, F::PadFuncOptions({0, Tp - T}));
    ig = F::pad(ig, F::PadFuncOptions({0, Tp - T}).value(-inf));
  }
  q = q.reshape({B, H, N, L, dk});
  k = k.reshape({B, H, N, L, dk});
  v = v.reshape({B, H, N, L, dv});
  ig = ig.reshape({B, H, N, L});
  auto b = logf.reshape({B, H, N, L}).cumsum(-1);  // b_t = Σ_{chunk start < l <= t} log f_l
  auto bL = b.select(-1, L - 1);                    // [B, H, N]

  // Chunk summaries: write j is weighted exp(b_L - b_j + ĩ_j) at the chunk end; stabilised by its max.
  auto a = bL.unsqueeze(-1) - b + ig;  // [B, H, N, L]
  auto m_loc = std::get<0>(a.max(-1));  // [B, H, N]
  auto kw = k * torch::exp(a - m_loc.unsqueeze(-1)).unsqueeze(-1);
  auto C_loc = torch::matmul(kw.transpose(-1, -2), v);  // [B, H, N, dk, dv]
  auto n_loc = kw.sum(-2);                              // [B, H, N, dk]

  // Inter-chunk recurrence of the stabilised states (a loop over chunks, not time steps).
  auto s = defaults(init, B, H, dk, dv, ct, q.device());
  std::vector<torch::Tensor> Cs, ns, ms;
  for (int64_t c = 0; c < N; ++c) {
    Cs.push_back(s.C);
    ns.push_back(s.n);
    ms.push_back(s.m);
    auto decay = bL.select(-1, c) + s.m;
    auto m_new = torch::maximum(decay, m_loc.select(-1, c));
    auto fw = torch::exp(decay - m_new), iw = torch::exp(m_loc.select(-1, c) - m_new);
    s.C = fw.unsqueeze(-1).unsqueeze(-1) * s.C + iw.unsqueeze(-1).unsqueeze(-1) * C_loc.select(2, c);
    s.n = fw.unsqueeze(-1) * s.n + iw.unsqueeze(-1) * n_loc.select(2, c);
    s.m = m_new;
  }
  auto C_prev = torch::stack(Cs, 2), n_prev = torch::stack(ns, 2), m_prev = torch::stack(ms, 2);

  // Intra-chunk log weights log D_tj = b_t - b_j + ĩ_j (j <= t); the carried state enters with m_prev + b_t.
  auto causal = torch::ones({L, L}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).tril();
  auto logD = (b.unsqueeze(-1) - b.unsqueeze(-2) + ig.unsqueeze(-2)).masked_fill(causal.logical_not(), -inf);
  auto inter = m_prev.unsqueeze(-1) + b;                                 // [B, H, N, L]
  auto stab = torch::maximum(std::get<0>(logD.max(-1)), inter);         // == recurrent m_t
  auto S = torch::matmul(q, k.transpose(-1, -2)) * torch::exp(logD - stab.unsqueeze(-1));  // [B, H, N, L, L]
  auto w_inter = torch::exp(inter - stab).unsqueeze(-1);                // [B, H, N, L, 1]
  auto num = torch::matmul(S, v) + w_inter * torch::matmul(q, C_prev);
  auto den = S.sum(-1, true) + w_inter * torch::matmul(q, n_prev.unsqueeze(-1));
  auto h = num / (torch::maximum(den.abs(), torch::exp(-stab).unsqueeze(-1)) + eps);
  h = h.reshape({B, H, Tp, dv}).narrow(2, 0, T).transpose(1, 2);
  return {h.to(v_in.scalar_type()), s};
}

torch::Tensor mlstm_step(const torch::Tensor& q_t, const torch::Tensor& k_t, const torch::Tensor& v_t,
                         const torch::Tensor& ig_t, const torch::Tensor& fg_t, MLstmState& s, double eps) {
  AutocastOff no_autocast;
  const auto ct = compute_type(v_t.scalar_type());
  const int64_t dk = q_t.size(-1);
  auto q = q_t.to(ct), k = k_t.to(ct) / std::sqrt(static_cast<double>(dk)), v = v_t.to(ct);
  auto a = torch::nn::functional::logsigmoid(fg_t.to(ct)) + s.m.to(ct);  // [B, H]
  auto ig = ig_t.to(ct);
  auto m = torch::maximum(a, ig);
  auto fp = torch::exp(a - m), ip = torch::exp(ig - m);
  s.C = fp.unsqueeze(-1).unsqueeze(-1) * s.C.to(ct) + ip.unsqueeze(-1).unsqueeze(-1) * k.unsqueeze(-1) * v.unsqueeze(-2);
  s.n = fp.unsqueeze(-1) * s.n.to(ct) + ip.unsqueeze(-1) * k;
  s.m = m;
  auto num = (q.unsqueeze(-1) * s.C).sum(-2);       // [B, H, dv]
  auto den = (q * s.n).sum(-1);                      // [B, H]
  auto h = num / (torch::maximum(den.abs(), torch::exp(-m)) + eps).unsqueeze(-1);
  return h.to(v_t.scalar_type());
}

MLstmOut mlstm_recurrent(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         const torch::Tensor& ig, const torch::Tensor& fg, double eps, const MLstmState& init) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), dk = q.size(3), dv = v.size(3);
  auto s = defaults(init, B, H, dk, dv, compute_type(v.scalar_type()), q.device());
  std::vector<torch::Tensor> hs;
  for (int64_t t = 0; t < T; ++t)
    hs.push_back(mlstm_step(q.select(1, t), k.select(1, t), v.select(1, t), ig.select(1, t), fg.select(1, t), s, eps));
  return {torch::stack(hs, 1), s};
}


bool mlstm_kernel_applies(const torch::Tensor& q, const torch::Tensor& v, Kernels kernels, std::string* why) {
  if (auto r = float_kernels_unavailable(v, kernels); !r.empty()) return refuse(why, r);
  if (q.dim() != 4 || v.dim() != 4) return refuse(why, "q, v are not [B, T, H, d]");
  if (q.size(3) != v.size(3)) return refuse(why, "dk != dv");
#ifdef MEMLAB_CUDA_KERNELS
  const int d = static_cast<int>(q.size(3));
  if (!kernels::mlstm_head_dim_supported(d))
    return refuse(why, "head dim " + std::to_string(d) + " is not 16, 32, 64 or 128");
  const size_t need = kernels::mlstm_backward_shared_bytes(d), have = max_shared_bytes_per_block(q);
  if (need > have)
    return refuse(why, "head dim " + std::to_string(d) + " needs " + std::to_string(need / 1024) +
                           " KB of shared memory per block, this GPU gives " + std::to_string(have / 1024));
#endif
  return true;
}

namespace {

#ifdef MEMLAB_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

kernels::MLstmProblem problem_of(const torch::Tensor& q, double eps) {
  kernels::MLstmProblem p;
  p.B = static_cast<int>(q.size(0));
  p.T = static_cast<int>(q.size(1));
  p.H = static_cast<int>(q.size(2));
  p.D = static_cast<int>(q.size(3));
  p.bf16 = q.scalar_type() == torch::kBFloat16;
  p.eps = static_cast<float>(eps);
  return p;
}

struct Forward {
  torch::Tensor h, CT, nT, mT, den, Cs, ns, ms;
};
// h [B, T, H, D] (fp32) and the final state; den and the chunks' starting states too when `keep`.
Forward forward_kernel(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& ig,
                       const torch::Tensor& fg, const torch::Tensor& C0, const torch::Tensor& n0,
                       const torch::Tensor& m0, double eps, bool keep) {
  const auto p = problem_of(q, eps);
  const int64_t N = p.chunks();
  auto o = ig.options();
  Forward f;
  f.h = torch::empty({p.B, p.T, p.H, p.D}, o);
  f.CT = torch::empty({p.B, p.H, p.D, p.D}, o);
  f.nT = torch::empty({p.B, p.H, p.D}, o);
  f.mT = torch::empty({p.B, p.H}, o);
  if (keep) {
    f.den = torch::empty({p.B, p.T, p.H}, o);
    f.Cs = torch::empty({p.B, p.H, N, p.D, p.D}, o);
    f.ns = torch::empty({p.B, p.H, N, p.D}, o);
    f.ms = torch::empty({p.B, p.H, N}, o);
  }
  kernels::MLstmForwardArgs a;
  a.q = q.data_ptr();
  a.k = k.data_ptr();
  a.v = v.data_ptr();
  a.ig = ptr(ig);
  a.fg = ptr(fg);
  a.C0 = ptr(C0);
  a.n0 = ptr(n0);
  a.m0 = ptr(m0);
  a.h = mut(f.h);
  a.den = mut(f.den);
  a.Cs = mut(f.Cs);
  a.ns = mut(f.ns);
  a.ms = mut(f.ms);
  a.CT = mut(f.CT);
  a.nT = mut(f.nT);
  a.mT = mut(f.mT);
  check_launch(kernels::mlstm_forward(p, a, stream_of(q)));
  return f;
}

// Inputs q, k, v (fp32 or bf16, one dtype), ig, fg (fp32), C0, n0, m0 (fp32, empty = the zero state); outputs h
// (fp32), C_T, n_T, m_T.
class MLstmFunction : public torch::autograd::Function<MLstmFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, torch::Tensor q, torch::Tensor k, torch::Tensor v,
                               torch::Tensor ig, torch::Tensor fg, torch::Tensor C0, torch::Tensor n0,
                               torch::Tensor m0, double eps) {
    c10::cuda::CUDAGuard guard(q.device());
    auto f = forward_kernel(q, k, v, ig, fg, C0, n0, m0, eps, true);
    ctx->set_materialize_grads(false);  // the final state's gradients are mostly absent: no zeros to fill and read
    ctx->save_for_backward({q, k, v, ig, fg, f.h, f.den, f.Cs, f.ns, f.ms, f.CT, f.nT, C0, n0, m0});
    ctx->saved_data["eps"] = eps;
    return {f.h, f.CT, f.nT, f.mT};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    auto &q = s[0], &k = s[1], &v = s[2], &ig = s[3], &fg = s[4], &h = s[5], &den = s[6], &Cs = s[7], &ns = s[8],
         &ms = s[9], &CT = s[10], &nT = s[11], &C0 = s[12], &n0 = s[13], &m0 = s[14];
    c10::cuda::CUDAGuard guard(q.device());
    const auto p = problem_of(q, ctx->saved_data["eps"].toDouble());
    const bool fresh = C0.numel() == 0, has_m0 = m0.numel() > 0;  // empty: the zero state
    auto dh = grads[0].defined() ? f32(grads[0]) : torch::zeros_like(h);
    auto dCT = f32(grads[1]), dnT = f32(grads[2]), dmT = f32(grads[3]);
    // m_T's whole gradient: its own, and C_T's and n_T's, which scale as exp(-m_T); undefined when all are absent
    torch::Tensor pend;
    if (dmT.defined() || dCT.defined() || dnT.defined()) {
      pend = dmT.defined() ? dmT.clone() : torch::zeros_like(ig.select(1, 0));
      if (dCT.defined()) pend -= (CT * dCT).sum({-2, -1});
      if (dnT.defined()) pend -= (nT * dnT).sum(-1);
    }
    auto dq = torch::empty_like(q), dk = torch::empty_like(k), dv = torch::empty_like(v);
    auto dig = torch::empty_like(ig), dfg = torch::empty_like(fg);
    torch::Tensor dC0, dn0, dm0;
    if (!fresh) {
      dC0 = torch::empty_like(CT);
      dn0 = torch::empty_like(nT);
    }
    if (has_m0) dm0 = torch::empty_like(m0);
    kernels::MLstmBackwardArgs a;
    a.q = q.data_ptr();
    a.k = k.data_ptr();
    a.v = v.data_ptr();
    a.ig = ptr(ig);
    a.fg = ptr(fg);
    a.h = ptr(h);
    a.den = ptr(den);
    a.Cs = ptr(Cs);
    a.ns = ptr(ns);
    a.ms = ptr(ms);
    a.dh = ptr(dh);
    a.dCT = ptr(dCT);
    a.dnT = ptr(dnT);
    a.dmT = ptr(dmT);
    a.pend = ptr(pend);
    a.dq = dq.data_ptr();
    a.dk = dk.data_ptr();
    a.dv = dv.data_ptr();
    a.dig = mut(dig);
    a.dfg = mut(dfg);
    a.dC0 = mut(dC0);
    a.dn0 = mut(dn0);
    a.dm0 = mut(dm0);
    check_launch(kernels::mlstm_backward(p, a, stream_of(q)));
    if (has_m0 && !fresh)  // the initial state is exp(m_0) (C_0, n_0) unstabilised
      dm0 += (C0 * dC0).sum({-2, -1}) + (n0 * dn0).sum(-1);
    return {dq, dk, dv, dig, dfg, dC0, dn0, dm0, torch::Tensor()};
  }
};
#endif

}  // namespace

MLstmOut mlstm(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& ig,
               const torch::Tensor& fg, int64_t chunk, const MLstmState& init, Kernels kernels, double eps,
               torch::ScalarType out) {
  MEMLAB_PROFILED_OP("memlab::mlstm");
  if (out == torch::ScalarType::Undefined) out = v.scalar_type();
  std::string why;
#ifdef MEMLAB_CUDA_KERNELS
  if (mlstm_kernel_applies(q, v, kernels, &why) && q.size(1) > 0) {
    AutocastOff no_autocast;
    const auto et = v.scalar_type();
    auto qc = q.to(et).contiguous(), kc = k.to(et).contiguous(), vc = v.contiguous();
    auto igc = f32(ig), fgc = f32(fg);
    auto empty = torch::empty({0}, igc.options());  // the zero state (autograd's inputs must be defined)
    auto C0 = empty, n0 = empty, m0 = init.m.defined() ? f32(init.m) : empty;
    if (init.C.defined() || init.n.defined()) {
      const int64_t B = q.size(0), H = q.size(2), D = q.size(3);
      C0 = init.C.defined() ? f32(init.C) : torch::zeros({B, H, D, D}, igc.options());
      n0 = init.n.defined() ? f32(init.n) : torch::zeros({B, H, D}, igc.options());
    }
    if (!recorded({q, k, v, ig, fg, init.C, init.n, init.m})) {
      c10::cuda::CUDAGuard guard(q.device());
      auto f = forward_kernel(qc, kc, vc, igc, fgc, C0, n0, m0, eps, false);
      return {f.h.to(out), {f.CT, f.nT, f.mT}};
    }
    auto o = MLstmFunction::apply(qc, kc, vc, igc, fgc, C0, n0, m0, eps);
    return {o[0].to(out), {o[1], o[2], o[3]}};
  }
#else
  mlstm_kernel_applies(q, v, kernels, &why);
#endif
  if (kernels == Kernels::Cuda && q.size(1) > 0)
    throw UserError("model.kernels=cuda: no mLSTM kernel for this call: " + why);
  auto r = mlstm_chunked(q, k, v, ig, fg, chunk, eps, init);
  r.h = r.h.to(out);
  return r;
}

namespace {
// How many members' heads w_i [H, 3I / K] holds for q [.., I]: each member's H/K heads read its own I/K columns.
int64_t gate_members(const torch::Tensor& q, const torch::Tensor& w_i) {
  const int64_t I = q.size(-1), H = w_i.size(0), width = w_i.size(1);
  TORCH_CHECK(w_i.dim() == 2 && width > 0 && (3 * I) % width == 0 && H % ((3 * I) / width) == 0,
              "mLSTM gates: weights [", H, ", ", width, "] for an inner width of ", I);
  return 3 * I / width;
}

constexpr const char* kPackedGates = "a packed layer (its members' heads read only their own q, k, v): tensor ops";
}  // namespace

MLstmGates mlstm_gates_reference(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 const torch::Tensor& w_i, const torch::Tensor& w_f, const torch::Tensor& b_i,
                                 const torch::Tensor& b_f) {
  AutocastOff no_autocast;
  const auto ct = compute_type(v.scalar_type());
  const int64_t H = w_i.size(0), K = gate_members(q, w_i);
  auto sizes = q.sizes().vec();
  if (K > 1) {  // member m's rows of [q | k | v] times its own weights only: a NaN stays in its member
    const int64_t I1 = q.size(-1) / K;
    auto part = [&](const torch::Tensor& t) { return t.reshape({-1, K, I1}); };
    auto qkv = torch::cat({part(q), part(k), part(v)}, -1).to(ct);  // [N, K, 3 I1]
    auto W = torch::cat({w_i.view({K, H / K, -1}), w_f.view({K, H / K, -1})}, 1).to(ct);  // [K, 2 H/K, 3 I1]
    auto b = torch::cat({b_i.view({K, -1}), b_f.view({K, -1})}, 1).to(ct);
    auto g = member_matmul(qkv.flatten(-2), W) + b;  // [N, K, 2 H/K]
    sizes.back() = H;
    return {g.narrow(-1, 0, H / K).reshape(sizes), g.narrow(-1, H / K, H / K).reshape(sizes)};
  }
  auto qkv = torch::cat({q, k, v}, -1).to(ct);
  auto g = torch::addmm(torch::cat({b_i, b_f}).to(ct), qkv.reshape({-1, qkv.size(-1)}),
                        torch::cat({w_i, w_f}).to(ct).t());
  sizes.back() = 2 * H;
  g = g.view(sizes);
  return {g.narrow(-1, 0, H), g.narrow(-1, H, H)};
}

bool mlstm_gates_kernel_applies(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t heads,
                                Kernels kernels, std::string* why) {
  if (auto r = float_kernels_unavailable(q, kernels); !r.empty()) return refuse(why, r);
  if (k.sizes() != q.sizes() || v.sizes() != q.sizes() || k.scalar_type() != q.scalar_type() ||
      v.scalar_type() != q.scalar_type())
    return refuse(why, "q, k, v differ in shape or dtype");
#ifdef MEMLAB_CUDA_KERNELS
  if (2 * heads > kernels::kMLstmGatesMax)
    return refuse(why, std::to_string(heads) + " heads (the gates kernel takes up to " +
                           std::to_string(kernels::kMLstmGatesMax / 2) + ")");
  if (q.dim() == 0 || q.size(-1) % kernels::kMLstmGatesWidthMultiple)
    return refuse(why, "an inner width that is not a multiple of " +
                           std::to_string(kernels::kMLstmGatesWidthMultiple));
#endif
  return true;
}

namespace {
#ifdef MEMLAB_CUDA_KERNELS
// t contiguous, copied if it starts off the 16-byte alignment of the kernels' row loads (a view may).
torch::Tensor aligned16(const torch::Tensor& t) {
  auto c = t.contiguous();
  return reinterpret_cast<std::uintptr_t>(c.data_ptr()) % 16 ? c.clone() : c;
}

kernels::MLstmGatesProblem gates_problem(const torch::Tensor& q, int64_t heads) {
  kernels::MLstmGatesProblem p;
  p.I = static_cast<int>(q.size(-1));
  p.rows = p.I ? q.numel() / p.I : 0;
  p.H = static_cast<int>(heads);
  p.bf16 = q.scalar_type() == torch::kBFloat16;
  return p;
}

// ig, fg (fp32) from q, k, v (contiguous, one dtype), W = [w_i; w_f] and b (fp32, contiguous).
variable_list gates_forward_kernel(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                   const torch::Tensor& W, const torch::Tensor& b) {
  c10::cuda::CUDAGuard guard(q.device());
  const int64_t H = W.size(0) / 2;
  auto sizes = q.sizes().vec();
  sizes.back() = H;
  auto ig = torch::empty(sizes, W.options()), fg = torch::empty(sizes, W.options());
  kernels::MLstmGatesForwardArgs a;
  a.q = q.data_ptr();
  a.k = k.data_ptr();
  a.v = v.data_ptr();
  a.W = ptr(W);
  a.b = ptr(b);
  a.ig = mut(ig);
  a.fg = mut(fg);
  check_launch(kernels::mlstm_gates_forward(gates_problem(q, H), a, stream_of(q)));
  return {ig, fg};
}

// Inputs as gates_forward_kernel's; outputs ig, fg.
class MLstmGatesFunction : public torch::autograd::Function<MLstmGatesFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, torch::Tensor q, torch::Tensor k, torch::Tensor v,
                               torch::Tensor W, torch::Tensor b) {
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({q, k, v, W});
    return gates_forward_kernel(q, k, v, W, b);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    auto &q = s[0], &k = s[1], &v = s[2], &W = s[3];
    c10::cuda::CUDAGuard guard(q.device());
    const int64_t H = W.size(0) / 2;
    const auto p = gates_problem(q, H);
    auto sizes = q.sizes().vec();
    sizes.back() = H;
    auto grad = [&](const torch::Tensor& g) { return g.defined() ? f32(g) : torch::zeros(sizes, W.options()); };
    auto dig = grad(grads[0]), dfg = grad(grads[1]);
    auto dq = torch::empty_like(q), dk = torch::empty_like(k), dv = torch::empty_like(v);
    // no rows or no columns: no launch, so the partial sums (db's among them) must start at zero
    const std::vector<int64_t> psize{kernels::mlstm_gates_slices(p), W.size(0), W.size(1) + 1};
    auto partial = p.rows && p.I ? torch::empty(psize, W.options()) : torch::zeros(psize, W.options());
    kernels::MLstmGatesBackwardArgs a;
    a.q = q.data_ptr();
    a.k = k.data_ptr();
    a.v = v.data_ptr();
    a.W = ptr(W);
    a.dig = ptr(dig);
    a.dfg = ptr(dfg);
    a.dq = dq.data_ptr();
    a.dk = dk.data_ptr();
    a.dv = dv.data_ptr();
    a.dW_partial = mut(partial);
    check_launch(kernels::mlstm_gates_backward(p, a, stream_of(q)));
    auto sum = partial.sum(0);  // [2H, 3I + 1]: dW, then db
    return {dq, dk, dv, sum.narrow(1, 0, W.size(1)), sum.select(1, W.size(1))};
  }
};
#endif
}  // namespace

MLstmGates mlstm_gates(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& w_i,
                       const torch::Tensor& w_f, const torch::Tensor& b_i, const torch::Tensor& b_f, Kernels kernels) {
  MEMLAB_PROFILED_OP("memlab::mlstm_gates");
  std::string why;
  const int64_t H = w_i.size(0);
  const bool packed = gate_members(q, w_i) > 1;
  if (packed) why = kPackedGates;
#ifdef MEMLAB_CUDA_KERNELS
  if (!packed && mlstm_gates_kernel_applies(q, k, v, H, kernels, &why)) {
    AutocastOff no_autocast;
    auto W = torch::cat({w_i, w_f}).to(torch::kFloat).contiguous();
    auto b = torch::cat({b_i, b_f}).to(torch::kFloat).contiguous();
    auto qc = aligned16(q), kc = aligned16(k), vc = aligned16(v);
    auto g = recorded({q, k, v, W, b}) ? MLstmGatesFunction::apply(qc, kc, vc, W, b)
                                       : gates_forward_kernel(qc, kc, vc, W, b);
    return {g[0], g[1]};
  }
#else
  if (!packed) mlstm_gates_kernel_applies(q, k, v, H, kernels, &why);
#endif
  if (kernels == Kernels::Cuda && !packed)
    throw UserError("model.kernels=cuda: no mLSTM gates kernel for this call: " + why);
  return mlstm_gates_reference(q, k, v, w_i, w_f, b_i, b_f);
}

namespace {
// x W_blockᵀ for the block-diagonal matrix of w's blocks [nb, bs, bs] (out, in), as one dense product: a batched
// product of 4 x 4 blocks over B T rows ran at a small fraction of the GPU (2.5 of 9.8 ms in an xLSTM[1:0] step at
// B256 T128, H200). K members: one dense product per member (member_matmul), whose blocks read only its columns, so
// that a NaN in one member's x is not multiplied into the others' by the zeros between blocks.
torch::Tensor block_diag_apply(const torch::Tensor& w, const torch::Tensor& x, int64_t members) {
  const int64_t nb = w.size(0) / members, bs = w.size(1), I = nb * bs;
  auto eye = torch::eye(nb, w.options()).view({1, nb, 1, nb, 1});
  auto dense = (w.view({members, nb, bs, 1, bs}) * eye).reshape({members, I, I});  // [K, out, in]
  if (members == 1) return torch::matmul(x, dense[0].to(x.scalar_type()).t());
  return member_matmul(x, dense).flatten(-2);
}
}  // namespace

MLstmProjection mlstm_project_reference(const torch::Tensor& c, const torch::Tensor& x, const torch::Tensor& w_q,
                                        const torch::Tensor& w_k, const torch::Tensor& w_v, const torch::Tensor& w_i,
                                        const torch::Tensor& w_f, const torch::Tensor& b_i, const torch::Tensor& b_f) {
  const int64_t K = gate_members(c, w_i);
  auto q = block_diag_apply(w_q, c, K), k = block_diag_apply(w_k, c, K), v = block_diag_apply(w_v, x, K);
  auto g = mlstm_gates_reference(q, k, v, w_i, w_f, b_i, b_f);
  return {q, k, v, g.ig, g.fg};
}

bool mlstm_project_kernel_applies(const torch::Tensor& c, const torch::Tensor& x, const torch::Tensor& w_q,
                                  int64_t heads, Kernels kernels, std::string* why) {
  if (auto r = float_kernels_unavailable(c, kernels); !r.empty()) return refuse(why, r);
  if (x.sizes() != c.sizes() || x.scalar_type() != c.scalar_type())
    return refuse(why, "c and x differ in shape or dtype");
#ifdef MEMLAB_CUDA_KERNELS
  if (w_q.dim() != 3 || w_q.size(1) != kernels::kMLstmProjectBlock || w_q.size(2) != kernels::kMLstmProjectBlock)
    return refuse(why, "q, k, v blocks that are not 4 x 4");
  if (2 * heads > kernels::kMLstmProjectMaxGates)
    return refuse(why, std::to_string(heads) + " heads (the projection kernel takes up to " +
                           std::to_string(kernels::kMLstmProjectMaxGates / 2) + ")");
  if (c.dim() == 0 || c.size(-1) == 0 || c.size(-1) % kernels::kMLstmGatesWidthMultiple ||
      c.size(-1) != w_q.size(0) * w_q.size(1))
    return refuse(why, "an inner width that is not a positive multiple of " +
                           std::to_string(kernels::kMLstmGatesWidthMultiple) + " or not the blocks' width");
  if (c.size(-1) > kernels::kMLstmProjectMaxWidth)
    return refuse(why, "an inner width over " + std::to_string(kernels::kMLstmProjectMaxWidth) +
                           " (the projection kernel stages the blocks in shared memory)");
#endif
  return true;
}

namespace {
#ifdef MEMLAB_CUDA_KERNELS
// q, k, v (c's dtype) and ig, fg (fp32) from c, x (contiguous, 16-byte aligned, one dtype) and fp32 contiguous
// weights: the blocks, Wg = [w_i; w_f] and bg.
variable_list project_forward_kernel(const torch::Tensor& c, const torch::Tensor& x, const torch::Tensor& Wq,
                                     const torch::Tensor& Wk, const torch::Tensor& Wv, const torch::Tensor& Wg,
                                     const torch::Tensor& bg) {
  c10::cuda::CUDAGuard guard(c.device());
  const int64_t H = Wg.size(0) / 2;
  auto sizes = c.sizes().vec();
  sizes.back() = H;
  auto q = torch::empty_like(c), k = torch::empty_like(c), v = torch::empty_like(c);
  auto ig = torch::empty(sizes, Wg.options()), fg = torch::empty(sizes, Wg.options());
  kernels::MLstmProjectForwardArgs a;
  a.c = c.data_ptr();
  a.x = x.data_ptr();
  a.Wq = ptr(Wq);
  a.Wk = ptr(Wk);
  a.Wv = ptr(Wv);
  a.Wg = ptr(Wg);
  a.bg = ptr(bg);
  a.q = q.data_ptr();
  a.k = k.data_ptr();
  a.v = v.data_ptr();
  a.ig = mut(ig);
  a.fg = mut(fg);
  check_launch(kernels::mlstm_project_forward(gates_problem(c, H), a, stream_of(c)));
  return {q, k, v, ig, fg};
}

// Inputs as project_forward_kernel's; outputs q, k, v, ig, fg.
class MLstmProjectFunction : public torch::autograd::Function<MLstmProjectFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, torch::Tensor c, torch::Tensor x, torch::Tensor Wq,
                               torch::Tensor Wk, torch::Tensor Wv, torch::Tensor Wg, torch::Tensor bg) {
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({c, x, Wq, Wk, Wv, Wg});
    return project_forward_kernel(c, x, Wq, Wk, Wv, Wg, bg);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    auto &c = s[0], &x = s[1], &Wq = s[2], &Wk = s[3], &Wv = s[4], &Wg = s[5];
    c10::cuda::CUDAGuard guard(c.device());
    const int64_t H = Wg.size(0) / 2, I = c.size(-1), O = Wg.size(0), C = Wg.size(1);
    const auto p = gates_problem(c, H);
    auto sizes = c.sizes().vec();
    sizes.back() = H;
    auto same = [&](const torch::Tensor& g) { return g.defined() ? aligned16(g.to(c.scalar_type())) : g; };
    auto gate = [&](const torch::Tensor& g) { return g.defined() ? f32(g) : torch::zeros(sizes, Wg.options()); };
    auto dq = same(grads[0]), dk = same(grads[1]), dv = same(grads[2]);
    auto dig = gate(grads[3]), dfg = gate(grads[4]);
    auto dc = torch::empty_like(c), dx = torch::empty_like(x);
    // no rows: no launch, so the partial sums must start at zero
    const std::vector<int64_t> psize{kernels::mlstm_project_slices(p), kernels::mlstm_project_partial_width(p)};
    auto partial = p.rows ? torch::empty(psize, Wg.options()) : torch::zeros(psize, Wg.options());
    kernels::MLstmProjectBackwardArgs a;
    a.c = c.data_ptr();
    a.x = x.data_ptr();
    a.Wq = ptr(Wq);
    a.Wk = ptr(Wk);
    a.Wv = ptr(Wv);
    a.Wg = ptr(Wg);
    a.dq = dq.defined() ? dq.data_ptr() : nullptr;
    a.dk = dk.defined() ? dk.data_ptr() : nullptr;
    a.dv = dv.defined() ? dv.data_ptr() : nullptr;
    a.dig = ptr(dig);
    a.dfg = ptr(dfg);
    a.dc = dc.data_ptr();
    a.dx = dx.data_ptr();
    a.partial = mut(partial);
    check_launch(kernels::mlstm_project_backward(p, a, stream_of(c)));
    auto sum = partial.sum(0);  // dW_q, dW_k, dW_v, dW_g, db_g
    auto block = [&](int i) { return sum.narrow(0, 4 * I * i, 4 * I).view(Wq.sizes()); };
    return {dc, dx, block(0), block(1), block(2), sum.narrow(0, 12 * I, O * C).view({O, C}),
            sum.narrow(0, 12 * I + O * C, O)};
  }
};
#endif
}  // namespace

MLstmProjection mlstm_project(const torch::Tensor& c, const torch::Tensor& x, const torch::Tensor& w_q,
                              const torch::Tensor& w_k, const torch::Tensor& w_v, const torch::Tensor& w_i,
                              const torch::Tensor& w_f, const torch::Tensor& b_i, const torch::Tensor& b_f,
                              Kernels kernels) {
  MEMLAB_PROFILED_OP("memlab::mlstm_project");
  const int64_t K = gate_members(c, w_i);
#ifdef MEMLAB_CUDA_KERNELS
  if (K == 1 && mlstm_project_kernel_applies(c, x, w_q, w_i.size(0), kernels)) {
    TORCH_CHECK(w_k.sizes() == w_q.sizes() && w_v.sizes() == w_q.sizes() && w_f.sizes() == w_i.sizes() &&
                    w_i.dim() == 2 && w_i.size(1) == 3 * c.size(-1) && b_i.numel() == w_i.size(0) &&
                    b_f.numel() == w_i.size(0),
                "mlstm_project: weights of mismatched shapes");
    AutocastOff no_autocast;
    auto f = [](const torch::Tensor& t) { return aligned16(t.to(torch::kFloat)); };
    auto Wg = torch::cat({w_i, w_f}).to(torch::kFloat).contiguous();
    auto bg = torch::cat({b_i, b_f}).to(torch::kFloat).contiguous();
    auto cc = aligned16(c), xc = aligned16(x), Wq = f(w_q), Wk = f(w_k), Wv = f(w_v);
    auto o = recorded({c, x, w_q, w_k, w_v, Wg, bg}) ? MLstmProjectFunction::apply(cc, xc, Wq, Wk, Wv, Wg, bg)
                                                       : project_forward_kernel(cc, xc, Wq, Wk, Wv, Wg, bg);
    return {o[0], o[1], o[2], o[3], o[4]};
  }
#endif
  auto q = block_diag_apply(w_q, c, K), k = block_diag_apply(w_k, c, K), v = block_diag_apply(w_v, x, K);
  auto g = mlstm_gates(q, k, v, w_i, w_f, b_i, b_f, kernels);
  return {q, k, v, g.ig, g.fg};
}

}  // namespace memlab
