#include "mixers/ops.h"

#include "ops/short_conv/short_conv.h"

#include <ATen/autocast_mode.h>

#include <cmath>

namespace memlab {

namespace {

// x [B, T, H, d] rotated by the angles of positions pos [T] (in the compute type).
torch::Tensor rope_at(const torch::Tensor& x, const torch::Tensor& pos, double theta) {
  const int64_t T = x.size(1), d = x.size(3), half = d / 2;
  const auto ct = compute_type(x);
  auto inv = torch::pow(theta, -torch::arange(0, half, pos.options()) * 2.0 / static_cast<double>(d));
  auto ang = torch::outer(pos, inv);  // [T, half]
  auto cos = torch::cos(ang).view({1, T, 1, half});
  auto sin = torch::sin(ang).view({1, T, 1, half});
  auto xf = x.to(ct);
  auto x1 = xf.narrow(-1, 0, half), x2 = xf.narrow(-1, half, half);
  auto out = torch::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
  if (d % 2) out = torch::cat({out, xf.narrow(-1, 2 * half, 1)}, -1);
  return out.to(x.scalar_type());
}

}  // namespace

torch::Tensor apply_rope(const torch::Tensor& x, int64_t offset, double theta) {
  auto fopts = torch::TensorOptions().dtype(compute_type(x)).device(x.device());
  return rope_at(x, torch::arange(offset, offset + x.size(1), fopts), theta);
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& offset, double theta) {
  const auto pos = offset + torch::arange(x.size(1), offset.options());
  return rope_at(x, pos.to(compute_type(x)), theta);
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

// Rows of the stacked weight rounded up to this with zero rows: cuBLAS runs matrices whose leading dimension is
// not a multiple of 8 bf16 elements in slow unaligned kernels (3x slower on an H200 for 388 rows).
constexpr int64_t kStackAlign = 8;

int64_t stack_padding(int64_t rows) { return (kStackAlign - rows % kStackAlign) % kStackAlign; }

LinearImpl::LinearImpl(int64_t in, int64_t out, int64_t members, bool with_bias) : members_(members) {
  TORCH_CHECK(members >= 1 && in % members == 0 && out % members == 0, "Linear: ", members,
              " members do not divide ", in, " -> ", out);
  // torch::nn::Linear's initialisation, drawing as many numbers (models re-initialise their layers anyway)
  weight = register_parameter("weight", torch::empty({out / members, in / members}));
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (members > 1) weight.set_data(weight.detach().unsqueeze(0).repeat({members, 1, 1}));
  if (with_bias)
    bias = register_parameter("bias", torch::empty({out}).uniform_(-1.0 / std::sqrt(static_cast<double>(in / members)),
                                                                     1.0 / std::sqrt(static_cast<double>(in / members))));
}

namespace {
// y[n, k] = x[n, k] @ w[k]^T for x [N, K, in], w [K, out, in]: y and dx as one batched matmul each, each member a
// batch entry, dw as one matmul per member (member_weight_grad). All read and write strided views of the
// member-interleaved rows in place, so no pass copies x, y or their gradients to and from member-major order.
struct MemberMatmul : torch::autograd::Function<MemberMatmul> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w) {
    ctx->save_for_backward({x, w});
    auto y = torch::empty({x.size(0), w.size(0), w.size(1)}, x.options());
    auto y_members = y.transpose(0, 1);
    at::bmm_out(y_members, x.transpose(0, 1), w.transpose(1, 2));
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1];
    auto dy = grads[0].contiguous().transpose(0, 1);  // [K, N, out]
    torch::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) {
      dx = torch::empty_like(x);
      auto dx_members = dx.transpose(0, 1);
      at::bmm_out(dx_members, dy, w);
    }
    if (ctx->needs_input_grad(1)) dw = member_weight_grad(dy, x.transpose(0, 1));
    return {dx, dw};
  }
};
}  // namespace

torch::Tensor member_weight_grad(const torch::Tensor& dy, const torch::Tensor& x) {
  TORCH_CHECK(dy.dim() == 3 && x.dim() == 3 && dy.size(0) == x.size(0) && dy.size(1) == x.size(1),
              "member_weight_grad: dy [K, N, out] and x [K, N, in] expected");
  auto dw = torch::empty({dy.size(0), dy.size(2), x.size(2)}, dy.options());
  for (int64_t k = 0; k < dy.size(0); ++k) {
    auto dw_k = dw.select(0, k);
    at::mm_out(dw_k, dy.select(0, k).t(), x.select(0, k));
  }
  return dw;
}

torch::Tensor member_matmul(const torch::Tensor& x, const torch::Tensor& w) {
  if (w.dim() == 2) return torch::matmul(x, w.t()).unsqueeze(-2);
  const int64_t K = w.size(0), in = w.size(2);
  auto sizes = x.sizes().vec();
  sizes.back() = K;
  sizes.push_back(w.size(1));
  // out= matmuls are outside autocast's reach: cast here as it would
  const auto dt = projection_input_type(x);
  auto y = MemberMatmul::apply(x.reshape({-1, K, in}).to(dt).contiguous(), w.to(dt));
  return y.view(sizes);
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  if (members_ == 1) return torch::linear(x, weight, bias);
  auto y = member_matmul(x, weight).flatten(-2);
  return bias.defined() ? y + bias : y;
}

torch::Tensor linear_stack(const torch::Tensor& x, const std::vector<Linear>& layers) {
  TORCH_CHECK(!layers.empty(), "linear_stack: no layers");
  const int64_t K = layers[0]->members();
  if (layers.size() == 1 && K == 1) return torch::linear(x, layers[0]->weight, layers[0]->bias);
  std::vector<torch::Tensor> w, b;
  int64_t rows = 0;
  for (const auto& l : layers) {
    TORCH_CHECK(l->members() == K, "linear_stack: layers of different member counts");
    w.push_back(l->weight);
    rows += l->out_per_member();
    if (l->bias.defined()) b.push_back(l->bias.view({K, -1}));
  }
  TORCH_CHECK(b.empty() || b.size() == layers.size(), "linear_stack: some layers have biases, others not");
  const int64_t in = w[0].size(-1);
  if (const int64_t pad = stack_padding(rows); pad > 0) {
    w.push_back(torch::zeros(K == 1 ? std::vector<int64_t>{pad, in} : std::vector<int64_t>{K, pad, in}, w[0].options()));
    if (!b.empty()) b.push_back(torch::zeros({K, pad}, b[0].options()));
  }
  auto bias = b.empty() ? torch::Tensor() : torch::cat(b, 1);
  if (K == 1) return torch::linear(x, torch::cat(w), bias.defined() ? bias.view(-1) : bias);
  auto y = member_matmul(x, torch::cat(w, 1));
  return bias.defined() ? y + bias : y;
}

std::vector<torch::Tensor> fused_linear(const torch::Tensor& x, const std::vector<Linear>& layers) {
  auto y = linear_stack(x, layers);
  const int64_t K = layers[0]->members();
  std::vector<int64_t> sizes;
  int64_t rows = 0;
  for (const auto& l : layers) {
    sizes.push_back(l->out_per_member());
    rows += sizes.back();
  }
  if (y.size(-1) > rows) sizes.push_back(y.size(-1) - rows);  // linear_stack's padding
  // split_with_sizes: autograd joins the parts' gradients with one cat (zeros for the padding)
  auto parts = y.split_with_sizes(sizes, -1);
  parts.resize(layers.size());
  if (K > 1)
    for (auto& p : parts) p = p.flatten(-2);  // [..., K, out] -> [..., K * out], member-major
  return parts;
}

torch::Tensor rows_per_head(const torch::Tensor& w, int64_t members, int64_t heads_per_member) {
  if (members == 1) return w;
  const int64_t d = w.numel() / members;
  return w.view({members, 1, d}).expand({members, heads_per_member, d}).reshape({members * heads_per_member, d});
}

torch::ScalarType projection_input_type(const torch::Tensor& x) {
  if (x.is_cuda() && at::autocast::is_autocast_enabled(at::kCUDA) && x.is_floating_point() &&
      x.scalar_type() != torch::kDouble)
    return at::autocast::get_autocast_dtype(at::kCUDA);
  return x.scalar_type();
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
