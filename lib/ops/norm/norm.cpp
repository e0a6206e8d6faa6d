#include "ops/norm/norm.h"

#include <fmt/format.h>

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
  auto y = xf * torch::rsqrt(xf.pow(2).mean(-1, true) + eps) * weight.to(ct);
  if (gate.defined()) y = y * torch::silu(gate.to(ct));
  return y.to(x.scalar_type());
}

torch::Tensor layer_norm_reference(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  const auto ct = compute_type(x);
  const int64_t D = x.size(-1), R = weight.dim() == 2 ? weight.size(0) : 1;
  auto y = torch::layer_norm(x.to(ct), {D}, {}, {}, eps);
  return (y.reshape({-1, R, D}) * weight.to(ct).view({1, R, D})).view(x.sizes()).to(x.scalar_type());
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

// What the kernels read: x and the gate contiguous, the weight in fp32; weight and gate undefined where absent
// (given undefined or, as autograd's apply needs them, empty).
struct NormInputs {
  torch::Tensor x, w32, gate;
};

NormInputs prepare(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& gate) {
  auto present = [](const torch::Tensor& t) { return t.defined() && t.numel() > 0; };
  return {x.contiguous(), present(weight) ? weight.to(torch::kFloat).contiguous() : torch::Tensor(),
          present(gate) ? gate.contiguous() : torch::Tensor()};
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
  p.weight_rows = p.has_weight ? static_cast<int>(in.w32.numel() / p.D) : 1;
  p.has_gate = in.gate.defined();
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
  a.y = y.data_ptr();
  check_launch(kernels::row_norm_forward(problem_of(in, eps, kind, out), a, stream_of(in.x)));
  return y;
}

// Inputs: x, the weight, the gate; a missing weight or gate comes as an empty tensor (autograd's apply
// cannot take undefined ones). Settings in saved_data.
class RowNormFunction : public torch::autograd::Function<RowNormFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor weight, torch::Tensor gate,
                               double eps, int64_t kind, int64_t out) {
    c10::cuda::CUDAGuard guard(x.device());
    const auto in = prepare(x, weight, gate);
    ctx->save_for_backward({in.x, in.w32.defined() ? in.w32 : weight, in.gate.defined() ? in.gate : gate});
    ctx->saved_data["eps"] = eps;
    ctx->saved_data["kind"] = kind;
    ctx->saved_data["out"] = out;
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return forward_kernel(in, eps, static_cast<NormKind>(kind), static_cast<torch::ScalarType>(out));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto in = prepare(saved[0], saved[1], saved[2]);  // already prepared: no copies
    const auto &xc = in.x, &w32 = in.w32, &gc = in.gate;
    const variable_list none(6);
    if (!grads[0].defined()) return none;
    c10::cuda::CUDAGuard guard(xc.device());
    auto p = problem_of(in, ctx->saved_data["eps"].toDouble(), static_cast<NormKind>(ctx->saved_data["kind"].toInt()),
                        static_cast<torch::ScalarType>(ctx->saved_data["out"].toInt()));
    auto dy = grads[0].contiguous();
    if (dy.scalar_type() != torch::kFloat && dy.scalar_type() != torch::kBFloat16) dy = dy.to(torch::kFloat);
    p.dy_bf16 = is_bf16(dy);
    auto dx = torch::empty_like(xc);
    auto dgate = gc.defined() ? torch::empty_like(gc) : torch::Tensor();
    auto partial = w32.defined() ? torch::empty({kernels::row_norm_backward_blocks(p.rows, p.D), w32.numel()},
                                                xc.options().dtype(torch::kFloat))
                                 : torch::Tensor();
    kernels::RowNormBackwardArgs a;
    a.x = xc.data_ptr();
    a.gate = gc.defined() ? gc.data_ptr() : nullptr;
    a.dy = dy.data_ptr();
    a.w = ptr(w32);
    a.dx = dx.data_ptr();
    a.dgate = dgate.defined() ? dgate.data_ptr() : nullptr;
    a.dw_partial = mut(partial);
    check_launch(kernels::row_norm_backward(p, a, stream_of(xc)));
    torch::Tensor dw;
    if (partial.defined())
      dw = partial.sum(0).view(w32.sizes()).to(static_cast<torch::ScalarType>(ctx->saved_data["w_dtype"].toInt()));
    return {dx, dw, dgate, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

torch::Tensor norm_kernel(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& gate, double eps,
                          NormKind kind, torch::ScalarType out) {
  AutocastOff no_autocast;
  if (recorded({x, weight, gate})) {
    auto none = torch::empty({0}, x.options());
    return RowNormFunction::apply(x, weight.defined() ? weight : none, gate.defined() ? gate : none, eps,
                                  static_cast<int64_t>(kind), static_cast<int64_t>(out));
  }
  c10::cuda::CUDAGuard guard(x.device());
  return forward_kernel(prepare(x, weight, gate), eps, kind, out);
}
#endif

// Runs the kernel, or returns an undefined tensor after checking that the tensor-op form may run.
torch::Tensor try_kernel(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& gate, double eps,
                         NormKind kind, torch::ScalarType out, Kernels kernels) {
  std::string why;
  bool applies = norm_kernel_applies(x, kernels, &why);
  if (applies && gate.defined() && (gate.sizes() != x.sizes() || (gate.scalar_type() != torch::kFloat &&
                                                                    gate.scalar_type() != torch::kBFloat16))) {
    applies = false;
    why = "a gate of another shape or dtype than x";
  }
  if (applies && weight.defined() && (weight.numel() > 1024 || weight.numel() % x.size(-1) ||
                                      (x.numel() / x.size(-1)) % (weight.numel() / x.size(-1)))) {
    applies = false;
    why = "a weight of more than 1024 elements, or rows that its rows do not tile";
  }
  if (applies && out != torch::kFloat && out != torch::kBFloat16) {
    applies = false;
    why = fmt::format("{} output", c10::toString(out));
  }
#ifdef MEMLAB_CUDA_KERNELS
  if (applies) return norm_kernel(x, weight, gate, eps, kind, out);
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
                         torch::ScalarType out) {
  MEMLAB_PROFILED_OP("memlab::layer_norm");
  if (out == torch::ScalarType::Undefined) out = x.scalar_type();
  auto y = try_kernel(x, weight, torch::Tensor(), eps, NormKind::Layer, out, kernels);
  return y.defined() ? y : layer_norm_reference(x, weight, eps).to(out);
}

torch::Tensor l2_normalize(const torch::Tensor& x, torch::ScalarType out, Kernels kernels, double eps) {
  MEMLAB_PROFILED_OP("memlab::l2_normalize");
  auto y = try_kernel(x, torch::Tensor(), torch::Tensor(), eps, NormKind::L2, out, kernels);
  return y.defined() ? y : l2_normalize_reference(x.to(out), eps);
}

}  // namespace memlab
