// GPU tests (ctest label gpu): the fused sLSTM recurrence against the tensor-op form in fp64. Two segments
// chained through the state, so that one test covers the outputs, every input gradient (pre, R, the initial
// h, c, n, m) and the final states, and the gradients that flow through a state from a later call; fp32 and
// bf16 pre; lengths 1, 37, 64 and 1000; B = 1 and batches that leave a block part-filled; odd head counts and
// head dims; strong gates; the step kernel == the sequence; the layer with kernels == without. Skipped, with
// the reason, where there is no CUDA device or no kernels.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "mixers/slstm.h"
#include "tests/mixer_check.h"

using namespace memlab;
using namespace memlab::testing;

namespace {

struct Inputs {
  torch::Tensor pre1, pre2, R, h0, c0, n0, m0, w1, w2;
  std::vector<torch::Tensor> leaves() const { return {pre1, pre2, R, h0, c0, n0, m0}; }
};

// fp64 leaves on the GPU; pre rounded to dt first so both forms see the same values. gate_scale makes the
// gates strong (saturated sigmoids, exponents of +-30 in the input gate).
Inputs random_inputs(int64_t B, int64_t T1, int64_t T2, int64_t H, int64_t dh, torch::ScalarType dt, double gate_scale) {
  auto o = torch::dtype(torch::kDouble).device(torch::kCUDA);
  auto pre = [&](int64_t T) { return (torch::randn({B, T, H, 4, dh}, o) * gate_scale).to(dt).to(torch::kDouble); };
  Inputs in;
  in.pre1 = pre(T1);
  in.pre2 = pre(T2);
  in.R = torch::randn({H, dh, 4 * dh}, o) / std::sqrt(static_cast<double>(dh));
  in.h0 = torch::randn({B, H, dh}, o) * 0.5;
  in.c0 = torch::randn({B, H, dh}, o);
  in.n0 = torch::rand({B, H, dh}, o) + 0.5;
  in.m0 = torch::randn({B, H, dh}, o);
  in.n0.select(1, 0).zero_();  // head 0 starts fresh: the zero-state rule
  in.c0.select(1, 0).zero_();
  in.w1 = torch::randn({B, T1, H, dh}, o);
  in.w2 = torch::randn({B, T2, H, dh}, o);
  return in;
}

struct Run {
  torch::Tensor h1, h2;
  SLstmState final_state;
  std::vector<torch::Tensor> grads;
};

// The first segment from (h0, c0, n0, m0), the second from its final state; loss Σ w1 h1 + Σ w2 h2.
Run run(const Inputs& in, torch::ScalarType dt, Kernels k) {
  std::vector<torch::Tensor> leaves;  // the kernel's: pre in dt, the rest fp32; the reference's: fp64
  const auto all = in.leaves();
  for (size_t i = 0; i < all.size(); ++i)
    leaves.push_back((k == Kernels::Torch ? all[i] : all[i].to(i < 2 ? dt : torch::kFloat)).clone().requires_grad_(true));
  auto seq = [&](const torch::Tensor& pre, const SLstmState& s) {
    return k == Kernels::Torch ? slstm_forward(pre, leaves[2], s) : slstm(pre, leaves[2], s, k);
  };
  auto a = seq(leaves[0], {leaves[3], leaves[4], leaves[5], leaves[6]});
  auto b = seq(leaves[1], a.state);
  auto loss = (a.h.to(torch::kDouble) * in.w1).sum() + (b.h.to(torch::kDouble) * in.w2).sum();
  Run r{a.h, b.h, b.state, torch::autograd::grad({loss}, leaves)};
  return r;
}

void compare(torch::ScalarType dt, int64_t B, int64_t T1, int64_t T2, int64_t H, int64_t dh, double gate_scale) {
  auto in = random_inputs(B, T1, T2, H, dh, dt, gate_scale);
  const auto ref = run(in, dt, Kernels::Torch);
  const auto got = run(in, dt, Kernels::Cuda);
  const double tol = dt == torch::kBFloat16 ? 1e-2 : (T1 + T2 > 200 ? 2e-4 : 5e-5);
  const auto what = ::testing::Message() << "B" << B << " T" << T1 << "+" << T2 << " H" << H << " dh" << dh
                                         << (dt == torch::kBFloat16 ? " bf16" : " fp32") << " gates x" << gate_scale;
  ASSERT_EQ(got.h1.scalar_type(), dt) << what;
  EXPECT_LT(rel_err(got.h1, ref.h1), tol) << what;
  EXPECT_LT(rel_err(got.h2, ref.h2), tol) << what;
  EXPECT_LT(rel_err(got.final_state.h, ref.final_state.h), tol) << what;
  EXPECT_LT(rel_err(got.final_state.c / got.final_state.n, ref.final_state.c / ref.final_state.n), tol) << what;
  EXPECT_LT(rel_err(got.final_state.m, ref.final_state.m), tol) << what;
  const char* names[] = {"pre1", "pre2", "R", "h0", "c0", "n0", "m0"};
  for (size_t i = 0; i < got.grads.size(); ++i) {
    ASSERT_TRUE(torch::isfinite(got.grads[i]).all().item<bool>()) << what << " d" << names[i];
    EXPECT_LT(rel_err(got.grads[i], ref.grads[i]), 4 * tol) << what << " d" << names[i];
  }
}

TEST(SLstmKernel, MatchesTensorOpsFp32) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(0);
  compare(torch::kFloat, 3, 37, 64, 4, 32, 2.0);
  compare(torch::kFloat, 1, 1, 1, 3, 16, 2.0);
  compare(torch::kFloat, 37, 64, 37, 5, 64, 2.0);  // 37 rows: the last block part-filled
  compare(torch::kFloat, 2, 1000, 37, 3, 50, 1.0);  // an odd head dim: the generic kernel
  compare(torch::kFloat, 5, 37, 1, 1, 5, 2.0);
}

TEST(SLstmKernel, MatchesTensorOpsBf16) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(1);
  compare(torch::kBFloat16, 3, 37, 64, 4, 32, 2.0);
  compare(torch::kBFloat16, 1, 1000, 1, 3, 64, 1.0);
}

TEST(SLstmKernel, StrongGates) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(2);
  compare(torch::kFloat, 4, 64, 37, 3, 32, 15.0);
}

TEST(SLstmKernel, StepEqualsSequence) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(3);
  auto o = torch::dtype(torch::kFloat).device(torch::kCUDA);
  const int64_t B = 5, T = 37, H = 3, dh = 32;
  auto pre = torch::randn({B, T, H, 4, dh}, o) * 2.0;
  auto R = torch::randn({H, dh, 4 * dh}, o) / std::sqrt(static_cast<double>(dh));
  torch::NoGradGuard ng;
  auto seq = slstm(pre, R, {}, Kernels::Cuda);
  auto ref = slstm_forward(pre.to(torch::kDouble), R.to(torch::kDouble));
  auto st = slstm_zero_state(B, H, dh, o);
  std::vector<torch::Tensor> hs;
  for (int64_t t = 0; t < T; ++t) hs.push_back(slstm_step(pre.select(1, t).contiguous(), R, st, Kernels::Cuda));
  EXPECT_LT(rel_err(torch::stack(hs, 1), seq.h), 1e-6);
  EXPECT_LT(rel_err(seq.h, ref.h), 5e-5);
  EXPECT_LT(rel_err(st.c, seq.state.c), 1e-6);
  EXPECT_LT(rel_err(st.m, seq.state.m), 1e-6);
}

TEST(SLstmKernel, LayerMatchesTensorOps) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(4);
  auto x = torch::randn({4, 45, 96}, torch::dtype(torch::kFloat).device(torch::kCUDA));
  auto f = layer_forms<SLstmImpl>(make_slstm, MixerShape{96, 3, 0.02, 1e-6}, x, 5);
  EXPECT_LT(rel_err(f.y_fast, f.y_ref), 1e-5);
  EXPECT_LT(rel_err(f.dx_fast, f.dx_ref), 1e-4);
  EXPECT_LT(rel_err(f.fast->recurrent_kernel.grad(), f.ref->recurrent_kernel.grad()), 1e-4);
}

}  // namespace
