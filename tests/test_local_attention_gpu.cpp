// GPU tests (ctest label gpu): local attention's window kernel (memlab's) and flash form (ATen's flash kernels with a
// window, or one sequence a block) against a dense fp64 computation written from the definition, outputs and the
// gradients of q, k and v; sliding and chunked, bf16 inputs and fp32 ones under bf16 autocast, the window kernel in
// fp32 too, head dims that need padding to 8, lengths under, at and past the window and a block of queries, B = 1.
// The blocked form is held to the same reference beside them.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/device.h"
#include "mixers/ops.h"
#include "ops/local_attention/local_attention.h"
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

enum class Form { Window, WindowCudaCores, Flash, Blocked };
const char* name(Form f) {
  return f == Form::Window ? "window kernel" : f == Form::WindowCudaCores ? "window kernel on CUDA cores"
                                             : f == Form::Flash           ? "flash"
                                                                          : "blocked";
}

torch::Tensor run(Form f, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t S,
                  bool chunked) {
  if (f == Form::Window) return local_attention_window(q, k, v, S, chunked);
  if (f == Form::WindowCudaCores) return local_attention_window(q, k, v, S, chunked, false);
  if (f == Form::Flash) return local_attention_flash(q, k, v, S, chunked);
  return local_attention_blocked(q, k, v, S, chunked);
}

// in_type: the inputs' dtype; autocast: under bf16 autocast (fp32 inputs). The output is bf16 but for fp32 inputs
// without autocast (the window kernel and the blocked form only), where it is fp32 and held 1000x tighter.
void compare(bool chunked, torch::ScalarType in_type, bool autocast, const std::vector<Form>& forms) {
  const auto o64 = torch::dtype(torch::kDouble).device(torch::kCUDA);
  const bool fp32 = in_type == torch::kFloat && !autocast;
  const double tol = fp32 ? 1e-5 : 1e-2;
  struct Shape {
    int64_t B, T, H, d, S;
  };
  for (auto [B, T, H, d, S] : std::vector<Shape>{{3, 781, 2, 50, 64}, {1, 37, 2, 50, 64}, {2, 200, 4, 32, 64},
                                                 {1, 1, 1, 3, 16}, {2, 129, 3, 64, 16}, {1, 96, 2, 8, 32},
                                                 {2, 128, 2, 16, 32}, {1, 20, 2, 8, 1}, {64, 40, 4, 32, 8},
                                                 {64, 40, 4, 32, 16}, {2, 150, 2, 128, 24}, {3, 70, 2, 40, 33}}) {
    const auto what = ::testing::Message() << (chunked ? "chunked" : "sliding") << ", " << c10::toString(in_type)
                                           << (autocast ? " autocast" : "") << ", B " << B << " T " << T << " H "
                                           << H << " d " << d << " S " << S;
    std::vector<torch::Tensor> x64;
    for (int i = 0; i < 3; ++i) x64.push_back((torch::randn({B, T, H, d}, o64) * (i < 2 ? 2.0 : 1.0)).to(in_type).to(torch::kDouble));
    const auto dy = torch::randn({B, T, H, d}, o64);
    std::vector<torch::Tensor> r64;
    for (auto& x : x64) r64.push_back(x.clone().requires_grad_(true));
    const auto y64 = dense(r64[0], r64[1], r64[2], S, chunked);
    const auto g64 = torch::autograd::grad({(y64 * dy).sum()}, r64);
    for (Form f : forms) {
      std::vector<torch::Tensor> xs;
      for (auto& x : x64) xs.push_back(x.to(in_type).requires_grad_(true));
      torch::Tensor y;
      {
        Bf16Autocast ac(autocast);
        if (f == Form::Window || f == Form::WindowCudaCores) {
          std::string why;
          ASSERT_TRUE(local_attention_kernel_applies(xs[0], xs[1], xs[2], S, Kernels::Auto, &why)) << what << why;
        }
        if (f == Form::Flash) ASSERT_TRUE(local_attention_flash_applies(xs[0], xs[1], xs[2], Kernels::Auto)) << what;
        y = run(f, xs[0], xs[1], xs[2], S, chunked);
      }
      ASSERT_EQ(y.scalar_type(), fp32 ? torch::kFloat : torch::kBFloat16) << what;
      ASSERT_EQ(y.sizes(), y64.sizes()) << what;
      const auto g = torch::autograd::grad({(y.to(torch::kDouble) * dy).sum()}, xs);
      EXPECT_LT(rel_err(y, y64), tol) << what << " " << name(f) << " output";
      for (int i = 0; i < 3; ++i)  // S = 1: q's and k's gradients are 0
        expect_close_or_zero(g[i], g64[i], 2 * tol, tol * dy.norm().item<double>(),
                             ::testing::Message(what) << " " << name(f) << " gradient " << i);
    }
  }
}

}  // namespace

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";              \
  if (device_capability(torch::kCUDA) < 80) GTEST_SKIP() << "flash attention needs compute capability 8.0"

const std::vector<Form> kAll{Form::Window, Form::WindowCudaCores, Form::Flash, Form::Blocked};

TEST(LocalAttentionGpu, SlidingBf16) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(1);
  compare(false, torch::kBFloat16, false, kAll);
}
TEST(LocalAttentionGpu, SlidingAutocast) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(2);
  compare(false, torch::kFloat, true, kAll);
}
TEST(LocalAttentionGpu, ChunkedBf16) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(3);
  compare(true, torch::kBFloat16, false, kAll);
}
TEST(LocalAttentionGpu, ChunkedAutocast) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(4);
  compare(true, torch::kFloat, true, kAll);
}
// fp32 without autocast: the window kernel computes in fp32 (flash has no fp32 and says why).
TEST(LocalAttentionGpu, WindowKernelFp32) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(7);
  compare(false, torch::kFloat, false, {Form::Window, Form::Blocked});
  compare(true, torch::kFloat, false, {Form::Window, Form::Blocked});
  const auto x = torch::randn({1, 8, 1, 16}, torch::device(torch::kCUDA));
  std::string why;
  EXPECT_FALSE(local_attention_flash_applies(x, x, x, Kernels::Auto, &why));
  EXPECT_EQ(why, "attention in Float");
  EXPECT_TRUE(local_attention_kernel_applies(x, x, x, 4, Kernels::Auto));
}

// What each form takes, and why it refuses the rest.
TEST(LocalAttentionGpu, FormsAndTheirRefusals) {
  SKIP_WITHOUT_CUDA();
  const auto o = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
  const auto x = torch::randn({1, 100, 1, 16}, o);
  std::string why;
  EXPECT_TRUE(local_attention_kernel_applies(x, x, x, 64, Kernels::Auto));
  EXPECT_FALSE(local_attention_kernel_applies(x, x, x, 1000, Kernels::Auto, &why));
  EXPECT_NE(why.find("window of 1000"), std::string::npos) << why;
  // A window past the sequence reads the sequence: T = 50 takes S = 1000 as 50.
  const auto short_x = torch::randn({1, 50, 1, 16}, o);
  EXPECT_TRUE(local_attention_kernel_applies(short_x, short_x, short_x, 1000, Kernels::Auto));
  const auto y = local_attention_window(short_x, short_x, short_x, 1000, false);
  const auto y_flash = local_attention_flash(short_x, short_x, short_x, 1000, false);
  EXPECT_LT(rel_err(y, y_flash), 1e-2);
  EXPECT_FALSE(local_attention_kernel_applies(x, x, x, 4, Kernels::Torch, &why));
  EXPECT_EQ(why, "model.kernels is torch");
  const auto wide = torch::randn({1, 8, 1, 160}, o);
  EXPECT_FALSE(local_attention_kernel_applies(wide, wide, wide, 4, Kernels::Auto));
  EXPECT_TRUE(local_attention_flash_applies(wide, wide, wide, Kernels::Auto));
}

// Which form local_attention runs: the window kernel where min(S, T) <= 32, flash past it, the kernel where flash
// does not apply (fp32 without autocast), the blocked form under model.kernels=torch. Each forward is deterministic,
// so the dispatched call equals the form it picked, to the bit.
TEST(LocalAttentionGpu, DispatchPicksTheFasterForm) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(8);
  const auto bf = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
  const auto q = torch::randn({2, 100, 2, 32}, bf), k = torch::randn({2, 100, 2, 32}, bf),
             v = torch::randn({2, 100, 2, 32}, bf);
  for (bool chunked : {false, true}) {
    EXPECT_TRUE(torch::equal(local_attention(q, k, v, 16, chunked, Kernels::Auto),
                             local_attention_window(q, k, v, 16, chunked)));
    EXPECT_TRUE(torch::equal(local_attention(q, k, v, 64, chunked, Kernels::Auto),
                             local_attention_flash(q, k, v, 64, chunked)));
    // a window of 64 over 20 tokens is a window of 20: the kernel's
    const auto q20 = q.narrow(1, 0, 20).contiguous();
    EXPECT_TRUE(torch::equal(local_attention(q20, q20, q20, 64, chunked, Kernels::Auto),
                             local_attention_window(q20, q20, q20, 64, chunked)));
    EXPECT_TRUE(torch::equal(local_attention(q, k, v, 16, chunked, Kernels::Torch),
                             local_attention_blocked(q, k, v, 16, chunked)));
    const auto q32 = q.to(torch::kFloat), k32 = k.to(torch::kFloat), v32 = v.to(torch::kFloat);
    EXPECT_TRUE(torch::equal(local_attention(q32, k32, v32, 64, chunked, Kernels::Auto),
                             local_attention_window(q32, k32, v32, 64, chunked)));
  }
}

// Strided inputs (column slices, as a fused projection hands them on) give what their contiguous copies give: the
// window kernel reads the slices where they lie, and takes a copy of a head-strided slice.
TEST(LocalAttentionGpu, StridedInputs) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(5);
  const auto o = torch::dtype(torch::kBFloat16).device(torch::kCUDA);
  for (int64_t d : {32, 50})
    for (bool head_strided : {false, true}) {
      auto base = torch::randn({2, 77, 6 * d}, o).requires_grad_(true);
      const auto dy = torch::randn({2, 77, 2, d}, o);
      auto slice = [&](const torch::Tensor& b, int i) {
        return head_strided ? b.view({2, 77, 2, 3 * d}).narrow(3, i * d, d) : b.narrow(2, i * 2 * d, 2 * d).view({2, 77, 2, d});
      };
      auto y = local_attention(slice(base, 0), slice(base, 1), slice(base, 2), 16, false, Kernels::Auto);
      const auto g = torch::autograd::grad({(y.to(torch::kFloat) * dy).sum()}, {base})[0];
      std::vector<torch::Tensor> xs;
      for (int i = 0; i < 3; ++i) xs.push_back(slice(base.detach(), i).contiguous().requires_grad_(true));
      auto y_ref = local_attention(xs[0], xs[1], xs[2], 16, false, Kernels::Auto);
      const auto g_ref = torch::autograd::grad({(y_ref.to(torch::kFloat) * dy).sum()}, xs);
      EXPECT_LT(rel_err(y, y_ref), 1e-6) << "d " << d << " head strided " << head_strided;
      for (int i = 0; i < 3; ++i)
        EXPECT_LT(rel_err(slice(g, i), g_ref[i]), 1e-6) << "d " << d << " head strided " << head_strided << " " << i;
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
