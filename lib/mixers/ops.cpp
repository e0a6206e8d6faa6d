#include "mixers/ops.h"

#include "ops/short_conv/short_conv.h"

#include <ATen/autocast_mode.h>

namespace memlab {

torch::Tensor apply_rope(const torch::Tensor& x, int64_t offset, double theta) {
  const int64_t T = x.size(1), d = x.size(3), half = d / 2;
  const auto ct = compute_type(x);
  auto fopts = torch::TensorOptions().dtype(ct).device(x.device());
  auto inv = torch::pow(theta, -torch::arange(0, half, fopts) * 2.0 / static_cast<double>(d));
  auto pos = torch::arange(offset, offset + T, fopts);
  auto ang = torch::outer(pos, inv);                       // [T, half]
  auto cos = torch::cos(ang).view({1, T, 1, half});
  auto sin = torch::sin(ang).view({1, T, 1, half});
  auto xf = x.to(ct);
  auto x1 = xf.narrow(-1, 0, half), x2 = xf.narrow(-1, half, half);
  auto out = torch::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
  if (d % 2) out = torch::cat({out, xf.narrow(-1, 2 * half, 1)}, -1);
  return out.to(x.scalar_type());
}

ShortConvImpl::ShortConvImpl(int64_t channels, int64_t kernel, double init_std, Kernels kernels)
    : channels_(channels), kernel_(kernel), kernels_(kernels) {
  weight = register_parameter("weight", torch::randn({channels, 1, kernel}) * init_std);
}

torch::Tensor ShortConvImpl::forward(const torch::Tensor& x, bool silu) { return short_conv(x, weight, silu, kernels_); }

torch::Tensor silu_after(ShortConv& conv, const torch::Tensor& x) { return conv ? conv(x, true) : torch::silu(x); }

torch::Tensor ShortConvImpl::init_tail(int64_t batch, const torch::TensorOptions& opts) const {
  return torch::zeros({batch, channels_, kernel_ - 1}, opts);
}

torch::Tensor ShortConvImpl::step(const torch::Tensor& x_t, torch::Tensor& tail) {
  auto window = torch::cat({tail, x_t.unsqueeze(-1)}, -1);  // [B, C, K]
  auto y = (window * weight.squeeze(1).to(x_t.scalar_type())).sum(-1);
  tail = window.narrow(-1, 1, kernel_ - 1);
  return y;
}

Bf16Autocast::Bf16Autocast(bool on) : on_(on) {
  if (!on_) return;
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  at::autocast::set_autocast_enabled(at::kCUDA, true);
}

Bf16Autocast::~Bf16Autocast() {
  if (!on_) return;
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  at::autocast::clear_cache();
}

AutocastOff::AutocastOff()
    : cuda_(at::autocast::is_autocast_enabled(at::kCUDA)), cpu_(at::autocast::is_autocast_enabled(at::kCPU)) {
  at::autocast::set_autocast_enabled(at::kCUDA, false);
  at::autocast::set_autocast_enabled(at::kCPU, false);
}

AutocastOff::~AutocastOff() {
  at::autocast::set_autocast_enabled(at::kCUDA, cuda_);
  at::autocast::set_autocast_enabled(at::kCPU, cpu_);
}

}  // namespace memlab
