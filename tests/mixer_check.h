#pragma once
// Shared checks for mixer tests: every form of a mixer (training, plain recurrence, step) must agree.
#include <gtest/gtest.h>
#include <cmath>
#include <torch/torch.h>

#include <map>
#include <string>

#include "core/config.h"
#include "mixers/mixer.h"
#include "mixers/ops.h"
#include "ops/kernels.h"
#include "train/trainer.h"

// GPU tests of fused kernels: skipped, with the reason, without kernels or without a CUDA device.
#define SKIP_WITHOUT_KERNELS()                                                        \
  do {                                                                                \
    if (!kernels_built()) GTEST_SKIP() << "memlab was built without nvcc (no kernels)"; \
    if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";               \
  } while (0)

namespace memlab::testing {

// The schema's defaults, the model the CLI trains unless told otherwise: tests build mixer options from them
// (deltanet_options(default_config()), ...) and change what they test.
inline const Config& default_config() {
  static const Config c(full_schema());
  return c;
}

// Whether AdamW decays each parameter of `m`, by its name.
inline std::map<std::string, bool> decays_by_name(torch::nn::Module& m) {
  std::map<std::string, bool> out;
  const auto mask = weight_decay_mask(m);
  size_t i = 0;
  for (const auto& p : m.named_parameters()) out[p.key()] = mask.at(i++);
  return out;
}

// Scoped: no TF32 in cuDNN or cuBLAS, so fp32 GPU forms compare at fp32 tolerances.
class NoTf32 {
 public:
  NoTf32() : cudnn_(at::globalContext().allowTF32CuDNN()), cublas_(at::globalContext().allowTF32CuBLAS()) {
    at::globalContext().setAllowTF32CuDNN(false);
    at::globalContext().setAllowTF32CuBLAS(false);
  }
  ~NoTf32() {
    at::globalContext().setAllowTF32CuDNN(cudnn_);
    at::globalContext().setAllowTF32CuBLAS(cublas_);
  }

 private:
  bool cudnn_, cublas_;
};

inline double rel_err(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a.to(torch::kDouble) - b.to(torch::kDouble)).norm() / (b.to(torch::kDouble).norm() + 1e-30)).item<double>();
}

// g against its reference: relatively within tol, or, where the reference is exactly 0 (a gradient that cancels,
// such as q's and k's when a query reads only its own key), absolutely within zero_tol: then only rounding is left.
inline void expect_close_or_zero(const torch::Tensor& g, const torch::Tensor& ref, double tol, double zero_tol,
                                 const ::testing::Message& what) {
  if (ref.norm().item<double>() == 0)
    EXPECT_LT(g.to(torch::kDouble).norm().item<double>(), zero_tol) << what;
  else
    EXPECT_LT(rel_err(g, ref), tol) << what;
}

// Under bf16 autocast a kernel form and the tensor-op form round at different places, and neither is the truth:
// each is measured against the fp32 tensor-op form. The kernels' own accuracy is tested against fp64 elsewhere;
// this catches a wrong dtype or layout in a mixer, which costs errors of order 1. The factor 3 leaves room for a
// solver amplifying rounding differences (Mesa's CG on random weights: 0.13 kernel form vs 0.045 tensor ops on
// an H200; every other mixer passed 1.5 x + 0.01).
inline void expect_bf16_no_worse(const std::vector<torch::Tensor>& kernel, const std::vector<torch::Tensor>& tensor_ops,
                                 const std::vector<torch::Tensor>& fp32, const std::string& what) {
  ASSERT_EQ(kernel.size(), fp32.size());
  ASSERT_EQ(tensor_ops.size(), fp32.size());
  for (size_t i = 0; i < fp32.size(); ++i) {
    const double ek = rel_err(kernel[i], fp32[i]), et = rel_err(tensor_ops[i], fp32[i]);
    EXPECT_LE(ek, 3 * et + 2e-2) << what << " tensor " << i << ": bf16 kernel form " << ek << ", bf16 tensor ops "
                                   << et << " from fp32";
  }
}

// The output (in fp32), then every parameter's gradient of sum(output²), with `forward` run under bf16 autocast
// when asked.
template <typename Forward>
std::vector<torch::Tensor> output_and_grads(torch::nn::Module& m, bool bf16, Forward&& forward) {
  torch::Tensor y;
  {
    Bf16Autocast autocast(bf16);
    y = forward();
  }
  y.to(torch::kFloat).pow(2).sum().backward();
  std::vector<torch::Tensor> g{y.detach().to(torch::kFloat)};
  for (auto& p : m.parameters()) g.push_back(p.grad().clone());
  return g;
}

// A module's kernel form against its tensor-op form, from grads_of(kernels, bf16) (output_and_grads of a module
// built afresh with the same weights): in fp32 within tol32, and under bf16 autocast no less accurate. Returns
// the kernel form's fp32 results.
template <typename GradsOf>
std::vector<torch::Tensor> expect_kernel_form_matches(GradsOf&& grads_of, const std::string& what,
                                                      double tol32 = 1e-4) {
  auto fp32 = grads_of(false, false), k32 = grads_of(true, false);
  EXPECT_EQ(k32.size(), fp32.size()) << what;
  for (size_t i = 0; i < fp32.size() && i < k32.size(); ++i)
    EXPECT_LT(rel_err(k32[i], fp32[i]), tol32) << what << " fp32 tensor " << i;
  expect_bf16_no_worse(grads_of(true, true), grads_of(false, true), fp32, what);
  return k32;
}

// The step form over x [B, T, D]: from init_state, or from init_fixed_state with room for `capacity` steps (> 0).
inline torch::Tensor run_steps(MixerImpl& m, const torch::Tensor& x, int64_t capacity = 0,
                               MixerState* final_state = nullptr) {
  auto st = capacity > 0 ? m.init_fixed_state(x.size(0), x.options(), capacity) : m.init_state(x.size(0), x.options());
  std::vector<torch::Tensor> ys;
  for (int64_t t = 0; t < x.size(1); ++t) ys.push_back(m.step(x.select(1, t), st));
  if (final_state) *final_state = st;
  return torch::stack(ys, 1);
}

// The fixed-shape step (init_fixed_state, room for T and for T + 5 steps) against the dynamic one: outputs, and
// the final states. A state that grows in the dynamic form (attention's [B, H, n, d] cache) is compared with the
// fixed one's slots T - n .. T - 1 along dim 2.
inline void check_fixed_step(MixerImpl& m, const torch::Tensor& x, double tol) {
  torch::NoGradGuard ng;
  const int64_t T = x.size(1);
  MixerState dyn, fixed;
  const auto y = run_steps(m, x, 0, &dyn);
  for (int64_t capacity : {T, T + 5}) {
    EXPECT_LT(rel_err(run_steps(m, x, capacity, &fixed), y), tol) << "fixed-shape step, capacity " << capacity;
    ASSERT_EQ(fixed.tensors.size(), dyn.tensors.size());
    for (size_t i = 0; i < dyn.tensors.size(); ++i) {
      auto f = fixed.tensors[i];
      const auto& d = dyn.tensors[i];
      if (f.sizes() != d.sizes() && f.dim() == 4 && d.dim() == 4) f = f.narrow(2, T - d.size(2), d.size(2));
      ASSERT_EQ(f.sizes(), d.sizes()) << "state " << i;
      EXPECT_LT(rel_err(f, d), tol) << "state " << i << ", capacity " << capacity;
    }
    if (fixed.position.defined()) EXPECT_EQ(fixed.position.item<int64_t>(), T);
  }
}

// Compare forward / reference / step outputs and d(loss)/dx of forward vs reference, in fp32 (tolerance
// 1e-4; parameter gradients 1e-3, since they sum over the batch) and in fp64 (tol64: 1e-9 where the forms
// are algebraically exact; an iterative solver may need more).
inline void check_mixer(MixerImpl& m, int64_t B, int64_t T, int64_t D, torch::ScalarType dt, double tol64 = 1e-9) {
  const double tol = dt == torch::kDouble ? tol64 : 1e-4, ptol = dt == torch::kDouble ? tol64 : 1e-3;
  m.to(dt);
  torch::manual_seed(1000 + T);
  auto x = torch::randn({B, T, D}, torch::dtype(dt)).requires_grad_(true);
  auto w = torch::randn({B, T, D}, torch::dtype(dt));
  auto y = m.forward(x);
  auto y_ref = m.forward_reference(x);
  auto y_step = run_steps(m, x.detach());
  check_fixed_step(m, x.detach(), tol);
  ASSERT_TRUE(torch::isfinite(y).all().item<bool>());
  EXPECT_LT(rel_err(y, y_ref), tol) << "T=" << T;
  EXPECT_LT(rel_err(y_step, y_ref), tol) << "T=" << T;
  auto g = torch::autograd::grad({(y * w).sum()}, {x})[0];
  auto g_ref = torch::autograd::grad({(y_ref * w).sum()}, {x})[0];
  ASSERT_TRUE(torch::isfinite(g).all().item<bool>());
  EXPECT_LT(rel_err(g, g_ref), tol) << "T=" << T;
  // parameter gradients too
  m.zero_grad();
  (m.forward(x.detach()) * w).sum().backward();
  // A parameter that one form never touches (e.g. a gate whose input is still empty) has gradient zero.
  auto grad_of = [](const torch::Tensor& p) { return p.grad().defined() ? p.grad().clone() : torch::zeros_like(p); };
  std::vector<torch::Tensor> gp;
  for (auto& p : m.parameters()) gp.push_back(grad_of(p));
  m.zero_grad();
  (m.forward_reference(x.detach()) * w).sum().backward();
  // A gradient that is zero in exact arithmetic (q/k weights of attention at T=1, say) holds rounding noise
  // whose size depends on the CPU's kernels, so errors are measured against at least a small fraction of
  // the whole model's gradient norm.
  std::vector<torch::Tensor> ref;
  for (auto& p : m.parameters()) ref.push_back(grad_of(p).to(torch::kDouble));
  double total = 0;
  for (auto& r : ref) total += r.square().sum().item<double>();
  const double floor = std::sqrt(total) * (dt == torch::kDouble ? 1e-6 : 1e-3);
  for (size_t i = 0; i < ref.size(); ++i) {
    ASSERT_TRUE(torch::isfinite(gp[i]).all().item<bool>());
    const double err = (gp[i].to(torch::kDouble) - ref[i]).norm().item<double>() / (ref[i].norm().item<double>() + floor);
    EXPECT_LT(err, ptol) << "param " << i << " T=" << T;
  }
  m.zero_grad();
  m.to(torch::kFloat);
}

inline void check_both(MixerImpl& m, int64_t B, int64_t T, int64_t D, double tol64 = 1e-9) {
  check_mixer(m, B, T, D, torch::kFloat);
  check_mixer(m, B, T, D, torch::kDouble, tol64);
}

inline void randomize(torch::nn::Module& m, double std = 0.3) {
  torch::NoGradGuard ng;
  for (auto& p : m.parameters()) p.normal_(0.0, std);
}

// A layer built twice by make(cfg, shape) with the same weights (manual_seed(seed), then randomize), once with
// model.kernels=cuda and once with torch, on the GPU, run on the same x: both outputs and x's gradients of
// sum(y²); the modules keep their parameters' gradients.
template <typename M>
struct LayerForms {
  std::shared_ptr<M> fast, ref;
  torch::Tensor y_fast, y_ref, dx_fast, dx_ref;
};
template <typename M, typename Make>
LayerForms<M> layer_forms(Make&& make, const MixerShape& shape, const torch::Tensor& x, uint64_t seed) {
  Config cfg(full_schema());
  auto build = [&](const char* kernels) {
    cfg.set_value("model.kernels", kernels, "test");
    torch::manual_seed(seed);
    auto m = std::dynamic_pointer_cast<M>(make(cfg, shape));
    randomize(*m);
    m->to(torch::kCUDA);
    return m;
  };
  LayerForms<M> f{build("cuda"), build("torch")};
  auto xf = x.clone().requires_grad_(true), xr = x.clone().requires_grad_(true);
  f.y_fast = f.fast->forward(xf);
  f.y_ref = f.ref->forward(xr);
  f.y_fast.pow(2).sum().backward();
  f.y_ref.pow(2).sum().backward();
  f.dx_fast = xf.grad();
  f.dx_ref = xr.grad();
  return f;
}

}  // namespace memlab::testing
