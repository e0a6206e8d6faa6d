#include "mixers/deltanet.h"

#include <fmt/format.h>

#include "core/config.h"
#include "ops/norm/norm.h"

#include <cmath>

#include "ops/delta_rule/delta_rule.h"

namespace memlab {

DeltaNetImpl::DeltaNetImpl(const MixerShape& shape, const DeltaNetOptions& opts)
    : shape_(shape), opts_(opts), head_dim_(shape.hidden / shape.heads) {
  const int64_t D = shape.hidden, H = shape.heads;
  auto lin = [&](const char* name, int64_t out) {
    return register_module(name, Linear(D, out, shape.members));
  };
  q_proj = lin("q_proj", D);
  k_proj = lin("k_proj", D);
  v_proj = lin("v_proj", D);
  b_proj = lin("b_proj", H);
  if (opts.out_gate) g_proj = lin("g_proj", D);
  o_proj = lin("o_proj", D);
  if (opts.short_conv) {
    q_conv = register_module("q_conv", ShortConv(D, opts.conv_size, shape.init_std, opts.kernels));
    k_conv = register_module("k_conv", ShortConv(D, opts.conv_size, shape.init_std, opts.kernels));
    v_conv = register_module("v_conv", ShortConv(D, opts.conv_size, shape.init_std, opts.kernels));
  }
  o_norm = register_parameter("o_norm", torch::ones({shape.members * head_dim_}));  // shared by a member's heads
}

double DeltaNetImpl::scale() const { return 1.0 / std::sqrt(static_cast<double>(head_dim_)); }

DeltaNetImpl::Inputs DeltaNetImpl::project(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), H = shape_.heads;
  Inputs in;
  const auto ct = compute_type(x);
  std::vector<Linear> layers{q_proj, k_proj, v_proj, b_proj};
  if (g_proj) layers.push_back(g_proj);
  const auto p = fused_linear(x, layers);
  if (g_proj) in.gate = p[4];
  in.q = silu_after(q_conv, p[0]).view({B, T, H, head_dim_});
  in.k = silu_after(k_conv, p[1]).view({B, T, H, head_dim_});
  in.v = silu_after(v_conv, p[2]).view({B, T, H, head_dim_});
  in.beta = torch::sigmoid(p[3].to(ct));
  if (opts_.neg_eigval) in.beta = in.beta * 2.0;
  return in;
}

torch::Tensor DeltaNetImpl::finish(const torch::Tensor& o, const torch::Tensor& x, const torch::Tensor& gate) {
  // o [B, T, H, d]
  auto y = rms_norm(o, rows_per_head(o_norm, shape_.members, shape_.heads / shape_.members), shape_.norm_eps,
                    opts_.kernels, gate.defined() ? gate.view(o.sizes()) : torch::Tensor(), x.scalar_type());
  return o_proj(y.reshape(x.sizes()));
}

torch::Tensor DeltaNetImpl::forward(const torch::Tensor& x) {
  auto in = project(x);
  const auto form = layer_rule_form(scale(), opts_.chunk, opts_.kernels);
  return finish(delta_rule(in.q, in.k, in.v, in.beta, form).o, x, in.gate);
}

torch::Tensor DeltaNetImpl::forward_reference(const torch::Tensor& x) {
  auto in = project(x);
  const auto ct = compute_type(x);
  auto r = delta_rule_recurrent(l2_normalize_reference(in.q.to(ct)), l2_normalize_reference(in.k.to(ct)), in.v,
                                in.beta, scale());
  return finish(r.o, x, in.gate);
}

namespace {
// MixerState::tensors: the fast-weight memory [B, H, d, d], then the short convs' tails where the layer has them
enum StateSlot : size_t { kMemory, kQTail, kKTail, kVTail };
}  // namespace

MixerState DeltaNetImpl::init_state(int64_t batch, const torch::TensorOptions& opts) const {
  MixerState s;
  const auto ct = compute_type(opts.dtype());
  s.tensors.push_back(torch::zeros({batch, shape_.heads, head_dim_, head_dim_}, opts.dtype(ct)));
  if (opts_.short_conv)
    for (auto* c : {&q_conv, &k_conv, &v_conv}) s.tensors.push_back((*c)->init_tail(batch, opts));
  return s;
}

torch::Tensor DeltaNetImpl::step(const torch::Tensor& x_t, MixerState& s) {
  const int64_t B = x_t.size(0), H = shape_.heads;
  auto q = q_proj(x_t), k = k_proj(x_t), v = v_proj(x_t);
  if (opts_.short_conv) {
    q = q_conv->step(q, s.tensors[kQTail]);
    k = k_conv->step(k, s.tensors[kKTail]);
    v = v_conv->step(v, s.tensors[kVTail]);
  }
  const auto ct = compute_type(x_t);
  auto qh = torch::silu(q).view({B, H, head_dim_}), kh = torch::silu(k).view({B, H, head_dim_});
  auto vh = torch::silu(v).view({B, H, head_dim_});
  auto beta = torch::sigmoid(b_proj(x_t).to(ct));
  if (opts_.neg_eigval) beta = beta * 2.0;
  const auto form = layer_rule_form(scale(), opts_.chunk, opts_.kernels);
  auto o = delta_rule_step(qh, kh, vh, beta, s.tensors[kMemory], form);  // [B, H, d]
  s.pos += 1;
  return finish(o.unsqueeze(1), x_t.unsqueeze(1), g_proj ? g_proj(x_t).unsqueeze(1) : torch::Tensor()).squeeze(1);
}

void register_deltanet_keys(Schema& s) {
  // memlab's default DeltaNet is the state-tracking variant of Grazzi et al.; false gives the classic [0,1] one.
  s.add_bool("model.deltanet.neg_eigval", true, "beta = 2*sigmoid: eigenvalues in [-1,1]; false = sigmoid, [0,1]");
  s.add_bool("model.deltanet.short_conv", false, "short causal depthwise conv on q, k, v");
  s.add_int("model.deltanet.conv_size", 4, "short conv kernel size", 2, 16);
  s.add_bool("model.deltanet.out_gate", false, "gate the per-head output norm with SiLU(W_g x)");
  s.add_int("model.deltanet.chunk", 64, "chunk size of the chunkwise training form", 1, 1024);
}

DeltaNetOptions deltanet_options(const Config& cfg) {
  DeltaNetOptions o;
  o.neg_eigval = cfg.get_bool("model.deltanet.neg_eigval");
  o.short_conv = cfg.get_bool("model.deltanet.short_conv");
  o.conv_size = cfg.get_int("model.deltanet.conv_size");
  o.out_gate = cfg.get_bool("model.deltanet.out_gate");
  o.chunk = cfg.get_int("model.deltanet.chunk");
  o.kernels = kernels_option(cfg);
  return o;
}

std::shared_ptr<MixerImpl> make_deltanet(const Config& cfg, const MixerShape& shape) {
  const DeltaNetOptions o = deltanet_options(cfg);
  return std::make_shared<DeltaNetImpl>(shape, o);
}

}  // namespace memlab
