#include "ops/norm/norm.h"

#include <fmt/format.h>

#include <limits>

#include "core/errors.h"
#include "mixers/ops.h"
#include "ops/kernel_call.h"

#ifdef MEMLAB_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>

#include "ops/norm/row_norm.h"
#endif

namespace memlab {

torch::Tensor rms_norm_reference(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                                 const torch::Tensor& gate) {
  const auto ct = compute_type(x);
  auto xf = x.to(ct);
  auto y = xf * torch::rsqrt(xf.pow(2).mean(-1, true) + eps);
  if (weight.dim() == 2) {  // a weight row per head: row r of x takes row r mod R
    const int64_t R = weight.size(0), D = x.size(-1);
    y = (y.reshape({-1, R, D}) * weight.to(ct).view({1, R, D})).view(x.sizes());
  } else {
    y = y * weight.to(ct);
  }
  if (gate.defined()) y = y * torch::silu(gate.to(ct));
  return y.to(x.scalar_type());
}

torch::Tensor layer_norm_reference(const torch::Tensor& x, const torch::Tensor& weight, double eps,
                                   const torch::Tensor& gate, const NormSkip& skip) {
  const auto ct = compute_type(x);
  const int64_t D = x.size(-1), R = weight.dim() == 2 ? weight.size(0) : 1;
  auto y = torch::layer_norm(x.to(ct), {D}, {}, {}, eps).reshape({-1, R, D}) * weight.to(ct).view({1, R, D});
  if (skip.defined()) y = y + skip.s.to(ct).view({1, R, D}) * skip.r.to(ct).reshape({-1, R, D});
  y = y.view(x.sizes());
  if (gate.defined()) y = y * torch::silu(gate.to(ct));
  return y.to(x.scalar_type());
}

torch::Tensor l2_normalize_reference(const torch::Tensor& x, double eps) {
  return x * torch::rsqrt(x.pow(2).sum(-1, true) + eps);
}

bool norm_kernel_applies(const torch::Tensor& x, Kernels kernels, std::string* why) {
  if (auto r = float_kernels_unavailable(x, kernels); !r.empty()) return refuse(why, r);
  if (x.dim() == 0 || x.size(-1) < 1 || x.size(-1) > 1024)
    return refuse(why, fmt::format("rows of {} (the kernel takes 1 to 1024)", x.dim() ? x.size(-1) : 0));
  return true;
}

namespace {

enum class NormKind { Rms, L2, Layer };

#ifdef MEMLAB_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool is_bf16(const torch::Tensor& t) { return t.scalar_type() == torch::kBFloat16; }

// What the kernels read: x, the gate and the skip input r contiguous, the weights in fp32; those absent undefined
// (given undefined or, as autograd's apply needs them, empty).
struct NormInputs {
  torch::Tensor x, w32, gate, s32, r;
};

NormInputs prepare(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& gate,
                   const torch::Tensor& s = {}, const torch::Tensor& r = {}) {
  auto present = [](const torch::Tensor& t) { return t.defined() && t.numel() > 0; };
  auto fp32 = [&](const torch::Tensor& t) { return present(t) ? t.to(torch::kFloat).contiguous() : torch::Tensor(); };
  return {x.contiguous(), fp32(weight), present(gate) ? gate.contiguous() : torch::Tensor(), fp32(s),
          present(r) ? r.contiguous() : torch::Tensor()};
}

// Everything but the pointers.
kernels::RowNormProblem problem_of(const NormInputs& in, double eps, NormKind kind, torch::ScalarType out) {
  kernels::RowNormProblem p;
  p.D = static_cast<int>(in.x.size(-1));
  p.rows = in.x.numel() / p.D;
  p.eps = static_cast<float>(eps);
  p.mean = kind != NormKind::L2;
  p.centre = kind == NormKind::Layer;
  p.has_weight = in.w32.defined();
  p.has_skip = in.s32.defined();
  p.weight_rows = p.has_weight ? static_cast<int>(in.w32.numel() / p.D)
                               : p.has_skip ? static_cast<int>(in.s32.numel() / p.D) : 1;
  p.has_gate = in.gate.defined();
  p.r_bf16 = in.r.defined() && is_bf16(in.r);
  p.x_bf16 = is_bf16(in.x);
  p.gate_bf16 = in.gate.defined() && is_bf16(in.gate);
  p.y_bf16 = out == torch::kBFloat16;
  return p;
}

torch::Tensor forward_kernel(const NormInputs& in, double eps, NormKind kind, torch::ScalarType out) {
  auto y = torch::empty(in.x.sizes(), in.x.options().dtype(out));
  kernels::RowNormForwardArgs a;
  a.x = in.x.data_ptr();
  a.w = ptr(in.w32);
  a.gate = in.gate.defined() ? in.gate.data_ptr() : nullptr;
  a.s = ptr(in.s32);
  a.r = in.r.defined() ? in.r.data_ptr() : nullptr;
  a.y = y.data_ptr();
  check_launch(kernels::row_norm_forward(problem_of(in, eps, kind, out), a, stream_of(in.x)));
  return y;
}

// Inputs: x, the weight, the gate, the skip weight s and input r; a missing one comes as an empty tensor
// (autograd's apply cannot take undefined ones). Settings in saved_data.
class RowNormFunction : public torch::autograd::Function<RowNormFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor weight, torch::Tensor gate,
                               torch::Tensor s, torch::Tensor r, double eps, int64_t kind, int64_t out) {
    c10::cuda::CUDAGuard guard(x.device());
    const auto in = prepare(x, weight, gate, s, r);
    ctx->save_for_backward({in.x, in.w32.defined() ? in.w32 : weight, in.gate.defined() ? in.gate : gate,
                            in.s32.defined() ? in.s32 : s, in.r.defined() ? in.r : r});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["kind"] = kind;
    ctx->saved_data["out"] = out;
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["s_dtype"] = static_cast<int64_t>(s.scalar_type());
    return forward_kernel(in, eps, static_cast<NormKind>(kind), static_cast<torch::ScalarType>(out));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto in = prepare(saved[0], saved[1], saved[2], saved[3], saved[4]);  // already prepared: no copies
    const auto &xc = in.x, &w32 = in.w32, &gc = in.gate, &s32 = in.s32, &rc = in.r;
    const variable_list none(8);
    if (!grads[0].defined()) return none;
    c10::cuda::CUDAGuard guard(xc.device());
    auto p = problem_of(in, ctx->saved_data["eps"].toDouble(), static_cast<NormKind>(ctx->saved_data["kind"].toInt()),
                        static_cast<torch::ScalarType>(ctx->saved_data["out"].toInt()));
    auto dy = grads[0].contiguous();
    if (dy.scalar_type() != torch::kFloat && dy.scalar_type() != torch::kBFloat16) dy = dy.to(torch::kFloat);
    p.dy_bf16 = is_bf16(dy);
    auto dx = torch::empty_like(xc);
    auto dgate = gc.defined() ? torch::empty_like(gc) : torch::Tensor();
    auto dr = rc.defined() ? torch::empty_like(rc) : torch::Tensor();
    auto partials = [&](const torch::Tensor& w) {
      return w.defined() ? torch::empty({kernels::row_norm_backward_blocks(p), w.numel()},
                                        xc.options().dtype(torch::kFloat))
                         : torch::Tensor();
    };
    auto dw_partial = partials(w32), ds_partial = partials(s32);
    kernels::RowNormBackwardArgs a;
    a.x = xc.data_ptr();
    a.gate = gc.defined() ? gc.data_ptr() : nullptr;
    a.dy = dy.data_ptr();
    a.w = ptr(w32);
    a.s = ptr(s32);
    a.r = rc.defined() ? rc.data_ptr() : nullptr;
    a.dx = dx.data_ptr();
    a.dgate = dgate.defined() ? dgate.data_ptr() : nullptr;
    a.dr = dr.defined() ? dr.data_ptr() : nullptr;
    a.dw_partial = mut(dw_partial);
    a.ds_partial = mut(ds_partial);
    check_launch(kernels::row_norm_backward(p, a, stream_of(xc)));
    auto reduce = [&](const torch::Tensor& partial, const torch::Tensor& w, const char* dtype) {
      if (!partial.defined()) return torch::Tensor();
      return partial.sum(0).view(w.sizes()).to(static_cast<torch::ScalarType>(ctx->saved_data[dtype].toInt()));
    };
    return {dx,  reduce(dw_partial, w32, "w_dtype"), dgate, reduce(ds_partial, s32, "s_dtype"), dr, torch::Tensor(),
            torch::Tensor(), torch::Tensor()};
  }
};

torch::Tensor norm_kernel(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& gate,
                          const NormSkip& skip, double eps, NormKind kind, torch::ScalarType out) {
  AutocastOff no_autocast;
  if (recorded({x, weight, gate, skip.s, skip.r})) {
    auto none = torch::empty({0}, x.options());
    auto given = [&](const torch::Tensor& t) { return t.defined() ? t : none; };
    return RowNormFunction::apply(x, given(weight), given(gate), given(skip.s), given(skip.r), eps,
                                  static_cast<int64_t>(kind), static_cast<int64_t>(out));
  }
  c10::cuda::CUDAGuard guard(x.device());
  return forward_kernel(prepare(x, weight, gate, skip.s, skip.r), eps, kind, out);
}
#endif

// Whether x's rows can take weight w (fp32 or not), one row per group: w has whole rows of x's length, and their
// number divides x's row count.
bool tiles_rows(const torch::Tensor& w, const torch::Tensor& x) {
  const int64_t D = x.size(-1);
  return w.numel() % D == 0 && w.numel() > 0 && (x.numel() / D) % (w.numel() / D) == 0;
}

bool float_like(const torch::Tensor& t, const torch::Tensor& x) {
  return t.sizes() == x.sizes() && (t.scalar_type() == torch::kFloat || t.scalar_type() == torch::kBFloat16);
}

// Runs the kernel, or returns an undefined tensor after checking that the tensor-op form may run.
torch::Tensor try_kernel(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& gate, double eps,
                         NormKind kind, torch::ScalarType out, Kernels kernels, const NormSkip& skip = {}) {
  std::string why;
  bool applies = norm_kernel_applies(x, kernels, &why);
  if (applies && gate.defined() && !float_like(gate, x)) {
    applies = false;
    why = "a gate of another shape or dtype than x";
  }
  if (applies && weight.defined() && !tiles_rows(weight, x)) {
    applies = false;
    why = "a weight whose rows do not tile x's rows";
  }
  if (applies && skip.defined() &&
      (!float_like(skip.r, x) || !tiles_rows(skip.s, x) ||
       (weight.defined() && weight.numel() != skip.s.numel()))) {
    applies = false;
    why = "a skip term whose input is not shaped as x, or whose weight is not shaped as the norm's";
  }
  if (applies && out != torch::kFloat && out != torch::kBFloat16) {
    applies = false;
    why = fmt::format("{} output", c10::toString(out));
  }
#ifdef MEMLAB_CUDA_KERNELS
  if (applies) return norm_kernel(x, weight, gate, skip, eps, kind, out);
#endif
  // model.kernels=cuda promises the kernel: say why it cannot run rather than fall back silently.
  if (kernels == Kernels::Cuda) throw UserError("model.kernels=cuda: no norm kernel for this call: " + why);
  return {};
}

}  // namespace

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps, Kernels kernels,
                       const torch::Tensor& gate, torch::ScalarType out) {
  MEMLAB_PROFILED_OP("memlab::rms_norm");
  if (out == torch::ScalarType::Undefined) out = x.scalar_type();
  auto y = try_kernel(x, weight, gate, eps, NormKind::Rms, out, kernels);
  return y.defined() ? y : rms_norm_reference(x, weight, eps, gate).to(out);
}

torch::Tensor layer_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps, Kernels kernels,
                         torch::ScalarType out, const torch::Tensor& gate, const NormSkip& skip) {
  MEMLAB_PROFILED_OP("memlab::layer_norm");
  if (out == torch::ScalarType::Undefined) out = x.scalar_type();
  auto y = try_kernel(x, weight, gate, eps, NormKind::Layer, out, kernels, skip);
  return y.defined() ? y : layer_norm_reference(x, weight, eps, gate, skip).to(out);
}

torch::Tensor l2_normalize(const torch::Tensor& x, torch::ScalarType out, Kernels kernels, double eps) {
  MEMLAB_PROFILED_OP("memlab::l2_normalize");
  auto y = try_kernel(x, torch::Tensor(), torch::Tensor(), eps, NormKind::L2, out, kernels);
  return y.defined() ? y : l2_normalize_reference(x.to(out), eps);
}

}  // namespace memlab
