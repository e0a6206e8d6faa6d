// GPU tests (ctest label gpu): local attention's flash form (ATen's flash kernels with a window, or one sequence a
// block) against a dense fp64 computation written from the definition, outputs and the gradients of q, k and v;
// sliding and chunked, bf16 inputs and fp32 ones under bf16 autocast, head dims that need padding to 8, lengths
// under, at and past the window, B = 1. The blocked form is held to the same reference beside it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "mixers/ops.h"
#include "ops/local_attention.h"
#include "tests/mixer_check.h"

using namespace memlab;
using namespace memlab::testing;

namespace {

// o_t = Σ_j softmax_j(q_t·k_j / sqrt(d)) v_j over the allowed j, in fp64 with one [T, T] mask.
torch::Tensor dense(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t S, bool chunked) {
  const int64_t T = q.size(1), d = q.size(3);
  const auto opt = q.options().dtype(torch::kLong);
  const auto t = torch::arange(T, opt).view({T, 1}), j = torch::arange(T, opt).view({1, T});
  const auto allowed = chunked ? (j <= t).logical_and(torch::div(j, S, "floor") == torch::div(t, S, "floor"))
                               : (j <= t).logical_and(j > t - S);
  auto s = torch::einsum("bthd,bjhd->bhtj", {q, k}) / std::sqrt(double(d));
  s = s.masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity());
  return torch::einsum("bhtj,bjhd->bthd", {torch::softmax(s, -1), v});
}

void compare(bool chunked, bool autocast) {
  const auto o64 = torch::dtype(torch::kDouble).device(torch::kCUDA);
  const auto in_type = autocast ? torch::kFloat : torch::kBFloat16;
  struct Shape {
    int64_t B, T, H, d, S;
  };
  for (auto [B, T, H, d, S] : std::vector<Shape>{{3, 781, 2, 50, 64}, {1, 37, 2, 50, 64}, {2, 200, 4, 32, 64},
                                                 {1, 1, 1, 3, 16}, {2, 129, 3, 64, 16}, {1, 96, 2, 8, 32}}) {
    const auto what = ::testing::Message() << (chunked ? "chunked" : "sliding") << (autocast ? ", autocast" : ", bf16")
                                           << ", B " << B << " T " << T << " H " << H << " d " << d << " S " << S;
    std::vector<torch::Tensor> x64;
    for (int i = 0; i < 3; ++i) x64.push_back((torch::randn({B, T, H, d}, o64) * (i < 2 ? 2.0 : 1.0)).to(in_type).to(torch::kDouble));
    const auto dy = torch::randn({B, T, H, d}, o64);
    std::vector<torch::Tensor> r64;
    for (auto& x : x64) r64.push_back(x.clone().requires_grad_(true));
    const auto y64 = dense(r64[0], r64[1], r64[2], S, chunked);
    const auto g64 = torch::autograd::grad({(y64 * dy).sum()}, r64);
    for (Kernels kernels : {Kernels::Auto, Kernels::Torch}) {
      std::vector<torch::Tensor> xs;
      for (auto& x : x64) xs.push_back(x.to(in_type).requires_grad_(true));
      torch::Tensor y;
      {
        Bf16Autocast ac(autocast);
        if (kernels == Kernels::Auto) ASSERT_TRUE(local_attention_flash_applies(xs[0], xs[1], xs[2], kernels)) << what;
        y = local_attention(xs[0], xs[1], xs[2], S, chunked, kernels);
      }
      ASSERT_EQ(y.scalar_type(), torch::kBFloat16) << what;
      ASSERT_EQ(y.sizes(), y64.sizes()) << what;
      const auto g = torch::autograd::grad({(y.to(torch::kDouble) * dy).sum()}, xs);
      const auto form = kernels == Kernels::Auto ? " flash" : " blocked";
      EXPECT_LT(rel_err(y, y64), 1e-2) << what << form << " output";
      for (int i = 0; i < 3; ++i) EXPECT_LT(rel_err(g[i], g64[i]), 2e-2) << what << form << " gradient " << i;
    }
  }
}

}  // namespace

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

TEST(LocalAttentionGpu, SlidingBf16) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(1);
  compare(false, false);
}
TEST(LocalAttentionGpu, SlidingAutocast) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(2);
  compare(false, true);
}
TEST(LocalAttentionGpu, ChunkedBf16) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(3);
  compare(true, false);
}
TEST(LocalAttentionGpu, ChunkedAutocast) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(4);
  compare(true, true);
}
// fp32 without autocast keeps the blocked form (flash has no fp32), and says why.
TEST(LocalAttentionGpu, Fp32StaysBlocked) {
  SKIP_WITHOUT_CUDA();
  const auto x = torch::randn({1, 8, 1, 16}, torch::device(torch::kCUDA));
  std::string why;
  EXPECT_FALSE(local_attention_flash_applies(x, x, x, Kernels::Auto, &why));
  EXPECT_EQ(why, "attention in Float");
}
