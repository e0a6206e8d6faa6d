// The norms' tensor-op forms (the references the fused kernel is tested against) against the formulas written
// out element by element, and their dispatch on the CPU: auto runs the tensor ops, cuda says why it cannot.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "core/errors.h"
#include "ops/norm/norm.h"
#include "tests/mixer_check.h"

using namespace memlab;
using memlab::testing::rel_err;

namespace {

// y[r, i] = x[r, i] / sqrt(c Σ_j x[r, j]² + eps) * w[i] * SiLU(g[r, i]), c = 1/D or 1; w, g optional.
torch::Tensor direct(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& g, double eps, bool mean) {
  auto x2 = x.reshape({-1, x.size(-1)}).contiguous();
  auto g2 = g.defined() ? g.reshape({-1, x.size(-1)}).contiguous() : torch::Tensor();
  auto y = torch::empty_like(x2);
  const int64_t R = x2.size(0), D = x2.size(1);
  auto xa = x2.accessor<double, 2>();
  auto ya = y.accessor<double, 2>();
  for (int64_t r = 0; r < R; ++r) {
    double ss = 0;
    for (int64_t i = 0; i < D; ++i) ss += xa[r][i] * xa[r][i];
    const double n = 1.0 / std::sqrt((mean ? ss / D : ss) + eps);
    for (int64_t i = 0; i < D; ++i) {
      double v = xa[r][i] * n;
      if (w.defined()) v *= w[i].item<double>();
      if (g2.defined()) {
        const double z = g2[r][i].item<double>();
        v *= z / (1 + std::exp(-z));
      }
      ya[r][i] = v;
    }
  }
  return y.view(x.sizes());
}

TEST(Norm, ReferencesMatchTheFormulas) {
  torch::manual_seed(0);
  auto o = torch::dtype(torch::kDouble);
  for (int64_t D : {1, 5, 32, 50}) {
    auto x = torch::randn({3, 4, D}, o), w = torch::randn({D}, o), g = torch::randn({3, 4, D}, o);
    EXPECT_LT(rel_err(rms_norm_reference(x, w, 1e-6), direct(x, w, {}, 1e-6, true)), 1e-12) << D;
    EXPECT_LT(rel_err(rms_norm_reference(x, w, 1e-6, g), direct(x, w, g, 1e-6, true)), 1e-12) << D;
    EXPECT_LT(rel_err(l2_normalize_reference(x, 1e-6), direct(x, {}, {}, 1e-6, false)), 1e-12) << D;
  }
}

TEST(Norm, CpuRunsTheTensorOpsAndCudaSaysWhyNot) {
  torch::manual_seed(1);
  auto x = torch::randn({2, 3, 8}), w = torch::randn({8}), g = torch::randn({2, 3, 8});
  EXPECT_TRUE(torch::equal(rms_norm(x, w, 1e-6, Kernels::Auto, g), rms_norm_reference(x, w, 1e-6, g)));
  auto l2 = l2_normalize(x.to(torch::kBFloat16), torch::kFloat, Kernels::Auto);
  EXPECT_EQ(l2.scalar_type(), torch::kFloat);
  EXPECT_TRUE(torch::equal(l2, l2_normalize_reference(x.to(torch::kBFloat16).to(torch::kFloat))));
  std::string why;
  EXPECT_FALSE(norm_kernel_applies(x, Kernels::Auto, &why));
  EXPECT_FALSE(why.empty());
  EXPECT_THROW(rms_norm(x, w, 1e-6, Kernels::Cuda), UserError);
  EXPECT_THROW(l2_normalize(x, torch::kFloat, Kernels::Cuda), UserError);
}

}  // namespace
