#include "ops/swiglu/swiglu.h"

#include "core/errors.h"
#include "mixers/ops.h"
#include "ops/kernel_call.h"

#ifdef MEMLAB_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>

#include "ops/swiglu/silu_mul.h"
#endif

namespace memlab {

torch::Tensor swiglu_reference(const torch::Tensor& gu) {
  auto parts = gu.chunk(2, -1);
  return torch::silu(parts[0]) * parts[1];
}

bool swiglu_kernel_applies(const torch::Tensor& gu, Kernels kernels, std::string* why) {
  if (auto r = float_kernels_unavailable(gu, kernels); !r.empty()) return refuse(why, r);
  if (gu.dim() == 0 || gu.size(-1) % 2) return refuse(why, "an odd number of columns");
  return true;
}

namespace {

#ifdef MEMLAB_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

kernels::SiluMulProblem problem_of(const torch::Tensor& gu) {
  kernels::SiluMulProblem p;
  p.inner = gu.size(-1) / 2;
  p.rows = p.inner ? gu.numel() / (2 * p.inner) : 0;
  p.bf16 = gu.scalar_type() == torch::kBFloat16;
  return p;
}

torch::Tensor forward_kernel(const torch::Tensor& guc) {
  auto sizes = guc.sizes().vec();
  sizes.back() /= 2;
  auto h = torch::empty(sizes, guc.options());
  kernels::SiluMulForwardArgs a;
  a.gu = guc.data_ptr();
  a.h = h.data_ptr();
  check_launch(kernels::silu_mul_forward(problem_of(guc), a, stream_of(guc)));
  return h;
}

class SwigluFunction : public torch::autograd::Function<SwigluFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor gu) {
    c10::cuda::CUDAGuard guard(gu.device());
    auto guc = gu.contiguous();
    ctx->save_for_backward({guc});
    return forward_kernel(guc);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto guc = ctx->get_saved_variables()[0];
    if (!grads[0].defined()) return {torch::Tensor()};
    c10::cuda::CUDAGuard guard(guc.device());
    auto dh = grads[0].to(guc.scalar_type()).contiguous();
    auto dgu = torch::empty_like(guc);
    kernels::SiluMulBackwardArgs a;
    a.gu = guc.data_ptr();
    a.dh = dh.data_ptr();
    a.dgu = dgu.data_ptr();
    check_launch(kernels::silu_mul_backward(problem_of(guc), a, stream_of(guc)));
    return {dgu};
  }
};
#endif

}  // namespace

torch::Tensor swiglu(const torch::Tensor& gu, Kernels kernels) {
  MEMLAB_PROFILED_OP("memlab::swiglu");
  std::string why;
#ifdef MEMLAB_CUDA_KERNELS
  if (swiglu_kernel_applies(gu, kernels, &why)) {
    AutocastOff no_autocast;
    if (!recorded({gu})) {
      c10::cuda::CUDAGuard guard(gu.device());
      return forward_kernel(gu.contiguous());
    }
    return SwigluFunction::apply(gu);
  }
#else
  swiglu_kernel_applies(gu, kernels, &why);
#endif
  // model.kernels=cuda promises the kernel: say why it cannot run rather than fall back silently.
  if (kernels == Kernels::Cuda) throw UserError("model.kernels=cuda: no SwiGLU kernel for this call: " + why);
  return swiglu_reference(gu);
}

}  // namespace memlab
