// Mamba-2: the SSD chunked form == the plain recurrence == the step (also for negative and zero transitions
// and strong decays), and the layer's forward == reference == step.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "core/config.h"
#include "mixers/mamba2.h"
#include "models/sequence_model.h"
#include "tests/mixer_check.h"

using namespace memlab;
using namespace memlab::testing;

namespace {

struct SsdIn {
  torch::Tensor x, dt, A, Bm, Cm, h0;
  std::vector<torch::Tensor> all() const { return {x, dt, A, Bm, Cm, h0}; }
};

// Random SSD inputs; dt in [dt_lo, dt_hi], A in [-a_hi, -a_lo].
SsdIn random_ssd(int64_t B, int64_t T, int64_t H, int64_t P, int64_t G, int64_t N, torch::ScalarType dtype,
                 double dt_lo = 0.01, double dt_hi = 1.0, double a_lo = 0.5, double a_hi = 4.0) {
  auto o = torch::dtype(dtype);
  SsdIn in;
  in.x = torch::randn({B, T, H, P}, o);
  in.dt = torch::rand({B, T, H}, o) * (dt_hi - dt_lo) + dt_lo;
  in.A = -(torch::rand({H}, o) * (a_hi - a_lo) + a_lo);
  in.Bm = torch::randn({B, T, G, N}, o);
  in.Cm = torch::randn({B, T, G, N}, o);
  in.h0 = torch::randn({B, H, P, N}, o);
  for (auto* t : {&in.x, &in.dt, &in.A, &in.Bm, &in.Cm, &in.h0}) t->requires_grad_(true);
  return in;
}

// Chunked vs recurrent: outputs, final state, and the gradients of a random projection of both w.r.t. every
// input (x, dt, A, B, C, h0).
void expect_chunked_equals_recurrent(const SsdIn& in, int64_t chunk, bool neg, double tol, const std::string& what) {
  auto c = ssd_chunked(in.x, in.dt, in.A, in.Bm, in.Cm, chunk, neg, in.h0);
  auto r = ssd_recurrent(in.x, in.dt, in.A, in.Bm, in.Cm, neg, in.h0);
  ASSERT_TRUE(torch::isfinite(c.y).all().item<bool>()) << what;
  EXPECT_LT(rel_err(c.y, r.y), tol) << what;
  EXPECT_LT(rel_err(c.state, r.state), tol) << what;
  torch::manual_seed(7);
  auto wy = torch::randn_like(r.y), ws = torch::randn_like(r.state);
  auto gc = torch::autograd::grad({(c.y * wy).sum() + (c.state * ws).sum()}, in.all());
  auto gr = torch::autograd::grad({(r.y * wy).sum() + (r.state * ws).sum()}, in.all());
  const char* names[] = {"x", "dt", "A", "B", "C", "h0"};
  for (size_t i = 0; i < gc.size(); ++i) {
    ASSERT_TRUE(torch::isfinite(gc[i]).all().item<bool>()) << what << " grad " << names[i];
    EXPECT_LT(rel_err(gc[i], gr[i]), tol) << what << " grad " << names[i];
  }
}

std::shared_ptr<Mamba2Impl> mamba2_for_test(bool neg, bool conv_bias, int64_t ngroups, int64_t head_dim, bool random_all) {
  Mamba2Options o = mamba2_options(default_config());
  o.neg_eigval = neg;
  o.conv_bias = conv_bias;
  o.ngroups = ngroups;
  o.head_dim = head_dim;
  o.d_state = 8;
  o.chunk = 16;  // test lengths span several chunks
  auto m = std::make_shared<Mamba2Impl>(MixerShape{32, 4, 0.02, 1e-6}, o);
  if (random_all) {
    randomize(*m);
  } else {  // keep mamba's A_log / dt_bias / D init (small dt, A in [1, 16]); randomise the rest
    torch::NoGradGuard ng;
    for (const auto& [name, decays] : decays_by_name(*m))
      if (decays) m->named_parameters()[name].normal_(0.0, 0.3);
  }
  return m;
}

}  // namespace

class SsdChunked : public ::testing::TestWithParam<bool> {};

TEST_P(SsdChunked, MatchesRecurrentAcrossChunkSizesAndLengths) {
  const bool neg = GetParam();
  torch::manual_seed(0);
  for (int64_t T : {1, 7, 16, 33, 70}) {
    for (int64_t G : {1, 3}) {
      auto in = random_ssd(2, T, 3, 4, G, 5, torch::kDouble);
      for (int64_t C : {1, 4, 16, 64}) {
        expect_chunked_equals_recurrent(in, C, neg, 1e-11, "fp64 T=" + std::to_string(T) + " C=" + std::to_string(C) +
                                                                " G=" + std::to_string(G));
      }
    }
    auto in32 = random_ssd(2, T, 3, 4, 1, 5, torch::kFloat);
    for (int64_t C : {1, 8, 64})
      expect_chunked_equals_recurrent(in32, C, neg, 2e-5, "fp32 T=" + std::to_string(T) + " C=" + std::to_string(C));
  }
}

TEST_P(SsdChunked, StrongDecaysStayExact) {
  // dt*A down to -3200 per step: exp underflows to 0 without neg_eigval; with it, alpha = -1 exactly.
  const bool neg = GetParam();
  torch::manual_seed(1);
  for (int64_t T : {5, 40}) {
    auto in = random_ssd(2, T, 2, 3, 1, 4, torch::kDouble, 0.001, 200.0, 1.0, 16.0);
    for (int64_t C : {1, 8, 64}) expect_chunked_equals_recurrent(in, C, neg, 1e-11, "strong T=" + std::to_string(T));
    auto in32 = random_ssd(2, T, 2, 3, 1, 4, torch::kFloat, 0.001, 200.0, 1.0, 16.0);
    for (int64_t C : {1, 8, 64})
      expect_chunked_equals_recurrent(in32, C, neg, 2e-5, "strong fp32 T=" + std::to_string(T));
  }
}

INSTANTIATE_TEST_SUITE_P(NegEigval, SsdChunked, ::testing::Bool());

TEST(Ssd, NegativeAndZeroTransitions) {
  // neg_eigval with dt*A spanning (-inf, 0]: alpha covers (-1, 1] with many negatives, some ~0 and some exactly -1.
  torch::manual_seed(2);
  const int64_t B = 2, T = 45, H = 2;
  auto in = random_ssd(B, T, H, 3, 1, 4, torch::kDouble);
  {
    torch::NoGradGuard ng;
    in.A.fill_(-1.0);
    auto dt = in.dt;
    dt.uniform_(0.0, 3.0);
    dt.select(1, 3).fill_(std::log(2.0));  // alpha = 2 * 0.5 - 1 = 0
    dt.select(1, 20).fill_(std::log(2.0));
    dt.select(1, 30).fill_(800.0);         // alpha = -1
    dt.select(1, 31).fill_(800.0);
  }
  auto alpha = ssd_transition(in.dt.detach(), in.A.detach(), true);
  EXPECT_GT((alpha < 0).sum().item<int64_t>(), 20);
  EXPECT_EQ(alpha.select(1, 3).abs().eq(kSsdAbsAlphaFloor).all().item<bool>(), true);  // floored
  EXPECT_EQ(alpha.select(1, 30).eq(-1.0).all().item<bool>(), true);
  for (int64_t C : {1, 4, 16, 64}) expect_chunked_equals_recurrent(in, C, true, 1e-11, "C=" + std::to_string(C));
}

TEST(Ssd, ZeroTransitionIsFlooredStraightThrough) {
  // At the float just below ln 2, fp32 exp(-dt) is 0.5, so 2 exp(dt A) - 1 = 0: alpha is +floor, and its gradient
  // w.r.t. dt is that of 2 exp(dt A) - 1 (straight-through), as is log|alpha|'s times the floor.
  auto A = torch::full({1}, -1.0f);
  auto dt = torch::full({1, 1}, std::nextafter(static_cast<float>(std::log(2.0)), 0.f), torch::requires_grad());
  // exp(-dt) is 0.48 ulp above 0.5: a correctly rounded exp gives 0.5, one an ulp off 0.5 + 6e-8; both are floored.
  ASSERT_LT(std::abs((torch::exp(-dt.detach()) * 2.0 - 1.0).item<float>()), 2e-7f);
  auto alpha = ssd_transition(dt, A, true);
  EXPECT_EQ(alpha.item<float>(), static_cast<float>(kSsdAbsAlphaFloor));
  auto g = torch::autograd::grad({alpha.sum()}, {dt})[0];
  EXPECT_NEAR(g.item<float>(), -1.0, 1e-6);  // d/d dt of 2 exp(-dt) - 1 at exp(-dt) = 0.5
  auto lt = ssd_log_transition(dt, A, true);
  EXPECT_NEAR(lt.log_abs.item<float>(), std::log(kSsdAbsAlphaFloor), 1e-5);
  auto gl = torch::autograd::grad({lt.log_abs.sum()}, {dt})[0];
  EXPECT_NEAR(gl.item<float>() * kSsdAbsAlphaFloor, -1.0, 1e-4);
  // Away from zero the floor changes nothing.
  auto dt2 = torch::full({1, 1}, 0.3f);
  EXPECT_EQ(ssd_transition(dt2, A, true).item<float>(), (torch::exp(-dt2) * 2.0 - 1.0).item<float>());
}

TEST(Ssd, AlphaMinusOneFlipsTheStateEveryStep) {
  // One input at t = 0, then alpha = -1: y_t = (-1)^t y_0 exactly, across chunk boundaries.
  const int64_t T = 23;
  auto x = torch::zeros({1, T, 1, 1}, torch::kDouble);
  x.index_put_({0, 0, 0, 0}, 1.0);
  auto dt = torch::full({1, T, 1}, 1000.0, torch::kDouble);
  auto A = torch::full({1}, -1.0, torch::kDouble);
  auto Bm = torch::ones({1, T, 1, 1}, torch::kDouble), Cm = torch::ones({1, T, 1, 1}, torch::kDouble);
  auto r = ssd_chunked(x, dt, A, Bm, Cm, 4, true);
  for (int64_t t = 0; t < T; ++t) EXPECT_EQ(r.y.view(-1)[t].item<double>(), (t % 2 ? -1000.0 : 1000.0)) << t;
  // Without neg_eigval the same input is forgotten at once.
  auto r0 = ssd_chunked(x, dt, A, Bm, Cm, 4, false);
  EXPECT_EQ(r0.y.view(-1)[0].item<double>(), 1000.0);
  EXPECT_EQ(r0.y.view(-1).narrow(0, 1, T - 1).abs().max().item<double>(), 0.0);
}

TEST(Ssd, HandComputedTwoSteps) {
  // H = P = N = 1: h_1 = dt_1 x_1 B_1; h_2 = alpha_2 h_1 + dt_2 x_2 B_2; y_t = C_t h_t.
  auto x = torch::tensor({3.0, 5.0}, torch::kDouble).view({1, 2, 1, 1});
  auto dt = torch::tensor({0.5, 2.0}, torch::kDouble).view({1, 2, 1});
  auto A = torch::tensor({-1.0}, torch::kDouble);
  auto Bm = torch::tensor({1.0, -1.0}, torch::kDouble).view({1, 2, 1, 1});
  auto Cm = torch::tensor({2.0, 1.0}, torch::kDouble).view({1, 2, 1, 1});
  for (bool neg : {false, true}) {
    const double h1 = 0.5 * 3.0 * 1.0;                                            // 1.5
    const double a2 = neg ? 2.0 * std::exp(-2.0) - 1.0 : std::exp(-2.0);         // -0.7293 or 0.1353
    const double h2 = a2 * h1 + 2.0 * 5.0 * -1.0;
    for (int64_t C : {1, 2, 64}) {
      auto r = ssd_chunked(x, dt, A, Bm, Cm, C, neg);
      EXPECT_NEAR(r.y.view(-1)[0].item<double>(), 2.0 * h1, 1e-12) << neg << C;
      EXPECT_NEAR(r.y.view(-1)[1].item<double>(), 1.0 * h2, 1e-12) << neg << C;
      EXPECT_NEAR(r.state.view(-1)[0].item<double>(), h2, 1e-12) << neg << C;
    }
    auto rr = ssd_recurrent(x, dt, A, Bm, Cm, neg);
    EXPECT_NEAR(rr.y.view(-1)[1].item<double>(), h2, 1e-12);
    auto st = torch::zeros({1, 1, 1, 1}, torch::kDouble);
    ssd_step(x.select(1, 0), dt.select(1, 0), A, Bm.select(1, 0), Cm.select(1, 0), neg, st);
    auto y2 = ssd_step(x.select(1, 1), dt.select(1, 1), A, Bm.select(1, 1), Cm.select(1, 1), neg, st);
    EXPECT_NEAR(y2.view(-1)[0].item<double>(), h2, 1e-12);
  }
}

TEST(Ssd, ChunkedCarriesStateAndStepMatches) {
  torch::manual_seed(3);
  for (bool neg : {false, true}) {
    auto in = random_ssd(2, 20, 4, 3, 2, 5, torch::kDouble);
    auto full = ssd_chunked(in.x, in.dt, in.A, in.Bm, in.Cm, 8, neg);
    auto part = [&](const torch::Tensor& t, int64_t s, int64_t n) { return t.narrow(1, s, n); };
    auto a = ssd_chunked(part(in.x, 0, 11), part(in.dt, 0, 11), in.A, part(in.Bm, 0, 11), part(in.Cm, 0, 11), 8, neg);
    auto b = ssd_chunked(part(in.x, 11, 9), part(in.dt, 11, 9), in.A, part(in.Bm, 11, 9), part(in.Cm, 11, 9), 8, neg,
                         a.state);
    EXPECT_LT(rel_err(torch::cat({a.y, b.y}, 1), full.y), 1e-12);
    EXPECT_LT(rel_err(b.state, full.state), 1e-12);
    auto st = torch::zeros({2, 4, 3, 5}, torch::kDouble);
    std::vector<torch::Tensor> ys;
    for (int64_t t = 0; t < 20; ++t)
      ys.push_back(ssd_step(in.x.select(1, t), in.dt.select(1, t), in.A, in.Bm.select(1, t), in.Cm.select(1, t), neg, st));
    EXPECT_LT(rel_err(torch::stack(ys, 1), full.y), 1e-12);
    EXPECT_LT(rel_err(st, full.state), 1e-12);
  }
}

// (neg_eigval, conv_bias, ngroups, head_dim, randomise A_log/dt_bias/D too)
class Mamba2Forms : public ::testing::TestWithParam<std::tuple<bool, bool, int64_t, int64_t, bool>> {};

TEST_P(Mamba2Forms, ChunkedEqualsRecurrentEqualsStep) {
  auto [neg, bias, groups, head_dim, random_all] = GetParam();
  auto m = mamba2_for_test(neg, bias, groups, head_dim, random_all);
  for (int64_t T : {1, 5, 16, 37}) check_both(*m, 2, T, 32);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, Mamba2Forms,
    ::testing::Values(std::make_tuple(false, true, int64_t(1), int64_t(0), true),
                      std::make_tuple(true, true, int64_t(1), int64_t(0), true),
                      std::make_tuple(true, false, int64_t(2), int64_t(0), false),
                      std::make_tuple(false, true, int64_t(1), int64_t(0), false),
                      std::make_tuple(true, true, int64_t(4), int64_t(8), true)));  // 8 heads of 8, 4 groups

TEST(Mamba2, DefaultInitAndShapes) {
  torch::manual_seed(4);
  auto m = std::make_shared<Mamba2Impl>(MixerShape{32, 4, 0.02, 1e-6}, mamba2_options(default_config()));
  EXPECT_EQ(m->heads(), 4);
  EXPECT_EQ(m->head_dim(), 16);  // expand 2 * hidden 32 / 4 heads
  auto A = m->A_log.exp();
  EXPECT_GE(A.min().item<double>(), 1.0 - 1e-6);
  EXPECT_LE(A.max().item<double>(), 16.0 + 1e-5);
  auto dt = torch::softplus(m->dt_bias);
  EXPECT_GE(dt.min().item<double>(), 1e-4 * (1 - 1e-4));
  EXPECT_LE(dt.max().item<double>(), 0.1 * (1 + 1e-4));
  EXPECT_TRUE(m->D.eq(1.0).all().item<bool>());
  EXPECT_TRUE(m->conv_bias.eq(0.0).all().item<bool>());
  const auto decays = decays_by_name(*m);
  for (const char* name : {"A_log", "dt_bias", "D", "conv_bias"}) EXPECT_FALSE(decays.at(name)) << name;
  EXPECT_TRUE(decays.at("in_proj.weight"));
  Mamba2Options o = mamba2_options(default_config());
  o.head_dim = 8;
  EXPECT_EQ(Mamba2Impl(MixerShape{32, 4, 0.02, 1e-6}, o).heads(), 8);
}

TEST(Mamba2, ConfigRejectsBadShapes) {
  Schema schema;
  register_model_keys(schema);
  auto build = [&](const std::string& key, const std::string& value) {
    Config cfg(schema);
    cfg.set_value(key, value, "test");
    return make_mixer("mamba2", cfg, MixerShape{32, 4, 0.02, 1e-6});
  };
  EXPECT_NO_THROW(build("model.mamba2.ngroups", "2"));
  EXPECT_ANY_THROW(build("model.mamba2.ngroups", "3"));
  EXPECT_ANY_THROW(build("model.mamba2.head_dim", "7"));
  EXPECT_NO_THROW(build("model.mamba2.head_dim", "32"));
}

TEST(Mamba2, Bf16ChunkedStaysFiniteAndClose) {
  for (bool neg : {false, true}) {
    auto m = mamba2_for_test(neg, true, 1, 0, false);
    torch::manual_seed(5);
    auto x = torch::randn({2, 40, 32});
    auto y = m->forward(x);
    m->to(torch::kBFloat16);
    auto yb = m->forward(x.to(torch::kBFloat16));
    ASSERT_TRUE(torch::isfinite(yb).all().item<bool>()) << neg;
    EXPECT_LT(rel_err(yb, y), 5e-2) << neg;
  }
}

// On a GPU host the same equalities must hold for the CUDA kernels LibTorch dispatches to.
TEST(Cuda, Mamba2FormsAgreeOnGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  for (bool neg : {false, true}) {
    auto m = mamba2_for_test(neg, true, 1, 0, true);
    m->to(torch::kCUDA, torch::kDouble);
    auto x = torch::randn({2, 45, 32}, torch::dtype(torch::kDouble).device(torch::kCUDA));
    auto y = m->forward(x), y_ref = m->forward_reference(x), y_step = run_steps(*m, x);
    EXPECT_LT(rel_err(y, y_ref), 1e-9) << neg;
    EXPECT_LT(rel_err(y_step, y_ref), 1e-9) << neg;
    auto in = random_ssd(2, 70, 3, 4, 1, 5, torch::kFloat);
    SsdIn g;
    g.x = in.x.detach().cuda().requires_grad_(true);
    g.dt = in.dt.detach().cuda().requires_grad_(true);
    g.A = in.A.detach().cuda().requires_grad_(true);
    g.Bm = in.Bm.detach().cuda().requires_grad_(true);
    g.Cm = in.Cm.detach().cuda().requires_grad_(true);
    g.h0 = in.h0.detach().cuda().requires_grad_(true);
    expect_chunked_equals_recurrent(g, 16, neg, 2e-5, "cuda fp32");
  }
}
