#include "mixers/mamba2.h"

#include <fmt/format.h>

#include "core/config.h"
#include "ops/norm/norm.h"

#include <cmath>

namespace memlab {

Mamba2Impl::Mamba2Impl(const MixerShape& shape, const Mamba2Options& opts) : shape_(shape), opts_(opts) {
  const int64_t hidden = shape.hidden, K = shape.members;
  inner_ = opts.expand * hidden;
  heads_ = opts.head_dim > 0 ? inner_ / opts.head_dim : shape.heads;
  head_dim_ = opts.head_dim > 0 ? opts.head_dim : inner_ / shape.heads;
  TORCH_CHECK(heads_ * head_dim_ == inner_, "mamba2: heads * head_dim must equal expand * hidden");
  TORCH_CHECK(heads_ % opts.ngroups == 0, "mamba2: ngroups must divide the number of heads");
  const int64_t GN = K * opts.ngroups * opts.d_state;  // each member's B and C groups
  conv_dim_ = inner_ + 2 * GN;
  in_proj = register_module("in_proj", Linear(hidden, 2 * inner_ + 2 * GN + heads_, K));
  conv = register_module("conv", ShortConv(conv_dim_, opts.d_conv, shape.init_std, opts.kernels));
  if (opts.conv_bias) conv_bias = register_no_decay("conv_bias", torch::zeros({conv_dim_}));
  // mamba_ssm's initialisation: A ~ U(1, 16); dt log-uniform in [1e-3, 0.1] (floor 1e-4) stored as its
  // inverse softplus; D = 1.
  A_log = register_no_decay("A_log", torch::empty({heads_}).uniform_(1.0, 16.0).log());
  const double lo = std::log(1e-3), hi = std::log(0.1);
  auto dt = torch::exp(torch::rand({heads_}) * (hi - lo) + lo).clamp_min(1e-4);
  dt_bias = register_no_decay("dt_bias", dt + torch::log(-torch::expm1(-dt)));
  D = register_no_decay("D", torch::ones({heads_}));
  norm = register_parameter("norm", torch::ones({inner_}));
  out_proj = register_module("out_proj", Linear(inner_, hidden, shape.members));
}

torch::Tensor Mamba2Impl::A() const { return -torch::exp(A_log.to(compute_type(A_log))); }

namespace {
// [.., K n] as [.., K, n] split along n into parts of the given sizes (per member), each back as [.., K part]:
// views where K = 1, copies of the members' columns otherwise.
std::vector<torch::Tensor> member_split(const torch::Tensor& t, int64_t K, const std::vector<int64_t>& sizes) {
  std::vector<torch::Tensor> out;
  for (const auto& part : t.unflatten(-1, {K, -1}).split_with_sizes(sizes, -1)) out.push_back(part.flatten(-2));
  return out;
}

// Splits the conv output [.., conv_dim] (K members' [x, B, C] side by side) into x [.., H, P], B and C [.., K G, N].
void split_xbc(const torch::Tensor& xbc, int64_t K, int64_t inner, int64_t H, int64_t P, int64_t G, int64_t N,
               torch::Tensor& x, torch::Tensor& Bm, torch::Tensor& Cm) {
  auto parts = member_split(xbc, K, {inner / K, G * N, G * N});
  auto lead = xbc.sizes().vec();
  lead.pop_back();
  auto shaped = [&](const torch::Tensor& t, int64_t a, int64_t b) {
    auto s = lead;
    s.push_back(a);
    s.push_back(b);
    return t.reshape(s);
  };
  x = shaped(parts[0], H, P);
  Bm = shaped(parts[1], K * G, N);
  Cm = shaped(parts[2], K * G, N);
}
}  // namespace

Mamba2Impl::Inputs Mamba2Impl::project(const torch::Tensor& u) {
  const int64_t K = shape_.members;
  auto parts = member_split(in_proj(u), K, {inner_ / K, conv_dim_ / K, heads_ / K});
  auto xbc = conv(parts[1], false);  // the bias comes before the SiLU
  if (conv_bias.defined()) xbc = xbc + conv_bias.to(xbc.scalar_type());
  Inputs in;
  in.z = parts[0];
  split_xbc(torch::silu(xbc), K, inner_, heads_, head_dim_, opts_.ngroups, opts_.d_state, in.x, in.Bm, in.Cm);
  const auto ct = compute_type(u);
  in.dt = torch::softplus(parts[2].to(ct) + dt_bias.to(ct));
  return in;
}

torch::Tensor Mamba2Impl::skip(const torch::Tensor& y, const Inputs& in) const {
  const auto ct = y.scalar_type();
  return y + D.to(ct).view({heads_, 1}) * in.x.to(ct);
}

torch::Tensor Mamba2Impl::finish(const torch::Tensor& yd, const Inputs& in, const torch::Tensor& u) {
  // yd [.., H, P] in the compute type; in.z [.., inner]
  const auto ct = compute_type(u);
  auto g = yd.reshape(in.z.sizes()) * torch::silu(in.z.to(ct));  // norm_before_gate = False: gate, then norm
  const int64_t K = shape_.members;
  auto y = K == 1 ? rms_norm(g, norm, shape_.norm_eps, opts_.kernels)
                  : rms_norm(g.unflatten(-1, {K, -1}), rows_per_head(norm, K, 1), shape_.norm_eps, opts_.kernels)
                        .flatten(-2);
  return out_proj(y.to(u.scalar_type()));
}

torch::Tensor Mamba2Impl::forward(const torch::Tensor& u) {
  auto in = project(u);
  auto r = ssd(in.x, in.dt, A(), in.Bm, in.Cm, opts_.chunk, opts_.neg_eigval, {}, opts_.kernels, D);
  return finish(r.y, in, u);
}

torch::Tensor Mamba2Impl::forward_reference(const torch::Tensor& u) {
  auto in = project(u);
  auto r = ssd_recurrent(in.x, in.dt, A(), in.Bm, in.Cm, opts_.neg_eigval);
  return finish(skip(r.y, in), in, u);
}

namespace {
enum StateSlot : size_t { kSsm, kConvTail };  // MixerState::tensors: [B, H, P, N], then the conv's tail
}  // namespace

MixerState Mamba2Impl::init_state(int64_t batch, const torch::TensorOptions& opts) const {
  MixerState s;
  const auto ct = compute_type(opts.dtype());
  s.tensors.push_back(torch::zeros({batch, heads_, head_dim_, opts_.d_state}, opts.dtype(ct)));
  s.tensors.push_back(conv->init_tail(batch, opts));
  return s;
}

torch::Tensor Mamba2Impl::step(const torch::Tensor& u_t, MixerState& s) {
  auto parts = member_split(in_proj(u_t), 1, {inner_, conv_dim_, heads_});  // a packed model has no step
  auto xbc = conv->step(parts[1], s.tensors[kConvTail]);
  if (conv_bias.defined()) xbc = xbc + conv_bias.to(xbc.scalar_type());
  Inputs in;
  in.z = parts[0];
  split_xbc(torch::silu(xbc), 1, inner_, heads_, head_dim_, opts_.ngroups, opts_.d_state, in.x, in.Bm, in.Cm);
  const auto ct = compute_type(u_t);
  in.dt = torch::softplus(parts[2].to(ct) + dt_bias.to(ct));
  auto y = ssd_step(in.x, in.dt, A(), in.Bm, in.Cm, opts_.neg_eigval, s.tensors[kSsm]);  // [B, H, P]
  s.pos += 1;
  return finish(skip(y, in), in, u_t);
}

void register_mamba2_keys(Schema& s) {
  // Mamba-2. d_state 16 (mamba_ssm: 64) as in Grazzi et al.'s Mamba runs: memlab's models are 16-128 wide.
  s.add_int("model.mamba2.d_state", 16, "SSM state size N per head", 1, 1024);
  s.add_int("model.mamba2.expand", 2, "inner width = expand * model.hidden", 1, 16);
  s.add_int("model.mamba2.head_dim", 0, "SSM head dim P; 0 = expand*hidden/model.heads, else heads = expand*hidden/P",
            0, 1 << 16);
  s.add_int("model.mamba2.d_conv", 4, "causal depthwise conv kernel over x, B, C", 2, 16);
  s.add_bool("model.mamba2.conv_bias", true, "bias in the causal conv (as mamba's conv1d)");
  s.add_int("model.mamba2.chunk", 64, "chunk size of the SSD training form", 1, 1024);
  s.add_int("model.mamba2.ngroups", 1, "groups of B and C shared by the heads", 1, 1024);
  s.add_bool("model.mamba2.neg_eigval", false, "transition 2*exp(dt*A)-1 in (-1,1] (Grazzi et al.); false = exp(dt*A)");
}

Mamba2Options mamba2_options(const Config& cfg) {
  Mamba2Options o;
  o.d_state = cfg.get_int("model.mamba2.d_state");
  o.expand = cfg.get_int("model.mamba2.expand");
  o.head_dim = cfg.get_int("model.mamba2.head_dim");
  o.d_conv = cfg.get_int("model.mamba2.d_conv");
  o.conv_bias = cfg.get_bool("model.mamba2.conv_bias");
  o.chunk = cfg.get_int("model.mamba2.chunk");
  o.ngroups = cfg.get_int("model.mamba2.ngroups");
  o.neg_eigval = cfg.get_bool("model.mamba2.neg_eigval");
  o.kernels = kernels_option(cfg);
  return o;
}

std::shared_ptr<MixerImpl> make_mamba2(const Config& cfg, const MixerShape& shape) {
  const Mamba2Options o = mamba2_options(cfg);
  const int64_t inner = o.expand * shape.hidden;
  if (o.head_dim > 0 && inner % o.head_dim)
    cfg.fail("model.mamba2.head_dim", fmt::format("must divide expand * model.hidden = {}", inner));
  const int64_t heads = o.head_dim > 0 ? inner / o.head_dim : shape.heads;
  if (o.head_dim == 0 && inner % heads)
    cfg.fail("model.heads", fmt::format("must divide model.mamba2.expand * model.hidden = {}", inner));
  if (heads % o.ngroups) cfg.fail("model.mamba2.ngroups", fmt::format("must divide the number of SSM heads ({})", heads));
  return std::make_shared<Mamba2Impl>(shape, o);
}

}  // namespace memlab
