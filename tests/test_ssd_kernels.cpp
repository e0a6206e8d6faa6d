// GPU tests (ctest label gpu): the chunkwise SSD kernels against the tensor-op chunkwise form in fp64. Two
// segments chained through the state, with a loss on both outputs and on the final state, so that one test covers
// the outputs, every input gradient (x, dt, B, C of both segments, A, the initial state, the skip D) and the final
// state; fp32
// and bf16 x, B, C; lengths 1, 31, 32, 33 and 300; B = 1; grouped B and C; head dims and state sizes 16 to 128;
// signed transitions (neg_eigval) and strong decays; the Mamba-2 layer with kernels == without. Skipped, with the
// reason, where there is no CUDA device or no kernels.
#include <gtest/gtest.h>
#include <cmath>
#include <torch/torch.h>

#include "mixers/mamba2.h"
#include "tests/mixer_check.h"

using namespace memlab;
using namespace memlab::testing;

namespace {

struct Shape {
  int64_t B, T1, T2, H, G, P, N;
};

struct Segment {
  torch::Tensor x, dt, Bm, Cm, w;  // w weighs y in the loss
};

struct Inputs {
  Segment s1, s2;
  torch::Tensor A, h0, D, wh;
  std::vector<torch::Tensor> leaves() const {
    return {s1.x, s1.dt, s1.Bm, s1.Cm, s2.x, s2.dt, s2.Bm, s2.Cm, A, h0, D};
  }
};

// fp64 tensors on the GPU; x, B, C rounded to `et` first so both forms see the same values. dt in (0, dt_max],
// A in [-a_max, -0.5]: large products dt |A| decay to nothing (or, with neg_eigval, flip sign at |alpha| ~ 1).
Inputs random_inputs(const Shape& s, torch::ScalarType et, double dt_max, double a_max) {
  auto o = torch::dtype(torch::kDouble).device(torch::kCUDA);
  auto segment = [&](int64_t T) {
    Segment g;
    g.x = torch::randn({s.B, T, s.H, s.P}, o).to(et).to(torch::kDouble);
    g.dt = torch::rand({s.B, T, s.H}, o) * dt_max + 1e-3;
    g.Bm = (torch::randn({s.B, T, s.G, s.N}, o) * 0.5).to(et).to(torch::kDouble);
    g.Cm = (torch::randn({s.B, T, s.G, s.N}, o) * 0.5).to(et).to(torch::kDouble);
    g.w = torch::randn({s.B, T, s.H, s.P}, o);
    return g;
  };
  Inputs in;
  in.s1 = segment(s.T1);
  in.s2 = segment(s.T2);
  in.A = -(torch::rand({s.H}, o) * (a_max - 0.5) + 0.5);
  in.h0 = torch::randn({s.B, s.H, s.P, s.N}, o) * 0.3;
  in.D = torch::randn({s.H}, o);
  in.wh = torch::randn({s.B, s.H, s.P, s.N}, o) * 0.1;
  return in;
}

struct Run {
  torch::Tensor y1, y2, hT;
  std::vector<torch::Tensor> grads;
};

Run run(const Inputs& in, torch::ScalarType et, bool neg, Kernels k) {
  std::vector<torch::Tensor> leaves;  // the kernel's: x, B, C in et, the rest fp32; the reference's: fp64
  const auto all = in.leaves();
  for (size_t i = 0; i < all.size(); ++i) {
    const bool low = i < 8 && i % 4 != 1;
    auto t = k == Kernels::Torch ? all[i] : all[i].to(low ? et : torch::kFloat);
    leaves.push_back(t.clone().requires_grad_(true));
  }
  const auto& A = leaves[8];
  auto a = ssd(leaves[0], leaves[1], A, leaves[2], leaves[3], 16, neg, leaves[9], k, leaves[10]);
  auto b = ssd(leaves[4], leaves[5], A, leaves[6], leaves[7], 16, neg, a.state, k, leaves[10]);
  auto d = [](const torch::Tensor& t) { return t.to(torch::kDouble); };
  auto loss = (d(a.y) * in.s1.w).sum() + (d(b.y) * in.s2.w).sum() + (d(b.state) * in.wh).sum();
  return {a.y, b.y, b.state, torch::autograd::grad({loss}, leaves)};
}

double grad_err(const torch::Tensor& g, const torch::Tensor& g_ref, double scale) {
  return (g.to(torch::kDouble) - g_ref).norm().item<double>() / (g_ref.norm().item<double>() + 1e-3 * scale);
}

void compare(torch::ScalarType et, const Shape& s, bool neg, double dt_max = 0.5, double a_max = 4.0) {
  auto in = random_inputs(s, et, dt_max, a_max);
  const auto ref = run(in, et, neg, Kernels::Torch);
  const auto got = run(in, et, neg, Kernels::Cuda);
  const double tol = et == torch::kBFloat16 ? 1e-2 : 2e-4;
  const auto what = ::testing::Message() << "B" << s.B << " T" << s.T1 << "+" << s.T2 << " H" << s.H << " G" << s.G
                                         << " P" << s.P << " N" << s.N << (et == torch::kBFloat16 ? " bf16" : " fp32")
                                         << (neg ? " neg_eigval" : "") << " dt<=" << dt_max << " |A|<=" << a_max;
  ASSERT_EQ(got.y1.scalar_type(), torch::kFloat) << what;
  EXPECT_LT(rel_err(got.y1, ref.y1), tol) << what;
  EXPECT_LT(rel_err(got.y2, ref.y2), tol) << what;
  EXPECT_LT(rel_err(got.hT, ref.hT), tol) << what;
  double scale = 0.0;
  for (const auto& g : ref.grads) scale = std::max(scale, g.norm().item<double>());
  const char* names[] = {"x1", "dt1", "B1", "C1", "x2", "dt2", "B2", "C2", "A", "h0", "D"};
  for (size_t i = 0; i < got.grads.size(); ++i) {
    ASSERT_TRUE(torch::isfinite(got.grads[i]).all().item<bool>()) << what << " d" << names[i];
    EXPECT_LT(grad_err(got.grads[i], ref.grads[i], scale), 4 * tol) << what << " d" << names[i];
  }
}

TEST(SsdKernel, MatchesTensorOpsFp32) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(0);
  compare(torch::kFloat, {3, 37, 64, 4, 1, 64, 16}, false);
  compare(torch::kFloat, {1, 1, 1, 3, 3, 16, 16}, false);
  compare(torch::kFloat, {2, 31, 33, 4, 2, 32, 64}, true);
  compare(torch::kFloat, {2, 300, 32, 2, 1, 64, 32}, true);
  compare(torch::kFloat, {1, 40, 29, 2, 1, 128, 128}, false);
  compare(torch::kFloat, {2, 33, 65, 3, 1, 16, 128}, true);
}

TEST(SsdKernel, MatchesTensorOpsBf16) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(1);
  compare(torch::kBFloat16, {3, 37, 64, 4, 1, 64, 16}, false);
  compare(torch::kBFloat16, {1, 300, 1, 3, 1, 32, 16}, true);
}

TEST(SsdKernel, StrongDecays) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(2);
  compare(torch::kFloat, {2, 64, 37, 3, 1, 32, 16}, false, 5.0, 16.0);
  compare(torch::kFloat, {2, 45, 50, 2, 2, 16, 32}, true, 5.0, 16.0);
}

// neg_eigval with alpha = 0 in fp32 at some tokens: dt = the float just below ln 2, A = -1, where fp32 exp gives
// 0.5 (and fp64 gives alpha = +5.8e-8; both floor it to +1e-4). The kernel's d log|alpha| there is its running
// sum's rounding error, divided by the floor in d alpha: with a floor of 1e-30 the dt gradients came out ~1e23
// times too large; with the floor they match the tensor ops.
TEST(SsdKernel, ZeroTransitionsKeepGradientsBounded) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(4);
  for (int64_t T : {40, 300}) {
    auto in = random_inputs({2, T, 17, 2, 1, 32, 16}, torch::kFloat, 0.5, 4.0);
    {
      torch::NoGradGuard ng;
      in.A.fill_(-1.0);
      const double dt0 = std::nextafter(static_cast<float>(std::log(2.0)), 0.f);
      for (int64_t t : {3, 16, 37}) in.s1.dt.select(1, t).fill_(dt0);
      in.s2.dt.select(1, 3).fill_(dt0);
    }
    const auto ref = run(in, torch::kFloat, true, Kernels::Torch);
    const auto got = run(in, torch::kFloat, true, Kernels::Cuda);
    const char* names[] = {"x1", "dt1", "B1", "C1", "x2", "dt2", "B2", "C2", "A", "h0", "D"};
    EXPECT_LT(rel_err(got.y1, ref.y1), 2e-4) << T;
    EXPECT_LT(rel_err(got.hT, ref.hT), 2e-4) << T;
    double scale = 0.0;
    for (const auto& g : ref.grads) scale = std::max(scale, g.norm().item<double>());
    // dA sums dt·d log|alpha| over every token, and a floored token's share carries the sum's rounding error times
    // 1 / floor: about 0.07 each against |dA| of 5-50 (an fp32 emulation here), so A gets a looser bound.
    for (size_t i = 0; i < got.grads.size(); ++i)
      EXPECT_LT(grad_err(got.grads[i], ref.grads[i], scale), i == 8 ? 0.1 : 1e-2) << "T" << T << " d" << names[i];
  }
}

// x, B and C as column slices of one [B, T, .] bf16 tensor, as the layer's projection gives them: read in place.
TEST(SsdKernel, ColumnSlices) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(4);
  auto o = torch::dtype(torch::kFloat).device(torch::kCUDA);
  const int64_t B = 2, T = 45, H = 4, P = 32, N = 16;
  auto xbc = torch::randn({B, T, H * P + 2 * N + 3}, o).to(torch::kBFloat16).requires_grad_(true);
  auto dt = (torch::rand({B, T, H}, o) * 0.5 + 0.01).requires_grad_(true);
  auto A = (-(torch::rand({H}, o) * 3.0 + 0.5)).requires_grad_(true);
  auto D = torch::randn({H}, o).requires_grad_(true);
  auto w = torch::randn({B, T, H, P}, o);
  auto grads = [&](Kernels k) {
    auto parts = xbc.split_with_sizes({H * P, N, N, 3}, -1);
    auto x = parts[0].view({B, T, H, P}), Bm = parts[1].view({B, T, 1, N}), Cm = parts[2].view({B, T, 1, N});
    if (k == Kernels::Torch) {
      x = x.to(torch::kDouble);
      Bm = Bm.to(torch::kDouble);
      Cm = Cm.to(torch::kDouble);
    }
    auto r = ssd(x, dt, A, Bm, Cm, 16, false, {}, k, D);
    auto loss = (r.y.to(torch::kDouble) * w).sum();
    auto g = torch::autograd::grad({loss}, {xbc, dt, A, D});
    g.insert(g.begin(), r.y);
    return g;
  };
  auto got = grads(Kernels::Cuda), ref = grads(Kernels::Torch);
  const char* names[] = {"y", "dxbc", "ddt", "dA", "dD"};
  for (size_t i = 0; i < got.size(); ++i) EXPECT_LT(rel_err(got[i], ref[i]), i == 1 ? 1e-2 : 1e-4) << names[i];
}

TEST(SsdKernel, ZeroStateAndNoGrad) {
  SKIP_WITHOUT_KERNELS();
  torch::manual_seed(3);
  auto o = torch::dtype(torch::kFloat).device(torch::kCUDA);
  const int64_t B = 2, T = 70, H = 4, P = 64, N = 16;
  auto x = torch::randn({B, T, H, P}, o), dt = torch::rand({B, T, H}, o) * 0.5 + 0.01;
  auto A = -(torch::rand({H}, o) * 3.0 + 0.5), Bm = torch::randn({B, T, 1, N}, o), Cm = torch::randn({B, T, 1, N}, o);
  auto d = [](const torch::Tensor& t) { return t.to(torch::kDouble); };
  auto ref = ssd_chunked(d(x), d(dt), d(A), d(Bm), d(Cm), 64, true);
  torch::NoGradGuard ng;
  auto got = ssd(x, dt, A, Bm, Cm, 64, true, {}, Kernels::Cuda);
  EXPECT_LT(rel_err(got.y, ref.y), 1e-5);
  EXPECT_LT(rel_err(got.state, ref.state), 1e-5);
}

TEST(SsdKernel, LayerMatchesTensorOps) {
  SKIP_WITHOUT_KERNELS();
  auto x = torch::randn({3, 77, 64}, torch::dtype(torch::kFloat).device(torch::kCUDA));
  auto f = layer_forms<Mamba2Impl>(make_mamba2, MixerShape{64, 2, 0.02, 1e-6}, x, 5);  // inner 128, head dim 64
  EXPECT_LT(rel_err(f.y_fast, f.y_ref), 1e-4);
  EXPECT_LT(rel_err(f.dx_fast, f.dx_ref), 1e-4);
  EXPECT_LT(rel_err(f.fast->A_log.grad(), f.ref->A_log.grad()), 1e-3);
  EXPECT_LT(rel_err(f.fast->dt_bias.grad(), f.ref->dt_bias.grad()), 1e-3);
  EXPECT_LT(rel_err(f.fast->D.grad(), f.ref->D.grad()), 1e-4);
}

}  // namespace
