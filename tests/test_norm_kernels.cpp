// GPU tests (ctest label gpu): the fused norm kernel against the tensor-op forms in fp64 (RMS norm with weight,
// with and without the SiLU gate; L2 norm into fp32 from bf16 or fp32; LayerNorm with one weight row per head, alone
// and with the mLSTM's skip term and SiLU gate; RMS norm with a weight row per packed run or head, past the 1024 weights
// the plain backward sums in shared memory): output and every input gradient, fp32
// and bf16, odd row lengths, one row and more rows than the grid holds; and a whole model, kernels against
// tensor ops. Skipped, with the reason, where there is no CUDA device or no kernels.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/config.h"
#include "mixers/ops.h"
#include "models/sequence_model.h"
#include "ops/norm/norm.h"
#include "tests/mixer_check.h"

using namespace memlab;
using namespace memlab::testing;

namespace {

struct Shape {
  int64_t rows, D;
};

// Rows of one element are left out: there dx = w eps / (x² + eps)^1.5 is the difference of two nearly equal
// terms, which fp32 cannot resolve in any form.
void compare(torch::ScalarType dt) {
  const std::vector<Shape> shapes = {{1, 3}, {3, 16}, {37, 32}, {5, 50}, {64, 64}, {129, 128}, {7, 130},
                                     {2, 1024}, {70001, 32}, {300001, 32}, {140001, 128}, {60000, 128},
                                     {96, 32}, {36, 130}, {480000, 128}, {480000, 32}};
  auto o64 = torch::dtype(torch::kDouble).device(torch::kCUDA);
  const double tol = dt == torch::kBFloat16 ? 1e-2 : 1e-5;
  for (const auto& s : shapes)
    for (int form = 0; form < 6; ++form) {  // 0: RMS norm, 1: gated RMS norm, 2: L2 norm into fp32, 3: LayerNorm,
                                            // 4: LayerNorm with skip term and gate, 5: RMS norm with a weight row
                                            // per member or head (packed runs: 12 or 48 rows)
      // Inputs rounded to dt, so that the fp64 reference sees the numbers the kernel reads.
      auto x = torch::randn({s.rows, s.D}, o64).to(dt).to(torch::kDouble);
      auto g = torch::randn({s.rows, s.D}, o64).mul(2).to(dt).to(torch::kDouble);
      // LayerNorm: a weight row per head where the rows split into 4 or 3 heads
      // with the skip term also 12 heads of 128 (the weights past the 1024 slots of the norm without it)
      const int64_t R = form == 5                       ? (s.rows % 48 == 0 && s.D <= 64 ? 48 : s.rows % 12 == 0 ? 12 : 1)
                        : form < 3                      ? 1
                        : form == 4 && s.rows % 12 == 0 ? 12
                        : s.rows % 4 == 0               ? 4
                        : s.rows % 3 == 0               ? 3
                                                        : 1;
      auto w = R > 1 ? torch::randn({R, s.D}, o64) : torch::randn({s.D}, o64);
      auto sw = torch::randn(w.sizes(), o64), r = torch::randn({s.rows, s.D}, o64).to(dt).to(torch::kDouble);
      const auto out = form == 2 ? torch::kFloat : dt;
      auto dy = torch::randn({s.rows, s.D}, o64).to(out).to(torch::kDouble);
      auto xr = x.clone().requires_grad_(true), wr = w.clone().requires_grad_(true), gr = g.clone().requires_grad_(true);
      auto xk = x.to(dt).requires_grad_(true), wk = w.to(torch::kFloat).requires_grad_(true),
           gk = g.to(dt).requires_grad_(true);
      auto swr = sw.clone().requires_grad_(true), rr = r.clone().requires_grad_(true);
      auto swk = sw.to(torch::kFloat).requires_grad_(true), rk = r.to(dt).requires_grad_(true);
      torch::Tensor y_ref, y;
      std::vector<torch::Tensor> ref_in{xr}, k_in{xk};
      if (form == 2) {
        y_ref = l2_normalize_reference(xr, 1e-6);
        y = l2_normalize(xk, out, Kernels::Cuda, 1e-6);
      } else if (form == 3) {
        y_ref = layer_norm_reference(xr, wr, 1e-5);
        y = layer_norm(xk, wk, 1e-5, Kernels::Cuda);
        ref_in.push_back(wr);
        k_in.push_back(wk);
      } else if (form == 4) {
        y_ref = layer_norm_reference(xr, wr, 1e-5, gr, {swr, rr});
        y = layer_norm(xk, wk, 1e-5, Kernels::Cuda, out, gk, {swk, rk});
        ref_in.insert(ref_in.end(), {wr, gr, swr, rr});
        k_in.insert(k_in.end(), {wk, gk, swk, rk});
      } else {
        y_ref = rms_norm_reference(xr, wr, 1e-5, form == 1 ? gr : torch::Tensor());
        y = rms_norm(xk, wk, 1e-5, Kernels::Cuda, form == 1 ? gk : torch::Tensor());
        ref_in.push_back(wr);
        k_in.push_back(wk);
        if (form == 1) {
          ref_in.push_back(gr);
          k_in.push_back(gk);
        }
      }
      const auto what = ::testing::Message() << "rows " << s.rows << " D " << s.D << " form " << form << " R " << R
                                             << (dt == torch::kBFloat16 ? " bf16" : " fp32");
      ASSERT_EQ(y.scalar_type(), out) << what;
      EXPECT_LT(rel_err(y, y_ref), tol) << what;
      auto g_ref = torch::autograd::grad({(y_ref * dy).sum()}, ref_in);
      auto g_k = torch::autograd::grad({(y.to(torch::kDouble) * dy).sum()}, k_in);
      for (size_t i = 0; i < g_ref.size(); ++i) {
        EXPECT_EQ(g_k[i].scalar_type(), k_in[i].scalar_type()) << what << " grad " << i;
        EXPECT_LT(rel_err(g_k[i], g_ref[i]), tol) << what << " grad " << i;
      }
      torch::NoGradGuard ng;  // the forward without autograd's record
      auto y_nograd = form == 2   ? l2_normalize(xk, out, Kernels::Cuda, 1e-6)
                      : form == 3 ? layer_norm(xk, wk, 1e-5, Kernels::Cuda)
                      : form == 4 ? layer_norm(xk, wk, 1e-5, Kernels::Cuda, out, gk, {swk, rk})
                                  : rms_norm(xk, wk, 1e-5, Kernels::Cuda, form == 1 ? gk : torch::Tensor());
      EXPECT_TRUE(torch::equal(y_nograd, y)) << what;
    }
}

TEST(NormKernel, MatchesReferenceFp32) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(0);
  compare(torch::kFloat);
}

TEST(NormKernel, MatchesReferenceBf16) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(1);
  compare(torch::kBFloat16);
}

// The gated RMS norm into another dtype than its input's, as the mixers' output norms run under autocast (fp32 o,
// bf16 gate, bf16 out for o_proj): the same output, to the bit, as the norm into fp32 followed by a cast, and the
// same gradients as that chain's; and fp32 out from bf16 input, as the cast to fp32 followed by the norm.
TEST(NormKernel, RmsNormIntoAnotherDtype) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(2);
  const auto f32 = torch::dtype(torch::kFloat).device(torch::kCUDA);
  for (const auto& s : std::vector<Shape>{{1, 32}, {37, 32}, {5, 50}, {4096, 32}})
    for (auto [in, out] : std::vector<std::pair<torch::ScalarType, torch::ScalarType>>{
             {torch::kFloat, torch::kBFloat16}, {torch::kBFloat16, torch::kFloat}}) {
      const auto what = ::testing::Message() << "rows " << s.rows << " D " << s.D << " in " << in << " out " << out;
      auto x = torch::randn({s.rows, s.D}, f32).to(in), g = torch::randn({s.rows, s.D}, f32).to(torch::kBFloat16);
      auto w = torch::randn({s.D}, f32);
      auto dy = torch::randn({s.rows, s.D}, f32).to(out);
      std::vector<torch::Tensor> a{x.clone().requires_grad_(true), w.clone().requires_grad_(true),
                                   g.clone().requires_grad_(true)};
      std::vector<torch::Tensor> b{x.clone().requires_grad_(true), w.clone().requires_grad_(true),
                                   g.clone().requires_grad_(true)};
      auto y = rms_norm(a[0], a[1], 1e-6, Kernels::Cuda, a[2], out);
      // the chain: the norm in fp32, then the cast (into bf16), or the cast first (from bf16)
      auto y_chain = out == torch::kBFloat16 ? rms_norm(b[0], b[1], 1e-6, Kernels::Cuda, b[2]).to(out)
                                             : rms_norm(b[0].to(out), b[1], 1e-6, Kernels::Cuda, b[2]);
      ASSERT_EQ(y.scalar_type(), out) << what;
      EXPECT_TRUE(torch::equal(y, y_chain)) << what;
      auto ga = torch::autograd::grad({y}, a, {dy}), gb = torch::autograd::grad({y_chain}, b, {dy});
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(ga[i].scalar_type(), a[i].scalar_type()) << what << " grad " << i;
        EXPECT_LT(rel_err(ga[i], gb[i]), ga[i].scalar_type() == torch::kBFloat16 ? 4e-3 : 1e-6) << what << " grad " << i;
      }
    }
}

// A whole parity model (embedding, blocks with every norm, MLP, head), model.kernels=auto against torch: loss
// and every parameter gradient in fp32, and under bf16 autocast each against fp32. Also 12 packed DeltaNet runs,
// whose block norms hold 12 x 128 weights and whose output norm 48 rows, and 12 packed Mamba-2 runs (a gated norm
// row per run, the SSD over members' heads and groups).
TEST(NormKernel, ModelMatchesTensorOpForm) {
  SKIP_WITHOUT_KERNELS();
  NoTf32 exact;
  for (const std::string name : {"deltanet", "gated_deltanet", "deltanet packed", "mamba2 packed"}) {
    const int64_t K = name.find(" packed") != std::string::npos ? 12 : 1;
    auto grads_of = [&](bool kernels, bool bf16) {
      Config c = default_config();
      c.set_value("model.name", name.substr(0, name.find(' ')), "test");
      c.set_value("model.kernels", kernels ? "auto" : "torch", "test");
      c.set_value("model.hidden", "128", "test");
      c.set_value("model.heads", "4", "test");
      torch::manual_seed(7);
      SequenceModel m(c, 5, K);
      m->to(torch::kCUDA);
      torch::manual_seed(3);
      auto tokens = torch::randint(0, 5, K > 1 ? std::vector<int64_t>{6, 41, K} : std::vector<int64_t>{6, 41},
                                   torch::dtype(torch::kLong).device(torch::kCUDA));
      return output_and_grads(*m, bf16, [&] { return m->forward(tokens); });
    };
    expect_kernel_form_matches(grads_of, name + " model");
  }
}

}  // namespace
