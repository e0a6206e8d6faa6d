// Local attention on the CPU: the blocked form (the reference) and the window kernel's per-block code (run on the
// CPU, as window.h offers) against attention with one dense [T, T] mask written from the definition: outputs, lse
// and the gradients of q, k and v; sliding and chunked, windows under and over a block's 32 queries, lengths under,
// at and past the window and the block, T = 1, S = 1, d = 1; q, k and v dense or read as column slices of wider rows
// (with rows on and off 16-byte boundaries: the vector and the scalar loads), and v sliced beside dense q and k.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "ops/local_attention/local_attention.h"
#include "tests/mixer_check.h"

#ifdef MEMLAB_CUDA_KERNELS
#include "ops/local_attention/window.h"
#endif

using namespace memlab;
using memlab::testing::expect_close_or_zero;
using memlab::testing::rel_err;

namespace {

struct Shape {
  int64_t B, T, H, d, S;
};
enum class Layout { Dense, Sliced, SlicedAligned, Mixed };
const std::vector<Shape> kShapes = {{2, 40, 4, 8, 8},   {1, 40, 2, 5, 16}, {2, 150, 2, 7, 16}, {1, 7, 1, 3, 16},
                                    {1, 100, 3, 4, 40},  {2, 130, 1, 6, 64}, {1, 33, 2, 1, 1},   {1, 65, 1, 3, 33},
                                    {2, 32, 2, 4, 32},   {1, 64, 1, 4, 24},  {3, 1, 2, 4, 8},    {1, 24, 2, 8, 24},
                                    {1, 128, 1, 4, 64}};

torch::Tensor allowed_mask(int64_t T, int64_t S, bool chunked) {
  const auto t = torch::arange(T).view({T, 1}), j = torch::arange(T).view({1, T});
  return chunked ? (j <= t).logical_and(torch::div(j, S, "floor") == torch::div(t, S, "floor"))
                 : (j <= t).logical_and(j > t - S);
}

// scores [B, H, T, T] of the allowed pairs (-inf elsewhere), q, k, v [B, T, H, d] in fp64.
torch::Tensor scores(const torch::Tensor& q, const torch::Tensor& k, int64_t S, bool chunked) {
  const int64_t T = q.size(1), d = q.size(3);
  auto s = torch::einsum("bthd,bjhd->bhtj", {q, k}) / std::sqrt(double(d));
  return s.masked_fill(allowed_mask(T, S, chunked).logical_not(), -std::numeric_limits<double>::infinity());
}

torch::Tensor dense(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t S, bool chunked) {
  return torch::einsum("bhtj,bjhd->bthd", {torch::softmax(scores(q, k, S, chunked), -1), v});
}

}  // namespace

TEST(LocalAttention, BlockedFormIsTheDefinition) {
  torch::manual_seed(1);
  const auto o = torch::dtype(torch::kDouble);
  for (const auto& s : kShapes)
    for (bool chunked : {false, true}) {
      std::vector<torch::Tensor> x;
      for (int i = 0; i < 3; ++i) x.push_back((torch::randn({s.B, s.T, s.H, s.d}, o) * 2.0).requires_grad_(true));
      const auto dy = torch::randn({s.B, s.T, s.H, s.d}, o);
      const auto y_ref = dense(x[0], x[1], x[2], s.S, chunked);
      const auto g_ref = torch::autograd::grad({(y_ref * dy).sum()}, x);
      const auto y = local_attention(x[0], x[1], x[2], s.S, chunked, Kernels::Torch);
      const auto g = torch::autograd::grad({(y * dy).sum()}, x);
      const auto what = ::testing::Message() << (chunked ? "chunked" : "sliding") << " B" << s.B << " T" << s.T
                                             << " H" << s.H << " d" << s.d << " S" << s.S;
      EXPECT_LT(rel_err(y, y_ref), 1e-10) << what;
      for (int i = 0; i < 3; ++i)  // T = 1 or S = 1: q's and k's gradients are 0
        expect_close_or_zero(g[i], g_ref[i], 1e-10, 1e-10 * dy.norm().item<double>(),
                             ::testing::Message(what) << " gradient " << i);
    }
}

TEST(LocalAttention, WindowKernelCodeMatchesTheDefinition) {
#ifndef MEMLAB_CUDA_KERNELS
  GTEST_SKIP() << "built without nvcc";
#else
  torch::manual_seed(2);
  const auto o = torch::dtype(torch::kDouble);
  for (const auto& s : kShapes)
    for (bool chunked : {false, true})
      for (Layout layout : {Layout::Dense, Layout::Sliced, Layout::SlicedAligned, Layout::Mixed}) {
        // Sliced: q, k, v as columns of one [B, T, gap + 3 H d] buffer, as from a fused projection with `gap`
        // columns before them: gap 3 (no row starts on 4 floats: scalar loads) or 4 (vector loads where d allows).
        // Mixed: q and k dense, v sliced (HQLT with rope).
        const bool aligned = layout == Layout::SlicedAligned || layout == Layout::Mixed;
        const int64_t hd = s.H * s.d, gap = aligned ? 4 : 3, wide = 3 * hd + gap;
        auto buf = torch::randn({s.B, s.T, wide}, o) * 2.0;
        std::vector<torch::Tensor> x64, xk;
        for (int i = 0; i < 3; ++i) {
          auto part = buf.narrow(2, gap + i * hd, hd).view({s.B, s.T, s.H, s.d});
          x64.push_back(part.clone().requires_grad_(true));
        }
        const auto buf32 = buf.to(torch::kFloat);
        for (int i = 0; i < 3; ++i) {
          const bool slice = layout == Layout::Sliced || layout == Layout::SlicedAligned || (layout == Layout::Mixed && i == 2);
          xk.push_back(slice ? buf32.narrow(2, gap + i * hd, hd).view({s.B, s.T, s.H, s.d})
                             : x64[i].detach().to(torch::kFloat).contiguous());
        }
        const auto dy = torch::randn({s.B, s.T, s.H, s.d}, o);
        const auto y_ref = dense(x64[0], x64[1], x64[2], s.S, chunked);
        const auto g_ref = torch::autograd::grad({(y_ref * dy).sum()}, x64);
        const auto lse_ref = torch::logsumexp(scores(x64[0].detach(), x64[1].detach(), s.S, chunked), -1);  // [B, H, T]

        kernels::WindowAttentionProblem p;
        p.B = static_cast<int>(s.B);
        p.T = static_cast<int>(s.T);
        p.H = static_cast<int>(s.H);
        p.d = static_cast<int>(s.d);
        p.S = static_cast<int>(s.S);
        p.chunked = chunked;
        p.q_row = layout == Layout::Sliced || layout == Layout::SlicedAligned ? wide : 0;
        p.k_row = p.q_row;
        p.v_row = layout == Layout::Dense ? 0 : wide;
        p.scale = static_cast<float>(1.0 / std::sqrt(double(s.d)));
        auto y = torch::empty({s.B, s.T, s.H, s.d}), lse = torch::empty({s.B, s.H, s.T});
        kernels::WindowAttentionForwardArgs fa;
        fa.q = xk[0].data_ptr();
        fa.k = xk[1].data_ptr();
        fa.v = xk[2].data_ptr();
        fa.o = y.data_ptr();
        fa.lse = lse.data_ptr<float>();
        ASSERT_EQ(kernels::window_attention_forward_host(p, fa), "");
        const auto dyf = dy.to(torch::kFloat).contiguous();
        std::vector<torch::Tensor> g;
        for (int i = 0; i < 3; ++i) g.push_back(torch::full({s.B, s.T, s.H, s.d}, std::nanf("")));
        kernels::WindowAttentionBackwardArgs ba;
        ba.q = fa.q;
        ba.k = fa.k;
        ba.v = fa.v;
        ba.o = y.data_ptr();
        ba.dout = dyf.data_ptr();
        ba.lse = lse.data_ptr<float>();
        ba.dq = g[0].data_ptr();
        ba.dk = g[1].data_ptr();
        ba.dv = g[2].data_ptr();
        ASSERT_EQ(kernels::window_attention_backward_host(p, ba), "");
        const auto what = ::testing::Message() << (chunked ? "chunked" : "sliding") << " layout " << int(layout)
                                               << " B" << s.B << " T" << s.T << " H" << s.H << " d" << s.d << " S"
                                               << s.S;
        EXPECT_LT(rel_err(y, y_ref), 1e-5) << what;
        EXPECT_LT(rel_err(lse, lse_ref), 1e-5) << what;
        for (int i = 0; i < 3; ++i)  // T = 1 or S = 1: q's and k's gradients are 0
          expect_close_or_zero(g[i], g_ref[i], 1e-5, 1e-5 * dy.norm().item<double>(),
                               ::testing::Message(what) << " gradient " << i);
      }
  kernels::WindowAttentionProblem bad;
  bad.B = bad.T = bad.H = bad.d = 1;
  bad.S = kernels::kWindowMaxS + 1;
  EXPECT_NE(kernels::window_attention_forward_host(bad, {}), "");
  bad.S = 4;
  bad.H = 2;
  bad.d = 8;
  bad.k_row = 15;
  EXPECT_NE(kernels::window_attention_forward_host(bad, {}), "");
#endif
}

// The window kernel is a CUDA one: on the CPU local attention runs the blocked form, and says why.
TEST(LocalAttention, KernelOnCpuIsRefused) {
  const auto x = torch::randn({1, 8, 1, 16});
  std::string why;
  EXPECT_FALSE(local_attention_kernel_applies(x, x, x, 4, Kernels::Auto, &why));
  EXPECT_FALSE(why.empty());
}
