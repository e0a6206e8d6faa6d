#include "ops/local_attention/local_attention.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>

#include <cmath>

#include "core/device.h"
#include "mixers/ops.h"
#include "ops/kernel_call.h"
#include "ops/local_attention/window.h"

#ifdef MEMLAB_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>
#endif

namespace memlab {

namespace {

// [..., d] -> [..., dp] in dtype dt, zero columns after d (the scores are unchanged), contiguous.
torch::Tensor padded(const torch::Tensor& x, int64_t dp, torch::ScalarType dt) {
  auto y = x.to(dt);
  if (dp != x.size(-1)) y = torch::constant_pad_nd(y, {0, dp - x.size(-1)});
  return y.contiguous();
}

int64_t padded_dim(int64_t d) { return (d + 7) / 8 * 8; }

}  // namespace

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

namespace {

// A window longer than the sequence reads the whole sequence, as a window of T does: the kernel's S.
int kernel_window(int64_t S, int64_t T) { return static_cast<int>(std::max<int64_t>(1, std::min(S, T))); }

// Up to this window the window kernel beats flash; past it flash's tiles of 128 rows waste less (H200, bf16,
// forward+backward ms, window kernel on tensor cores / flash: chunks of 16 0.42 / 1.22 and a window of 8 0.40 / 0.53
// at B1024 T40 H4 d32; a window of 64 1.53 / 0.67 at B1024 T128, 0.91 / 0.63 at B64 T781 H2 d50: the kernel's
// backward loses there). Where flash does not apply (fp32), the kernel takes every window it can.
constexpr int64_t kWindowBeatsFlash = 32;

#ifdef MEMLAB_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Elements between x's consecutive token rows [B, T, H, d] where each head's channels are dense and the rows evenly
// spaced (a contiguous tensor, or column slices of one), else -1.
int64_t token_row(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), d = x.size(3);
  if ((d > 1 && x.stride(3) != 1) || (H > 1 && x.stride(2) != d)) return -1;
  const int64_t rs = T > 1 ? x.stride(1) : B > 1 ? x.stride(0) / T : H * d;
  if (rs < H * d) return -1;
  if (B > 1 && x.stride(0) != T * rs) return -1;
  return rs;
}

// x in dtype dt, as the kernel reads it: as it lies where its token rows are evenly spaced, else a dense copy.
torch::Tensor kernel_input(const torch::Tensor& x, torch::ScalarType dt) {
  auto y = x.to(dt);
  return token_row(y) >= 0 ? y : y.contiguous();
}

kernels::WindowAttentionProblem window_problem(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                               int64_t S, bool chunked, bool tensor_cores) {
  kernels::WindowAttentionProblem p;
  p.B = static_cast<int>(q.size(0));
  p.T = static_cast<int>(q.size(1));
  p.H = static_cast<int>(q.size(2));
  p.d = static_cast<int>(q.size(3));
  p.S = kernel_window(S, q.size(1));
  p.chunked = chunked;
  p.bf16 = q.scalar_type() == torch::kBFloat16;
  p.tensor_cores = p.bf16 && tensor_cores;
  p.q_row = token_row(q);
  p.k_row = token_row(k);
  p.v_row = token_row(v);
  p.scale = static_cast<float>(1.0 / std::sqrt(double(p.d)));
  return p;
}

// o and lse of the window kernel on q, k, v already in the kernel's dtype and layout.
std::pair<torch::Tensor, torch::Tensor> window_forward(const torch::Tensor& q, const torch::Tensor& k,
                                                       const torch::Tensor& v, int64_t S, bool chunked,
                                                       bool tensor_cores) {
  const auto p = window_problem(q, k, v, S, chunked, tensor_cores);
  auto o = torch::empty(q.sizes(), q.options());
  auto lse = torch::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(torch::kFloat));
  kernels::WindowAttentionForwardArgs a;
  a.q = q.data_ptr();
  a.k = k.data_ptr();
  a.v = v.data_ptr();
  a.o = o.data_ptr();
  a.lse = lse.data_ptr<float>();
  check_launch(kernels::window_attention_forward(p, a, stream_of(q)));
  return {o, lse};
}

class WindowAttentionFunction : public torch::autograd::Function<WindowAttentionFunction> {
 public:
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor q, torch::Tensor k, torch::Tensor v, int64_t S,
                               bool chunked, bool tensor_cores) {
    c10::cuda::CUDAGuard guard(q.device());
    auto [o, lse] = window_forward(q, k, v, S, chunked, tensor_cores);
    ctx->save_for_backward({q, k, v, o, lse});
    ctx->saved_data["S"] = S;
    ctx->saved_data["chunked"] = chunked;
    ctx->saved_data["tensor_cores"] = tensor_cores;
    return o;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto s = ctx->get_saved_variables();
    if (!grads[0].defined())
      return {torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
    const auto &q = s[0], &k = s[1], &v = s[2], &o = s[3], &lse = s[4];
    c10::cuda::CUDAGuard guard(q.device());
    const auto p = window_problem(q, k, v, ctx->saved_data["S"].toInt(), ctx->saved_data["chunked"].toBool(),
                                  ctx->saved_data["tensor_cores"].toBool());
    auto dout = grads[0].to(q.scalar_type()).contiguous();
    auto dq = torch::empty(q.sizes(), q.options()), dk = torch::empty(q.sizes(), q.options()),
         dv = torch::empty(q.sizes(), q.options());
    kernels::WindowAttentionBackwardArgs a;
    a.q = q.data_ptr();
    a.k = k.data_ptr();
    a.v = v.data_ptr();
    a.o = o.data_ptr();
    a.dout = dout.data_ptr();
    a.lse = lse.data_ptr<float>();
    a.dq = dq.data_ptr();
    a.dk = dk.data_ptr();
    a.dv = dv.data_ptr();
    check_launch(kernels::window_attention_backward(p, a, stream_of(q)));
    return {dq, dk, dv, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

#endif

}  // namespace

torch::Tensor local_attention_window(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t S,
                                     bool chunked, bool tensor_cores) {
#ifndef MEMLAB_CUDA_KERNELS
  (void)q, (void)k, (void)v, (void)S, (void)chunked, (void)tensor_cores;
  throw std::logic_error("local_attention_window: memlab was built without nvcc");
#else
  const auto dt = projection_input_type(q);  // autocast's, as the flash form takes it
  AutocastOff no_autocast;
  const auto qk = kernel_input(q, dt), kk = kernel_input(k, dt), vk = kernel_input(v, dt);
  if (!recorded({q, k, v})) {
    c10::cuda::CUDAGuard guard(q.device());
    return window_forward(qk, kk, vk, S, chunked, tensor_cores).first;
  }
  return WindowAttentionFunction::apply(qk, kk, vk, S, chunked, tensor_cores);
#endif
}

bool local_attention_kernel_applies(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t S,
                                    Kernels kernels, std::string* why) {
  if (auto r = kernels_unavailable(q, kernels); !r.empty()) return refuse(why, r);
  // The kernel takes q's shape for all three: anything else is for the other forms to reject.
  if (q.dim() != 4 || k.sizes() != q.sizes() || v.sizes() != q.sizes() || k.device() != q.device() ||
      v.device() != q.device())
    return refuse(why, "q, k and v not of one [B, T, H, d] shape on one device");
  if (q.size(2) < 1 || q.size(3) < 1) return refuse(why, "no heads or an empty head dim");
  const auto dt = projection_input_type(q);
  if (dt != torch::kBFloat16 && dt != torch::kFloat) return refuse(why, fmt::format("attention in {}", c10::toString(dt)));
  if (!at::autocast::is_autocast_enabled(at::kCUDA) && (k.scalar_type() != dt || v.scalar_type() != dt))
    return refuse(why, "q, k and v of different dtypes");
  if (q.size(3) > kernels::kWindowMaxDim) return refuse(why, fmt::format("a head dim over {}", kernels::kWindowMaxDim));
  if (kernel_window(S, q.size(1)) > kernels::kWindowMaxS)
    return refuse(why, fmt::format("a window of {} (the kernel takes up to {})", S, kernels::kWindowMaxS));
  if (q.size(0) * q.size(1) >= (int64_t(1) << 31)) return refuse(why, "2^31 tokens or more");
#ifdef MEMLAB_CUDA_KERNELS
  auto p = window_problem(q, k, v, S, /*chunked=*/false, /*tensor_cores=*/true);  // chunked needs the same smem
  p.bf16 = p.tensor_cores = dt == torch::kBFloat16;  // the dtype the kernel will see, autocast included
  if (kernels::window_attention_backward_smem(p) > max_shared_bytes_per_block(q))
    return refuse(why, fmt::format("head dim {} with a window of {} needs more shared memory than a block has",
                                   p.d, p.S));
#endif
  return true;
}

bool local_attention_flash_applies(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                   Kernels kernels, std::string* why) {
  if (kernels == Kernels::Torch) return refuse(why, "model.kernels=torch");
  if (!q.is_cuda()) return refuse(why, "not on CUDA");
  if (device_capability(q.device()) < 80) return refuse(why, "flash attention needs compute capability 8.0 or newer");
  if (q.size(0) * q.size(1) >= (int64_t(1) << 31))
    return refuse(why, "2^31 tokens or more (flash's token offsets are int32)");
  const auto dt = projection_input_type(q);  // fp64 stays fp64 under autocast
  if (dt != torch::kBFloat16 && dt != torch::kHalf)
    return refuse(why, fmt::format("attention in {}", c10::toString(dt)));
  if (!at::autocast::is_autocast_enabled(at::kCUDA) && (k.scalar_type() != dt || v.scalar_type() != dt))
    return refuse(why, "q, k and v of different dtypes");
  if (padded_dim(q.size(3)) > 256) return refuse(why, "a head dim over 256");
  return true;
}

torch::Tensor local_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t S,
                              bool chunked, Kernels kernels) {
  MEMLAB_PROFILED_OP("memlab::local_attention");
  if (S < 1) throw std::invalid_argument("local_attention: the window must be at least 1");
  const bool window = local_attention_kernel_applies(q, k, v, S, kernels);
  const bool flash = local_attention_flash_applies(q, k, v, kernels);
  if (window && (kernel_window(S, q.size(1)) <= kWindowBeatsFlash || !flash))
    return local_attention_window(q, k, v, S, chunked);
  if (flash) return local_attention_flash(q, k, v, S, chunked);
  return local_attention_blocked(q, k, v, S, chunked);
}

}  // namespace memlab
