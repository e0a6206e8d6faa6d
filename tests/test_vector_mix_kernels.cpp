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

// A copy of t that starts one element into its storage, so that no vector load is aligned.
torch::Tensor misaligned(const torch::Tensor& t) {
  auto storage = torch::zeros({t.numel() + 1}, t.options());
  storage.narrow(0, 1, t.numel()).copy_(t.flatten());
  return storage.narrow(0, 1, t.numel()).view(t.sizes());
}

TEST(VectorMixKernel, MatchesReference) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(11);
  const auto o64 = torch::dtype(torch::kDouble).device(torch::kCUDA);
  struct Types {
    torch::ScalarType a, b, m;
  };
  const auto F = torch::kFloat, H = torch::kBFloat16;
  for (const auto& ty : std::vector<Types>{{F, F, F}, {H, H, H}, {H, F, H}, {F, H, F}})
    for (auto shape : std::vector<std::vector<int64_t>>{{1, 1, 1, 1}, {2, 37, 3, 5}, {4, 40, 4, 32}})
      for (bool off : {false, true}) {
        const auto what = ::testing::Message() << "types " << ty.a << "/" << ty.b << "/" << ty.m << " shape ["
                                               << shape[0] << "," << shape[1] << "," << shape[2] << "," << shape[3]
                                               << "]" << (off ? " misaligned" : "");
        std::vector<int64_t> m_shape{shape[0], shape[1], shape[2] * shape[3]};
        auto a = torch::randn(shape, o64).to(ty.a), b = torch::randn(shape, o64).to(ty.b);
        auto m = (torch::randn(m_shape, o64) * 3).to(ty.m);
        if (off) a = misaligned(a);
        auto d_o = torch::randn(shape, o64);
        std::vector<torch::Tensor> ref_in, k_in;
        for (const auto& t : {a, b, m}) {
          ref_in.push_back(t.to(torch::kDouble).requires_grad_(true));
          k_in.push_back(t.detach().requires_grad_(true));
        }
        auto o_ref = vector_mix_reference(ref_in[0], ref_in[1], ref_in[2]);
        auto g_ref = torch::autograd::grad({(o_ref * d_o).sum()}, ref_in);
        auto o = vector_mix(k_in[0], k_in[1], k_in[2], Kernels::Cuda);
        ASSERT_EQ(o.scalar_type(), torch::kFloat) << what;
        auto g = torch::autograd::grad({(o.to(torch::kDouble) * d_o).sum()}, k_in);
        torch::Tensor o_nograd;
        {
          torch::NoGradGuard ng;
          o_nograd = vector_mix(a, b, m, Kernels::Cuda);
        }
        EXPECT_LT(rel_err(o, o_ref), 1e-6) << what;
        EXPECT_TRUE(torch::equal(o, o_nograd)) << what;
        for (int i = 0; i < 3; ++i) {
          ASSERT_EQ(g[i].scalar_type(), k_in[i].scalar_type()) << what << " input " << i;
          ASSERT_EQ(g[i].sizes(), k_in[i].sizes()) << what << " input " << i;
          EXPECT_LT(rel_err(g[i], g_ref[i]), k_in[i].scalar_type() == H ? 1e-2 : 1e-6) << what << " input " << i;
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
