// Gated delta rule (chunked == recurrent == step, strong decays, hand-computed case) and the Gated DeltaNet mixer.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "core/config.h"
#include "ops/delta_rule/reference.h"
#include "mixers/gated_deltanet.h"
#include "mixers/ops.h"
#include "ops/norm/norm.h"
#include "tests/mixer_check.h"

using namespace memlab;
using namespace memlab::testing;

namespace {

struct GatedInputs {
  torch::Tensor q, k, v, beta, g;
};

// Random inputs; g uniform in [g_min, 0].
GatedInputs random_gated(int64_t B, int64_t T, int64_t H, int64_t dk, int64_t dv, double g_min,
                         torch::ScalarType dt = torch::kFloat) {
  auto o = torch::dtype(dt);
  return {l2_normalize_reference(torch::randn({B, T, H, dk}, o)), l2_normalize_reference(torch::randn({B, T, H, dk}, o)),
          torch::randn({B, T, H, dv}, o), torch::rand({B, T, H}, o) * 2.0, torch::rand({B, T, H}, o) * g_min};
}

std::shared_ptr<GatedDeltaNetImpl> random_gdn(bool neg, bool conv, bool gate, int64_t expand_v = 1) {
  GatedDeltaNetOptions o = gated_deltanet_options(default_config());
  o.neg_eigval = neg;
  o.short_conv = conv;
  o.out_gate = gate;
  o.expand_v = expand_v;
  o.chunk = 16;
  auto m = std::make_shared<GatedDeltaNetImpl>(MixerShape{32, 4, 0.02, 1e-6}, o);
  randomize(*m);
  return m;
}

}  // namespace

TEST(GatedDeltaRule, ChunkedMatchesRecurrentAcrossChunkSizes) {
  torch::manual_seed(0);
  for (auto dt : {torch::kFloat, torch::kDouble}) {
    const double tol = dt == torch::kDouble ? 1e-11 : 1e-5;
    for (int64_t T : {1, 7, 16, 33, 70}) {
      auto in = random_gated(2, T, 3, 8, 6, -3.0, dt);
      auto ref = delta_rule_recurrent(in.q, in.k, in.v, in.beta, 0.5, {}, in.g);
      for (int64_t C : {1, 4, 16, 64}) {
        auto out = delta_rule_chunked(in.q, in.k, in.v, in.beta, C, 0.5, {}, true, in.g);
        EXPECT_LT(rel_err(out.o, ref.o), tol) << "T=" << T << " C=" << C;
        EXPECT_LT(rel_err(out.state, ref.state), tol) << "T=" << T << " C=" << C;
      }
    }
  }
}

TEST(GatedDeltaRule, StrongDecaysStayFiniteAndExact) {
  // Within a chunk of 64 the cumulative log-decay reaches -1280: exp of the unmasked upper triangle would overflow.
  torch::manual_seed(1);
  auto opts = torch::dtype(torch::kDouble);
  for (double g_min : {-20.0, -5.0}) {
    auto in = random_gated(2, 70, 2, 8, 8, g_min, torch::kDouble);
    in.g.select(1, 3).fill_(-20.0);
    in.g.select(1, 4).fill_(0.0);
    std::vector<torch::Tensor> leaves = {in.q, in.k, in.v, in.beta, in.g};
    for (auto& t : leaves) t.requires_grad_(true);
    auto w = torch::randn({2, 70, 2, 8}, opts);
    auto ref = delta_rule_recurrent(leaves[0], leaves[1], leaves[2], leaves[3], 0.5, {}, leaves[4]);
    auto g_ref = torch::autograd::grad({(ref.o * w).sum() + ref.state.sum()}, leaves);
    for (int64_t C : {16, 64}) {
      for (auto dt : {torch::kFloat, torch::kDouble}) {
        std::vector<torch::Tensor> x;
        for (auto& t : leaves) x.push_back(t.detach().to(dt).requires_grad_(true));
        auto out = delta_rule_chunked(x[0], x[1], x[2], x[3], C, 0.5, {}, true, x[4]);
        ASSERT_TRUE(torch::isfinite(out.o).all().item<bool>()) << C;
        ASSERT_TRUE(torch::isfinite(out.state).all().item<bool>()) << C;
        auto gr = torch::autograd::grad({(out.o * w.to(dt)).sum() + out.state.sum()}, x);
        const double tol = dt == torch::kDouble ? 1e-10 : 1e-4;
        EXPECT_LT(rel_err(out.o, ref.o), tol) << "C=" << C << " g_min=" << g_min;
        for (size_t i = 0; i < gr.size(); ++i) {
          ASSERT_TRUE(torch::isfinite(gr[i]).all().item<bool>()) << "grad " << i << " C=" << C;
          EXPECT_LT(rel_err(gr[i], g_ref[i]), tol) << "grad " << i << " C=" << C << " g_min=" << g_min;
        }
      }
    }
  }
}

TEST(GatedDeltaRule, HandComputedTwoSteps) {
  // d = 1, α = (0.5, 0.25), β = (0.5, 2), k = (1, -1), v = (3, 5), q = 1, scale 1.
  // From S_0 = 0: u_1 = 0.5 (3 - 0) = 1.5, S_1 = 1.5; S <- 0.375, u_2 = 2 (5 - 0.375 (-1)) = 10.75,
  //   S_2 = 0.375 - 10.75 = -10.375.
  // From S_0 = 2: S <- 1, u_1 = 0.5 (3 - 1) = 1, S_1 = 2; S <- 0.5, u_2 = 2 (5 + 0.5) = 11, S_2 = -10.5.
  auto q = torch::tensor({1.0, 1.0}, torch::kDouble).view({1, 2, 1, 1});
  auto k = torch::tensor({1.0, -1.0}, torch::kDouble).view({1, 2, 1, 1});
  auto v = torch::tensor({3.0, 5.0}, torch::kDouble).view({1, 2, 1, 1});
  auto beta = torch::tensor({0.5, 2.0}, torch::kDouble).view({1, 2, 1});
  auto g = torch::tensor({std::log(0.5), std::log(0.25)}, torch::kDouble).view({1, 2, 1});
  auto S0 = torch::full({1, 1, 1, 1}, 2.0, torch::kDouble);
  for (int64_t C : {1, 2, 64}) {
    auto a = delta_rule_chunked(q, k, v, beta, C, 1.0, {}, true, g);
    EXPECT_NEAR(a.o.view(-1)[0].item<double>(), 1.5, 1e-12) << C;
    EXPECT_NEAR(a.o.view(-1)[1].item<double>(), -10.375, 1e-12) << C;
    EXPECT_NEAR(a.state.view(-1)[0].item<double>(), -10.375, 1e-12) << C;
    auto b = delta_rule_chunked(q, k, v, beta, C, 1.0, S0, true, g);
    EXPECT_NEAR(b.o.view(-1)[0].item<double>(), 2.0, 1e-12) << C;
    EXPECT_NEAR(b.o.view(-1)[1].item<double>(), -10.5, 1e-12) << C;
    EXPECT_NEAR(b.state.view(-1)[0].item<double>(), -10.5, 1e-12) << C;
  }
  auto S = S0.clone();
  auto o1 = delta_rule_step_reference(q.select(1, 0), k.select(1, 0), v.select(1, 0), beta.select(1, 0), 1.0, S, g.select(1, 0));
  auto o2 = delta_rule_step_reference(q.select(1, 1), k.select(1, 1), v.select(1, 1), beta.select(1, 1), 1.0, S, g.select(1, 1));
  EXPECT_NEAR(o1.item<double>(), 2.0, 1e-12);
  EXPECT_NEAR(o2.item<double>(), -10.5, 1e-12);
}

TEST(GatedDeltaRule, ChunkedCarriesInitialStateAndStepAgrees) {
  torch::manual_seed(3);
  const int64_t B = 2, T = 20, H = 2, d = 4;
  auto in = random_gated(B, T, H, d, d, -1.0);
  auto S0 = torch::randn({B, H, d, d});
  auto full = delta_rule_chunked(in.q, in.k, in.v, in.beta, 8, 1.0, S0, true, in.g);
  auto sl = [](const torch::Tensor& t, int64_t a, int64_t n) { return t.narrow(1, a, n); };
  auto a = delta_rule_chunked(sl(in.q, 0, 11), sl(in.k, 0, 11), sl(in.v, 0, 11), sl(in.beta, 0, 11), 8, 1.0, S0, true,
                              sl(in.g, 0, 11));
  auto b = delta_rule_chunked(sl(in.q, 11, 9), sl(in.k, 11, 9), sl(in.v, 11, 9), sl(in.beta, 11, 9), 8, 1.0, a.state,
                              true, sl(in.g, 11, 9));
  EXPECT_LT(rel_err(torch::cat({a.o, b.o}, 1), full.o), 1e-5);
  EXPECT_LT(rel_err(b.state, full.state), 1e-5);
  auto ref = delta_rule_recurrent(in.q, in.k, in.v, in.beta, 1.0, S0, in.g);
  EXPECT_LT(rel_err(full.o, ref.o), 1e-5);
  auto S = S0.clone();
  std::vector<torch::Tensor> ys;
  for (int64_t t = 0; t < T; ++t)
    ys.push_back(delta_rule_step_reference(in.q.select(1, t), in.k.select(1, t), in.v.select(1, t), in.beta.select(1, t), 1.0, S,
                                 in.g.select(1, t)));
  EXPECT_LT(rel_err(torch::stack(ys, 1), ref.o), 1e-5);
  EXPECT_LT(rel_err(S, ref.state), 1e-5);
}

TEST(GatedDeltaRule, ZeroLogDecayIsTheDeltaRule) {
  torch::manual_seed(4);
  auto in = random_gated(2, 37, 2, 8, 8, -1.0, torch::kDouble);
  auto g0 = torch::zeros_like(in.g);
  auto a = delta_rule_chunked(in.q, in.k, in.v, in.beta, 16, 0.5, {}, true, g0);
  auto b = delta_rule_chunked(in.q, in.k, in.v, in.beta, 16, 0.5);
  EXPECT_LT(rel_err(a.o, b.o), 1e-12);
  EXPECT_LT(rel_err(a.state, b.state), 1e-12);
}

TEST(GatedDeltaRule, InterChunkReadOnly) {
  // with_intra = false: o_t = scale (q_t exp(G_t))^T S_{start of t's chunk}, G_t the in-chunk cumulative log-decay.
  torch::manual_seed(5);
  const int64_t C = 8, T = 21;
  auto in = random_gated(1, T, 2, 4, 4, -1.0, torch::kDouble);
  auto S0 = torch::randn({1, 2, 4, 4}, torch::kDouble);
  auto out = delta_rule_chunked(in.q, in.k, in.v, in.beta, C, 0.5, S0, false, in.g);
  auto full = delta_rule_recurrent(in.q, in.k, in.v, in.beta, 0.5, S0, in.g);
  EXPECT_LT(rel_err(out.state, full.state), 1e-12);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t start = t / C * C;
    auto S = start == 0 ? S0
                        : delta_rule_recurrent(in.q.narrow(1, 0, start), in.k.narrow(1, 0, start),
                                               in.v.narrow(1, 0, start), in.beta.narrow(1, 0, start), 0.5, S0,
                                               in.g.narrow(1, 0, start))
                              .state;
    auto G = in.g.narrow(1, start, t - start + 1).sum(1);  // [1, H]
    auto expect = torch::einsum("bhkv,bhk->bhv", {S, in.q.select(1, t) * 0.5 * G.exp().unsqueeze(-1)});
    EXPECT_LT(rel_err(out.o.select(1, t), expect), 1e-12) << t;
  }
}

class GatedDeltaNetForms : public ::testing::TestWithParam<std::tuple<bool, bool, bool, int64_t>> {};

TEST_P(GatedDeltaNetForms, ChunkedEqualsRecurrentEqualsStep) {
  auto [neg, conv, gate, expand_v] = GetParam();
  auto m = random_gdn(neg, conv, gate, expand_v);
  for (int64_t T : {1, 5, 16, 37}) check_both(*m, 2, T, 32);
}

INSTANTIATE_TEST_SUITE_P(Variants, GatedDeltaNetForms,
                         ::testing::Values(std::make_tuple(true, true, true, int64_t(1)),
                                           std::make_tuple(false, true, true, int64_t(2)),
                                           std::make_tuple(true, false, false, int64_t(1))));

TEST(GatedDeltaNet, InitMatchesFla) {
  GatedDeltaNetOptions o = gated_deltanet_options(default_config());
  auto m = std::make_shared<GatedDeltaNetImpl>(MixerShape{64, 16, 0.02, 1e-6}, o);
  auto A = m->A_log.exp(), dt = torch::softplus(m->dt_bias);
  EXPECT_TRUE(torch::isfinite(m->A_log).all().item<bool>());
  EXPECT_GT(A.min().item<float>(), 0.0f);
  EXPECT_LE(A.max().item<float>(), 16.0f);
  EXPECT_GE(dt.min().item<float>(), 1e-3f * 0.999f);
  EXPECT_LE(dt.max().item<float>(), 0.1f * 1.001f);
  const auto decays = decays_by_name(*m);
  EXPECT_FALSE(decays.at("A_log"));
  EXPECT_FALSE(decays.at("dt_bias"));
  EXPECT_TRUE(decays.at("q_proj.weight"));
}

TEST(GatedDeltaNet, Bf16ChunkedStaysFiniteAndClose) {
  GatedDeltaNetOptions o = gated_deltanet_options(default_config());
  o.neg_eigval = true;
  auto m = std::make_shared<GatedDeltaNetImpl>(MixerShape{32, 4, 0.02, 1e-6}, o);
  randomize(*m);
  auto x = torch::randn({2, 100, 32});
  auto y = m->forward(x);
  m->to(torch::kBFloat16);
  auto yb = m->forward(x.to(torch::kBFloat16));
  ASSERT_TRUE(torch::isfinite(yb).all().item<bool>());
  EXPECT_LT(rel_err(yb, y), 5e-2);
}
