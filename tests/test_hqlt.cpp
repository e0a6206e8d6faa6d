// HQLT: chunked training form == per-token recurrence from the paper's equations == step, for every variant,
// mixing and positional encoding; which past tokens each variant can see.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "mixers/hqlt.h"
#include "ops/vector_mix/vector_mix.h"
#include "tests/mixer_check.h"

#ifdef MEMLAB_CUDA_KERNELS
#include "ops/vector_mix/sigmoid_blend.h"
#endif

using namespace memlab;
using namespace memlab::testing;

namespace {

std::shared_ptr<HqltImpl> random_hqlt(HqltOptions o, double std = 0.3) {
  auto m = std::make_shared<HqltImpl>(MixerShape{32, 4, 0.02, 1e-6}, o);
  randomize(*m, std);
  return m;
}

struct Case {
  HqltVariant variant;
  HqltMixing mixing;
  HqltFastWeight fw;
  bool rope, conv;
  int64_t fw_block;
  bool evicted_beta;
};

// Readable, deterministic test names (the default printer shows the struct's padding bytes).
void PrintTo(const Case& c, std::ostream* os) {
  const char* v[] = {"sync", "delayed_stream", "delayed_chunk"};
  const char* m[] = {"sum", "scalar", "vector"};
  *os << v[static_cast<int>(c.variant)] << "_" << m[static_cast<int>(c.mixing)]
      << (c.fw == HqltFastWeight::LinearAttention ? "_linear" : "") << (c.rope ? "_rope" : "")
      << (c.conv ? "_conv" : "") << "_block" << c.fw_block << (c.evicted_beta ? "_evicted" : "");
}

}  // namespace

class HqltForms : public ::testing::TestWithParam<Case> {};

TEST_P(HqltForms, ChunkedEqualsRecurrentEqualsStep) {
  const auto c = GetParam();
  HqltOptions o = hqlt_options(default_config());
  o.variant = c.variant;
  o.mixing = c.mixing;
  o.fw = c.fw;
  o.rope = c.rope;
  o.short_conv = c.conv;
  o.fw_block = c.fw_block;
  o.evicted_beta = c.evicted_beta;
  o.window = 4;
  o.chunk = 8;
  auto m = random_hqlt(o);
  // At T = 1 with sum or per-head scalar mixing (o = (a + b β q·k) v per head) or normalised linear attention
  // (o_FW = v), the per-head RMSNorm removes every dependence on q and k: their gradients are rounding noise, so
  // start at T = 2.
  const bool degenerate = c.mixing != HqltMixing::Vector || c.fw == HqltFastWeight::LinearAttention;
  for (int64_t T : {1, 3, 8, 13, 37})
    if (!(degenerate && T == 1)) check_both(*m, 2, T, 32);
}

INSTANTIATE_TEST_SUITE_P(
    Variants, HqltForms,
    ::testing::Values(
        Case{HqltVariant::Synchronous, HqltMixing::Vector, HqltFastWeight::DeltaNet, false, true, 0, false},
        Case{HqltVariant::Synchronous, HqltMixing::Scalar, HqltFastWeight::DeltaNet, true, false, 0, false},
        Case{HqltVariant::Synchronous, HqltMixing::Sum, HqltFastWeight::DeltaNet, false, false, 0, false},
        Case{HqltVariant::Synchronous, HqltMixing::Vector, HqltFastWeight::LinearAttention, false, true, 0, false},
        Case{HqltVariant::DelayedStream, HqltMixing::Vector, HqltFastWeight::DeltaNet, false, true, 0, false},
        Case{HqltVariant::DelayedStream, HqltMixing::Scalar, HqltFastWeight::DeltaNet, true, true, 0, true},
        Case{HqltVariant::DelayedChunk, HqltMixing::Vector, HqltFastWeight::DeltaNet, false, true, 0, false},
        Case{HqltVariant::DelayedChunk, HqltMixing::Sum, HqltFastWeight::DeltaNet, true, false, 8, false}));

// Delayed-Chunk, chunk 4, no short conv: at t = 5 the paper's form still sees token 0 through the FW state
// read at the chunk start (t = 4); with the reference code's 64-token FW blocks, token 5 sees token 0 through
// neither memory.
TEST(Hqlt, DelayedChunkReadStatePaperVersusReferenceCode) {
  for (int64_t fw_block : {0, 64}) {
    HqltOptions o = hqlt_options(default_config());
    o.variant = HqltVariant::DelayedChunk;
    o.window = 4;
    o.short_conv = false;
    o.fw_block = fw_block;
    auto m = random_hqlt(o);
    torch::manual_seed(5);
    auto x = torch::randn({1, 8, 32});
    auto x2 = x.clone();
    x2.select(1, 0).add_(2.0);
    auto y = m->forward(x), y2 = m->forward(x2);
    const double change = rel_err(y.select(1, 5), y2.select(1, 5));
    if (fw_block == 0)
      EXPECT_GT(change, 1e-4);
    else
      EXPECT_LT(change, 1e-6);
    EXPECT_GT(rel_err(y.select(1, 0), y2.select(1, 0)), 1e-4);  // the perturbation itself is visible
  }
}

// Delayed-Stream, window 3, no conv: the FW-memory receives nothing before t = 3 (the first evicted pair), so
// outputs at t < 3 do not depend on β and differ from Synchronous (whose FW-memory holds token 0 at t = 0).
TEST(Hqlt, DelayedStreamFwMemoryLagsByWindow) {
  HqltOptions o = hqlt_options(default_config());
  o.window = 3;
  o.short_conv = false;
  o.variant = HqltVariant::DelayedStream;  // vector mixing: per-channel gates, so RMSNorm cannot hide the FW part
  auto delayed = random_hqlt(o);
  o.variant = HqltVariant::Synchronous;
  auto sync = std::make_shared<HqltImpl>(MixerShape{32, 4, 0.02, 1e-6}, o);
  {
    torch::NoGradGuard ng;
    auto src = delayed->named_parameters();
    for (auto& p : sync->named_parameters()) p.value().copy_(src[p.key()]);
  }
  torch::manual_seed(6);
  auto x = torch::randn({2, 10, 32});
  auto yd = delayed->forward(x), ys = sync->forward(x);
  EXPECT_GT(rel_err(yd.select(1, 0), ys.select(1, 0)), 1e-4);
  // Changing the β projection must leave t < 3 unchanged and change t >= 3.
  auto y0 = delayed->forward(x);
  {
    torch::NoGradGuard ng;
    delayed->named_parameters()["b_proj.weight"].add_(0.5);
  }
  auto y1 = delayed->forward(x);
  EXPECT_LT(rel_err(y1.narrow(1, 0, 3), y0.narrow(1, 0, 3)), 1e-6);
  EXPECT_GT(rel_err(y1.narrow(1, 3, 7), y0.narrow(1, 3, 7)), 1e-4);
}

// The KV-memory reads keys in blocks of the window (the sliding window also from the block before): a head dim
// that is not a multiple of 8 (padded for the attention kernels), windows that do not divide T, and T shorter
// than one window, against the per-token reference and the step.
TEST(Hqlt, BlockedWindowAttentionOddShapes) {
  for (auto variant : {HqltVariant::Synchronous, HqltVariant::DelayedChunk})
    for (int64_t window : {5, 16}) {
      HqltOptions o = hqlt_options(default_config());
      o.variant = variant;
      o.window = window;
      o.rope = true;
      auto m = std::make_shared<HqltImpl>(MixerShape{30, 3, 0.02, 1e-6}, o);  // head dim 10
      randomize(*m, 0.3);
      for (int64_t T : {3, 23}) check_both(*m, 2, T, 30);
    }
}

TEST(Hqlt, Bf16StaysFiniteAndClose) {
  for (auto variant : {HqltVariant::Synchronous, HqltVariant::DelayedStream, HqltVariant::DelayedChunk}) {
    HqltOptions o = hqlt_options(default_config());
    o.variant = variant;
    o.window = 8;
    o.rope = true;
    auto m = random_hqlt(o, 0.2);
    torch::manual_seed(7);
    auto x = torch::randn({2, 40, 32});
    auto y = m->forward(x);
    m->to(torch::kBFloat16);
    auto yb = m->forward(x.to(torch::kBFloat16));
    ASSERT_TRUE(torch::isfinite(yb).all().item<bool>());
    EXPECT_LT(rel_err(yb, y), 5e-2);
  }
}


// Vector mixing: the tensor-op form against the formula element by element; the fused kernel's per-element code
// (run on the CPU) against the tensor-op form's autograd; the CUDA form refused on the CPU.
TEST(HqltVectorMix, ReferenceMatchesFormula) {
  torch::manual_seed(3);
  auto a = torch::randn({2, 3, 2, 4}, torch::kDouble), b = torch::randn({2, 3, 2, 4}, torch::kDouble);
  auto m = torch::randn({2, 3, 8}, torch::kDouble) * 3;
  auto o = vector_mix_reference(a, b, m);
  ASSERT_EQ(o.sizes(), a.sizes());
  auto af = a.flatten(), bf = b.flatten(), mf = m.flatten(), of = o.flatten();
  for (int64_t i = 0; i < af.numel(); ++i) {
    const double g = 1 / (1 + std::exp(-mf[i].item<double>()));
    EXPECT_NEAR(of[i].item<double>(), g * af[i].item<double>() + (1 - g) * bf[i].item<double>(), 1e-12);
  }
}

TEST(HqltVectorMix, KernelCodeOnHostMatchesReference) {
#ifndef MEMLAB_CUDA_KERNELS
  GTEST_SKIP() << "memlab was built without nvcc (no kernels)";
#else
  torch::manual_seed(4);
  for (int64_t n : {1, 7, 64}) {
    auto a = torch::randn({n}, torch::kDouble).requires_grad_(true), b = torch::randn({n}, torch::kDouble).requires_grad_(true);
    auto m = (torch::randn({n}, torch::kDouble) * 4).requires_grad_(true);
    auto d_o = torch::randn({n}, torch::kDouble);
    auto o_ref = vector_mix_reference(a, b, m);
    auto g_ref = torch::autograd::grad({(o_ref * d_o).sum()}, {a, b, m});
    auto af = a.detach().to(torch::kFloat), bf = b.detach().to(torch::kFloat), mf = m.detach().to(torch::kFloat);
    auto df = d_o.to(torch::kFloat);
    auto o = torch::empty({n}), da = torch::empty({n}), db = torch::empty({n}), dm = torch::empty({n});
    kernels::SigmoidBlendProblem p;
    p.n = n;
    kernels::SigmoidBlendForwardArgs fa{af.data_ptr(), bf.data_ptr(), mf.data_ptr(), o.data_ptr<float>()};
    ASSERT_EQ(kernels::sigmoid_blend_forward_host(p, fa), "");
    kernels::SigmoidBlendBackwardArgs ba{af.data_ptr(), bf.data_ptr(), mf.data_ptr(), df.data_ptr<float>(),
                                         da.data_ptr(), db.data_ptr(), dm.data_ptr()};
    ASSERT_EQ(kernels::sigmoid_blend_backward_host(p, ba), "");
    EXPECT_LT(rel_err(o, o_ref), 1e-6) << "n " << n;
    EXPECT_LT(rel_err(da, g_ref[0]), 1e-6) << "n " << n;
    EXPECT_LT(rel_err(db, g_ref[1]), 1e-6) << "n " << n;
    EXPECT_LT(rel_err(dm, g_ref[2]), 1e-6) << "n " << n;
  }
  kernels::SigmoidBlendProblem bad;
  bad.n = -1;
  EXPECT_NE(kernels::sigmoid_blend_forward_host(bad, {}), "");
  kernels::SigmoidBlendProblem half;
  half.a_bf16 = true;
  EXPECT_NE(kernels::sigmoid_blend_backward_host(half, {}), "");
#endif
}

TEST(HqltVectorMix, CudaFormOnCpuIsRefused) {
  auto a = torch::randn({2, 5, 2, 3}), b = torch::randn({2, 5, 2, 3}), m = torch::randn({2, 5, 6});
  EXPECT_THROW(vector_mix(a, b, m, Kernels::Cuda), std::exception);
  EXPECT_LT(rel_err(vector_mix(a, b, m, Kernels::Auto), vector_mix_reference(a, b, m)), 1e-12);
}
