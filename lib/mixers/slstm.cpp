#include "mixers/slstm.h"

#include <fmt/format.h>

#include "core/config.h"

#include "mixers/mlstm.h"

namespace memlab {

SLstmImpl::SLstmImpl(const MixerShape& shape, const SLstmOptions& opts)
    : shape_(shape), opts_(opts), head_dim_(shape.hidden / shape.heads) {
  const int64_t D = shape.hidden, H = shape.heads, dh = head_dim_;
  auto lin = [&](const char* name, int64_t out) {
    return register_module(name, Linear(D, out, shape.members));
  };
  if_proj = lin("if_proj", 2 * D);
  zo_proj = lin("zo_proj", 2 * D);
  o_proj = lin("o_proj", D);
  if (opts.conv_size > 0) conv = register_module("conv", ShortConv(D, opts.conv_size, shape.init_std, opts.kernels));
  recurrent_kernel = register_no_decay("recurrent_kernel", torch::zeros({H, dh, 4 * dh}));
  // xlstm "powerlaw_blockdependent" forget-gate bias
  const double ratio = shape.layers > 1 ? static_cast<double>(shape.layer) / static_cast<double>(shape.layers - 1) : 0.0;
  auto pos = dh > 1 ? torch::arange(dh, torch::kDouble) / static_cast<double>(dh - 1) : torch::zeros({1}, torch::kDouble);
  auto f_bias = -(-5.0 + 12.0 * pos.pow(0.3 + 1.3 * ratio));
  auto bias = torch::zeros({H, 4, dh}, torch::kDouble);
  bias.select(1, 1).copy_(f_bias.unsqueeze(0).expand({H, dh}));
  gate_bias = register_no_decay("gate_bias", bias.to(torch::kFloat));
  norm_weight = register_parameter("norm_weight", torch::zeros({D}));
}

torch::Tensor SLstmImpl::pre_activations(const torch::Tensor& x, const torch::Tensor& x_c) {
  auto sizes = x.sizes().vec();
  sizes.back() = shape_.heads;
  sizes.push_back(2);
  sizes.push_back(head_dim_);
  auto if_pre = if_proj(x_c).reshape(sizes), zo_pre = zo_proj(x).reshape(sizes);
  AutocastOff no_autocast;  // gate pre-activations feed exponentials
  const auto ct = compute_type(x.scalar_type());
  return torch::cat({if_pre, zo_pre}, -2).to(ct) + gate_bias.to(ct);
}

torch::Tensor SLstmImpl::finish(const torch::Tensor& h, const torch::Tensor& x) {
  auto y = head_layer_norm(h, norm_weight, opts_.kernels).reshape(x.sizes());
  return o_proj(y.to(x.scalar_type()));
}

torch::Tensor SLstmImpl::forward(const torch::Tensor& x) {
  auto x_c = conv ? conv(x, true) : x;
  auto h = slstm(pre_activations(x, x_c), recurrent_kernel, {}, opts_.kernels).h;
  return finish(h.to(x.scalar_type()), x);
}

torch::Tensor SLstmImpl::forward_reference(const torch::Tensor& x) {
  auto x_c = conv ? conv(x, true) : x;
  auto h = slstm_reference(pre_activations(x, x_c), recurrent_kernel).h;
  return finish(h.to(x.scalar_type()), x);
}

namespace {
// MixerState::tensors: h, c, n, m [B, H, d] each, then the conv's tail where the layer has one
enum StateSlot : size_t { kH, kC, kN, kM, kConvTail };
}  // namespace

MixerState SLstmImpl::init_state(int64_t batch, const torch::TensorOptions& opts) const {
  auto z = slstm_zero_state(batch, shape_.heads, head_dim_, opts);
  MixerState s;
  s.tensors = {z.h, z.c, z.n, z.m};
  if (conv) s.tensors.push_back(conv->init_tail(batch, opts));
  return s;
}

torch::Tensor SLstmImpl::step(const torch::Tensor& x_t, MixerState& s) {
  auto x_c = conv ? torch::silu(conv->step(x_t, s.tensors[kConvTail])) : x_t;
  SLstmState st{s.tensors[kH], s.tensors[kC], s.tensors[kN], s.tensors[kM]};
  auto h = slstm_step(pre_activations(x_t, x_c), recurrent_kernel, st, opts_.kernels);  // [B, H, dh]
  s.tensors[kH] = st.h;
  s.tensors[kC] = st.c;
  s.tensors[kN] = st.n;
  s.tensors[kM] = st.m;
  s.pos += 1;
  return finish(h.to(x_t.scalar_type()), x_t);
}

void register_slstm_keys(Schema& s) {
  s.add_int("model.slstm.conv_size", 4, "sLSTM causal conv kernel feeding the i, f gates; 0 = none", 0, 16);
}

SLstmOptions slstm_options(const Config& cfg) {
  SLstmOptions o;
  o.conv_size = cfg.get_int("model.slstm.conv_size");
  o.kernels = kernels_option(cfg);
  return o;
}

std::shared_ptr<MixerImpl> make_slstm(const Config& cfg, const MixerShape& shape) {
  const SLstmOptions o = slstm_options(cfg);
  return std::make_shared<SLstmImpl>(shape, o);
}

}  // namespace memlab
