// SwiGLU's gating: the tensor-op form against an element-by-element loop, the fused kernel's per-thread code
// (run on the CPU, as silu_mul.h offers) against the tensor-op form's autograd, the fused gate-and-up
// projection against two linear layers, and the CUDA form refused on the CPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "mixers/ops.h"
#include "ops/swiglu/swiglu.h"
#include "tests/mixer_check.h"

#ifdef MEMLAB_CUDA_KERNELS
#include "ops/swiglu/silu_mul.h"
#endif

using namespace memlab;
using memlab::testing::rel_err;

namespace {

TEST(Swiglu, ReferenceMatchesDirectLoop) {
  torch::manual_seed(0);
  auto gu = torch::randn({3, 5, 14}, torch::kDouble);
  auto h = swiglu_reference(gu);
  ASSERT_EQ(h.sizes(), (std::vector<int64_t>{3, 5, 7}));
  auto ga = gu.accessor<double, 3>();
  auto ha = h.accessor<double, 3>();
  for (int64_t b = 0; b < 3; ++b)
    for (int64_t t = 0; t < 5; ++t)
      for (int64_t i = 0; i < 7; ++i) {
        const double g = ga[b][t][i], u = ga[b][t][7 + i];
        EXPECT_NEAR(ha[b][t][i], g / (1 + std::exp(-g)) * u, 1e-12);
      }
}

TEST(Swiglu, KernelCodeOnHostMatchesReference) {
#ifndef MEMLAB_CUDA_KERNELS
  GTEST_SKIP() << "memlab was built without nvcc (no kernels)";
#else
  torch::manual_seed(1);
  for (int64_t inner : {1, 3, 8, 37}) {
    auto gu = (torch::randn({6, 2 * inner}, torch::kDouble) * 3).requires_grad_(true);
    auto dh = torch::randn({6, inner}, torch::kDouble);
    auto h_ref = swiglu_reference(gu);
    auto dgu_ref = torch::autograd::grad({(h_ref * dh).sum()}, {gu})[0];
    kernels::SiluMulProblem p;
    p.rows = 6;
    p.inner = inner;
    auto guf = gu.detach().to(torch::kFloat).contiguous(), dhf = dh.to(torch::kFloat).contiguous();
    auto h = torch::empty({6, inner}), dgu = torch::empty({6, 2 * inner});
    kernels::SiluMulForwardArgs fa;
    fa.gu = guf.data_ptr();
    fa.h = h.data_ptr();
    ASSERT_EQ(kernels::silu_mul_forward_host(p, fa), "");
    kernels::SiluMulBackwardArgs ba;
    ba.gu = guf.data_ptr();
    ba.dh = dhf.data_ptr();
    ba.dgu = dgu.data_ptr();
    ASSERT_EQ(kernels::silu_mul_backward_host(p, ba), "");
    EXPECT_LT(rel_err(h, h_ref), 1e-6) << "inner " << inner;
    EXPECT_LT(rel_err(dgu, dgu_ref), 1e-6) << "inner " << inner;
  }
  kernels::SiluMulProblem bad;
  bad.rows = -1;
  EXPECT_NE(kernels::silu_mul_forward_host(bad, {}), "");
#endif
}

// One matmul on the concatenated weights equals the separate layers, outputs and every gradient.
TEST(Swiglu, FusedProjectionMatchesSeparateLayers) {
  torch::manual_seed(2);
  auto a = Linear(6, 4);
  auto b = Linear(6, 3);
  a->to(torch::kDouble);
  b->to(torch::kDouble);
  auto x = torch::randn({2, 5, 6}, torch::kDouble).requires_grad_(true);
  auto parts = fused_linear(x, {a, b});
  auto da = torch::randn({2, 5, 4}, torch::kDouble), db = torch::randn({2, 5, 3}, torch::kDouble);
  auto fused = torch::autograd::grad({(parts[0] * da).sum() + (parts[1] * db).sum()}, {x, a->weight, b->weight});
  auto ya = a(x), yb = b(x);
  auto sep = torch::autograd::grad({(ya * da).sum() + (yb * db).sum()}, {x, a->weight, b->weight});
  EXPECT_LT(rel_err(parts[0], ya), 1e-12);
  EXPECT_LT(rel_err(parts[1], yb), 1e-12);
  for (int i = 0; i < 3; ++i) EXPECT_LT(rel_err(fused[i], sep[i]), 1e-12) << "gradient " << i;
}

TEST(Swiglu, CudaFormOnCpuIsRefused) {
  auto gu = torch::randn({4, 6});
  EXPECT_THROW(swiglu(gu, Kernels::Cuda), std::exception);
  EXPECT_LT(rel_err(swiglu(gu, Kernels::Auto), swiglu_reference(gu)), 1e-12);
}

}  // namespace
