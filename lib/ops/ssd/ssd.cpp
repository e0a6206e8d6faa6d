#include "ops/ssd/ssd.h"

#include <algorithm>

#include "core/errors.h"
#include "mixers/ops.h"
#include "ops/kernel_call.h"

#ifdef MEMLAB_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>

#include "ops/ssd/chunk.h"
#endif

namespace memlab {

namespace {

namespace F = torch::nn::functional;

// [.., G, N] along `dim` -> [.., H, N]: head h reads group h / (H / G), as in mamba_ssm.
torch::Tensor groups_to_heads(const torch::Tensor& t, int64_t heads, int64_t dim) {
  const int64_t G = t.size(dim);
  TORCH_CHECK(heads % G == 0, "ssd: heads (", heads, ") must be a multiple of the groups of B and C (", G, ")");
  return G == heads ? t : t.repeat_interleave(heads / G, dim);
}

// Stable segment sums: out[.., i, j] = sum_{j < k <= i} a[.., k] for i >= j (0 above the diagonal). A masked
// cumsum, not differences of one cumsum, so long or strong decays keep their precision.
torch::Tensor segsum(const torch::Tensor& a) {
  const int64_t C = a.size(-1);
  auto strict = torch::ones({C, C}, a.options().dtype(torch::kBool)).tril(-1);  // i > j
  auto sizes = a.sizes().vec();
  sizes.push_back(C);
  auto rep = a.unsqueeze(-1).expand(sizes);  // rep[i, j] = a_i
  return rep.masked_fill(strict.logical_not(), 0.0).cumsum(-2);
}

// Segment products of the transitions, lower-triangular: S_i S_j exp(segsum(log|alpha|)) (S undefined = all +1).
torch::Tensor decay_matrix(const torch::Tensor& log_abs, const torch::Tensor& sign_prefix) {
  const int64_t C = log_abs.size(-1);
  auto causal = torch::ones({C, C}, log_abs.options().dtype(torch::kBool)).tril(0);
  auto L = torch::exp(segsum(log_abs)).masked_fill(causal.logical_not(), 0.0);
  if (sign_prefix.defined()) L = L * (sign_prefix.unsqueeze(-1) * sign_prefix.unsqueeze(-2));
  return L;
}

// neg_eigval's transition as sign and floored magnitude (ssd.h): |a| = sign * a, so d|a|/da = +1 at a = 0 too;
// the floor is straight-through, value max(|a|, floor) with gradient 1.
struct SignedMagnitude {
  torch::Tensor mag, sign;
};
SignedMagnitude signed_magnitude(const torch::Tensor& dt, const torch::Tensor& A) {
  auto a = torch::exp(dt * A.to(dt.scalar_type())) * 2.0 - 1.0;
  torch::Tensor sign;
  {
    torch::NoGradGuard ng;  // a sign has no gradient
    sign = torch::where(a < 0, -1.0, 1.0).to(dt.scalar_type());
  }
  auto mag = a * sign;
  return {mag + (mag.clamp_min(kSsdAbsAlphaFloor) - mag).detach(), sign};
}

}  // namespace

SsdLogTransition ssd_log_transition(const torch::Tensor& dt, const torch::Tensor& A, bool neg_eigval) {
  if (!neg_eigval) return {dt * A.to(dt.scalar_type()), {}};
  auto m = signed_magnitude(dt, A);
  return {torch::log(m.mag), m.sign};
}

torch::Tensor ssd_transition(const torch::Tensor& dt, const torch::Tensor& A, bool neg_eigval) {
  if (!neg_eigval) return torch::exp(dt * A.to(dt.scalar_type()));
  auto m = signed_magnitude(dt, A);
  return m.sign * m.mag;
}

SsdOut ssd_chunked(const torch::Tensor& x_in, const torch::Tensor& dt_in, const torch::Tensor& A_in,
                   const torch::Tensor& B_in, const torch::Tensor& C_in, int64_t chunk, bool neg_eigval,
                   const torch::Tensor& initial_state) {
  AutocastOff no_autocast;
  const auto ct = compute_type(x_in);
  const int64_t B = x_in.size(0), T = x_in.size(1), H = x_in.size(2), P = x_in.size(3), N = B_in.size(3);
  auto dt = dt_in.to(ct);
  auto xdt = x_in.to(ct) * dt.unsqueeze(-1);        // [B, T, H, P]
  auto Bm = groups_to_heads(B_in.to(ct), H, 2);     // [B, T, H, N]
  auto Cm = groups_to_heads(C_in.to(ct), H, 2);
  auto lt = ssd_log_transition(dt, A_in.to(ct), neg_eigval);
  auto log_abs = lt.log_abs, sign = lt.sign;        // [B, T, H]
  const int64_t C = std::max<int64_t>(1, std::min<int64_t>(chunk, T));
  const int64_t Nc = (T + C - 1) / C, Tp = Nc * C;
  if (Tp != T) {  // padded steps have dt = 0: alpha = 1 (log 0, sign +1) and no input, so they change nothing
    xdt = F::pad(xdt, F::PadFuncOptions({0, 0, 0, 0, 0, Tp - T}));
    Bm = F::pad(Bm, F::PadFuncOptions({0, 0, 0, 0, 0, Tp - T}));
    Cm = F::pad(Cm, F::PadFuncOptions({0, 0, 0, 0, 0, Tp - T}));
    log_abs = F::pad(log_abs, F::PadFuncOptions({0, 0, 0, Tp - T}));
    if (sign.defined()) sign = F::pad(sign, F::PadFuncOptions({0, 0, 0, Tp - T}).value(1.0));
  }
  // [B, H, Nc, C, d]
  xdt = xdt.transpose(1, 2).reshape({B, H, Nc, C, P});
  Bm = Bm.transpose(1, 2).reshape({B, H, Nc, C, N});
  Cm = Cm.transpose(1, 2).reshape({B, H, Nc, C, N});
  log_abs = log_abs.transpose(1, 2).reshape({B, H, Nc, C});
  torch::Tensor sign_prefix;  // S_t within each chunk
  if (sign.defined()) sign_prefix = sign.transpose(1, 2).reshape({B, H, Nc, C}).cumprod(-1);

  // 1. intra-chunk (diagonal blocks): y_l = sum_{s<=l} alpha(s, l] (C_l . B_s) dt_s x_s
  auto L = decay_matrix(log_abs, sign_prefix);  // [B, H, Nc, C, C]
  auto y = torch::matmul(torch::matmul(Cm, Bm.transpose(-1, -2)) * L, xdt);
  // 2. each chunk's own end state (zero start): sum_s alpha(s, end] dt_s x_s B_s^T
  auto to_end = L.select(-2, C - 1).unsqueeze(-1);                               // [B, H, Nc, C, 1]
  auto states = torch::matmul((xdt * to_end).transpose(-1, -2), Bm);            // [B, H, Nc, P, N]
  // 3. across chunks: the same segment products over chunk totals, index 0 = the initial state
  auto log_cum = log_abs.cumsum(-1);                                            // log|alpha(start, t]|
  auto chunk_log = F::pad(log_cum.select(-1, C - 1), F::PadFuncOptions({1, 0}));  // [B, H, Nc + 1]
  torch::Tensor chunk_sign;
  if (sign_prefix.defined())
    chunk_sign = F::pad(sign_prefix.select(-1, C - 1), F::PadFuncOptions({1, 0}).value(1.0)).cumprod(-1);
  auto Lc = decay_matrix(chunk_log, chunk_sign);                                // [B, H, Nc + 1, Nc + 1]
  auto h0 = initial_state.defined() ? initial_state.to(ct) : torch::zeros({B, H, P, N}, xdt.options());
  auto all = torch::cat({h0.unsqueeze(2), states}, 2).reshape({B, H, Nc + 1, P * N});
  auto entering = torch::matmul(Lc, all).view({B, H, Nc + 1, P, N});          // state before chunk z; last = final
  // 4. off-diagonal read: y_l += alpha(start, l] C_l h_start
  auto from_start = torch::exp(log_cum);
  if (sign_prefix.defined()) from_start = from_start * sign_prefix;
  y = y + torch::matmul(Cm, entering.narrow(2, 0, Nc).transpose(-1, -2)) * from_start.unsqueeze(-1);
  y = y.reshape({B, H, Tp, P}).narrow(2, 0, T).transpose(1, 2);
  return {y, entering.select(2, Nc)};
}

SsdOut ssd_recurrent(const torch::Tensor& x, const torch::Tensor& dt_in, const torch::Tensor& A,
                     const torch::Tensor& B_in, const torch::Tensor& C_in, bool neg_eigval,
                     const torch::Tensor& initial_state) {
  const auto ct = compute_type(x);
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), P = x.size(3), N = B_in.size(3);
  auto dt = dt_in.to(ct);
  auto alpha = ssd_transition(dt, A.to(ct), neg_eigval);  // [B, T, H]
  auto Bm = groups_to_heads(B_in.to(ct), H, 2), Cm = groups_to_heads(C_in.to(ct), H, 2);
  auto h = initial_state.defined() ? initial_state.to(ct) : torch::zeros({B, H, P, N}, x.options().dtype(ct));
  std::vector<torch::Tensor> ys;
  for (int64_t t = 0; t < T; ++t) {
    auto xt = x.select(1, t).to(ct) * dt.select(1, t).unsqueeze(-1);  // dt_t x_t [B, H, P]
    h = alpha.select(1, t).view({B, H, 1, 1}) * h + torch::einsum("bhp,bhn->bhpn", {xt, Bm.select(1, t)});
    ys.push_back(torch::einsum("bhpn,bhn->bhp", {h, Cm.select(1, t)}));
  }
  return {torch::stack(ys, 1), h};
}

torch::Tensor ssd_step(const torch::Tensor& x_t, const torch::Tensor& dt_t, const torch::Tensor& A,
                       const torch::Tensor& B_t, const torch::Tensor& C_t, bool neg_eigval, torch::Tensor& state) {
  const auto ct = compute_type(x_t);
  const int64_t H = x_t.size(1);
  auto dt = dt_t.to(ct);
  auto alpha = ssd_transition(dt, A.to(ct), neg_eigval);  // [B, H]
  auto Bh = groups_to_heads(B_t.to(ct), H, 1), Ch = groups_to_heads(C_t.to(ct), H, 1);
  auto xdt = x_t.to(ct) * dt.unsqueeze(-1);
  state = alpha.unsqueeze(-1).unsqueeze(-1) * state + xdt.unsqueeze(-1) * Bh.unsqueeze(-2);
  return torch::matmul(state, Ch.unsqueeze(-1)).squeeze(-1);
}

bool ssd_kernel_applies(const torch::Tensor& x, const torch::Tensor& Bm, Kernels kernels, std::string* why) {
  if (auto r = float_kernels_unavailable(x, kernels); !r.empty()) return refuse(why, r);
  if (x.dim() != 4 || Bm.dim() != 4) return refuse(why, "x, Bm are not [B, T, H, P], [B, T, G, N]");
#ifdef MEMLAB_CUDA_KERNELS
  const int P = static_cast<int>(x.size(3)), N = static_cast<int>(Bm.size(3));
  if (!kernels::ssd_dim_supported(P) || !kernels::ssd_dim_supported(N))
    return refuse(why, "head dim " + std::to_string(P) + " or state size " + std::to_string(N) +
                           " is not 16, 32, 64 or 128");
  const size_t need = kernels::ssd_backward_shared_bytes(P, N), have = max_shared_bytes_per_block(x);
  if (need > have)
    return refuse(why, "head dim " + std::to_string(P) + " and state size " + std::to_string(N) + " need " +
                           std::to_string(need / 1024) + " KB of shared memory per block, this GPU gives " +
                           std::to_string(have / 1024));
#endif
  return true;
}

namespace {

#ifdef MEMLAB_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// A [B, T, ., d] input as the kernels read it: itself where it is dense but for the token stride (a column slice of
// one projection), else a dense copy; `row` = the elements from one token to the next.
struct Rows {
  torch::Tensor t;
  int64_t row;
};
Rows rows_of(const torch::Tensor& t) {
  if (t.size(1) > 1 && t.stride(3) == 1 && t.stride(2) == t.size(3) && t.stride(0) == t.size(1) * t.stride(1))
    return {t, t.stride(1)};
  auto c = t.contiguous();
  return {c, c.size(2) * c.size(3)};
}

kernels::SsdProblem problem_of(const torch::Tensor& x, const torch::Tensor& Bm, int64_t x_row, int64_t bc_row) {
  kernels::SsdProblem p;
  p.B = static_cast<int>(x.size(0));
  p.T = static_cast<int>(x.size(1));
  p.H = static_cast<int>(x.size(2));
  p.P = static_cast<int>(x.size(3));
  p.G = static_cast<int>(Bm.size(2));
  p.N = static_cast<int>(Bm.size(3));
  p.bf16 = x.scalar_type() == torch::kBFloat16;
  p.x_row = x_row;
  p.bc_row = bc_row;
  return p;
}

// The inputs both kernels read (their Args share the field names).
template <typename Args>
void set_inputs(Args& a, const torch::Tensor& x, const torch::Tensor& dt, const torch::Tensor& g,
                const torch::Tensor& sign, const torch::Tensor& Bm, const torch::Tensor& Cm, const torch::Tensor& D) {
  a.x = x.data_ptr();
  a.Bm = Bm.data_ptr();
  a.Cm = Cm.data_ptr();
  a.dt = ptr(dt);
  a.g = ptr(g);
  a.sign = ptr(sign);
  a.D = ptr(D);
}

struct Forward {
  torch::Tensor y, hT, hs;
};
// y [B, T, H, P] and the final state (fp32); the chunks' starting states too when `keep`.
Forward forward_kernel(const kernels::SsdProblem& p, const torch::Tensor& x, const torch::Tensor& dt,
                       const torch::Tensor& g, const torch::Tensor& sign, const torch::Tensor& Bm,
                       const torch::Tensor& Cm, const torch::Tensor& h0, const torch::Tensor& D, bool keep) {
  auto o = dt.options();
  Forward f;
  f.y = torch::empty({p.B, p.T, p.H, p.P}, o);
  f.hT = torch::empty({p.B, p.H, p.P, p.N}, o);
  if (keep) f.hs = torch::empty({p.B, p.H, p.chunks(), p.P, p.N}, o);
  kernels::SsdForwardArgs a;
  set_inputs(a, x, dt, g, sign, Bm, Cm, D);
  a.h0 = ptr(h0);
  a.y = mut(f.y);
  a.hs = mut(f.hs);
  a.hT = mut(f.hT);
  check_launch(kernels::ssd_forward(p, a, stream_of(x)));
  return f;
}

// Inputs: x, Bm, Cm (fp32 or bf16, one dtype, dense rows with the token strides x_row, bc_row), dt, g = log|alpha|,
// sign (empty: all +1), h0 (empty: the zero state), D (empty: no skip), all fp32; outputs y (fp32) and h_T. g's
// gradient goes back to dt and A through the caller's tensor ops.
class SsdFunction : public torch::autograd::Function<SsdFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor dt, torch::Tensor g,
                               torch::Tensor sign, torch::Tensor Bm, torch::Tensor Cm, torch::Tensor h0,
                               torch::Tensor D, int64_t x_row, int64_t bc_row) {
    c10::cuda::CUDAGuard guard(x.device());
    auto f = forward_kernel(problem_of(x, Bm, x_row, bc_row), x, dt, g, sign, Bm, Cm, h0, D, true);
    ctx->set_materialize_grads(false);  // an absent final-state gradient stays null for the kernel: no zeros
    ctx->save_for_backward({x, dt, g, sign, Bm, Cm, h0, D, f.hs, f.hT});
    ctx->saved_data["x_row"] = x_row;
    ctx->saved_data["bc_row"] = bc_row;
    return {f.y, f.hT};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    auto &x = s[0], &dt = s[1], &g = s[2], &sign = s[3], &Bm = s[4], &Cm = s[5], &h0 = s[6], &D = s[7], &hs = s[8],
         &hT = s[9];
    c10::cuda::CUDAGuard guard(x.device());
    const auto p = problem_of(x, Bm, ctx->saved_data["x_row"].toInt(), ctx->saved_data["bc_row"].toInt());
    auto o = dt.options();
    auto dy = grads[0].defined() ? f32(grads[0]) : torch::zeros({p.B, p.T, p.H, p.P}, o);
    auto dhT = f32(grads[1]);
    torch::Tensor final_dot;  // <h_T, dh_T>: every transition scales h_T
    if (dhT.defined()) final_dot = (hT * dhT).sum({-2, -1}).contiguous();
    auto dx = torch::empty({p.B, p.T, p.H, p.P}, o), ddt = torch::empty_like(dt), dg = torch::empty_like(g);
    auto dB = torch::empty({p.B, p.T, p.H, p.N}, o), dC = torch::empty_like(dB);
    torch::Tensor dh0, dD;
    if (h0.numel()) dh0 = torch::empty_like(h0);
    if (D.numel()) dD = torch::empty({p.B, p.H}, o);
    kernels::SsdBackwardArgs a;
    set_inputs(a, x, dt, g, sign, Bm, Cm, D);
    a.hs = ptr(hs);
    a.dy = ptr(dy);
    a.dhT = ptr(dhT);
    a.final_dot = ptr(final_dot);
    a.dx = mut(dx);
    a.ddt = mut(ddt);
    a.dg = mut(dg);
    a.dB = mut(dB);
    a.dC = mut(dC);
    a.dh0 = mut(dh0);
    a.dD = mut(dD);
    check_launch(kernels::ssd_backward(p, a, stream_of(x)));
    if (p.G != p.H) {  // per head -> per group
      dB = dB.view({p.B, p.T, p.G, p.H / p.G, p.N}).sum(3);
      dC = dC.view({p.B, p.T, p.G, p.H / p.G, p.N}).sum(3);
    }
    const auto et = x.scalar_type();
    if (dD.defined()) dD = dD.sum(0);
    return {dx.to(et), ddt, dg, torch::Tensor(), dB.to(et), dC.to(et), dh0, dD, torch::Tensor(), torch::Tensor()};
  }
};
#endif

}  // namespace

SsdOut ssd(const torch::Tensor& x, const torch::Tensor& dt, const torch::Tensor& A, const torch::Tensor& Bm,
           const torch::Tensor& Cm, int64_t chunk, bool neg_eigval, const torch::Tensor& initial_state,
           Kernels kernels, const torch::Tensor& D) {
  MEMLAB_PROFILED_OP("memlab::ssd");
  std::string why;
#ifdef MEMLAB_CUDA_KERNELS
  if (ssd_kernel_applies(x, Bm, kernels, &why) && x.size(1) > 0) {
    AutocastOff no_autocast;
    auto xr = rows_of(x), br = rows_of(Bm.to(x.scalar_type())), cr = rows_of(Cm.to(x.scalar_type()));
    if (br.row != cr.row) {
      br = rows_of(br.t.contiguous());
      cr = rows_of(cr.t.contiguous());
    }
    auto dtc = f32(dt);
    auto lt = ssd_log_transition(dtc, f32(A), neg_eigval);
    auto empty = torch::empty({0}, dtc.options());  // absent inputs (autograd's must be defined)
    auto g = lt.log_abs.contiguous(), sign = lt.sign.defined() ? lt.sign.contiguous() : empty;
    auto h0 = initial_state.defined() ? f32(initial_state) : empty;
    auto Dc = D.defined() ? f32(D) : empty;
    if (!recorded({x, dt, A, Bm, Cm, initial_state, D})) {
      c10::cuda::CUDAGuard guard(x.device());
      auto f = forward_kernel(problem_of(xr.t, br.t, xr.row, br.row), xr.t, dtc, g, sign, br.t, cr.t, h0, Dc, false);
      return {f.y, f.hT};
    }
    auto out = SsdFunction::apply(xr.t, dtc, g, sign, br.t, cr.t, h0, Dc, xr.row, br.row);
    return {out[0], out[1]};
  }
#else
  ssd_kernel_applies(x, Bm, kernels, &why);
#endif
  if (kernels == Kernels::Cuda && x.size(1) > 0)
    throw UserError("model.kernels=cuda: no SSD kernel for this call: " + why);
  auto r = ssd_chunked(x, dt, A, Bm, Cm, chunk, neg_eigval, initial_state);
  if (D.defined()) r.y = r.y + D.to(r.y.scalar_type()).view({-1, 1}) * x.to(r.y.scalar_type());
  return r;
}

}  // namespace memlab
