// GPU tests (ctest label gpu): local attention's flash form (ATen's flash kernels with a window, or one sequence a
// block) against a dense fp64 computation written from the definition, outputs and the gradients of q, k and v;
// sliding and chunked, bf16 inputs and fp32 ones under bf16 autocast, head dims that need padding to 8, lengths
// under, at and past the window, B = 1. The blocked form is held to the same reference beside it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/device.h"
#include "mixers/ops.h"
#include "ops/local_attention.h"
#include "train/cuda_graph.h"
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
                                                 {1, 1, 1, 3, 16}, {2, 129, 3, 64, 16}, {1, 96, 2, 8, 32},
                                                 {2, 128, 2, 16, 32}, {1, 20, 2, 8, 1}}) {
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
      for (int i = 0; i < 3; ++i) {
        // With S = 1 chunked, a query reads only its own key: q's and k's gradients are 0, and only rounding is left.
        if (g64[i].norm().item<double>() == 0)
          EXPECT_LT(g[i].to(torch::kDouble).norm().item<double>(), 1e-2 * dy.norm().item<double>()) << what << form;
        else
          EXPECT_LT(rel_err(g[i], g64[i]), 2e-2) << what << form << " gradient " << i;
      }
    }
  }
}

}  // namespace

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";              \
  if (device_capability(torch::kCUDA) < 80) GTEST_SKIP() << "flash attention needs compute capability 8.0"

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

// Strided inputs (column slices, as a fused projection hands them on) give what their contiguous copies give.
TEST(LocalAttentionGpu, StridedInputs) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(5);
  const auto o = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
  for (int64_t d : {32, 50}) {
    auto base = torch::randn({2, 77, 2, 3 * d}, o).requires_grad_(true);
    const auto dy = torch::randn({2, 77, 2, d}, o);
    auto y = local_attention(base.narrow(3, 0, d), base.narrow(3, d, d), base.narrow(3, 2 * d, d), 16, false,
                             Kernels::Auto);
    const auto g = torch::autograd::grad({(y.to(torch::kFloat) * dy).sum()}, {base})[0];
    std::vector<torch::Tensor> xs;
    for (int i = 0; i < 3; ++i) xs.push_back(base.detach().narrow(3, i * d, d).contiguous().requires_grad_(true));
    auto y_ref = local_attention(xs[0], xs[1], xs[2], 16, false, Kernels::Auto);
    const auto g_ref = torch::autograd::grad({(y_ref.to(torch::kFloat) * dy).sum()}, xs);
    EXPECT_LT(rel_err(y, y_ref), 1e-6) << "d " << d;
    // The backward's atomic sums may round in another order.
    for (int i = 0; i < 3; ++i) EXPECT_LT(rel_err(g.narrow(3, i * d, d), g_ref[i]), 1e-2) << "d " << d << " " << i;
  }
}

// Captured in a CUDA graph (as the training step and the SAC update run it), forward and backward replay what an
// eager call computes, on inputs changed after the capture.
TEST(LocalAttentionGpu, CapturedInACudaGraph) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(6);
  const auto o = torch::dtype(torch::kFloat).device(torch::kCUDA);
  for (bool chunked : {false, true}) {
    auto q = torch::randn({3, 100, 2, 50}, o).requires_grad_(true), k = torch::randn({3, 100, 2, 50}, o).requires_grad_(true);
    auto v = torch::randn({3, 100, 2, 50}, o).requires_grad_(true);
    const auto dy = torch::randn({3, 100, 2, 50}, o);
    auto fwd_bwd = [&] {
      Bf16Autocast ac(true);
      auto y = local_attention(q, k, v, 16, chunked, Kernels::Auto);
      auto g = torch::autograd::grad({(y.to(torch::kFloat) * dy).sum()}, {q, k, v});
      return std::vector<torch::Tensor>{y, g[0], g[1], g[2]};
    };
    std::vector<torch::Tensor> out;
    GraphedStep step(true);
    auto compute = [&] {
      auto r = fwd_bwd();
      if (out.empty())
        for (auto& t : r) out.push_back(torch::empty_like(t));
      for (size_t i = 0; i < r.size(); ++i) out[i].copy_(r[i]);
    };
    for (int i = 0; i < 8 && !step.captured(); ++i) step.run(compute);
    ASSERT_TRUE(step.captured()) << step.mode();
    {
      torch::NoGradGuard ng;
      for (auto* x : {&q, &k, &v}) x->copy_(torch::randn_like(*x));
    }
    step.run(compute);  // a replay
    torch::cuda::synchronize();
    const auto eager = fwd_bwd();
    EXPECT_LT(rel_err(out[0], eager[0]), 1e-6) << (chunked ? "chunked" : "sliding");
    for (int i = 1; i < 4; ++i) EXPECT_LT(rel_err(out[i], eager[i]), 1e-2) << (chunked ? "chunked" : "sliding") << " " << i;
  }
}
