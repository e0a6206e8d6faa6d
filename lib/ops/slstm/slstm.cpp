#include "ops/slstm/slstm.h"

#include "core/errors.h"
#include "mixers/ops.h"
#include "ops/kernel_call.h"

#ifdef MEMLAB_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>

#include "ops/slstm/fused_recurrent.h"
#endif

namespace memlab {

namespace {

SLstmState defaults(const SLstmState& init, int64_t B, int64_t H, int64_t dh, torch::ScalarType ct,
                    const torch::Device& dev) {
  if (!init.h.defined()) return slstm_zero_state(B, H, dh, torch::TensorOptions().dtype(ct).device(dev));
  return {init.h.to(ct), init.c.to(ct), init.n.to(ct), init.m.to(ct)};
}
}  // namespace

SLstmState slstm_zero_state(int64_t B, int64_t H, int64_t dh, const torch::TensorOptions& opts) {
  auto o = opts.dtype(compute_type(opts.dtype().toScalarType()));
  return {torch::zeros({B, H, dh}, o), torch::zeros({B, H, dh}, o), torch::zeros({B, H, dh}, o),
          torch::zeros({B, H, dh}, o)};
}

SLstmOut slstm_forward(const torch::Tensor& pre_in, const torch::Tensor& R_in, const SLstmState& init) {
  AutocastOff no_autocast;
  const auto ct = compute_type(pre_in.scalar_type());
  const int64_t B = pre_in.size(0), T = pre_in.size(1), H = pre_in.size(2), dh = pre_in.size(4);
  // time-major, heads as the bmm batch: [T, H, B, 4 dh]
  auto pre = pre_in.to(ct).permute({1, 2, 0, 3, 4}).reshape({T, H, B, 4 * dh});
  auto R = R_in.to(ct);
  auto s0 = defaults(init, B, H, dh, ct, pre.device());
  const bool fresh = !init.h.defined();
  auto hb = [](const torch::Tensor& t) { return t.transpose(0, 1); };  // [B, H, dh] <-> [H, B, dh]
  auto h = hb(s0.h), c = hb(s0.c), n = hb(s0.n), m = hb(s0.m);
  std::vector<torch::Tensor> hs;
  hs.reserve(T);
  for (int64_t t = 0; t < T; ++t) {
    auto raw = torch::baddbmm(pre[t], h, R);  // [H, B, 4 dh]
    auto g = raw.split(dh, -1);
    auto a = torch::nn::functional::logsigmoid(g[1]) + m;
    // From the zero state the first token sets m = ĩ; afterwards n >= 1, so only a given state needs the check.
    torch::Tensor m_new;
    if (fresh && t == 0)
      m_new = g[0];
    else if (fresh)
      m_new = torch::maximum(g[0], a);
    else
      m_new = torch::where(n == 0, g[0], torch::maximum(g[0], a));
    auto ip = torch::exp(g[0] - m_new), fp = torch::exp(a - m_new);
    c = fp * c + ip * torch::tanh(g[2]);
    n = fp * n + ip;
    m = m_new;
    h = torch::sigmoid(g[3]) * c / n;
    hs.push_back(h);
  }
  auto out = torch::stack(hs, 0).permute({2, 0, 1, 3});  // [B, T, H, dh]
  return {out.to(pre_in.scalar_type()), {hb(h), hb(c), hb(n), hb(m)}};
}

namespace {

torch::Tensor step_tensor_ops(const torch::Tensor& pre_t, const torch::Tensor& R_in, SLstmState& s) {
  AutocastOff no_autocast;
  const auto ct = compute_type(pre_t.scalar_type());
  const int64_t B = pre_t.size(0), H = pre_t.size(1), dh = pre_t.size(3);
  auto raw = pre_t.to(ct) + torch::einsum("bhd,hde->bhe", {s.h.to(ct), R_in.to(ct)}).view({B, H, 4, dh});
  auto gi = raw.select(2, 0), gf = raw.select(2, 1), gz = raw.select(2, 2), go = raw.select(2, 3);
  auto m_prev = s.m.to(ct), n_prev = s.n.to(ct);
  auto logf = torch::nn::functional::logsigmoid(gf);
  auto m = torch::where(n_prev == 0, gi, torch::maximum(gi, logf + m_prev));
  auto fp = torch::exp(logf + m_prev - m), ip = torch::exp(gi - m);
  s.c = fp * s.c.to(ct) + ip * torch::tanh(gz);
  s.n = fp * n_prev + ip;
  s.m = m;
  s.h = torch::sigmoid(go) * s.c / s.n;
  return s.h.to(pre_t.scalar_type());
}

}  // namespace

SLstmOut slstm_reference(const torch::Tensor& pre_in, const torch::Tensor& R_in, const SLstmState& init) {
  const auto ct = compute_type(pre_in.scalar_type());
  const int64_t B = pre_in.size(0), T = pre_in.size(1), H = pre_in.size(2), dh = pre_in.size(4);
  auto pre = pre_in.to(ct);
  auto R = R_in.to(ct);
  auto s = defaults(init, B, H, dh, ct, pre.device());
  std::vector<torch::Tensor> hs;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<torch::Tensor> h_heads, c_heads, n_heads, m_heads;
    for (int64_t j = 0; j < H; ++j) {
      auto h_prev = s.h.select(1, j), c_prev = s.c.select(1, j), n_prev = s.n.select(1, j), m_prev = s.m.select(1, j);
      auto gates = pre.select(1, t).select(1, j) + torch::matmul(h_prev, R[j]).view({B, 4, dh});  // [B, 4, dh]
      auto i_raw = gates.select(1, 0), f_raw = gates.select(1, 1), z = torch::tanh(gates.select(1, 2));
      auto o = torch::sigmoid(gates.select(1, 3));
      auto log_f = torch::nn::functional::logsigmoid(f_raw);
      auto fresh = n_prev == 0;  // nothing stored yet: m_t = ĩ_t
      auto m = torch::where(fresh, i_raw, torch::maximum(log_f + m_prev, i_raw));
      auto i_gate = torch::exp(i_raw - m);
      auto f_gate = torch::exp(log_f + m_prev - m);
      auto c = f_gate * c_prev + i_gate * z;
      auto n = f_gate * n_prev + i_gate;
      h_heads.push_back(o * (c / n));
      c_heads.push_back(c);
      n_heads.push_back(n);
      m_heads.push_back(m);
    }
    s = {torch::stack(h_heads, 1), torch::stack(c_heads, 1), torch::stack(n_heads, 1), torch::stack(m_heads, 1)};
    hs.push_back(s.h);
  }
  return {torch::stack(hs, 1).to(pre_in.scalar_type()), s};
}

bool slstm_kernel_applies(const torch::Tensor& pre, Kernels kernels, std::string* why) {
  if (auto r = float_kernels_unavailable(pre, kernels); !r.empty()) return refuse(why, r);
  if (pre.dim() != 5 || pre.size(3) != 4) return refuse(why, "pre is not [B, T, H, 4, dh]");
#ifdef MEMLAB_CUDA_KERNELS
  if (pre.size(4) > kernels::kSLstmMaxHeadDim)
    return refuse(why, "head dim " + std::to_string(pre.size(4)) + " > " + std::to_string(kernels::kSLstmMaxHeadDim));
#endif
  return true;
}

namespace {

#ifdef MEMLAB_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

kernels::SLstmProblem problem_of(const torch::Tensor& pre) {
  kernels::SLstmProblem p;
  p.B = static_cast<int>(pre.size(0));
  p.T = static_cast<int>(pre.size(1));
  p.H = static_cast<int>(pre.size(2));
  p.dh = static_cast<int>(pre.size(4));
  return p;
}


// Runs the forward kernel: h [B, T, H, dh] and the final state; gates and cells too when `keep` (for the backward).
struct Forward {
  torch::Tensor h, hT, cT, nT, mT, gates, cells;
};
Forward forward_kernel(const torch::Tensor& pre, const torch::Tensor& R, const SLstmState& s0, bool keep) {
  const auto p = problem_of(pre);
  auto o = pre.options();
  Forward f;
  f.h = torch::empty({p.B, p.T, p.H, p.dh}, o);
  for (auto* t : {&f.hT, &f.cT, &f.nT, &f.mT}) *t = torch::empty({p.B, p.H, p.dh}, o);
  if (keep) {
    f.gates = torch::empty_like(pre);
    f.cells = torch::empty({p.B, p.T, p.H, 3, p.dh}, o);
  }
  kernels::SLstmForwardArgs a;
  a.pre = ptr(pre);
  a.R = ptr(R);
  a.h0 = ptr(s0.h);
  a.c0 = ptr(s0.c);
  a.n0 = ptr(s0.n);
  a.m0 = ptr(s0.m);
  a.h = mut(f.h);
  a.gates = mut(f.gates);
  a.cells = mut(f.cells);
  a.hT = mut(f.hT);
  a.cT = mut(f.cT);
  a.nT = mut(f.nT);
  a.mT = mut(f.mT);
  check_launch(kernels::slstm_forward(p, a, stream_of(pre)));
  return f;
}

// Inputs pre, R, h0, c0, n0, m0 (fp32, contiguous; the zero state passed as zeros: autograd's inputs are defined);
// outputs h, hT, cT, nT, mT.
class SLstmFunction : public torch::autograd::Function<SLstmFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, torch::Tensor pre, torch::Tensor R, torch::Tensor h0,
                               torch::Tensor c0, torch::Tensor n0, torch::Tensor m0) {
    c10::cuda::CUDAGuard guard(pre.device());
    auto f = forward_kernel(pre, R, {h0, c0, n0, m0}, true);
    ctx->set_materialize_grads(false);  // absent final-state gradients stay null for the kernel: no zeros
    ctx->save_for_backward({R, f.gates, f.cells, f.h, h0, c0, n0, m0});
    ctx->mark_non_differentiable({f.mT});
    return {f.h, f.hT, f.cT, f.nT, f.mT};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto R = saved[0], gates = saved[1], cells = saved[2], h = saved[3], h0 = saved[4], c0 = saved[5], n0 = saved[6],
         m0 = saved[7];
    c10::cuda::CUDAGuard guard(gates.device());
    const auto p = problem_of(gates);
    auto o = gates.options();
    auto dy = grads[0].defined() ? f32(grads[0]) : torch::zeros_like(h);
    auto dhT = f32(grads[1]), dcT = f32(grads[2]), dnT = f32(grads[3]);
    auto dpre = torch::empty_like(gates);
    torch::Tensor dh0, dc0, dn0, dm0;
    for (auto* t : {&dh0, &dc0, &dn0, &dm0}) *t = torch::empty({p.B, p.H, p.dh}, o);
    kernels::SLstmBackwardArgs a;
    a.R = ptr(R);
    a.gates = ptr(gates);
    a.cells = ptr(cells);
    a.dh = ptr(dy);
    a.c0 = ptr(c0);
    a.n0 = ptr(n0);
    a.m0 = ptr(m0);
    a.dhT = ptr(dhT);
    a.dcT = ptr(dcT);
    a.dnT = ptr(dnT);
    a.dpre = mut(dpre);
    a.dh0 = mut(dh0);
    a.dc0 = mut(dc0);
    a.dn0 = mut(dn0);
    a.dm0 = mut(dm0);
    check_launch(kernels::slstm_backward(p, a, stream_of(gates)));
    // dR_h = Σ_{b,t} h_{t-1}ᵀ dpre_t, as one small matmul per (b, h) summed over b: as a single product over
    // all B T rows cuBLAS picked a kernel that took 1.2 ms at B256 T128 H4 dh32 (H200).
    auto h_prev = torch::cat({h0.unsqueeze(1), h.narrow(1, 0, p.T - 1)}, 1).permute({0, 2, 3, 1});  // [B, H, dh, T]
    auto dR = torch::matmul(h_prev, dpre.view({p.B, p.T, p.H, 4 * p.dh}).permute({0, 2, 1, 3})).sum(0);
    return {dpre, dR, dh0, dc0, dn0, dm0};
  }
};
#endif

}  // namespace

SLstmOut slstm(const torch::Tensor& pre, const torch::Tensor& R, const SLstmState& init, Kernels kernels) {
  MEMLAB_PROFILED_OP("memlab::slstm");
  std::string why;
#ifdef MEMLAB_CUDA_KERNELS
  if (slstm_kernel_applies(pre, kernels, &why) && pre.size(1) > 0) {
    AutocastOff no_autocast;
    auto pre32 = f32(pre), R32 = f32(R);
    SLstmState s0{f32(init.h), f32(init.c), f32(init.n), f32(init.m)};
    if (!recorded({pre, R, init.h, init.c, init.n, init.m})) {
      c10::cuda::CUDAGuard guard(pre.device());
      auto f = forward_kernel(pre32, R32, s0, false);
      return {f.h.to(pre.scalar_type()), {f.hT, f.cT, f.nT, f.mT}};
    }
    // autograd's inputs must be defined: zeros, which the kernel treats as the fresh state it is
    if (!s0.h.defined()) s0 = slstm_zero_state(pre.size(0), pre.size(2), pre.size(4), pre32.options());
    auto out = SLstmFunction::apply(pre32, R32, s0.h, s0.c, s0.n, s0.m);
    return {out[0].to(pre.scalar_type()), {out[1], out[2], out[3], out[4]}};
  }
#else
  slstm_kernel_applies(pre, kernels, &why);
#endif
  if (kernels == Kernels::Cuda && pre.size(1) > 0) throw UserError("model.kernels=cuda: no sLSTM kernel for this call: " + why);
  return slstm_forward(pre, R, init);
}

torch::Tensor slstm_step(const torch::Tensor& pre_t, const torch::Tensor& R, SLstmState& state, Kernels kernels) {
  // The kernel is the sequence's with T = 1 (which says why not when model.kernels=cuda cannot run it).
  if (kernels == Kernels::Cuda || slstm_kernel_applies(pre_t.unsqueeze(1), kernels)) {
    auto out = slstm(pre_t.unsqueeze(1), R, state, kernels);
    state = out.state;
    return out.h.squeeze(1);
  }
  return step_tensor_ops(pre_t, R, state);
}

}  // namespace memlab
