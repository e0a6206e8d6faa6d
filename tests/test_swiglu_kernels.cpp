// GPU tests (ctest label gpu): the fused SwiGLU gating against the tensor-op form in fp64 (output and the
// gradient of the fused gate-and-up input; fp32 and bf16; inner widths that take and miss the 16-byte
// vectors; a strided input). Skipped, with the reason, where there is no CUDA device or no kernels.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "ops/swiglu/swiglu.h"
#include "tests/mixer_check.h"

using namespace memlab;
using namespace memlab::testing;

namespace {

void compare(torch::ScalarType dt) {
  auto o64 = torch::dtype(torch::kDouble).device(torch::kCUDA);
  for (auto [rows, inner] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {37, 3}, {64, 8}, {1000, 512}, {5, 100}}) {
    auto gu = (torch::randn({rows, 2 * inner}, o64) * 3).to(dt).to(torch::kDouble);
    auto dh = torch::randn({rows, inner}, o64).to(dt).to(torch::kDouble);
    auto gr = gu.clone().requires_grad_(true);
    auto h_ref = swiglu_reference(gr);
    auto g_ref = torch::autograd::grad({(h_ref * dh).sum()}, {gr})[0];
    auto gk = gu.to(dt).requires_grad_(true);
    auto h = swiglu(gk, Kernels::Cuda);
    ASSERT_EQ(h.scalar_type(), dt);
    auto g = torch::autograd::grad({(h.to(torch::kDouble) * dh).sum()}, {gk})[0];
    torch::Tensor h_nograd;
    {
      torch::NoGradGuard ng;
      h_nograd = swiglu(gu.to(dt), Kernels::Cuda);
    }
    const double tol = dt == torch::kBFloat16 ? 1e-2 : 1e-6;
    const auto what = ::testing::Message() << "rows " << rows << " inner " << inner
                                           << (dt == torch::kBFloat16 ? " bf16" : " fp32");
    EXPECT_LT(rel_err(h, h_ref), tol) << what;
    EXPECT_LT(rel_err(h_nograd, h_ref), tol) << what;
    EXPECT_LT(rel_err(g, g_ref), tol) << what;
  }
  // A transposed (non-contiguous) input is copied, not misread.
  auto gu = torch::randn({16, 10}, o64).to(dt);
  auto t = gu.t();  // [10, 16], columns strided
  EXPECT_LT(rel_err(swiglu(t, Kernels::Cuda), swiglu_reference(t.to(torch::kDouble))),
            dt == torch::kBFloat16 ? 1e-2 : 1e-6);
}

TEST(SwigluKernel, MatchesReferenceFp32) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(0);
  compare(torch::kFloat);
}

TEST(SwigluKernel, MatchesReferenceBf16) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(1);
  compare(torch::kBFloat16);
}

}  // namespace
