// GPU tests (ctest label gpu): the fused short-conv kernel against the tensor-op form in fp64 (output, dx, dw;
// fp32 and bf16 inputs; odd shapes; with and without SiLU), and every mixer with a short conv, kernels against
// tensor ops. Skipped, with the reason, where there is no CUDA device or no kernels.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/config.h"
#include "mixers/mixer.h"
#include "mixers/ops.h"
#include "ops/short_conv/short_conv.h"
#include "tests/mixer_check.h"

using namespace memlab;
using namespace memlab::testing;

namespace {

struct Shape {
  int64_t B, T, C, K;
};

void compare(torch::ScalarType dt) {
  const std::vector<Shape> shapes = {{1, 1, 5, 4},    {2, 37, 7, 4},  {3, 16, 33, 2}, {2, 17, 130, 3},
                                     {1, 1000, 64, 4}, {4, 40, 128, 4}, {2, 33, 20, 16}, {70000, 3, 32, 4}};
  auto o64 = torch::dtype(torch::kDouble).device(torch::kCUDA);
  for (const auto& s : shapes)
    for (bool silu : {false, true}) {
      // Inputs rounded to dt, so that the fp64 reference sees the numbers the kernel reads.
      auto x = torch::randn({s.B, s.T, s.C}, o64).to(dt).to(torch::kDouble);
      auto w = torch::randn({s.C, 1, s.K}, o64) * 0.5;
      auto dy = torch::randn({s.B, s.T, s.C}, o64).to(dt).to(torch::kDouble);
      auto xr = x.clone().requires_grad_(true), wr = w.clone().requires_grad_(true);
      auto y_ref = short_conv_reference(xr, wr, silu);
      auto g_ref = torch::autograd::grad({(y_ref * dy).sum()}, {xr, wr});
      auto xk = x.to(dt).requires_grad_(true), wk = w.to(torch::kFloat).requires_grad_(true);
      // With SiLU, x arrives as a column slice (rows of C + 1), as from a fused projection.
      auto xin = silu ? torch::cat({xk, xk.narrow(2, 0, 1)}, 2).narrow(2, 0, s.C) : xk;
      auto y = short_conv(xin, wk, silu, Kernels::Cuda);
      ASSERT_EQ(y.scalar_type(), dt);
      auto g = torch::autograd::grad({(y.to(torch::kDouble) * dy).sum()}, {xk, wk});
      torch::Tensor y_nograd;
      {
        torch::NoGradGuard ng;
        y_nograd = short_conv(x.to(dt), w.to(torch::kFloat), silu, Kernels::Cuda);
      }
      const double tol = dt == torch::kBFloat16 ? 1e-2 : 1e-5;
      const auto what = ::testing::Message() << "B" << s.B << " T" << s.T << " C" << s.C << " K" << s.K
                                             << " silu " << silu << (dt == torch::kBFloat16 ? " bf16" : " fp32");
      EXPECT_LT(rel_err(y, y_ref), tol) << what;
      EXPECT_LT(rel_err(y_nograd, y_ref), tol) << what;
      EXPECT_LT(rel_err(g[0], g_ref[0]), tol) << what;
      EXPECT_LT(rel_err(g[1], g_ref[1]), dt == torch::kBFloat16 ? 1e-2 : 1e-5) << what;
      EXPECT_EQ(g[1].scalar_type(), torch::kFloat);
    }
}

// Size-1 dimensions whose strides PyTorch ignores: [3, 1, C] made by a transpose has a T stride of 3C and is
// "contiguous"; the kernel must read its rows C apart.
TEST(ShortConvKernel, ReadsRowsOfLengthOneSequences) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(2);
  auto o = torch::dtype(torch::kFloat).device(torch::kCUDA);
  auto x = torch::randn({1, 3, 4}, o).transpose(0, 1);  // [3, 1, 4], strides (4, 12, 1)
  ASSERT_TRUE(x.is_contiguous());
  auto w = torch::randn({4, 1, 4}, o);
  EXPECT_LT(rel_err(short_conv(x, w, true, Kernels::Cuda), short_conv_reference(x, w, true)), 1e-5);
  auto y = torch::randn({2, 1, 10}, o).narrow(2, 3, 5);  // [2, 1, 5], rows 10 apart
  auto w5 = torch::randn({5, 1, 3}, o);
  EXPECT_LT(rel_err(short_conv(y, w5, false, Kernels::Cuda), short_conv_reference(y, w5, false)), 1e-5);
}

TEST(ShortConvKernel, MatchesReferenceFp32) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(0);
  compare(torch::kFloat);
}

TEST(ShortConvKernel, MatchesReferenceBf16) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(1);
  compare(torch::kBFloat16);
}

// Every mixer with a short conv, model.kernels=auto against torch: output and parameter gradients in fp32, and
// the one-token steps (tensor ops) against the kernel-form sequence; under bf16 autocast both forms are measured
// against fp32 and the kernel form is no less accurate.
TEST(ShortConvKernel, MixersMatchTensorOpForms) {
  SKIP_WITHOUT_KERNELS();
  NoTf32 exact;  // cuDNN may run the tensor-op form's fp32 conv in TF32
  // hqlt/delayed_chunk: the FW memory's Delayed-Chunk read (interleaved read and update tokens in the kernels).
  for (const std::string name :
       {"deltanet", "gated_deltanet", "hqlt", "hqlt/delayed_chunk", "mamba2", "mesa", "mlstm", "slstm"}) {
    auto build = [&](const char* kernels) {
      Config c = default_config();
      c.set_value("model.kernels", kernels, "test");
      c.set_value("model.deltanet.short_conv", "true", "test");
      if (name == "hqlt/delayed_chunk") c.set_value("model.hqlt.variant", "delayed_chunk", "test");
      torch::manual_seed(7);
      auto m = make_mixer(name.substr(0, name.find('/')), c, MixerShape{128, 4, 0.02, 1e-6});
      randomize(*m);
      m->to(torch::kCUDA);
      return m;
    };
    torch::manual_seed(3);
    auto x = torch::randn({3, 45, 128}, torch::dtype(torch::kFloat).device(torch::kCUDA));
    auto grads_of = [&](bool kernels, bool bf16) {
      auto m = build(kernels ? "auto" : "torch");
      return output_and_grads(*m, bf16, [&] { return m->forward(x); });
    };
    // The mLSTM kernel multiplies fp32 on tensor cores in 3xTF32 (about 2^-21 per product against FMA's 2^-24):
    // 2.8e-4 on this layer's weight gradients on an H200. Its own test bounds it against fp64.
    const auto k32 = expect_kernel_form_matches(grads_of, name, name == "mlstm" ? 5e-4 : 1e-4);
    {
      torch::NoGradGuard ng;  // the tensor-op steps equal the kernel sequence form
      EXPECT_LT(rel_err(run_steps(*build("auto"), x), k32.front()), 1e-4) << name << ": steps against the sequence";
    }
  }
}

}  // namespace
