#include "mixers/gated_deltanet.h"

#include <fmt/format.h>

#include "core/config.h"
#include "ops/norm/norm.h"

#include <cmath>

#include "ops/delta_rule/delta_rule.h"

namespace memlab {

GatedDeltaNetImpl::GatedDeltaNetImpl(const MixerShape& shape, const GatedDeltaNetOptions& opts)
    : shape_(shape), opts_(opts), dk_(shape.hidden / shape.heads), dv_(shape.hidden / shape.heads * opts.expand_v) {
  const int64_t D = shape.hidden, H = shape.heads, Dk = H * dk_, Dv = H * dv_;
  auto lin = [&](const char* name, int64_t in, int64_t out) {
    return register_module(name, Linear(in, out, shape.members));
  };
  q_proj = lin("q_proj", D, Dk);
  k_proj = lin("k_proj", D, Dk);
  v_proj = lin("v_proj", D, Dv);
  a_proj = lin("a_proj", D, H);
  b_proj = lin("b_proj", D, H);
  if (opts.out_gate) g_proj = lin("g_proj", D, Dv);
  o_proj = lin("o_proj", Dv, D);
  if (opts.short_conv) {
    q_conv = register_module("q_conv", ShortConv(Dk, opts.conv_size, shape.init_std, opts.kernels));
    k_conv = register_module("k_conv", ShortConv(Dk, opts.conv_size, shape.init_std, opts.kernels));
    v_conv = register_module("v_conv", ShortConv(Dv, opts.conv_size, shape.init_std, opts.kernels));
  }
  o_norm = register_parameter("o_norm", torch::ones({shape.members * dv_}));  // shared by a member's heads
  // fla's init: A ~ U(0, 16) (drawn in (0, 16] so log A is finite); dt log-uniform in [1e-3, 0.1], floor 1e-4.
  auto A = 16.0 * (1.0 - torch::rand({H}));
  A_log = register_no_decay("A_log", torch::log(A));
  const double dt_min = 1e-3, dt_max = 0.1;
  auto dt = torch::exp(torch::rand({H}) * (std::log(dt_max) - std::log(dt_min)) + std::log(dt_min)).clamp_min(1e-4);
  dt_bias = register_no_decay("dt_bias", dt + torch::log(-torch::expm1(-dt)));  // softplus^{-1}(dt)
}

double GatedDeltaNetImpl::scale() const { return 1.0 / std::sqrt(static_cast<double>(dk_)); }

namespace {
// MixerState::tensors: the fast-weight memory [B, H, dk, dv], then the short convs' tails where the layer has them
enum StateSlot : size_t { kMemory, kQTail, kKTail, kVTail };
}  // namespace

GatedDeltaNetImpl::Inputs GatedDeltaNetImpl::project(const torch::Tensor& x, std::vector<torch::Tensor>* tails) {
  const int64_t B = x.size(0), T = x.size(1), H = shape_.heads;
  std::vector<Linear> layers{q_proj, k_proj, v_proj, a_proj, b_proj};
  if (g_proj) layers.push_back(g_proj);
  const auto p = fused_linear(x, layers);
  auto q = p[0], k = p[1], v = p[2];
  if (opts_.short_conv && tails) {
    q = torch::silu(q_conv->step(q.squeeze(1), (*tails)[kQTail]).unsqueeze(1));
    k = torch::silu(k_conv->step(k.squeeze(1), (*tails)[kKTail]).unsqueeze(1));
    v = torch::silu(v_conv->step(v.squeeze(1), (*tails)[kVTail]).unsqueeze(1));
  } else {
    q = silu_after(q_conv, q);
    k = silu_after(k_conv, k);
    v = silu_after(v_conv, v);
  }
  Inputs in;
  const auto ct = compute_type(x);
  in.q = q.view({B, T, H, dk_});
  in.k = k.view({B, T, H, dk_});
  in.v = v.view({B, T, H, dv_});
  in.beta = torch::sigmoid(p[4].to(ct));
  if (opts_.neg_eigval) in.beta = in.beta * 2.0;
  in.g = -torch::exp(A_log.to(ct)) * torch::softplus(p[3].to(ct) + dt_bias.to(ct));  // [B, T, H], <= 0
  if (g_proj) in.gate = p[5];
  return in;
}

torch::Tensor GatedDeltaNetImpl::finish(const torch::Tensor& o, const torch::Tensor& x, const torch::Tensor& gate) {
  // o [B, T, H, dv]
  auto y = rms_norm(o, rows_per_head(o_norm, shape_.members, shape_.heads / shape_.members), shape_.norm_eps,
                    opts_.kernels, gate.defined() ? gate.view(o.sizes()) : torch::Tensor(), x.scalar_type());
  return o_proj(y.flatten(2));
}

torch::Tensor GatedDeltaNetImpl::forward(const torch::Tensor& x) {
  auto in = project(x, nullptr);
  const auto form = layer_rule_form(scale(), opts_.chunk, opts_.kernels);
  return finish(delta_rule(in.q, in.k, in.v, in.beta, form, in.g).o, x, in.gate);
}

torch::Tensor GatedDeltaNetImpl::forward_reference(const torch::Tensor& x) {
  auto in = project(x, nullptr);
  const auto ct = compute_type(x);
  auto r = delta_rule_recurrent(l2_normalize_reference(in.q.to(ct)), l2_normalize_reference(in.k.to(ct)), in.v,
                                in.beta, scale(), {}, in.g);
  return finish(r.o, x, in.gate);
}

MixerState GatedDeltaNetImpl::init_state(int64_t batch, const torch::TensorOptions& opts) const {
  MixerState s;
  const auto ct = compute_type(opts.dtype());
  s.tensors.push_back(torch::zeros({batch, shape_.heads, dk_, dv_}, opts.dtype(ct)));
  if (opts_.short_conv)
    for (auto* c : {&q_conv, &k_conv, &v_conv}) s.tensors.push_back((*c)->init_tail(batch, opts));
  return s;
}

torch::Tensor GatedDeltaNetImpl::step(const torch::Tensor& x_t, MixerState& s) {
  auto x = x_t.unsqueeze(1);
  auto in = project(x, &s.tensors);
  auto o = delta_rule_step(in.q.squeeze(1), in.k.squeeze(1), in.v.squeeze(1), in.beta.squeeze(1), s.tensors[kMemory],
                           layer_rule_form(scale(), opts_.chunk, opts_.kernels), in.g.squeeze(1));  // [B, H, dv]
  s.pos += 1;
  return finish(o.unsqueeze(1), x, in.gate).squeeze(1);
}

void register_gated_deltanet_keys(Schema& s) {
  // Same default as memlab's DeltaNet (fla's GatedDeltaNet defaults to allow_neg_eigval=False).
  s.add_bool("model.gated_deltanet.neg_eigval", true,
             "beta = 2*sigmoid: eigenvalues in [-1,1] (as memlab's DeltaNet default; fla's is false)");
  s.add_bool("model.gated_deltanet.short_conv", true, "short causal depthwise conv (+SiLU) on q, k, v");
  s.add_int("model.gated_deltanet.conv_size", 4, "short conv kernel size", 2, 16);
  s.add_bool("model.gated_deltanet.out_gate", true, "gate the per-head output norm with SiLU(W_g x)");
  s.add_int("model.gated_deltanet.expand_v", 1, "value head dim = expand_v * hidden/heads (fla: 2)", 1, 8);
  s.add_int("model.gated_deltanet.chunk", 64, "chunk size of the chunkwise training form", 1, 1024);
}

GatedDeltaNetOptions gated_deltanet_options(const Config& cfg) {
  GatedDeltaNetOptions o;
  o.neg_eigval = cfg.get_bool("model.gated_deltanet.neg_eigval");
  o.short_conv = cfg.get_bool("model.gated_deltanet.short_conv");
  o.conv_size = cfg.get_int("model.gated_deltanet.conv_size");
  o.out_gate = cfg.get_bool("model.gated_deltanet.out_gate");
  o.expand_v = cfg.get_int("model.gated_deltanet.expand_v");
  o.chunk = cfg.get_int("model.gated_deltanet.chunk");
  o.kernels = kernels_option(cfg);
  return o;
}

std::shared_ptr<MixerImpl> make_gated_deltanet(const Config& cfg, const MixerShape& shape) {
  const GatedDeltaNetOptions o = gated_deltanet_options(cfg);
  return std::make_shared<GatedDeltaNetImpl>(shape, o);
}

}  // namespace memlab
