// GPU tests (ctest label gpu): the fused delta-rule kernels against the tensor-op reference in fp64: outputs,
// every input gradient and the final state, fp32 and bf16, odd shapes, β near 0 and 2, strong gates, initial
// states; the one-token step against the sequence kernel; the mixers with kernels against themselves without; the
// kernels inside a CUDA graph, and the training step's graph when its capture breaks off.
// Skipped, with the reason, where there is no CUDA device or no kernels.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>

#include <optional>
#include <torch/torch.h>

#include <fmt/format.h>

#include "mixers/deltanet.h"
#include "mixers/gated_deltanet.h"
#include "mixers/linear_attention.h"
#include "mixers/ops.h"
#include "ops/delta_rule/delta_rule.h"
#ifdef MEMLAB_CUDA_KERNELS
#include "ops/delta_rule/chunk.h"
#endif
#include "ops/norm/norm.h"
#include "tests/mixer_check.h"
#include "train/cuda_graph.h"

using namespace memlab;
using namespace memlab::testing;

namespace {

struct Case {
  int64_t B, T, H, dk, dv;
  bool gated, h0;
  const char* betas;  // "mid", "low" (near 0), "high" (near 2)
  const char* gates;  // "mild" or "strong"
};

std::string name(const Case& c, torch::ScalarType dt) {
  return fmt::format("B{} T{} H{} dk{} dv{} {} h0={} beta={} gates={} {}", c.B, c.T, c.H, c.dk, c.dv,
                     c.gated ? "gated" : "ungated", c.h0, c.betas, c.gates, dt == torch::kBFloat16 ? "bf16" : "fp32");
}

struct Leaves {
  std::vector<torch::Tensor> x;  // q, k, v, beta, g, h0 (g, h0 possibly undefined)
};

// Inputs in fp64 on the GPU, already rounded to `dt` where the kernel reads them in `dt` (q, k, v), so that the
// fp64 reference and the kernel see the same numbers. raw: q and k rows of lengths spread over e^±2 (for
// form.qk_l2norm), else unit rows.
Leaves make_inputs(const Case& c, torch::ScalarType dt, bool raw = false) {
  auto o = torch::dtype(torch::kDouble).device(torch::kCUDA);
  auto round = [&](const torch::Tensor& t) { return t.to(dt).to(torch::kDouble); };
  auto qk = [&] {
    auto x = torch::randn({c.B, c.T, c.H, c.dk}, o);
    return raw ? x * torch::exp(torch::randn({c.B, c.T, c.H, 1}, o)) : l2_normalize_reference(x);
  };
  Leaves l;
  l.x.push_back(round(qk()));
  l.x.push_back(round(qk()));
  l.x.push_back(round(torch::randn({c.B, c.T, c.H, c.dv}, o)));
  const std::string b = c.betas;
  auto u = torch::rand({c.B, c.T, c.H}, o);
  l.x.push_back(b == "low" ? u * 1e-3 : b == "high" ? 2.0 - u * 1e-3 : u * 2.0);
  if (c.gated) {
    const bool strong = std::string(c.gates) == "strong";
    // strong: most steps keep e^-0.1.. of the state, some wipe it (e^-30), so the backward must recompute.
    auto g = -torch::rand({c.B, c.T, c.H}, o) * (strong ? 3.0 : 0.5);
    if (strong) g = torch::where(torch::rand({c.B, c.T, c.H}, o) < 0.15, torch::full_like(g, -30.0), g);
    l.x.push_back(g);
  } else {
    l.x.push_back({});
  }
  l.x.push_back(c.h0 ? torch::randn({c.B, c.H, c.dk, c.dv}, o) * 0.3 : torch::Tensor());
  return l;
}

struct Result {
  torch::Tensor o, state;
  std::vector<torch::Tensor> grads;  // per leaf, undefined where the leaf is
};

// Runs one form on leaves cast to `dt` (beta, g, h0 stay fp32 for the kernel, fp64 for the reference) and
// backpropagates a fixed random weighting of o and the final state.
// norm_first: q and k (raw) normalised by l2_normalize on these kernels before a rule that takes them as unit
// vectors, as model.kernels=auto's tensor-op training form does at wide heads.
Result run(const Leaves& in, torch::ScalarType dt, Kernels kernels, const torch::Tensor& wo, const torch::Tensor& ws,
           bool raw, bool delayed, bool interleaved = false, std::optional<Kernels> norm_first = std::nullopt) {
  std::vector<torch::Tensor> leaves;
  for (size_t i = 0; i < in.x.size(); ++i) {
    if (!in.x[i].defined()) {
      leaves.push_back({});
      continue;
    }
    const auto t = i < 3 ? dt : (dt == torch::kDouble ? torch::kDouble : torch::kFloat);
    leaves.push_back(in.x[i].to(t).detach().requires_grad_(true));
  }
  DeltaRuleForm form;
  form.scale = 1.0 / std::sqrt(static_cast<double>(in.x[0].size(3)));
  form.chunk = 16;
  form.kernels = kernels;
  form.qk_l2norm = raw && !norm_first;
  form.with_intra = !delayed;
  auto q = leaves[0], k = leaves[1];
  if (raw && norm_first) {
    q = l2_normalize(q, q.scalar_type(), *norm_first);
    k = l2_normalize(k, k.scalar_type(), *norm_first);
  }
  auto r = interleaved ? delta_rule_delayed_read_interleaved(q, k, leaves[2], leaves[3], form, leaves[4], leaves[5])
                       : delta_rule(q, k, leaves[2], leaves[3], form, leaves[4], leaves[5]);
  auto loss = (r.o.to(torch::kDouble) * wo).sum() + (r.state.to(torch::kDouble) * ws).sum();
  loss.backward();
  Result out{r.o.detach(), r.state.detach(), {}};
  for (auto& l : leaves) out.grads.push_back(l.defined() ? l.grad() : torch::Tensor());
  return out;
}

// Relative error, with a floor on the reference's size: some gradients are exactly zero (dg at t = 0 from a zero
// state), where the kernel leaves rounding residue.
double err(const torch::Tensor& a, const torch::Tensor& b) {
  const auto d = (a.to(torch::kDouble) - b.to(torch::kDouble)).norm().item<double>();
  const auto n = b.to(torch::kDouble).norm().item<double>();
  return d / std::max(n, 1e-4 * std::sqrt(static_cast<double>(b.numel())));
}

// delayed: the Delayed-Chunk read (form.with_intra false, chunks of 16); interleaved: the kernel form of it on twice
// the tokens, whatever delta_rule would pick.
void compare(const Case& c, torch::ScalarType dt, bool raw = false, bool delayed = false, bool interleaved = false) {
  const auto label = name(c, dt) + (raw ? " raw q, k" : "") + (delayed ? " delayed read" : "") +
                     (interleaved ? " interleaved" : "");
  auto in = make_inputs(c, dt, raw);
  auto o64 = torch::dtype(torch::kDouble).device(torch::kCUDA);
  auto wo = torch::randn({c.B, c.T, c.H, c.dv}, o64), ws = torch::randn({c.B, c.H, c.dk, c.dv}, o64);
  auto ref = run(in, torch::kDouble, Kernels::Torch, wo, ws, raw, delayed);
  auto ker = run(in, dt, Kernels::Cuda, wo, ws, raw, delayed, interleaved);
  // fp32: rounding only. bf16: the output and the gradients are rounded to bf16 (8 bits of mantissa).
  const double tol = dt == torch::kBFloat16 ? 1e-2 : 2e-4;
  EXPECT_EQ(ker.o.scalar_type(), dt) << label;
  EXPECT_EQ(ker.state.scalar_type(), torch::kFloat) << label;
  EXPECT_LT(err(ker.o, ref.o), tol) << label << ": o";
  EXPECT_LT(err(ker.state, ref.state), tol) << label << ": final state";
  const char* names[] = {"dq", "dk", "dv", "dbeta", "dg", "dh0"};
  for (size_t i = 0; i < ref.grads.size(); ++i) {
    if (!ref.grads[i].defined()) continue;
    ASSERT_TRUE(ker.grads[i].defined()) << label << ": " << names[i];
    EXPECT_EQ(ker.grads[i].scalar_type(), i < 3 ? dt : torch::kFloat) << label << ": " << names[i];
    EXPECT_EQ(ker.grads[i].sizes(), ref.grads[i].sizes()) << label << ": " << names[i];
    EXPECT_TRUE(torch::isfinite(ker.grads[i]).all().item<bool>()) << label << ": " << names[i];
    EXPECT_LT(err(ker.grads[i], ref.grads[i]), tol) << label << ": " << names[i];
  }
}

const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {1, 1, 1, 16, 16, false, false, "mid", "mild"},    {2, 37, 3, 32, 32, false, false, "mid", "mild"},
      {1, 64, 2, 50, 50, false, true, "high", "mild"},   {1, 1000, 1, 64, 64, false, false, "mid", "mild"},
      {3, 37, 5, 128, 128, false, true, "low", "mild"},  {2, 40, 4, 32, 20, false, false, "high", "mild"},
      {1, 1, 1, 16, 16, true, false, "mid", "mild"},     {2, 37, 3, 32, 32, true, true, "mid", "strong"},
      {1, 64, 2, 50, 50, true, false, "high", "strong"}, {1, 1000, 1, 64, 64, true, true, "mid", "mild"},
      {1, 1000, 3, 16, 16, true, false, "low", "strong"}, {3, 37, 5, 128, 100, true, false, "high", "strong"},
      // chunk boundaries of the chunkwise kernel (32 steps): one past, one short, many chunks with a state
      {1, 33, 3, 16, 16, false, true, "low", "mild"},     {3, 95, 1, 64, 48, false, false, "mid", "mild"},
      {2, 777, 2, 50, 50, false, true, "high", "mild"},
      // more heads: the chunkwise kernel keeps all columns in one block
      {40, 37, 4, 50, 50, false, true, "mid", "mild"},    {70, 45, 2, 32, 20, false, false, "high", "mild"},
      // the gated chunkwise kernel at the same boundaries and head counts
      {1, 33, 3, 16, 16, true, true, "low", "strong"},    {3, 95, 1, 64, 48, true, false, "mid", "mild"},
      {2, 777, 2, 50, 50, true, true, "high", "mild"},    {40, 37, 4, 50, 50, true, true, "mid", "strong"},
      {70, 45, 2, 32, 20, true, false, "high", "strong"},
      // 512+ heads: the recurrent kernel, gated and ungated, at head dims the chunkwise kernel takes otherwise
      {130, 37, 4, 32, 32, true, true, "mid", "strong"},  {130, 20, 4, 50, 50, false, false, "high", "mild"},
  };
  return c;
}

}  // namespace

TEST(DeltaRuleKernel, MatchesReferenceFp32) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(0);
  for (const auto& c : cases()) compare(c, torch::kFloat);
}

TEST(DeltaRuleKernel, MatchesReferenceBf16) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(1);
  for (const auto& c : cases()) compare(c, torch::kBFloat16);
}

// model.kernels=auto trains head dims past 64 on the tensor-op chunked form (faster there than the recurrent kernel),
// the Delayed-Chunk read and q, k raw (the norm in the rule, as layers call it) included, and runs the kernel without
// gradients; model.kernels=cuda keeps the kernel for both.
TEST(DeltaRuleKernel, AutoTrainsWideHeadsOnTensorOps) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(9);
  auto o64 = torch::dtype(torch::kDouble).device(torch::kCUDA);
  struct Wide {
    Case c;
    bool raw, delayed;
  };
  for (const Wide& w : {Wide{{2, 37, 3, 128, 128, false, true, "mid", "mild"}, false, false},
                        Wide{{2, 37, 3, 100, 64, true, false, "mid", "strong"}, true, false},
                        Wide{{2, 37, 3, 128, 32, false, false, "mid", "mild"}, true, true},
                        Wide{{2, 37, 3, 64, 64, true, false, "mid", "mild"}, false, false}}) {
    const Case& c = w.c;
    const auto label = name(c, torch::kFloat) + (w.raw ? " raw q, k" : "") + (w.delayed ? " delayed read" : "");
    auto in = make_inputs(c, torch::kFloat, w.raw);
    auto wo = torch::randn({c.B, c.T, c.H, c.dv}, o64), ws = torch::randn({c.B, c.H, c.dk, c.dv}, o64);
    auto autos = run(in, torch::kFloat, Kernels::Auto, wo, ws, w.raw, w.delayed);
    const bool wide = c.dk > 64;
    // At wide heads auto normalises raw q, k with the norm kernel, then runs the tensor-op rule.
    auto same = wide ? run(in, torch::kFloat, Kernels::Torch, wo, ws, w.raw, w.delayed, false, Kernels::Auto)
                     : run(in, torch::kFloat, Kernels::Cuda, wo, ws, w.raw, w.delayed);
    auto other = run(in, torch::kFloat, wide ? Kernels::Cuda : Kernels::Torch, wo, ws, w.raw, w.delayed);
    // The form auto picked gives its results to the last bit; the other form's differ by rounding.
    EXPECT_TRUE(torch::equal(autos.o, same.o)) << label << ": o";
    EXPECT_TRUE(torch::equal(autos.grads[0], same.grads[0])) << label << ": dq";
    EXPECT_FALSE(torch::equal(autos.o, other.o)) << label << ": o";
    EXPECT_LT(err(autos.o, other.o), 4e-4) << label << ": o";  // each form within 2e-4 of fp64
    torch::NoGradGuard no_grad;
    DeltaRuleForm form;
    form.scale = 1.0 / std::sqrt(static_cast<double>(c.dk));
    form.chunk = 16;
    form.qk_l2norm = w.raw;
    form.with_intra = !w.delayed;
    auto f32 = [](const torch::Tensor& t) { return t.defined() ? t.to(torch::kFloat) : t; };
    auto eval = [&](Kernels k) {
      form.kernels = k;
      return delta_rule(f32(in.x[0]), f32(in.x[1]), f32(in.x[2]), f32(in.x[3]), form, f32(in.x[4]), f32(in.x[5])).o;
    };
    EXPECT_TRUE(torch::equal(eval(Kernels::Auto), eval(Kernels::Cuda))) << label << ": o without gradients";
  }
}

// q and k raw, the rule normalising them (form.qk_l2norm): in the recurrent kernel (head dims over 64, or 512+
// heads; dv <= 32 for its backward), else by the norm op before the kernel (dv > 32, the chunkwise kernel).
TEST(DeltaRuleKernel, L2NormInTheRuleMatchesReference) {
  SKIP_WITHOUT_KERNELS();
  static const std::vector<Case> raw = {
      {2, 37, 3, 32, 32, true, true, "mid", "strong"},    {1, 1000, 3, 16, 16, true, false, "low", "strong"},
      {2, 40, 3, 64, 32, true, false, "high", "mild"},    {1, 37, 2, 128, 20, true, true, "mid", "mild"},
      {2, 33, 2, 20, 20, true, false, "mid", "mild"},     {1, 1, 1, 16, 16, true, false, "mid", "mild"},
      {130, 20, 4, 32, 32, false, false, "high", "mild"}, {600, 5, 1, 16, 16, false, true, "mid", "mild"},
      {1, 64, 2, 50, 50, true, false, "high", "strong"},  {2, 37, 3, 32, 32, false, false, "mid", "mild"},
      {130, 20, 4, 32, 32, true, false, "mid", "strong"},
  };
  torch::manual_seed(5);
  for (auto dt : {torch::kFloat, torch::kBFloat16})
    for (const auto& c : raw) compare(c, dt, /*raw=*/true);
  // Without a backward the recurrent kernel normalises bf16 inputs too (evaluation, rollouts).
  torch::NoGradGuard no_grad;
  for (const auto& c : raw) {
    auto in = make_inputs(c, torch::kBFloat16, /*raw=*/true);
    DeltaRuleForm form;
    form.scale = 1.0 / std::sqrt(static_cast<double>(c.dk));
    form.qk_l2norm = true;
    form.kernels = Kernels::Torch;
    auto ref = delta_rule(in.x[0], in.x[1], in.x[2], in.x[3], form, in.x[4], in.x[5]);
    form.kernels = Kernels::Cuda;
    auto f32 = [](const torch::Tensor& t) { return t.defined() ? t.to(torch::kFloat) : t; };
    auto ker = delta_rule(in.x[0].to(torch::kBFloat16), in.x[1].to(torch::kBFloat16), in.x[2].to(torch::kBFloat16),
                          f32(in.x[3]), form, f32(in.x[4]), f32(in.x[5]));
    EXPECT_LT(err(ker.o, ref.o), 1e-2) << name(c, torch::kBFloat16) << " raw q, k, no grad: o";
    EXPECT_LT(err(ker.state, ref.state), 1e-2) << name(c, torch::kBFloat16) << " raw q, k, no grad: state";
  }
}

#ifdef MEMLAB_CUDA_KERNELS
// The chunkwise kernel's one-set plan, each chunk's copies waited for at its start: what the backward runs where two
// sets of inputs do not fit in shared memory (A100). fp32 (3xTF32), and bf16 callers' one TF32 pass (q and k
// normalised to fp32 by the norm op).
TEST(DeltaRuleKernel, ChunkwiseWithoutPrefetchMatchesReference) {
  SKIP_WITHOUT_KERNELS();
  static const std::vector<Case> chunkwise = {
      {1, 33, 3, 16, 16, false, true, "low", "mild"},  {2, 777, 2, 50, 50, false, true, "high", "mild"},
      {3, 95, 1, 64, 48, true, false, "mid", "mild"},  {40, 37, 4, 50, 50, true, true, "mid", "strong"},
  };
  struct Prefetch {  // restored however the test ends
    Prefetch() { kernels::delta_rule_chunk_set_prefetch(false); }
    ~Prefetch() { kernels::delta_rule_chunk_set_prefetch(true); }
  } off;
  torch::manual_seed(7);
  for (const auto& c : chunkwise) {
    compare(c, torch::kFloat);
    compare(c, torch::kBFloat16, /*raw=*/true);
  }
}
#endif

// Delayed-Chunk HQLT's read through the kernels (twice the tokens, delta_rule_delayed_read_interleaved, or with
// 512+ heads ungated the recurrent kernel's states, delta_rule_delayed_read_states) against the tensor-op form
// without the intra-chunk term.
TEST(DeltaRuleKernel, DelayedChunkReadMatchesReference) {
  SKIP_WITHOUT_KERNELS();
  static const std::vector<Case> delayed = {
      {1, 1, 1, 16, 16, false, false, "mid", "mild"},   {2, 37, 3, 32, 32, false, true, "high", "mild"},
      {2, 48, 3, 32, 32, true, true, "mid", "strong"},  {1, 100, 2, 50, 50, true, false, "low", "mild"},
      {130, 21, 4, 32, 32, false, false, "mid", "mild"}, {2, 37, 1, 128, 64, true, false, "mid", "mild"},
      // 512+ heads, ungated: read from the recurrent kernel's states (delta_rule_delayed_read_states), at chunk
      // boundaries, one token, two column groups, initial states
      {128, 16, 4, 32, 32, false, true, "high", "mild"}, {129, 1, 4, 16, 16, false, true, "mid", "mild"},
      {130, 40, 4, 50, 50, false, true, "mid", "mild"},  {65, 33, 8, 32, 20, false, false, "low", "mild"},
      {2, 37, 1, 128, 64, false, true, "mid", "mild"},
  };
  torch::manual_seed(6);
  for (auto dt : {torch::kFloat, torch::kBFloat16})
    for (const auto& c : delayed)
      for (bool raw : {false, true}) compare(c, dt, raw, /*delayed=*/true);
  // Which form delta_rule takes: the states where ungated with 512+ heads or head dims past the chunkwise kernel's.
  for (const auto& c : delayed) {
    auto o = torch::dtype(torch::kFloat).device(torch::kCUDA);
    DeltaRuleForm form;
    form.chunk = 16;
    form.kernels = Kernels::Cuda;
    const bool expect = !c.gated && (c.B * c.H >= 512 || c.dk > 64 || c.dv > 64);
    EXPECT_EQ(delayed_read_by_states_applies(torch::zeros({c.B, c.T, c.H, c.dk}, o), torch::zeros({c.B, c.T, c.H, c.dv}, o),
                                             form, c.gated ? torch::zeros({c.B, c.T, c.H}, o) : torch::Tensor()),
              expect)
        << name(c, torch::kFloat);
  }
  // The interleaved form on the recurrent kernel (512+ heads), which delta_rule no longer picks ungated.
  compare({130, 21, 4, 32, 32, false, true, "mid", "mild"}, torch::kFloat, /*raw=*/true, /*delayed=*/true,
          /*interleaved=*/true);
}

// Linear attention with its numerator on the recurrent kernel's linear rule (linear_attention, many heads or
// kernels = cuda) against the tensor-op chunked form in fp64: outputs, S and z, gradients of q, k, v and both
// initial states; normalised and not, odd lengths, two column groups (dv 40), B = 1.
TEST(DeltaRuleKernel, LinearAttentionMatchesChunked) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(5);
  struct LinearCase {
    int64_t B, T, H, dk, dv;
    bool h0, normalize;
    Kernels kernels;
  };
  const std::vector<LinearCase> cases = {
      {130, 37, 4, 32, 32, false, true, Kernels::Auto}, {128, 40, 4, 24, 40, true, true, Kernels::Auto},
      {130, 20, 4, 50, 50, true, false, Kernels::Auto}, {1, 77, 2, 16, 16, true, true, Kernels::Cuda},
      {2, 300, 3, 64, 48, false, true, Kernels::Cuda},
  };
  auto o64 = torch::dtype(torch::kDouble).device(torch::kCUDA);
  for (const auto& c : cases) {
    for (auto dt : {torch::kFloat, torch::kBFloat16}) {
      const auto label = fmt::format("B{} T{} H{} dk{} dv{} h0={} normalize={} {}", c.B, c.T, c.H, c.dk, c.dv, c.h0,
                                     c.normalize, dt == torch::kBFloat16 ? "bf16" : "fp32");
      auto round = [&](const torch::Tensor& t) { return t.to(dt).to(torch::kDouble); };
      std::vector<torch::Tensor> x = {round(elu_plus_one(torch::randn({c.B, c.T, c.H, c.dk}, o64))),
                                      round(elu_plus_one(torch::randn({c.B, c.T, c.H, c.dk}, o64))),
                                      round(torch::randn({c.B, c.T, c.H, c.dv}, o64))};
      x.push_back(c.h0 ? torch::randn({c.B, c.H, c.dk, c.dv}, o64) * 0.3 : torch::Tensor());
      x.push_back(c.h0 ? torch::rand({c.B, c.H, c.dk}, o64) : torch::Tensor());
      auto wo = torch::randn({c.B, c.T, c.H, c.dv}, o64), ws = torch::randn({c.B, c.H, c.dk, c.dv}, o64);
      auto wz = torch::randn({c.B, c.H, c.dk}, o64);
      const double scale = 1.0 / std::sqrt(static_cast<double>(c.dk));
      auto run = [&](torch::ScalarType t, bool kernel) {
        std::vector<torch::Tensor> leaves;
        for (size_t i = 0; i < x.size(); ++i) {
          const auto lt = i < 3 ? t : (t == torch::kDouble ? torch::kDouble : torch::kFloat);
          leaves.push_back(x[i].defined() ? x[i].to(lt).detach().requires_grad_(true) : torch::Tensor());
        }
        if (kernel) {  // else the test would compare the chunked form with itself
          DeltaRuleForm f;
          f.kernels = c.kernels;
          EXPECT_TRUE(linear_rule_kernel_applies(leaves[0], leaves[2], f)) << label;
        }
        auto r = kernel ? linear_attention(leaves[0], leaves[1], leaves[2], 16, scale, c.normalize, c.kernels,
                                           leaves[3], leaves[4])
                        : linear_attention_chunked(leaves[0], leaves[1], leaves[2], 16, scale, c.normalize, leaves[3],
                                                   leaves[4]);
        ((r.o.to(torch::kDouble) * wo).sum() + (r.state.to(torch::kDouble) * ws).sum() +
         (r.z.to(torch::kDouble) * wz).sum())
            .backward();
        std::vector<torch::Tensor> out = {r.o.detach(), r.state.detach(), r.z.detach()};
        for (auto& l : leaves) out.push_back(l.defined() ? l.grad() : torch::Tensor());
        return out;
      };
      auto ref = run(torch::kDouble, false), ker = run(dt, true);
      const double tol = dt == torch::kBFloat16 ? 1e-2 : 2e-4;
      EXPECT_EQ(ker[0].scalar_type(), dt) << label;
      const char* names[] = {"o", "S", "z", "dq", "dk", "dv", "dS0", "dz0"};
      for (size_t i = 0; i < ref.size(); ++i) {
        if (!ref[i].defined()) continue;
        ASSERT_TRUE(ker[i].defined()) << label << ": " << names[i];
        EXPECT_TRUE(torch::isfinite(ker[i]).all().item<bool>()) << label << ": " << names[i];
        EXPECT_LT(err(ker[i], ref[i]), tol) << label << ": " << names[i];
      }
    }
  }
}

// The one-token kernel walks the same recurrence: token by token it gives the sequence kernel's outputs and
// final state, and it updates the state in place.
TEST(DeltaRuleKernel, StepMatchesForward) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(2);
  torch::NoGradGuard no_grad;
  for (bool gated : {false, true})
  for (bool raw : {false, true}) {
    const int64_t B = 3, T = 21, H = 2, d = 50;
    auto o = torch::dtype(torch::kFloat).device(torch::kCUDA);
    auto q = torch::randn({B, T, H, d}, o) * 2.0, k = torch::randn({B, T, H, d}, o) * 0.5;
    if (!raw) q = l2_normalize_reference(q), k = l2_normalize_reference(k);
    auto v = torch::randn({B, T, H, d}, o), beta = torch::rand({B, T, H}, o) * 2.0;
    auto g = gated ? -torch::rand({B, T, H}, o) : torch::Tensor();
    auto S0 = torch::randn({B, H, d, d}, o) * 0.3;
    DeltaRuleForm form;
    form.scale = 0.3;
    form.kernels = Kernels::Cuda;
    form.qk_l2norm = raw;  // the step normalises in its kernel; the sequence too or by the norm op
    auto full = delta_rule(q, k, v, beta, form, g, S0);
    auto S = S0.clone();
    const auto* storage = S.data_ptr<float>();
    std::vector<torch::Tensor> ys;
    for (int64_t t = 0; t < T; ++t)
      ys.push_back(delta_rule_step(q.select(1, t), k.select(1, t), v.select(1, t), beta.select(1, t), S, form,
                                   gated ? g.select(1, t) : torch::Tensor()));
    EXPECT_EQ(S.data_ptr<float>(), storage) << "the step kernel updates the state in place";
    // The sequence runs the chunkwise kernel (3xTF32 products): fp32 rounding, summed differently.
    const double tol = 1e-5;
    EXPECT_LT(rel_err(torch::stack(ys, 1), full.o), tol) << "gated=" << gated << " raw=" << raw;
    EXPECT_LT(rel_err(S, full.state), tol) << "gated=" << gated << " raw=" << raw;
  }
}

// The mixers with model.kernels=cuda equal themselves with torch in fp32; under bf16 autocast both are measured
// against fp32 and the kernel form is no less accurate.
TEST(DeltaRuleKernel, MixersMatchTensorOpForms) {
  SKIP_WITHOUT_KERNELS();
  NoTf32 exact;  // cuDNN may run the tensor-op form's fp32 conv in TF32
  torch::manual_seed(3);
  for (bool gated : {false, true}) {
    // The same weights in both forms: the same seed before construction and randomisation.
    auto build = [&](Kernels k) -> std::shared_ptr<MixerImpl> {
      torch::manual_seed(7);
      std::shared_ptr<MixerImpl> m;
      if (gated) {
        auto o = gated_deltanet_options(default_config());
        o.kernels = k;
        m = std::make_shared<GatedDeltaNetImpl>(MixerShape{128, 4, 0.02, 1e-6}, o);
      } else {
        auto o = deltanet_options(default_config());
        o.short_conv = true;
        o.kernels = k;
        m = std::make_shared<DeltaNetImpl>(MixerShape{128, 4, 0.02, 1e-6}, o);
      }
      randomize(*m);
      m->to(torch::kCUDA);
      return m;
    };
    auto x = torch::randn({4, 77, 128}, torch::dtype(torch::kFloat).device(torch::kCUDA));
    auto grads_of = [&](bool kernels, bool bf16) {
      auto m = build(kernels ? Kernels::Cuda : Kernels::Torch);
      return output_and_grads(*m, bf16, [&] { return m->forward(x); });
    };
    expect_kernel_form_matches(grads_of, gated ? "gated" : "deltanet");
  }
}

// Inside a captured CUDA graph (as the training step runs): replaying with new inputs copied into the captured
// tensors gives the eager outputs and gradients, so no kernel reads stale pointers or runs outside the graph.
TEST(DeltaRuleKernel, CudaGraphReplayMatchesEager) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(4);
  for (bool gated : {false, true}) {
    const int64_t B = 4, T = 40, H = 4, d = 32;
    auto o = torch::dtype(torch::kFloat).device(torch::kCUDA);
    auto fresh = [&] {
      std::vector<torch::Tensor> x{l2_normalize_reference(torch::randn({B, T, H, d}, o)), l2_normalize_reference(torch::randn({B, T, H, d}, o)),
                                   torch::randn({B, T, H, d}, o), torch::rand({B, T, H}, o) * 2.0};
      if (gated) x.push_back(-torch::rand({B, T, H}, o));
      return x;
    };
    auto w = torch::randn({B, T, H, d}, o);
    DeltaRuleForm form;
    form.scale = 0.25;
    form.kernels = Kernels::Cuda;
    // Outputs and input gradients of one forward and backward.
    auto step = [&](const std::vector<torch::Tensor>& x) {
      std::vector<torch::Tensor> leaves;
      for (auto& t : x) leaves.push_back(t.detach().requires_grad_(true));
      auto r = delta_rule(leaves[0], leaves[1], leaves[2], leaves[3], form, gated ? leaves[4] : torch::Tensor());
      auto grads = torch::autograd::grad({(r.o * w).sum()}, leaves);
      grads.insert(grads.begin(), r.o.detach());
      return grads;
    };
    auto inputs = fresh();  // the captured tensors
    auto side = c10::cuda::getStreamFromPool();
    std::vector<torch::Tensor> captured;
    at::cuda::CUDAGraph graph;
    {
      c10::cuda::CUDAStreamGuard guard(side);
      step(inputs);  // warm-up on the side stream, as the trainer does
      torch::cuda::synchronize();
      graph.capture_begin();
      captured = step(inputs);
      graph.capture_end();
    }
    torch::cuda::synchronize();
    for (int rep = 0; rep < 2; ++rep) {
      auto x = fresh();
      {
        torch::NoGradGuard ng;
        for (size_t i = 0; i < x.size(); ++i) inputs[i].copy_(x[i]);
      }
      graph.replay();
      torch::cuda::synchronize();
      auto eager = step(x);
      for (size_t i = 0; i < eager.size(); ++i)
        EXPECT_LT(rel_err(captured[i], eager[i]), 1e-6) << "gated=" << gated << " replay " << rep << " tensor " << i;
    }
  }
}

// The training step's graph (GraphedStep) when its capture breaks off inside the step, after the delta-rule kernels
// and a large allocation were recorded: by an exception on the host, or by a CUDA call that capture forbids (a
// host sync), which invalidates the capture. Each time the step falls back to eager and runs once eagerly, the
// stream takes launches again, the CUDA generator draws again, and the capture's memory pool is handed back (its
// 256 MiB block is freed).
TEST(DeltaRuleKernel, GraphCaptureThatBreaksOffFallsBackToEager) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(5);
  const int64_t B = 4, T = 40, H = 4, d = 32;
  auto o = torch::dtype(torch::kFloat).device(torch::kCUDA);
  auto q = l2_normalize_reference(torch::randn({B, T, H, d}, o)), k = l2_normalize_reference(torch::randn({B, T, H, d}, o));
  auto v = torch::randn({B, T, H, d}, o), beta = torch::rand({B, T, H}, o);
  auto out = torch::zeros({B, T, H, d}, o);
  DeltaRuleForm form;
  form.scale = 0.25;
  form.kernels = Kernels::Cuda;
  const auto reserved = [] { return c10::cuda::CUDACachingAllocator::getDeviceStats(0).reserved_bytes[0].current; };
  for (const bool invalidate : {false, true}) {
    int calls = 0;
    auto compute = [&] {
      ++calls;
      out.copy_(delta_rule(q, k, v, beta, form).o);
      if (calls == 4) {  // the first call after the 3 warm-up steps: the capture
        auto big = torch::rand({64 << 20}, o);
        if (invalidate) big.sum().item<float>();  // a host sync, which capture forbids
        throw std::runtime_error("a step that breaks off during capture");
      }
    };
    const std::string what = invalidate ? "a sync in the capture" : "a host exception in the capture";
    GraphedStep graphed(true);
    for (int s = 0; s < 3; ++s) graphed.run(compute);
    c10::cuda::CUDACachingAllocator::emptyCache();
    const int64_t before = reserved();
    graphed.run(compute);  // the capture breaks off; the step runs eagerly
    graphed.run(compute);
    EXPECT_EQ(calls, 6) << what;
    EXPECT_FALSE(graphed.captured()) << what;
    EXPECT_EQ(graphed.mode().rfind("eager (CUDA graph capture failed: ", 0), 0u) << what << ": " << graphed.mode();
    torch::cuda::synchronize();
    EXPECT_LT(rel_err(out, delta_rule(q, k, v, beta, form).o), 1e-6) << what;
    EXPECT_NO_THROW(torch::randn({8}, o).sum().item<float>()) << what << ": the CUDA generator is left capturing";
    c10::cuda::CUDACachingAllocator::emptyCache();
    EXPECT_LT(reserved() - before, int64_t{128} << 20) << what << ": the capture's memory pool was not handed back";
  }
}
