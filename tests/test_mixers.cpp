// Every mixer: training form == plain recurrence == step-by-step (outputs and input gradients, fp32).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "core/config.h"
#include "mixers/attention.h"
#include "ops/delta_rule/delta_rule.h"
#include "ops/delta_rule/reference.h"
#include "mixers/deltanet.h"
#include "mixers/linear_attention.h"
#include "mixers/mamba2.h"
#include "mixers/mesa.h"
#include "ops/norm/norm.h"
#include "models/sequence_model.h"
#include "tests/mixer_check.h"

using namespace memlab;
using namespace memlab::testing;

namespace {

// A randomised DeltaNet of width 32 and 4 heads, chunk 16 (so test lengths span several chunks).
std::shared_ptr<DeltaNetImpl> random_deltanet(bool neg, bool conv, bool gate) {
  DeltaNetOptions o = deltanet_options(default_config());
  o.neg_eigval = neg;
  o.short_conv = conv;
  o.out_gate = gate;
  o.chunk = 16;
  auto m = std::make_shared<DeltaNetImpl>(MixerShape{32, 4, 0.02, 1e-6}, o);
  randomize(*m);
  return m;
}

}  // namespace

TEST(DeltaRule, ChunkedMatchesRecurrentAcrossChunkSizes) {
  torch::manual_seed(0);
  const int64_t B = 2, H = 3, d = 8;
  for (int64_t T : {1, 7, 16, 33, 70}) {
    auto q = l2_normalize_reference(torch::randn({B, T, H, d}));
    auto k = l2_normalize_reference(torch::randn({B, T, H, d}));
    auto v = torch::randn({B, T, H, d});
    auto beta = torch::rand({B, T, H}) * 2.0;  // eigenvalues of the transition in [-1, 1]
    auto ref = delta_rule_recurrent(q, k, v, beta, 0.5);
    for (int64_t C : {1, 4, 16, 64}) {
      auto out = delta_rule_chunked(q, k, v, beta, C, 0.5);
      EXPECT_LT(rel_err(out.o, ref.o), 1e-5) << "T=" << T << " C=" << C;
      EXPECT_LT(rel_err(out.state, ref.state), 1e-5) << "T=" << T << " C=" << C;
    }
  }
}

TEST(DeltaRule, HandComputedTwoSteps) {
  // d = 1: S_1 = b1 v1 k1^2; S_2 = S_1 + k2 * b2 * (v2 - S_1 k2); o_t = S_t q_t.
  auto q = torch::tensor({1.0f, 1.0f}).view({1, 2, 1, 1});
  auto k = torch::tensor({1.0f, -1.0f}).view({1, 2, 1, 1});
  auto v = torch::tensor({3.0f, 5.0f}).view({1, 2, 1, 1});
  auto beta = torch::tensor({0.5f, 2.0f}).view({1, 2, 1});
  // S1 = 1.5; S2 = 1.5 + (-1) * 2 * (5 - 1.5*(-1)) = 1.5 - 13 = -11.5
  auto out = delta_rule_chunked(q, k, v, beta, 64, 1.0);
  EXPECT_NEAR(out.o.view(-1)[0].item<float>(), 1.5f, 1e-6);
  EXPECT_NEAR(out.o.view(-1)[1].item<float>(), -11.5f, 1e-5);
  EXPECT_NEAR(out.state.view(-1)[0].item<float>(), -11.5f, 1e-5);
}

TEST(DeltaRule, ChunkedCarriesInitialState) {
  torch::manual_seed(3);
  const int64_t B = 1, T = 20, H = 2, d = 4;
  auto q = l2_normalize_reference(torch::randn({B, T, H, d})), k = l2_normalize_reference(torch::randn({B, T, H, d}));
  auto v = torch::randn({B, T, H, d});
  auto beta = torch::rand({B, T, H});
  auto full = delta_rule_chunked(q, k, v, beta, 8, 1.0);
  auto a = delta_rule_chunked(q.narrow(1, 0, 11), k.narrow(1, 0, 11), v.narrow(1, 0, 11), beta.narrow(1, 0, 11), 8, 1.0);
  auto b = delta_rule_chunked(q.narrow(1, 11, 9), k.narrow(1, 11, 9), v.narrow(1, 11, 9), beta.narrow(1, 11, 9), 8, 1.0,
                              a.state);
  EXPECT_LT(rel_err(torch::cat({a.o, b.o}, 1), full.o), 1e-5);
}

// The Delayed-Chunk read as the full rule on interleaved read and update tokens (what the kernels run) equals the
// chunked form without the intra-chunk term: outputs, final state and every input gradient, fp64.
TEST(DeltaRule, DelayedReadInterleavedMatchesChunkedRead) {
  torch::manual_seed(4);
  auto f64 = torch::dtype(torch::kDouble);
  const int64_t B = 2, H = 3, d = 5;
  for (bool gated : {false, true})
    for (int64_t T : {1, 7, 16, 33})
      for (int64_t C : {4, 16}) {
        std::vector<torch::Tensor> x = {torch::randn({B, T, H, d}, f64), torch::randn({B, T, H, d}, f64),
                                        torch::randn({B, T, H, d}, f64), torch::rand({B, T, H}, f64) * 2.0,
                                        -torch::rand({B, T, H}, f64), torch::randn({B, H, d, d}, f64) * 0.3};
        DeltaRuleForm form = layer_rule_form(0.7, C, Kernels::Torch);
        form.with_intra = false;
        auto run = [&](bool interleaved) {
          std::vector<torch::Tensor> leaves;
          for (auto& t : x) leaves.push_back(t.clone().requires_grad_(true));
          const auto g = gated ? leaves[4] : torch::Tensor();
          auto r = interleaved
                       ? delta_rule_delayed_read_interleaved(leaves[0], leaves[1], leaves[2], leaves[3], form, g, leaves[5])
                       : delta_rule(leaves[0], leaves[1], leaves[2], leaves[3], form, g, leaves[5]);
          ((r.o * torch::cos(torch::arange(r.o.numel(), f64).view_as(r.o))).sum() + r.state.square().sum()).backward();
          std::vector<torch::Tensor> out = {r.o.detach(), r.state.detach()};
          for (auto& l : leaves) out.push_back(l.grad().defined() ? l.grad() : torch::zeros_like(l));
          return out;
        };
        auto ref = run(false), got = run(true);
        const char* names[] = {"o", "state", "dq", "dk", "dv", "dbeta", "dg", "dh0"};
        for (size_t i = 0; i < ref.size(); ++i)
          EXPECT_LT(rel_err(got[i], ref[i]), 1e-10) << names[i] << " gated=" << gated << " T=" << T << " C=" << C;
      }
}

// The Delayed-Chunk read from the states before each chunk (what delta_rule_delayed_read_states reads from the
// kernel), with the states from the token-by-token reference here, equals the chunked form without the intra-chunk
// term: outputs and every input gradient, fp64, lengths around the chunk of 16.
TEST(DeltaRule, DelayedReadFromStatesMatchesChunkedRead) {
  torch::manual_seed(5);
  auto f64 = torch::dtype(torch::kDouble);
  const int64_t B = 2, H = 3, dk = 5, dv = 4, C = 16;
  for (int64_t T : {1, 15, 16, 17, 40}) {
    std::vector<torch::Tensor> x = {l2_normalize_reference(torch::randn({B, T, H, dk}, f64)),
                                    l2_normalize_reference(torch::randn({B, T, H, dk}, f64)),
                                    torch::randn({B, T, H, dv}, f64), torch::rand({B, T, H}, f64) * 2.0,
                                    torch::randn({B, H, dk, dv}, f64) * 0.3};
    auto run = [&](bool by_states) {
      std::vector<torch::Tensor> l;
      for (auto& t : x) l.push_back(t.clone().requires_grad_(true));
      torch::Tensor o;
      if (by_states) {
        std::vector<torch::Tensor> states;
        auto S = l[4];
        for (int64_t t = 0; t < T; ++t) {
          if (t % C == 0) states.push_back(S);
          delta_rule_step_reference(l[0].select(1, t), l[1].select(1, t), l[2].select(1, t), l[3].select(1, t), 0.7, S);
        }
        o = delta_rule_read_states(l[0], torch::stack(states, 2), C, 0.7);
      } else {
        o = delta_rule_chunked(l[0], l[1], l[2], l[3], C, 0.7, l[4], /*with_intra=*/false).o;
      }
      (o * torch::cos(torch::arange(o.numel(), f64).view_as(o))).sum().backward();
      std::vector<torch::Tensor> out = {o.detach()};
      for (auto& t : l) out.push_back(t.grad().defined() ? t.grad() : torch::zeros_like(t));
      return out;
    };
    auto ref = run(false), got = run(true);
    const char* names[] = {"o", "dq", "dk", "dv", "dbeta", "dh0"};
    for (size_t i = 0; i < ref.size(); ++i) EXPECT_LT(rel_err(got[i], ref[i]), 1e-10) << names[i] << " T=" << T;
  }
}

class DeltaNetForms : public ::testing::TestWithParam<std::tuple<bool, bool, bool>> {};

TEST_P(DeltaNetForms, ChunkedEqualsRecurrentEqualsStep) {
  auto [neg, conv, gate] = GetParam();
  auto m = random_deltanet(neg, conv, gate);
  for (int64_t T : {1, 5, 16, 37}) check_both(*m, 2, T, 32);
}

INSTANTIATE_TEST_SUITE_P(Variants, DeltaNetForms,
                         ::testing::Values(std::make_tuple(false, true, true), std::make_tuple(true, true, true),
                                           std::make_tuple(true, false, false), std::make_tuple(false, false, true)));

class AttentionForms : public ::testing::TestWithParam<std::tuple<int64_t, bool>> {};

TEST_P(AttentionForms, ParallelEqualsRecurrentEqualsStep) {
  auto [window, rope] = GetParam();
  AttentionOptions o = attention_options(default_config());
  o.window = window;
  o.rope = rope;
  MixerShape shape{32, 4, 0.02, 1e-6};
  auto m = std::make_shared<AttentionImpl>(shape, o);
  randomize(*m, 0.2);
  for (int64_t T : {1, 6, 19}) check_both(*m, 2, T, 32);
}

INSTANTIATE_TEST_SUITE_P(Variants, AttentionForms,
                         ::testing::Values(std::make_tuple(int64_t(0), false), std::make_tuple(int64_t(0), true),
                                           std::make_tuple(int64_t(4), true), std::make_tuple(int64_t(5), false)));

TEST(Attention, WindowForgetsOldTokens) {
  // With a window of 2, changing token 0 cannot change the output at t >= 2 in a single layer.
  AttentionOptions o = attention_options(default_config());
  o.window = 2;
  MixerShape shape{16, 2, 0.02, 1e-6};
  auto m = std::make_shared<AttentionImpl>(shape, o);
  randomize(*m);
  auto x = torch::randn({1, 6, 16});
  auto x2 = x.clone();
  x2.select(1, 0).add_(3.0);
  auto y = m->forward(x), y2 = m->forward(x2);
  EXPECT_GT(rel_err(y.select(1, 1), y2.select(1, 1)), 1e-3);
  EXPECT_LT(rel_err(y.narrow(1, 2, 4), y2.narrow(1, 2, 4)), 1e-6);
}

TEST(DeltaNet, Bf16ChunkedStaysFiniteAndClose) {
  DeltaNetOptions o = deltanet_options(default_config());
  o.neg_eigval = true;
  MixerShape shape{32, 4, 0.02, 1e-6};
  auto m = std::make_shared<DeltaNetImpl>(shape, o);
  randomize(*m);
  auto x = torch::randn({2, 40, 32});
  auto y = m->forward(x);
  m->to(torch::kBFloat16);
  auto yb = m->forward(x.to(torch::kBFloat16));
  ASSERT_TRUE(torch::isfinite(yb).all().item<bool>());
  EXPECT_LT(rel_err(yb, y), 5e-2);
}

// Every registered mixer, inside the full model: forward == reference == step, and all parameters get finite
// gradients. A mixer's "model.<name>.chunk" key, where it has one, is set small so 21 tokens span chunks.
// The one-hot backward of small vocabularies gives ATen's embedding gradient, repeated tokens included.
TEST(SequenceModel, TokenEmbeddingGradientMatchesAten) {
  torch::manual_seed(4);
  for (int64_t V : {5, 64, 65}) {
    auto w = torch::randn({V, 6}, torch::kDouble).requires_grad_(true);
    auto tokens = torch::randint(0, V, {3, 9}, torch::kLong);
    auto dy = torch::randn({3, 9, 6}, torch::kDouble);
    auto ours = torch::autograd::grad({(token_embedding(w, tokens) * dy).sum()}, {w})[0];
    auto aten = torch::autograd::grad({(torch::embedding(w, tokens) * dy).sum()}, {w})[0];
    EXPECT_LT((ours - aten).abs().max().item<double>(), 1e-12) << "V " << V;
    EXPECT_TRUE(torch::equal(token_embedding(w, tokens), torch::embedding(w, tokens))) << "V " << V;
  }
}

TEST(SequenceModel, EveryMixerForwardEqualsReferenceEqualsStep) {
  Schema schema;
  register_model_keys(schema);
  for (const auto& name : mixer_names()) {
    Config cfg(schema);
    cfg.set_value("model.name", name, "test");
    cfg.set_value("model.hidden", "32", "test");
    cfg.set_value("model.heads", "2", "test");
    cfg.set_value("model.init_std", "0.2", "test");
    if (schema.find("model." + name + ".chunk")) cfg.set_value("model." + name + ".chunk", "8", "test");
    SequenceModel model(cfg, 5);
    model->to(torch::kDouble);
    auto tokens = torch::randint(0, 5, {3, 21});
    auto y = model->forward(tokens);
    auto y_ref = model->forward_reference(tokens);
    EXPECT_LT(rel_err(y, y_ref), 1e-8) << name;
    auto st = model->init_state(3, torch::TensorOptions().dtype(torch::kDouble));
    std::vector<torch::Tensor> ys;
    for (int64_t t = 0; t < 21; ++t) ys.push_back(model->step(tokens.select(1, t), st));
    EXPECT_LT(rel_err(torch::stack(ys, 1), y_ref), 1e-8) << name;
    y.logsumexp(-1).sum().backward();
    for (auto& p : model->named_parameters()) {
      ASSERT_TRUE(p.value().grad().defined()) << name << " " << p.key();
      EXPECT_TRUE(torch::isfinite(p.value().grad()).all().item<bool>()) << name << " " << p.key();
    }
  }
}

// On a GPU host the same equalities must hold for the CUDA kernels LibTorch dispatches to.
TEST(Cuda, DeltaNetAndAttentionFormsAgreeOnGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto m = random_deltanet(true, true, true);
  m->to(torch::kCUDA, torch::kDouble);
  auto x = torch::randn({2, 45, 32}, torch::dtype(torch::kDouble).device(torch::kCUDA));
  auto y = m->forward(x), y_ref = m->forward_reference(x), y_step = run_steps(*m, x);
  EXPECT_LT(rel_err(y, y_ref), 1e-9);
  EXPECT_LT(rel_err(y_step, y_ref), 1e-9);
  AttentionOptions ao = attention_options(default_config());  // the CLI's defaults (rope_theta, ...)
  ao.window = 5;
  ao.rope = true;
  auto a = std::make_shared<AttentionImpl>(MixerShape{32, 4, 0.02, 1e-6}, ao);
  randomize(*a, 0.2);
  a->to(torch::kCUDA, torch::kFloat);
  auto xf = x.to(torch::kFloat);
  EXPECT_LT(rel_err(a->forward(xf), a->forward_reference(xf)), 1e-4);
  EXPECT_LT(rel_err(run_steps(*a, xf), a->forward_reference(xf)), 1e-4);
}

// External check against flash-linear-attention's naive.py functions: tests/check_fla_naive.py writes fixed inputs
// and fla's outputs to the file named by MEMLAB_FLA_FIXTURE and runs this test on it.
namespace {

std::map<std::string, torch::Tensor> read_fixture(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::map<std::string, torch::Tensor> out;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream hdr(line);
    std::string name;
    int64_t ndim = 0;
    hdr >> name >> ndim;
    std::vector<int64_t> shape(ndim);
    for (auto& s : shape) hdr >> s;
    auto t = torch::empty(shape, torch::kFloat);
    in.read(reinterpret_cast<char*>(t.data_ptr<float>()), t.numel() * sizeof(float));
    out[name] = t;
  }
  return out;
}

}  // namespace

TEST(FlaNaive, MatchesFixture) {
  const char* path = std::getenv("MEMLAB_FLA_FIXTURE");
  if (!path) GTEST_SKIP() << "run through tests/check_fla_naive.py (needs flash-linear-attention)";
  auto f = read_fixture(path);
  const auto& q = f.at("dr_q");
  const auto& k = f.at("dr_k");
  const auto& v = f.at("dr_v");
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  // fla.ops.delta_rule.naive.delta_rule_recurrence
  EXPECT_LT(rel_err(delta_rule_chunked(q, k, v, f.at("dr_beta"), 16, scale).o, f.at("dr_o")), 1e-5);
  // fla.ops.gated_delta_rule.naive.naive_recurrent_gated_delta_rule
  EXPECT_LT(rel_err(delta_rule_chunked(q, k, v, f.at("dr_beta"), 16, scale, {}, true, f.at("gdr_g")).o, f.at("gdr_o")),
            1e-5);
  // fla.ops.simple_gla.naive.naive_recurrent_simple_gla (Mamba-2's SSD with q = C, k = B, v = x dt, g = dt A)
  for (int64_t chunk : {8, 64})
    EXPECT_LT(rel_err(ssd_chunked(f.at("ssd_x"), f.at("ssd_dt"), f.at("ssd_A"), f.at("ssd_B"), f.at("ssd_C"), chunk,
                                  false)
                          .y,
                      f.at("ssd_y")),
              1e-5);
  // fla.ops.linear_attn.naive.naive_recurrent_linear_attn(normalize=True)
  EXPECT_LT(rel_err(linear_attention_chunked(f.at("la_q"), f.at("la_k"), v, 16, scale, true).o, f.at("la_o")), 1e-5);
  // fla.ops.mesa_net.naive: the exact solve, and fla's chunked CG (zero start, eps 1e-5, 30 steps, T = 32)
  MesaCG cg;
  cg.steps = 30;
  EXPECT_LT(rel_err(mesa_chunked(q, k, v, f.at("mesa_g"), f.at("mesa_beta"), f.at("mesa_lambda"), cg, 16).o,
                    f.at("mesa_exact_o")),
            1e-4);
  MesaCG fla_cg;
  fla_cg.init = MesaCGInit::Zero;
  fla_cg.eps = 1e-5;
  fla_cg.normalize_rhs = false;
  auto first = [](const torch::Tensor& t) { return t.narrow(1, 0, 32); };
  EXPECT_LT(rel_err(mesa_chunked(first(q), first(k), first(v), first(f.at("mesa_g")), first(f.at("mesa_beta")),
                                 f.at("mesa_lambda"), fla_cg, 16)
                        .o,
                    f.at("mesa_cg_o")),
            1e-4);
}
