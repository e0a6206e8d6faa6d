#include "mixers/slstm.h"

#include <fmt/format.h>

#include "core/config.h"

#include <cmath>

#include "mixers/mlstm.h"

namespace memlab {

namespace {

SLstmState defaults(const SLstmState& init, int64_t B, int64_t H, int64_t dh, torch::ScalarType ct,
                    const torch::Device& dev) {
  if (!init.h.defined()) return slstm_zero_state(B, H, dh, torch::TensorOptions().dtype(ct).device(dev));
  return {init.h.to(ct), init.c.to(ct), init.n.to(ct), init.m.to(ct)};
}
}  // namespace

SLstmState slstm_zero_state(int64_t B, int64_t H, int64_t dh, const torch::TensorOptions& opts) {
  auto o = opts.dtype(compute_type(opts.dtype().toScalarType()));
  return {torch::zeros({B, H, dh}, o), torch::zeros({B, H, dh}, o), torch::zeros({B, H, dh}, o),
          torch::zeros({B, H, dh}, o)};
}

SLstmOut slstm_forward(const torch::Tensor& pre_in, const torch::Tensor& R_in, const SLstmState& init) {
  AutocastOff no_autocast;
  const auto ct = compute_type(pre_in.scalar_type());
  const int64_t B = pre_in.size(0), T = pre_in.size(1), H = pre_in.size(2), dh = pre_in.size(4);
  // time-major, heads as the bmm batch: [T, H, B, 4 dh]
  auto pre = pre_in.to(ct).permute({1, 2, 0, 3, 4}).reshape({T, H, B, 4 * dh});
  auto R = R_in.to(ct);
  auto s0 = defaults(init, B, H, dh, ct, pre.device());
  const bool fresh = !init.h.defined();
  auto hb = [](const torch::Tensor& t) { return t.transpose(0, 1); };  // [B, H, dh] <-> [H, B, dh]
  auto h = hb(s0.h), c = hb(s0.c), n = hb(s0.n), m = hb(s0.m);
  std::vector<torch::Tensor> hs;
  hs.reserve(T);
  for (int64_t t = 0; t < T; ++t) {
    auto raw = torch::baddbmm(pre[t], h, R);  // [H, B, 4 dh]
    auto g = raw.split(dh, -1);
    auto a = torch::nn::functional::logsigmoid(g[1]) + m;
    // From the zero state the first token sets m = ĩ; afterwards n >= 1, so only a given state needs the check.
    torch::Tensor m_new;
    if (fresh && t == 0)
      m_new = g[0];
    else if (fresh)
      m_new = torch::maximum(g[0], a);
    else
      m_new = torch::where(n == 0, g[0], torch::maximum(g[0], a));
    auto ip = torch::exp(g[0] - m_new), fp = torch::exp(a - m_new);
    c = fp * c + ip * torch::tanh(g[2]);
    n = fp * n + ip;
    m = m_new;
    h = torch::sigmoid(g[3]) * c / n;
    hs.push_back(h);
  }
  auto out = torch::stack(hs, 0).permute({2, 0, 1, 3});  // [B, T, H, dh]
  return {out.to(pre_in.scalar_type()), {hb(h), hb(c), hb(n), hb(m)}};
}

torch::Tensor slstm_step(const torch::Tensor& pre_t, const torch::Tensor& R_in, SLstmState& s) {
  AutocastOff no_autocast;
  const auto ct = compute_type(pre_t.scalar_type());
  const int64_t B = pre_t.size(0), H = pre_t.size(1), dh = pre_t.size(3);
  auto raw = pre_t.to(ct) + torch::einsum("bhd,hde->bhe", {s.h.to(ct), R_in.to(ct)}).view({B, H, 4, dh});
  auto gi = raw.select(2, 0), gf = raw.select(2, 1), gz = raw.select(2, 2), go = raw.select(2, 3);
  auto m_prev = s.m.to(ct), n_prev = s.n.to(ct);
  auto logf = torch::nn::functional::logsigmoid(gf);
  auto m = torch::where(n_prev == 0, gi, torch::maximum(gi, logf + m_prev));
  auto fp = torch::exp(logf + m_prev - m), ip = torch::exp(gi - m);
  s.c = fp * s.c.to(ct) + ip * torch::tanh(gz);
  s.n = fp * n_prev + ip;
  s.m = m;
  s.h = torch::sigmoid(go) * s.c / s.n;
  return s.h.to(pre_t.scalar_type());
}

SLstmOut slstm_reference(const torch::Tensor& pre_in, const torch::Tensor& R_in, const SLstmState& init) {
  const auto ct = compute_type(pre_in.scalar_type());
  const int64_t B = pre_in.size(0), T = pre_in.size(1), H = pre_in.size(2), dh = pre_in.size(4);
  auto pre = pre_in.to(ct);
  auto R = R_in.to(ct);
  auto s = defaults(init, B, H, dh, ct, pre.device());
  std::vector<torch::Tensor> hs;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<torch::Tensor> h_heads, c_heads, n_heads, m_heads;
    for (int64_t j = 0; j < H; ++j) {
      auto h_prev = s.h.select(1, j), c_prev = s.c.select(1, j), n_prev = s.n.select(1, j), m_prev = s.m.select(1, j);
      auto gates = pre.select(1, t).select(1, j) + torch::matmul(h_prev, R[j]).view({B, 4, dh});  // [B, 4, dh]
      auto i_raw = gates.select(1, 0), f_raw = gates.select(1, 1), z = torch::tanh(gates.select(1, 2));
      auto o = torch::sigmoid(gates.select(1, 3));
      auto log_f = torch::nn::functional::logsigmoid(f_raw);
      auto fresh = n_prev == 0;  // nothing stored yet: m_t = ĩ_t
      auto m = torch::where(fresh, i_raw, torch::maximum(log_f + m_prev, i_raw));
      auto i_gate = torch::exp(i_raw - m);
      auto f_gate = torch::exp(log_f + m_prev - m);
      auto c = f_gate * c_prev + i_gate * z;
      auto n = f_gate * n_prev + i_gate;
      h_heads.push_back(o * (c / n));
      c_heads.push_back(c);
      n_heads.push_back(n);
      m_heads.push_back(m);
    }
    s = {torch::stack(h_heads, 1), torch::stack(c_heads, 1), torch::stack(n_heads, 1), torch::stack(m_heads, 1)};
    hs.push_back(s.h);
  }
  return {torch::stack(hs, 1).to(pre_in.scalar_type()), s};
}

SLstmImpl::SLstmImpl(const MixerShape& shape, const SLstmOptions& opts)
    : shape_(shape), opts_(opts), head_dim_(shape.hidden / shape.heads) {
  const int64_t D = shape.hidden, H = shape.heads, dh = head_dim_;
  auto lin = [&](const char* name, int64_t out) {
    return register_module(name, torch::nn::Linear(torch::nn::LinearOptions(D, out).bias(false)));
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
  auto y = head_layer_norm(h, norm_weight).reshape(x.sizes());
  return o_proj(y.to(x.scalar_type()));
}

torch::Tensor SLstmImpl::forward(const torch::Tensor& x) {
  auto x_c = conv ? conv(x, true) : x;
  auto h = slstm_forward(pre_activations(x, x_c), recurrent_kernel).h;
  return finish(h.to(x.scalar_type()), x);
}

torch::Tensor SLstmImpl::forward_reference(const torch::Tensor& x) {
  auto x_c = conv ? conv(x, true) : x;
  auto h = slstm_reference(pre_activations(x, x_c), recurrent_kernel).h;
  return finish(h.to(x.scalar_type()), x);
}

MixerState SLstmImpl::init_state(int64_t batch, const torch::TensorOptions& opts) const {
  auto z = slstm_zero_state(batch, shape_.heads, head_dim_, opts);
  MixerState s;
  s.tensors = {z.h, z.c, z.n, z.m};
  if (conv) s.tensors.push_back(conv->init_tail(batch, opts));
  return s;
}

torch::Tensor SLstmImpl::step(const torch::Tensor& x_t, MixerState& s) {
  auto x_c = conv ? torch::silu(conv->step(x_t, s.tensors[4])) : x_t;
  SLstmState st{s.tensors[0], s.tensors[1], s.tensors[2], s.tensors[3]};
  auto h = slstm_step(pre_activations(x_t, x_c), recurrent_kernel, st);  // [B, H, dh]
  s.tensors[0] = st.h;
  s.tensors[1] = st.c;
  s.tensors[2] = st.n;
  s.tensors[3] = st.m;
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
