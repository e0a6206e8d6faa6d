#include "ops/vector_mix/vector_mix.h"

#include "core/errors.h"
#include "mixers/ops.h"
#include "ops/kernel_call.h"

#ifdef MEMLAB_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>

#include "ops/vector_mix/sigmoid_blend.h"
#endif

namespace memlab {

torch::Tensor vector_mix_reference(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& m) {
  const auto ct = compute_type(a);
  auto g = torch::sigmoid(m.to(ct)).view(a.sizes());
  return g * a.to(ct) + (1.0 - g) * b.to(ct);
}

bool vector_mix_kernel_applies(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& m,
                               Kernels kernels, std::string* why) {
  for (const auto* t : {&a, &b, &m})
    if (auto r = float_kernels_unavailable(*t, kernels); !r.empty()) return refuse(why, r);
  if (a.sizes() != b.sizes() || m.numel() != a.numel()) return refuse(why, "inputs of different shapes");
  if (a.device() != b.device() || a.device() != m.device()) return refuse(why, "inputs on different devices");
  return true;
}

namespace {

#ifdef MEMLAB_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

kernels::SigmoidBlendProblem problem_of(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& m) {
  kernels::SigmoidBlendProblem p;
  p.n = a.numel();
  p.a_bf16 = a.scalar_type() == torch::kBFloat16;
  p.b_bf16 = b.scalar_type() == torch::kBFloat16;
  p.m_bf16 = m.scalar_type() == torch::kBFloat16;
  return p;
}

// a, b, m contiguous.
torch::Tensor forward_kernel(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& m) {
  auto o = torch::empty(a.sizes(), a.options().dtype(torch::kFloat));
  kernels::SigmoidBlendForwardArgs x;
  x.a = a.data_ptr();
  x.b = b.data_ptr();
  x.m = m.data_ptr();
  x.o = o.data_ptr<float>();
  check_launch(kernels::sigmoid_blend_forward(problem_of(a, b, m), x, stream_of(a)));
  return o;
}

class VectorMixFunction : public torch::autograd::Function<VectorMixFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor a, torch::Tensor b, torch::Tensor m) {
    c10::cuda::CUDAGuard guard(a.device());
    auto ac = a.contiguous(), bc = b.contiguous(), mc = m.contiguous();
    ctx->save_for_backward({ac, bc, mc});
    return forward_kernel(ac, bc, mc);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &a = saved[0], &b = saved[1], &m = saved[2];
    if (!grads[0].defined()) return {torch::Tensor(), torch::Tensor(), torch::Tensor()};
    c10::cuda::CUDAGuard guard(a.device());
    auto d_o = grads[0].to(torch::kFloat).contiguous();
    auto da = torch::empty_like(a), db = torch::empty_like(b), dm = torch::empty_like(m);
    kernels::SigmoidBlendBackwardArgs x;
    x.a = a.data_ptr();
    x.b = b.data_ptr();
    x.m = m.data_ptr();
    x.d_o = d_o.data_ptr<float>();
    x.da = da.data_ptr();
    x.db = db.data_ptr();
    x.dm = dm.data_ptr();
    check_launch(kernels::sigmoid_blend_backward(problem_of(a, b, m), x, stream_of(a)));
    return {da, db, dm};
  }
};
#endif

}  // namespace

torch::Tensor vector_mix(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& m, Kernels kernels) {
  MEMLAB_PROFILED_OP("memlab::vector_mix");
  std::string why;
#ifdef MEMLAB_CUDA_KERNELS
  if (vector_mix_kernel_applies(a, b, m, kernels, &why)) {
    AutocastOff no_autocast;
    if (!recorded({a, b, m})) {
      c10::cuda::CUDAGuard guard(a.device());
      return forward_kernel(a.contiguous(), b.contiguous(), m.contiguous());
    }
    return VectorMixFunction::apply(a, b, m);
  }
#else
  vector_mix_kernel_applies(a, b, m, kernels, &why);
#endif
  // model.kernels=cuda promises the kernel: say why it cannot run rather than fall back silently.
  if (kernels == Kernels::Cuda) throw UserError("model.kernels=cuda: no vector-mixing kernel for this call: " + why);
  return vector_mix_reference(a, b, m);
}

}  // namespace memlab
