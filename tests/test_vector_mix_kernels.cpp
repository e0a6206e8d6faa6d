// GPU tests (ctest label gpu): HQLT's fused vector mixing against the tensor-op form in fp64 (output and the three
// input gradients; fp32, bf16 and mixed inputs; sizes that take and miss the vector loads; an input off their
// alignment), and the HQLT layer with its kernels against its tensor-op form. Skipped, with the reason, where there
// is no CUDA device or no kernels.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "mixers/hqlt.h"
#include "ops/vector_mix/vector_mix.h"
#include "tests/mixer_check.h"

using namespace memlab;
using namespace memlab::testing;

namespace {

// A copy of t that starts `by` elements into its storage, so that its vector loads are not aligned.
torch::Tensor misaligned(const torch::Tensor& t, int64_t by) {
  auto storage = torch::zeros({t.numel() + by}, t.options());
  storage.narrow(0, by, t.numel()).copy_(t.flatten());
  return storage.narrow(0, by, t.numel()).view(t.sizes());
}

// Every dtype combination of a, b, m; sizes that take the 4-element vectors and sizes that do not; each of a, b, m
// and dO in turn one or two elements off its alignment; m a column slice of a wider tensor (as the fused projection
// hands it over); the no-grad path. Output and the three gradients against the tensor-op form in fp64.
TEST(VectorMixKernel, MatchesReference) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(11);
  const auto o64 = torch::dtype(torch::kDouble).device(torch::kCUDA);
  const auto F = torch::kFloat, H = torch::kBFloat16;
  for (int types = 0; types < 8; ++types)
    for (auto shape : std::vector<std::vector<int64_t>>{{1, 1, 1, 1}, {2, 37, 3, 5}, {4, 40, 4, 32}})
      for (int off = 0; off < 10; ++off) {  // 0: aligned; 1-8: input off % 4 by 1 + off / 5 elements; 9: m sliced
        const torch::ScalarType ta = types & 4 ? H : F, tb = types & 2 ? H : F, tm = types & 1 ? H : F;
        const int which = off >= 1 && off <= 8 ? (off - 1) % 4 : -1;
        const int64_t by = off >= 5 && off <= 8 ? 2 : 1;
        const auto what = ::testing::Message() << "types " << ta << "/" << tb << "/" << tm << " shape [" << shape[0]
                                               << "," << shape[1] << "," << shape[2] << "," << shape[3] << "] case "
                                               << off;
        std::vector<int64_t> m_shape{shape[0], shape[1], shape[2] * shape[3]};
        auto a = torch::randn(shape, o64).to(ta), b = torch::randn(shape, o64).to(tb);
        auto m = (torch::randn(m_shape, o64) * 3).to(tm);
        auto d_o = torch::randn(shape, o64);
        std::vector<torch::Tensor> ref_in;
        for (const auto& t : {a, b, m}) ref_in.push_back(t.to(torch::kDouble).requires_grad_(true));
        auto o_ref = vector_mix_reference(ref_in[0], ref_in[1], ref_in[2]);
        auto g_ref = torch::autograd::grad({o_ref}, ref_in, {d_o});
        torch::Tensor m_wide;  // case 9: m is columns [D, 2D) of m_wide
        if (off == 9) {
          m_wide = torch::zeros({m_shape[0], m_shape[1], 2 * m_shape[2]}, m.options());
          m_wide.narrow(2, m_shape[2], m_shape[2]).copy_(m);
          m_wide.requires_grad_(true);
        }
        std::vector<torch::Tensor> k_in{a, b, m};
        for (int i = 0; i < 3; ++i) k_in[i] = (which == i ? misaligned(k_in[i], by) : k_in[i]).detach().requires_grad_(true);
        const auto m_in = off == 9 ? m_wide.narrow(2, m_shape[2], m_shape[2]) : k_in[2];
        const auto d_o_in = which == 3 ? misaligned(d_o.to(F), by) : d_o.to(F);
        auto o = vector_mix(k_in[0], k_in[1], m_in, Kernels::Cuda);
        ASSERT_EQ(o.scalar_type(), F) << what;
        auto g = torch::autograd::grad({o}, {k_in[0], k_in[1], off == 9 ? m_wide : k_in[2]}, {d_o_in});
        if (off == 9) {
          EXPECT_EQ(g[2].narrow(2, 0, m_shape[2]).abs().max().item<double>(), 0.0) << what;
          g[2] = g[2].narrow(2, m_shape[2], m_shape[2]);
        }
        torch::Tensor o_nograd;
        {
          torch::NoGradGuard ng;
          o_nograd = vector_mix(k_in[0], k_in[1], m_in, Kernels::Cuda);
        }
        EXPECT_LT(rel_err(o, o_ref), 1e-6) << what;
        EXPECT_TRUE(torch::equal(o, o_nograd)) << what;
        for (int i = 0; i < 3; ++i) {
          const auto dt = i == 0 ? ta : i == 1 ? tb : tm;
          ASSERT_EQ(g[i].scalar_type(), dt) << what << " input " << i;
          ASSERT_EQ(g[i].sizes(), ref_in[i].sizes()) << what << " input " << i;
          EXPECT_LT(rel_err(g[i], g_ref[i]), dt == H ? 1e-2 : 1e-6) << what << " input " << i;
        }
      }
}

TEST(VectorMixKernel, RefusedWhereItCannotRun) {
  SKIP_WITHOUT_KERNELS();
  const auto o = torch::dtype(torch::kFloat).device(torch::kCUDA);
  auto a = torch::randn({2, 3, 2, 4}, o), m = torch::randn({2, 3, 8}, o);
  std::string why;
  EXPECT_TRUE(vector_mix_kernel_applies(a, a, m, Kernels::Auto, &why)) << why;
  EXPECT_FALSE(vector_mix_kernel_applies(a, a, m.narrow(2, 0, 4), Kernels::Auto, &why));
  EXPECT_EQ(why, "inputs of different shapes");
  EXPECT_FALSE(vector_mix_kernel_applies(a.to(torch::kDouble), a, m, Kernels::Auto, &why));
  EXPECT_FALSE(vector_mix_kernel_applies(a, a, m, Kernels::Torch, &why));
  EXPECT_THROW(vector_mix(a.to(torch::kDouble), a, m, Kernels::Cuda), std::exception);
}

// The HQLT layer (the Table 3 setting: Synchronous, vector mixing, short convs, window 8) with model.kernels=cuda
// against its tensor-op form, fp32: output, the input's gradient and the mixing projection's weight gradient.
TEST(VectorMixKernel, HqltLayerMatchesTensorOps) {
  SKIP_WITHOUT_KERNELS();
  NoTf32 exact;
  torch::manual_seed(12);
  auto x = torch::randn({3, 45, 128}, torch::dtype(torch::kFloat).device(torch::kCUDA));
  auto f = layer_forms<HqltImpl>(make_hqlt, MixerShape{128, 4, 0.02, 1e-6}, x, 13);
  EXPECT_LT(rel_err(f.y_fast, f.y_ref), 1e-3);
  EXPECT_LT(rel_err(f.dx_fast, f.dx_ref), 1e-3);
  const auto fast = f.fast->named_parameters(), ref = f.ref->named_parameters();
  ASSERT_TRUE(fast.contains("mix_proj.weight"));
  EXPECT_LT(rel_err(fast["mix_proj.weight"].grad(), ref["mix_proj.weight"].grad()), 1e-3);
}

}  // namespace
