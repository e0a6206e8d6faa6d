// Mesa layer: chunked CG == exact solve (fp64, CG run to convergence), custom backward (implicit differentiation)
// == autograd through an exact solve, training form == per-token reference == step, hand-computed d = 1 case.
//
// What "exact" means here: CG with at least dk steps and a negligible eps converges, in exact arithmetic, to the
// solution of (H_t + Λ) x = q_t, so in fp64 the chunked CG must match mesa_exact (materialised H_t and
// torch::linalg_solve) to rounding; with fewer steps or fla's eps = 1e-5 it is an approximation and only the forms
// that run the same CG (mesa_recurrent, mesa_step) must agree with it to rounding.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/config.h"
#include "mixers/mesa.h"
#include "ops/norm/norm.h"
#include "tests/mixer_check.h"

using namespace memlab;
using namespace memlab::testing;

namespace {

struct Inputs {
  torch::Tensor q, k, v, g, beta, lam, h0, g0;
};

// Random inputs as the layer makes them: unit q, k; γ = sigmoid(.) in roughly [0.5, 1]; β in (0, 1); λ >= 0.25.
Inputs random_inputs(int64_t B, int64_t T, int64_t H, int64_t dk, int64_t dv, torch::ScalarType dt,
                     bool init_state = false) {
  auto o = torch::dtype(dt);
  Inputs in;
  in.q = l2_normalize_reference(torch::randn({B, T, H, dk}, o));
  in.k = l2_normalize_reference(torch::randn({B, T, H, dk}, o));
  in.v = torch::randn({B, T, H, dv}, o);
  in.g = torch::log_sigmoid(torch::randn({B, T, H}, o) + 2.0);
  in.beta = torch::sigmoid(torch::randn({B, T, H}, o));
  in.lam = torch::softplus(torch::randn({H, dk}, o)) + 0.25;
  if (init_state) {
    auto kk = l2_normalize_reference(torch::randn({B, H, 3, dk}, o));
    in.h0 = torch::matmul(kk.transpose(-1, -2), kk);  // PSD
    in.g0 = torch::randn({B, H, dk, dv}, o) * 0.5;
  }
  return in;
}

MesaCG converged_cg(int64_t dk) {
  MesaCG cg;
  cg.steps = 2 * dk;
  cg.eps = 1e-30;
  return cg;
}

std::shared_ptr<MesaImpl> random_mesa(bool conv, bool gate, MesaCGInit init, int64_t hidden = 32, int64_t heads = 4) {
  MesaOptions o = mesa_options(default_config());
  o.short_conv = conv;
  o.out_gate = gate;
  o.cg.init = init;
  o.cg.steps = 2 * (hidden / heads);  // converged: forward (CG) == forward_reference (exact solve)
  o.chunk = 16;
  auto m = std::make_shared<MesaImpl>(MixerShape{hidden, heads, 0.02, 1e-6}, o);
  randomize(*m);
  return m;
}

}  // namespace

TEST(MesaCore, ChunkedCgEqualsExactSolveAcrossChunksAndLengths) {
  torch::manual_seed(0);
  const int64_t B = 2, H = 2, dk = 6, dv = 5;
  for (bool with_init : {false, true})
    for (int64_t T : {1, 5, 16, 37}) {
      auto in = random_inputs(B, T, H, dk, dv, torch::kDouble, with_init);
      auto ref = mesa_exact(in.q, in.k, in.v, in.g, in.beta, in.lam, in.h0, in.g0);
      for (auto init : {MesaCGInit::Jacobi, MesaCGInit::Zero, MesaCGInit::Query})
        for (int64_t C : {1, 4, 16, 64}) {
          auto cg = converged_cg(dk);
          cg.init = init;
          auto out = mesa_chunked(in.q, in.k, in.v, in.g, in.beta, in.lam, cg, C, in.h0, in.g0);
          EXPECT_LT(rel_err(out.o, ref.o), 1e-10) << "T=" << T << " C=" << C << " init=" << int(init);
          EXPECT_LT(rel_err(out.h_kk, ref.h_kk), 1e-12) << "T=" << T << " C=" << C;
          EXPECT_LT(rel_err(out.h_kv, ref.h_kv), 1e-12) << "T=" << T << " C=" << C;
        }
    }
}

TEST(MesaCore, CustomBackwardEqualsAutogradThroughExactSolve) {
  torch::manual_seed(1);
  const int64_t B = 2, H = 2, dk = 5, dv = 4;
  for (int64_t T : {1, 7, 20})
    for (int64_t C : {2, 4, 8}) {  // 2: ten chunks at T = 20, the scan as one product
      auto in = random_inputs(B, T, H, dk, dv, torch::kDouble, true);
      std::vector<torch::Tensor> leaves = {in.q, in.k, in.v, in.g, in.beta, in.lam, in.h0, in.g0};
      for (auto& t : leaves) t.requires_grad_(true);
      auto wo = torch::randn({B, T, H, dv}, torch::kDouble);
      auto wh = torch::randn({B, H, dk, dk}, torch::kDouble), wg = torch::randn({B, H, dk, dv}, torch::kDouble);
      auto loss = [&](const MesaOut& r) { return (r.o * wo).sum() + (r.h_kk * wh).sum() + (r.h_kv * wg).sum(); };
      auto gr = torch::autograd::grad({loss(mesa_exact(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4],
                                                       leaves[5], leaves[6], leaves[7]))},
                                      leaves);
      auto gc = torch::autograd::grad({loss(mesa_chunked(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4],
                                                         leaves[5], converged_cg(dk), C, leaves[6], leaves[7]))},
                                      leaves);
      const char* names[] = {"q", "k", "v", "g", "beta", "lambda", "h_kk0", "h_kv0"};
      for (size_t i = 0; i < leaves.size(); ++i)
        EXPECT_LT(rel_err(gc[i], gr[i]), 1e-9) << names[i] << " T=" << T << " C=" << C;
    }
}

TEST(MesaCore, BackwardSolveIsScaleInvariant) {
  // The adjoint solve's right-hand side scales with the loss gradient; with normalize_rhs the gradients scale exactly.
  torch::manual_seed(2);
  auto in = random_inputs(2, 24, 2, 8, 8, torch::kFloat);
  in.k.requires_grad_(true);
  MesaCG cg;  // defaults
  auto w = torch::randn({2, 24, 2, 8});
  auto o = mesa_chunked(in.q, in.k, in.v, in.g, in.beta, in.lam, cg, 8).o;
  auto g1 = torch::autograd::grad({(o * w).sum()}, {in.k}, {}, true)[0];
  auto g2 = torch::autograd::grad({(o * w * 1e-7).sum()}, {in.k})[0];
  EXPECT_LT(rel_err(g2 * 1e7, g1), 1e-5);
}

TEST(MesaCore, RecurrentAndStepRunTheSameCg) {
  // Default CG (30 steps, dk = 32: not converged): chunked, per-token recurrence and step agree to rounding, for
  // memlab's defaults and for fla's convention (x_0 = 0, absolute eps = 1e-5).
  torch::manual_seed(3);
  const int64_t B = 2, T = 33, H = 2, dk = 32, dv = 16;
  for (auto dt : {torch::kFloat, torch::kDouble}) {
    auto in = random_inputs(B, T, H, dk, dv, dt);
    for (bool fla_conv : {false, true}) {
      MesaCG cg;
      if (fla_conv) {  // fla's naive_mesa_net_CG convention
        cg.init = MesaCGInit::Zero;
        cg.eps = 1e-5;
        cg.normalize_rhs = false;
      }
      auto ch = mesa_chunked(in.q, in.k, in.v, in.g, in.beta, in.lam, cg, 16);
      auto rec = mesa_recurrent(in.q, in.k, in.v, in.g, in.beta, in.lam, cg);
      auto hk = torch::zeros({B, H, dk, dk}, torch::dtype(dt)), hv = torch::zeros({B, H, dk, dv}, torch::dtype(dt));
      std::vector<torch::Tensor> steps;
      for (int64_t t = 0; t < T; ++t)
        steps.push_back(mesa_step(in.q.select(1, t), in.k.select(1, t), in.v.select(1, t), in.g.select(1, t),
                                  in.beta.select(1, t), in.lam, cg, hk, hv));
      const double tol = dt == torch::kDouble ? 1e-11 : 2e-6;
      EXPECT_LT(rel_err(ch.o, rec.o), tol) << "fla=" << fla_conv;
      EXPECT_LT(rel_err(torch::stack(steps, 1), rec.o), tol) << "fla=" << fla_conv;
      EXPECT_LT(rel_err(hk, ch.h_kk), tol);
      EXPECT_LT(rel_err(hv, ch.h_kv), tol);
    }
  }
}

TEST(MesaCore, ThirtyFp32CgStepsCloseToExactSolve) {
  // Well-conditioned (λ >= 0.25, unit keys, forgetting): 30 fp32 steps at the default eps reach the exact solve.
  torch::manual_seed(4);
  auto in = random_inputs(2, 64, 2, 32, 16, torch::kDouble);  // dk = 32 > 30 steps
  auto ref = mesa_exact(in.q, in.k, in.v, in.g, in.beta, in.lam);
  auto f = [](const torch::Tensor& t) { return t.to(torch::kFloat); };
  MesaCG cg;
  auto out = mesa_chunked(f(in.q), f(in.k), f(in.v), f(in.g), f(in.beta), f(in.lam), cg, 64);
  EXPECT_LT(rel_err(out.o, ref.o), 1e-4);
  // fla's eps = 1e-5 stops short of that (the steepest-descent floor near sqrt(eps), see mesa.h)
  cg.eps = 1e-5;
  auto fla = mesa_chunked(f(in.q), f(in.k), f(in.v), f(in.g), f(in.beta), f(in.lam), cg, 64);
  EXPECT_GT(rel_err(fla.o, ref.o), 2e-5);
  EXPECT_LT(rel_err(fla.o, ref.o), 3e-3);
}

TEST(MesaCore, HandComputedScalarCase) {
  // d = 1: H_t = γ_t H_{t-1} + β_t k_t^2, G_t = γ_t G_{t-1} + β_t k_t v_t, o_t = G_t / (H_t + λ) q_t.
  // γ = (0.5, 0.8), β = (0.5, 1), k = (1, -1), v = (2, 3), q = (1, 0.5), λ = 0.75:
  // H = (0.5, 1.4), G = (1, -2.2), o = (1 / 1.25, -2.2 * 0.5 / 2.15) = (0.8, -0.5116279...)
  auto q = torch::tensor({1.0f, 0.5f}).view({1, 2, 1, 1});
  auto k = torch::tensor({1.0f, -1.0f}).view({1, 2, 1, 1});
  auto v = torch::tensor({2.0f, 3.0f}).view({1, 2, 1, 1});
  auto g = torch::log(torch::tensor({0.5f, 0.8f})).view({1, 2, 1});
  auto beta = torch::tensor({0.5f, 1.0f}).view({1, 2, 1});
  auto lam = torch::tensor({0.75f}).view({1, 1});
  const float o2 = -2.2f * 0.5f / 2.15f;
  for (auto init : {MesaCGInit::Jacobi, MesaCGInit::Zero, MesaCGInit::Query})
    for (int64_t C : {1, 2}) {
      MesaCG cg;
      cg.init = init;
      auto out = mesa_chunked(q, k, v, g, beta, lam, cg, C);
      EXPECT_NEAR(out.o.view(-1)[0].item<float>(), 0.8f, 1e-6);
      EXPECT_NEAR(out.o.view(-1)[1].item<float>(), o2, 1e-6);
      EXPECT_NEAR(out.h_kk.item<float>(), 1.4f, 1e-6);
      EXPECT_NEAR(out.h_kv.item<float>(), -2.2f, 1e-6);
      auto rec = mesa_recurrent(q, k, v, g, beta, lam, cg);
      EXPECT_NEAR(rec.o.view(-1)[1].item<float>(), o2, 1e-6);
    }
  auto ex = mesa_exact(q, k, v, g, beta, lam);
  EXPECT_NEAR(ex.o.view(-1)[1].item<float>(), o2, 1e-6);
}

class MesaForms : public ::testing::TestWithParam<std::tuple<bool, bool, MesaCGInit>> {};

TEST_P(MesaForms, ChunkedEqualsRecurrentEqualsStep) {
  auto [conv, gate, init] = GetParam();
  auto m = random_mesa(conv, gate, init);
  // forward: chunked CG with the implicit backward; reference: exact solve with autograd; step: per-token CG
  for (int64_t T : {2, 5, 16, 37}) check_both(*m, 2, T, 32, 1e-8);
  // T = 1: the forget gate multiplies the empty state H_0 = 0, so the a_proj gradients are exactly zero in the
  // reference and rounding-sized (a·o - β k·P cancels) in forward: check_mixer's relative error is meaningless for
  // them. Compare everything else, and the a_proj gradients against the scale of the other gradients.
  torch::manual_seed(11);
  for (auto dt : {torch::kFloat, torch::kDouble}) {
    m->to(dt);
    const double tol = dt == torch::kDouble ? 1e-8 : 1e-4, ptol = dt == torch::kDouble ? 1e-8 : 1e-3;
    // dλ = -Σ dq ⊙ q* sums signed terms over batch and heads: the cancellation amplifies fp32 rounding.
    const double lambda_ptol = dt == torch::kDouble ? 1e-8 : 2e-2;
    const double zero_tol = dt == torch::kDouble ? 1e-12 : 1e-5;  // rounding, relative to the input gradient
    auto x = torch::randn({3, 1, 32}, torch::dtype(dt)).requires_grad_(true);
    auto y = m->forward(x), y_ref = m->forward_reference(x);
    EXPECT_LT(rel_err(y, y_ref), tol);
    EXPECT_LT(rel_err(run_steps(*m, x.detach()), y_ref), tol);
    auto grads = [&](bool ref) {
      m->zero_grad();
      auto xx = x.detach().requires_grad_(true);
      ((ref ? m->forward_reference(xx) : m->forward(xx)) * y_ref.detach()).sum().backward();
      std::vector<torch::Tensor> gs = {xx.grad().clone()};
      for (auto& p : m->named_parameters()) gs.push_back(p.value().grad().clone());
      return gs;
    };
    auto gf = grads(false), gr = grads(true);
    size_t i = 1;
    EXPECT_LT(rel_err(gf[0], gr[0]), tol) << "input grad";
    for (auto& p : m->named_parameters()) {
      if (p.key().rfind("a_proj", 0) == 0)
        EXPECT_LT((gf[i] - gr[i]).abs().max().item<double>(), zero_tol * gf[0].abs().max().item<double>()) << p.key();
      else
        EXPECT_LT(rel_err(gf[i], gr[i]), p.key() == "lambda_params" ? lambda_ptol : ptol) << p.key();
      ++i;
    }
    m->zero_grad();
  }
  m->to(torch::kFloat);
}

INSTANTIATE_TEST_SUITE_P(Variants, MesaForms,
                         ::testing::Values(std::make_tuple(true, false, MesaCGInit::Jacobi),
                                           std::make_tuple(true, true, MesaCGInit::Zero),
                                           std::make_tuple(false, false, MesaCGInit::Query),
                                           std::make_tuple(false, true, MesaCGInit::Jacobi)));

TEST(Mesa, DefaultStepMatchesForward) {
  // Default options (30 CG steps < dk = 32, so not converged): step runs the same CG as forward.
  MesaOptions o = mesa_options(default_config());
  o.chunk = 16;
  auto m = std::make_shared<MesaImpl>(MixerShape{64, 2, 0.02, 1e-6}, o);
  randomize(*m);
  torch::manual_seed(5);
  auto x = torch::randn({2, 40, 64});
  auto y = m->forward(x);
  // 1e-4, not 1e-5: the CG has not converged, so the fp32 rounding of the two mat-vec orders (chunked and
  // materialised) survives in the result; with another thread count for the CPU's reductions it reached 1.5e-5.
  EXPECT_LT(rel_err(run_steps(*m, x), y), 1e-4);
  EXPECT_LT(rel_err(m->forward_reference(x), y), 1e-3);  // the exact solve: 30 < dk steps, close but not equal
}

TEST(Mesa, LambdaStartsAtInitAndRespectsLowerBound) {
  MesaOptions o = mesa_options(default_config());
  o.lambda_min = 0.25;
  o.lambda_init = 1.0;
  auto m = std::make_shared<MesaImpl>(MixerShape{32, 4, 0.02, 1e-6}, o);
  EXPECT_LT((m->lambda() - 1.0).abs().max().item<float>(), 1e-6);
  EXPECT_EQ(m->lambda().sizes(), (std::vector<int64_t>{4, 8}));
  for (auto& p : m->named_parameters())
    if (p.key() == "lambda_params") {
      torch::NoGradGuard ng;
      p.value().copy_(torch::linspace(-200.0, 3.0, 32));
    }
  EXPECT_GE(m->lambda().min().item<float>(), 0.25f);
  EXPECT_FALSE(decays_by_name(*m).at("lambda_params"));
}

TEST(Mesa, Bf16ChunkedStaysFiniteAndClose) {
  MesaOptions o = mesa_options(default_config());
  MixerShape shape{32, 4, 0.02, 1e-6};
  auto m = std::make_shared<MesaImpl>(shape, o);
  randomize(*m);
  auto x = torch::randn({2, 40, 32});
  auto y = m->forward(x);
  m->to(torch::kBFloat16);
  auto xb = x.to(torch::kBFloat16).requires_grad_(true);
  auto yb = m->forward(xb);
  ASSERT_TRUE(torch::isfinite(yb).all().item<bool>());
  EXPECT_LT(rel_err(yb, y), 5e-2);
  yb.to(torch::kFloat).pow(2).sum().backward();
  EXPECT_TRUE(torch::isfinite(xb.grad()).all().item<bool>());
}


// On a GPU host the same equalities must hold for the CUDA ops LibTorch dispatches to.
TEST(Cuda, MesaFormsAgreeOnGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  auto m = random_mesa(true, true, MesaCGInit::Jacobi);
  m->to(torch::kCUDA, torch::kDouble);
  auto x = torch::randn({2, 45, 32}, torch::dtype(torch::kDouble).device(torch::kCUDA)).requires_grad_(true);
  auto y = m->forward(x), y_ref = m->forward_reference(x);
  EXPECT_LT(rel_err(y, y_ref), 1e-9);
  EXPECT_LT(rel_err(run_steps(*m, x.detach()), y_ref), 1e-9);
  auto w = torch::randn_like(y);
  auto g = torch::autograd::grad({(y * w).sum()}, {x})[0];
  auto g_ref = torch::autograd::grad({(y_ref * w).sum()}, {x})[0];
  EXPECT_LT(rel_err(g, g_ref), 1e-8);
}
