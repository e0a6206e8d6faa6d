#include "ops/short_conv/short_conv.h"

#include <fmt/format.h>

#include "core/errors.h"
#include "mixers/ops.h"
#include "ops/kernel_call.h"

#ifdef MEMLAB_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>

#include "ops/short_conv/causal_conv.h"
#endif

namespace memlab {

torch::Tensor short_conv_reference(const torch::Tensor& x, const torch::Tensor& weight, bool silu) {
  namespace F = torch::nn::functional;
  const int64_t K = weight.size(-1);
  auto xt = F::pad(x.transpose(1, 2), F::PadFuncOptions({K - 1, 0}));  // [B, C, K-1+T]
  auto y = torch::conv1d(xt, weight.to(x.scalar_type()), torch::Tensor(), torch::IntArrayRef{1}, torch::IntArrayRef{0},
                         torch::IntArrayRef{1}, weight.size(0))
               .transpose(1, 2);
  return silu ? torch::silu(y) : y;
}

bool short_conv_kernel_applies(const torch::Tensor& x, const torch::Tensor& weight, Kernels kernels,
                               std::string* why) {
  if (auto r = float_kernels_unavailable(x, kernels); !r.empty()) return refuse(why, r);
  const int64_t K = weight.size(-1);
  if (K < 2 || K > 16) return refuse(why, fmt::format("conv size {} (the kernel takes 2 to 16)", K));
  return true;
}

namespace {

#ifdef MEMLAB_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Elements between x's consecutive rows (b, t) where its channels are dense and its rows evenly spaced (a
// column slice of a fused projection, a contiguous tensor), else -1. Strides of size-1 dimensions mean nothing
// (PyTorch ignores them), so T = 1 and B = 1 take the stride that matters.
int64_t row_stride(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  if (C > 1 && x.stride(2) != 1) return -1;
  const int64_t rs = T > 1 ? x.stride(1) : B > 1 ? x.stride(0) : C;
  if (rs < C) return -1;
  if (T > 1 && B > 1 && x.stride(0) != T * rs) return -1;
  return rs;
}

// x as the kernel reads it: as it is where its rows are evenly spaced, else a contiguous copy.
torch::Tensor rows_of(const torch::Tensor& x) { return row_stride(x) >= 0 ? x : x.contiguous(); }

kernels::CausalConvProblem problem_of(const torch::Tensor& x, int64_t K, bool silu) {
  kernels::CausalConvProblem p;
  p.B = static_cast<int>(x.size(0));
  p.T = static_cast<int>(x.size(1));
  p.C = static_cast<int>(x.size(2));
  p.x_row = row_stride(x);  // >= C: x went through rows_of
  p.K = static_cast<int>(K);
  p.silu = silu;
  p.bf16 = x.scalar_type() == torch::kBFloat16;
  return p;
}

// The weight [C, 1, K] as the kernel reads it: [C, K] in fp32.
torch::Tensor kernel_weight(const torch::Tensor& weight) {
  return weight.reshape({weight.size(0), weight.size(-1)}).to(torch::kFloat).contiguous();
}

torch::Tensor forward_kernel(const torch::Tensor& xc, const torch::Tensor& w32, bool silu) {
  auto y = torch::empty(xc.sizes(), xc.options());
  kernels::CausalConvForwardArgs a;
  a.x = xc.data_ptr();
  a.w = w32.data_ptr<float>();
  a.y = y.data_ptr();
  check_launch(kernels::causal_conv_forward(problem_of(xc, w32.size(1), silu), a, stream_of(xc)));
  return y;
}

class ShortConvFunction : public torch::autograd::Function<ShortConvFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor x, torch::Tensor weight, bool silu) {
    c10::cuda::CUDAGuard guard(x.device());
    auto xc = rows_of(x);
    auto w32 = kernel_weight(weight);
    ctx->save_for_backward({xc, w32});
    ctx->saved_data["silu"] = silu;
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return forward_kernel(xc, w32, silu);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    auto &xc = saved[0], &w32 = saved[1];
    if (!grads[0].defined()) return {torch::Tensor(), torch::Tensor(), torch::Tensor()};
    c10::cuda::CUDAGuard guard(xc.device());
    const auto p = problem_of(xc, w32.size(1), ctx->saved_data["silu"].toBool());
    auto dy = grads[0].to(xc.scalar_type()).contiguous();
    auto dx = torch::empty(xc.sizes(), xc.options());
    auto partial = torch::empty({kernels::causal_conv_partial_rows(p), p.C, p.K},
                                xc.options().dtype(torch::kFloat));
    kernels::CausalConvBackwardArgs a;
    a.x = xc.data_ptr();
    a.dy = dy.data_ptr();
    a.w = w32.data_ptr<float>();
    a.dx = dx.data_ptr();
    a.dw_partial = partial.data_ptr<float>();
    check_launch(kernels::causal_conv_backward(p, a, stream_of(xc)));
    auto dw = partial.sum(0).view({p.C, 1, p.K}).to(static_cast<torch::ScalarType>(ctx->saved_data["w_dtype"].toInt()));
    return {dx, dw, torch::Tensor()};
  }
};
#endif

}  // namespace

torch::Tensor short_conv(const torch::Tensor& x, const torch::Tensor& weight, bool silu, Kernels kernels) {
  MEMLAB_PROFILED_OP("memlab::short_conv");
  std::string why;
#ifdef MEMLAB_CUDA_KERNELS
  if (short_conv_kernel_applies(x, weight, kernels, &why)) {
    AutocastOff no_autocast;
    if (!recorded({x, weight})) {
      c10::cuda::CUDAGuard guard(x.device());
      return forward_kernel(rows_of(x), kernel_weight(weight), silu);
    }
    return ShortConvFunction::apply(x, weight, silu);
  }
#else
  short_conv_kernel_applies(x, weight, kernels, &why);
#endif
  // model.kernels=cuda promises the kernel: say why it cannot run rather than fall back silently.
  if (kernels == Kernels::Cuda) throw UserError("model.kernels=cuda: no short-conv kernel for this call: " + why);
  return short_conv_reference(x, weight, silu);
}

}  // namespace memlab
