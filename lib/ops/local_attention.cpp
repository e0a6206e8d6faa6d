#include "ops/local_attention.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>

#include <cmath>

#include "core/device.h"
#include "mixers/ops.h"
#include "ops/kernel_call.h"

namespace memlab {

namespace {

// [..., d] -> [..., dp] in dtype dt, zero columns after d (the scores are unchanged), contiguous.
torch::Tensor padded(const torch::Tensor& x, int64_t dp, torch::ScalarType dt) {
  auto y = x.to(dt);
  if (dp != x.size(-1)) y = torch::constant_pad_nd(y, {0, dp - x.size(-1)});
  return y.contiguous();
}

int64_t padded_dim(int64_t d) { return (d + 7) / 8 * 8; }

// Sliding: one flash call with its window (left S - 1, right 0). Chunked: each block of S is a causal sequence of
// its own, by the variable-length call; block i of batch b starts at token b T + i S, so the starts (and the end,
// B T, as i = 0 of b = B) come from one arange on the device, with nothing read back (graph capture holds). The
// chunked backward's fp32 workspace pads each block to 128 rows, about 128 / S times the tokens' rows.
torch::Tensor local_attention_flash(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t S,
                                    bool chunked) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), d = q.size(3), dp = padded_dim(d);
  const auto dt = projection_input_type(q);  // autocast's, as for SDPA; the flash op is not on its list
  const auto qp = padded(q, dp, dt), kp = padded(k, dp, dt), vp = padded(v, dp, dt);
  const double scale = 1.0 / std::sqrt(double(d));
  torch::Tensor o;
  if (!chunked) {
    o = std::get<0>(at::_flash_attention_forward(qp, kp, vp, {}, {}, T, T, 0.0, /*is_causal=*/true, false, scale,
                                                 /*window_size_left=*/S - 1, /*window_size_right=*/0));
  } else {
    const int64_t NB = (T + S - 1) / S, longest = std::min(S, T);
    const auto i = torch::arange(B * NB + 1, q.options().dtype(torch::kInt));
    const auto starts = (torch::div(i, NB, "floor") * T + torch::remainder(i, NB) * S).to(torch::kInt);
    auto flat = [&](const torch::Tensor& x) { return x.view({B * T, H, dp}); };
    o = std::get<0>(at::_flash_attention_forward(flat(qp), flat(kp), flat(vp), starts, starts, longest, longest, 0.0,
                                                 /*is_causal=*/true, false, scale))
            .view({B, T, H, dp});
  }
  return dp == d ? o : o.narrow(3, 0, d);
}

// Queries go in blocks of S; a block reads the keys of its own block and, sliding, of the block before: [S, 2S]
// scores per block instead of one [T, T] mask, whose math-path attention took a quarter of an HQLT agent's SAC
// update (H200, T = 781). The head dim is padded to a multiple of 8 with zeros, which the fused kernels need.
torch::Tensor local_attention_blocked(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                      int64_t S, bool chunked) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), d = q.size(3);
  const int64_t NB = (T + S - 1) / S, dp = padded_dim(d), span = chunked ? S : 2 * S;
  auto pad = [&](const torch::Tensor& x, int64_t before) {  // [B, T, H, d] -> [B, before + NB*S, H, dp]
    return torch::constant_pad_nd(x, {0, dp - d, 0, 0, before, NB * S - T});
  };
  // blocks: [B, NB, H, rows, dp] -> [B*NB, H, rows, dp]
  auto blocks = [&](const torch::Tensor& x) { return x.permute({0, 1, 3, 2, 4}).reshape({B * NB, H, -1, dp}); };
  const auto qb = blocks(pad(q, 0).view({B, NB, S, H, dp}));
  auto keys = [&](const torch::Tensor& x) {
    if (chunked) return blocks(pad(x, 0).view({B, NB, S, H, dp}));
    // block b reads positions (b-1)S .. (b+1)S-1: windows of 2S, stride S, over the keys padded by S in front
    return blocks(pad(x, S).unfold(1, 2 * S, S).permute({0, 1, 4, 2, 3}));
  };
  const auto kb = keys(k), vb = keys(v);
  // allowed[b][r][m]: query bS + r reads key slot m (position (b-1)S + m, or bS + m when chunked)
  const auto opt = q.options().dtype(torch::kLong);
  const auto r = torch::arange(S, opt).view({1, S, 1}), m = torch::arange(span, opt).view({1, 1, span});
  torch::Tensor allowed;
  if (chunked) {
    allowed = (m <= r).expand({NB, S, span});
  } else {
    const auto b = torch::arange(NB, opt).view({NB, 1, 1});
    allowed = (m > r).logical_and(m <= r + S).logical_and((b > 0).logical_or(m >= S));  // block 0: no block before
  }
  allowed = allowed.unsqueeze(0).expand({B, NB, S, span}).reshape({B * NB, 1, S, span});
  const auto o = at::scaled_dot_product_attention(qb, kb, vb, allowed, 0.0, false, 1.0 / std::sqrt(double(d)));
  // [B*NB, H, S, dp] -> [B, T, H, d]
  return o.view({B, NB, H, S, dp}).permute({0, 1, 3, 2, 4}).reshape({B, NB * S, H, dp}).narrow(1, 0, T).narrow(3, 0, d);
}

}  // namespace

bool local_attention_flash_applies(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                   Kernels kernels, std::string* why) {
  auto no = [&](std::string w) {
    if (why) *why = std::move(w);
    return false;
  };
  if (kernels == Kernels::Torch) return no("model.kernels=torch");
  if (!q.is_cuda()) return no("not on CUDA");
  if (device_capability(q.device()) < 80) return no("flash attention needs compute capability 8.0 or newer");
  if (q.size(0) * q.size(1) >= (int64_t(1) << 31)) return no("2^31 tokens or more (flash's token offsets are int32)");
  const auto dt = projection_input_type(q);  // fp64 stays fp64 under autocast
  if (dt != torch::kBFloat16 && dt != torch::kHalf) return no(fmt::format("attention in {}", c10::toString(dt)));
  if (!at::autocast::is_autocast_enabled(at::kCUDA) && (k.scalar_type() != dt || v.scalar_type() != dt))
    return no("q, k and v of different dtypes");
  if (padded_dim(q.size(3)) > 256) return no("a head dim over 256");
  return true;
}

torch::Tensor local_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t S,
                              bool chunked, Kernels kernels) {
  MEMLAB_PROFILED_OP("memlab::local_attention");
  if (S < 1) throw std::invalid_argument("local_attention: the window must be at least 1");
  if (local_attention_flash_applies(q, k, v, kernels)) return local_attention_flash(q, k, v, S, chunked);
  return local_attention_blocked(q, k, v, S, chunked);
}

}  // namespace memlab
