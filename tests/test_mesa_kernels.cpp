// GPU tests (ctest label gpu): Mesa's op in its kernels (ops/mesa/cg.h for both CG solves, ops/mesa/chunk.h for the
// states, reads and adjoints) against the tensor-op form in fp64 with the same CG, and against the exact solve where
// the CG has converged: the output, the final states and every input gradient (q, k, v, g, β, λ, the initial
// states); fp32 q, k, v (products to fp32 accuracy) and bf16 ones (TF32 chunk products, fp16 CG products: also with a
// state beyond fp16's range, near-unit and strong forget gates); lengths 1, 37, 64 and 100 (a partial chunk); B = 1,
// and B x H of 512 (the scans' one-walk kernel); head dims 16, 24, 27, 32, 50 and 64 (padded inside), value dims other
// than the key's; chunks 16, 32 and 64; every CG initial guess, with and without the normalised right-hand side; the
// layer with kernels == without. Skipped, with the reason, where there is no CUDA device or no kernels.
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
  torch::Tensor q, k, v, g, beta, lam, h0, g0, w, wh, wg;  // w, wh, wg weigh o and the final states in the loss
  std::vector<torch::Tensor> leaves() const { return {q, k, v, g, beta, lam, h0, g0}; }
};

// As the layer makes them (unit q, k; γ roughly in [0.5, 1] with the default gate_shift; β in (0, 1); λ >= 0.25),
// fp64 on the GPU, q, k, v rounded to `et` first. h0 is PSD, h0_scale times a unit one.
Inputs random_inputs(int64_t B, int64_t T, int64_t H, int64_t dk, int64_t dv, torch::ScalarType et,
                     double gate_shift = 2.0, double h0_scale = 1.0) {
  auto o = torch::dtype(torch::kDouble).device(torch::kCUDA);
  Inputs in;
  in.q = l2_normalize_reference(torch::randn({B, T, H, dk}, o)).to(et).to(torch::kDouble);
  in.k = l2_normalize_reference(torch::randn({B, T, H, dk}, o)).to(et).to(torch::kDouble);
  in.v = torch::randn({B, T, H, dv}, o).to(et).to(torch::kDouble);
  in.g = torch::log_sigmoid(torch::randn({B, T, H}, o) + gate_shift);
  in.beta = torch::sigmoid(torch::randn({B, T, H}, o));
  in.lam = torch::softplus(torch::randn({H, dk}, o)) + 0.25;
  auto kk = l2_normalize_reference(torch::randn({B, H, 3, dk}, o));
  in.h0 = h0_scale * (torch::matmul(kk.transpose(-1, -2), kk) + 0.5 * torch::eye(dk, o));  // PSD
  in.g0 = torch::randn({B, H, dk, dv}, o) * 0.5;
  in.w = torch::randn({B, T, H, dv}, o);
  in.wh = torch::randn({B, H, dk, dk}, o) * 0.1;
  in.wg = torch::randn({B, H, dk, dv}, o) * 0.1;
  return in;
}

struct Run {
  MesaOut out;
  std::vector<torch::Tensor> grads;
};

Run run(const Inputs& in, torch::ScalarType et, const MesaCG& cg, int64_t chunk, Kernels k) {
  std::vector<torch::Tensor> leaves;  // the kernel's: q, k, v in et, the rest fp32; the reference's: fp64
  const auto all = in.leaves();
  for (size_t i = 0; i < all.size(); ++i) {
    auto t = k == Kernels::Torch ? all[i] : all[i].to(i < 3 ? et : torch::kFloat);
    leaves.push_back(t.clone().requires_grad_(true));
  }
  auto out = mesa_chunked(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4], leaves[5], cg, chunk, leaves[6],
                          leaves[7], k);
  auto d = [](const torch::Tensor& t) { return t.to(torch::kDouble); };
  auto loss = (d(out.o) * in.w).sum() + (d(out.h_kk) * in.wh).sum() + (d(out.h_kv) * in.wg).sum();
  return {out, torch::autograd::grad({loss}, leaves)};
}

void compare(torch::ScalarType et, int64_t B, int64_t T, int64_t H, int64_t dk, int64_t chunk, MesaCG cg,
             int64_t dv = 0, double gate_shift = 2.0, double h0_scale = 1.0) {
  dv = dv ? dv : dk;
  auto in = random_inputs(B, T, H, dk, dv, et, gate_shift, h0_scale);
  const auto ref = run(in, et, cg, chunk, Kernels::Torch);
  const auto got = run(in, et, cg, chunk, Kernels::Cuda);
  const double tol = et == torch::kBFloat16 ? 1e-2 : 1e-4;
  const auto what = ::testing::Message() << "B" << B << " T" << T << " H" << H << " dk" << dk << " dv" << dv
                                         << " chunk " << chunk
                                         << (et == torch::kBFloat16 ? " bf16" : " fp32") << " steps " << cg.steps
                                         << " init " << static_cast<int>(cg.init) << " normalize " << cg.normalize_rhs
                                         << " gate shift " << gate_shift << " h0 scale " << h0_scale;
  EXPECT_LT(rel_err(got.out.o, ref.out.o), tol) << what;
  // the states sum fp32 chunk products: TF32 ones (bf16 inputs) keep about 11 bits of each term
  const double state_tol = et == torch::kBFloat16 ? 2e-3 : 1e-5;
  EXPECT_LT(rel_err(got.out.h_kk, ref.out.h_kk), state_tol) << what;
  EXPECT_LT(rel_err(got.out.h_kv, ref.out.h_kv), state_tol) << what;
  const char* names[] = {"q", "k", "v", "g", "beta", "lambda", "h0", "g0"};
  for (size_t i = 0; i < got.grads.size(); ++i) {
    ASSERT_TRUE(torch::isfinite(got.grads[i]).all().item<bool>()) << what << " d" << names[i];
    EXPECT_LT(rel_err(got.grads[i], ref.grads[i]), 5 * tol) << what << " d" << names[i];
  }
}

MesaCG cg_with(int64_t steps, MesaCGInit init, bool normalize) {
  MesaCG cg;
  cg.steps = steps;
  cg.init = init;
  cg.normalize_rhs = normalize;
  return cg;
}

TEST(MesaCgKernel, MatchesTensorOpsFp32) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(0);
  compare(torch::kFloat, 2, 100, 3, 32, 64, cg_with(30, MesaCGInit::Jacobi, true));
  compare(torch::kFloat, 1, 1, 2, 16, 64, cg_with(30, MesaCGInit::Jacobi, true));
  compare(torch::kFloat, 2, 37, 2, 24, 16, cg_with(10, MesaCGInit::Zero, false));
  compare(torch::kFloat, 1, 64, 4, 50, 32, cg_with(30, MesaCGInit::Query, true));
  compare(torch::kFloat, 1, 100, 2, 64, 64, cg_with(30, MesaCGInit::Jacobi, true));
  compare(torch::kFloat, 2, 70, 2, 32, 32, cg_with(30, MesaCGInit::Jacobi, true), 48);
  compare(torch::kFloat, 1, 45, 1, 40, 16, cg_with(20, MesaCGInit::Zero, true), 20);
}

TEST(MesaCgKernel, MatchesTensorOpsBf16) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(1);
  compare(torch::kBFloat16, 2, 100, 3, 32, 64, cg_with(30, MesaCGInit::Jacobi, true));
  compare(torch::kBFloat16, 1, 37, 2, 24, 16, cg_with(10, MesaCGInit::Zero, false));
  compare(torch::kBFloat16, 1, 130, 2, 64, 64, cg_with(30, MesaCGInit::Jacobi, true));
  compare(torch::kBFloat16, 2, 64, 2, 50, 32, cg_with(30, MesaCGInit::Query, true), 64);
  // chunk 64 puts the chunk products on fp16 operands: key and value widths apart, odd ones (no vector loads or stores)
  compare(torch::kBFloat16, 2, 90, 2, 40, 64, cg_with(30, MesaCGInit::Jacobi, true), 24);
  compare(torch::kBFloat16, 1, 77, 3, 50, 64, cg_with(30, MesaCGInit::Jacobi, true), 37);
  // chunk 16 at head dim 64: one warp a chunk carries all of S's tiles (the fp16 CG's widest register load)
  compare(torch::kBFloat16, 2, 50, 2, 64, 16, cg_with(30, MesaCGInit::Jacobi, true));
  // an odd key width (the fp16 CG's unpaired loads and stores), and the fp16 CG's smaller instances
  compare(torch::kBFloat16, 1, 45, 2, 37, 64, cg_with(30, MesaCGInit::Jacobi, true), 20);
  compare(torch::kBFloat16, 2, 40, 2, 16, 16, cg_with(20, MesaCGInit::Jacobi, true));
  compare(torch::kBFloat16, 1, 50, 2, 32, 32, cg_with(30, MesaCGInit::Zero, true));
  // 512 (batch, head) pairs or more at head dims 17-32: each scan's contributions summed in one walk (mesa_chunk_walk);
  // an odd key width there (scalar loads) and a chunk of 32 (rows past it zero)
  compare(torch::kBFloat16, 256, 100, 2, 32, 64, cg_with(30, MesaCGInit::Jacobi, true), 24);
  compare(torch::kBFloat16, 128, 45, 4, 27, 32, cg_with(20, MesaCGInit::Zero, true), 32);
}

// bf16 inputs put the CG's products on fp16 operands, scaled into fp16's range: a state whose entries pass fp16's
// largest (65504), near-unit forget gates over several chunks, and strong decays within a sub-chunk.
TEST(MesaCgKernel, Bf16StatesBeyondFp16Range) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(3);
  compare(torch::kBFloat16, 2, 200, 2, 64, 64, cg_with(30, MesaCGInit::Jacobi, true), 0, 2.0, 1e5);
  compare(torch::kBFloat16, 1, 300, 2, 32, 64, cg_with(30, MesaCGInit::Jacobi, true), 0, 8.0, 1.0);
  compare(torch::kBFloat16, 2, 100, 2, 64, 32, cg_with(30, MesaCGInit::Zero, true), 0, -3.0, 1.0);
  compare(torch::kBFloat16, 1, 90, 1, 16, 64, cg_with(30, MesaCGInit::Jacobi, false), 0, 2.0, 3e5);
}

// Many CG steps: the kernel's output is the exact solve's (materialised H_t, torch::linalg_solve, fp64).
TEST(MesaCgKernel, ConvergesToExactSolve) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(2);
  for (int64_t dk : {16, 32}) {
    auto in = random_inputs(2, 70, 2, dk, dk, torch::kFloat);
    MesaCG cg = cg_with(2 * dk, MesaCGInit::Jacobi, true);
    auto f = [](const torch::Tensor& t) { return t.to(torch::kFloat); };
    auto got = mesa_chunked(f(in.q), f(in.k), f(in.v), f(in.g), f(in.beta), f(in.lam), cg, 64, f(in.h0), f(in.g0),
                            Kernels::Cuda);
    auto exact = mesa_exact(in.q, in.k, in.v, in.g, in.beta, in.lam, in.h0, in.g0);
    EXPECT_LT(rel_err(got.o, exact.o), 1e-4) << "dk " << dk;
  }
}

TEST(MesaCgKernel, LayerMatchesTensorOps) {
  SKIP_WITHOUT_KERNELS();
  auto x = torch::randn({3, 77, 64}, torch::dtype(torch::kFloat).device(torch::kCUDA));
  auto f = layer_forms<MesaImpl>(make_mesa, MixerShape{64, 2, 0.02, 1e-6}, x, 5);  // head dim 32
  EXPECT_LT(rel_err(f.y_fast, f.y_ref), 1e-4);
  EXPECT_LT(rel_err(f.dx_fast, f.dx_ref), 1e-3);
}

}  // namespace
