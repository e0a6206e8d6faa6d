// The short causal conv's tensor-op form against a direct loop, and the fused kernel's per-thread code (run on
// the CPU, as causal_conv.h offers) against the tensor-op form: outputs, dx and dw, with and without SiLU, odd
// shapes, lengths shorter and longer than a thread's tile, every kernel size class, x dense or a column slice.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ops/short_conv/short_conv.h"
#include "tests/mixer_check.h"

#ifdef MEMLAB_CUDA_KERNELS
#include "ops/short_conv/causal_conv.h"
#endif

using namespace memlab;
using memlab::testing::rel_err;

namespace {

struct Shape {
  int64_t B, T, C, K;
};
const std::vector<Shape> kShapes = {{1, 1, 5, 4}, {2, 37, 7, 4}, {3, 16, 33, 2}, {2, 17, 130, 3},
                                    {1, 70, 16, 16}, {2, 15, 9, 5}, {3, 37, 12, 4}};

// y[b, t, c] = Σ_j w[c, j] x[b, t - (K-1) + j, c], then SiLU: written out element by element.
torch::Tensor direct(const torch::Tensor& x, const torch::Tensor& w, bool silu) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), K = w.size(-1);
  auto y = torch::zeros_like(x);
  auto xa = x.accessor<double, 3>();
  auto wa = w.accessor<double, 3>();
  auto ya = y.accessor<double, 3>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        double z = 0;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t s = t - (K - 1) + j;
          if (s >= 0) z += wa[c][0][j] * xa[b][s][c];
        }
        ya[b][t][c] = silu ? z / (1 + std::exp(-z)) : z;
      }
  return y;
}

TEST(ShortConv, ReferenceMatchesDirectLoop) {
  torch::manual_seed(0);
  for (const auto& s : kShapes)
    for (bool silu : {false, true}) {
      auto x = torch::randn({s.B, s.T, s.C}, torch::kDouble);
      auto w = torch::randn({s.C, 1, s.K}, torch::kDouble);
      EXPECT_LT(rel_err(short_conv_reference(x, w, silu), direct(x, w, silu)), 1e-12)
          << "T" << s.T << " C" << s.C << " K" << s.K << " silu " << silu;
    }
}

TEST(ShortConv, KernelCodeOnHostMatchesReference) {
#ifndef MEMLAB_CUDA_KERNELS
  GTEST_SKIP() << "memlab was built without nvcc (no kernels)";
#else
  torch::manual_seed(1);
  for (const auto& s : kShapes)
    for (bool silu : {false, true}) {
      auto x = torch::randn({s.B, s.T, s.C}, torch::kDouble).requires_grad_(true);
      auto w = torch::randn({s.C, 1, s.K}, torch::kDouble).requires_grad_(true);
      auto dy = torch::randn({s.B, s.T, s.C}, torch::kDouble);
      auto y_ref = short_conv_reference(x, w, silu);
      auto grads = torch::autograd::grad({(y_ref * dy).sum()}, {x, w});

      kernels::CausalConvProblem p;
      p.B = static_cast<int>(s.B);
      p.T = static_cast<int>(s.T);
      p.C = static_cast<int>(s.C);
      p.K = static_cast<int>(s.K);
      p.silu = silu;
      p.slices = silu ? 0 : 2;  // without SiLU, threads sum dw over two or more sequences
      // With SiLU, x is read as columns [2, 2 + C) of rows of C + 5, as from a fused projection.
      auto wide = torch::randn({s.B, s.T, s.C + 5});
      wide.narrow(2, 2, s.C).copy_(x.detach());
      auto xf = silu ? wide.narrow(2, 2, s.C) : x.detach().to(torch::kFloat).contiguous();
      p.x_row = silu ? s.C + 5 : 0;
      auto dyf = dy.to(torch::kFloat).contiguous();
      auto wf = w.detach().to(torch::kFloat).reshape({s.C, s.K}).contiguous();
      auto y = torch::empty({s.B, s.T, s.C}), dx = torch::empty({s.B, s.T, s.C});
      auto partial = torch::empty({kernels::causal_conv_partial_rows(p), s.C, s.K});
      kernels::CausalConvForwardArgs fa;
      fa.x = xf.data_ptr();
      fa.w = wf.data_ptr<float>();
      fa.y = y.data_ptr();
      ASSERT_EQ(kernels::causal_conv_forward_host(p, fa), "");
      kernels::CausalConvBackwardArgs ba;
      ba.x = xf.data_ptr();
      ba.dy = dyf.data_ptr();
      ba.w = wf.data_ptr<float>();
      ba.dx = dx.data_ptr();
      ba.dw_partial = partial.data_ptr<float>();
      ASSERT_EQ(kernels::causal_conv_backward_host(p, ba), "");
      const auto what = ::testing::Message() << "B" << s.B << " T" << s.T << " C" << s.C << " K" << s.K
                                             << " silu " << silu;
      EXPECT_LT(rel_err(y, y_ref), 1e-6) << what;
      EXPECT_LT(rel_err(dx, grads[0]), 1e-6) << what;
      EXPECT_LT(rel_err(partial.sum(0).view({s.C, 1, s.K}), grads[1]), 1e-6) << what;
    }
  kernels::CausalConvProblem bad;
  bad.K = 17;
  EXPECT_NE(kernels::causal_conv_forward_host(bad, {}), "");
  bad.K = 4;
  bad.C = 8;
  bad.x_row = 7;
  EXPECT_NE(kernels::causal_conv_forward_host(bad, {}), "");
#endif
}

TEST(ShortConv, CudaFormOnCpuIsRefused) {
  auto x = torch::randn({1, 4, 3});
  auto w = torch::randn({3, 1, 4});
  EXPECT_THROW(short_conv(x, w, true, Kernels::Cuda), std::exception);
  EXPECT_LT(rel_err(short_conv(x, w, true, Kernels::Auto), short_conv_reference(x, w, true)), 1e-12);
}

}  // namespace
