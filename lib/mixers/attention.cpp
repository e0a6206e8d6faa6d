#include "mixers/attention.h"

#include <fmt/format.h>

#include "core/config.h"
#include "ops/local_attention/local_attention.h"

#include <cmath>

namespace memlab {

AttentionImpl::AttentionImpl(const MixerShape& shape, const AttentionOptions& opts)
    : shape_(shape), opts_(opts), head_dim_(shape.hidden / shape.heads) {
  auto lin = [&](const char* name) {
    return register_module(name, Linear(shape.hidden, shape.hidden, shape.members));
  };
  q_proj = lin("q_proj");
  k_proj = lin("k_proj");
  v_proj = lin("v_proj");
  o_proj = lin("o_proj");
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> AttentionImpl::qkv(const torch::Tensor& x, int64_t offset,
                                                                           const torch::Tensor& offset_t) {
  const int64_t B = x.size(0), T = x.size(1), H = shape_.heads;
  auto q = q_proj(x).view({B, T, H, head_dim_});
  auto k = k_proj(x).view({B, T, H, head_dim_});
  auto v = v_proj(x).view({B, T, H, head_dim_});
  if (opts_.rope && offset_t.defined()) {
    q = apply_rope(q, offset_t, opts_.rope_theta);
    k = apply_rope(k, offset_t, opts_.rope_theta);
  } else if (opts_.rope) {
    q = apply_rope(q, offset, opts_.rope_theta);
    k = apply_rope(k, offset, opts_.rope_theta);
  }
  return {q, k, v};
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1);
  auto [q, k, v] = qkv(x, 0);
  torch::Tensor o;  // [B, T, H, d]
  if (opts_.window <= 0 || opts_.window >= T) {
    o = at::scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), {}, 0.0,
                                         /*is_causal=*/true)
            .transpose(1, 2);
  } else {
    // The Transformer takes no model.kernels: Auto (memlab's window kernel or ATen's flash, wherever one applies).
    o = local_attention(q, k, v, opts_.window, /*chunked=*/false, Kernels::Auto);
  }
  return o_proj(o.reshape({B, T, shape_.hidden}));
}

torch::Tensor AttentionImpl::forward_reference(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1);
  auto [q, k, v] = qkv(x, 0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  std::vector<torch::Tensor> outs;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t lo = opts_.window > 0 ? std::max<int64_t>(0, t - opts_.window + 1) : 0;
    auto ks = k.narrow(1, lo, t - lo + 1), vs = v.narrow(1, lo, t - lo + 1);  // [B, n, H, d]
    auto scores = torch::einsum("bhd,bnhd->bhn", {q.select(1, t), ks}) * scale;
    auto p = torch::softmax(scores.to(compute_type(v)), -1)
                 .to(v.scalar_type());
    outs.push_back(torch::einsum("bhn,bnhd->bhd", {p, vs}));
  }
  return o_proj(torch::stack(outs, 1).reshape({B, T, shape_.hidden}));
}

namespace {
enum StateSlot : size_t { kKeys, kValues };  // MixerState::tensors: the KV cache, [B, H, n, d] each
}  // namespace

MixerState AttentionImpl::init_state(int64_t batch, const torch::TensorOptions& opts) const {
  MixerState s;
  s.tensors = {torch::zeros({batch, shape_.heads, 0, head_dim_}, opts),
               torch::zeros({batch, shape_.heads, 0, head_dim_}, opts)};
  return s;
}

MixerState AttentionImpl::init_fixed_state(int64_t batch, const torch::TensorOptions& opts, int64_t capacity) const {
  MixerState s;
  s.tensors = {torch::zeros({batch, shape_.heads, capacity, head_dim_}, opts),
               torch::zeros({batch, shape_.heads, capacity, head_dim_}, opts)};
  s.position = torch::zeros({1}, opts.dtype(torch::kLong));
  return s;
}

torch::Tensor AttentionImpl::fixed_step(const torch::Tensor& x_t, MixerState& s) {
  const int64_t B = x_t.size(0);
  auto [q, k, v] = qkv(x_t.unsqueeze(1), 0, s.position);
  auto& kc = s.tensors[kKeys];
  auto& vc = s.tensors[kValues];
  kc.index_copy_(2, s.position, k.transpose(1, 2).to(kc.scalar_type()));
  vc.index_copy_(2, s.position, v.transpose(1, 2).to(vc.scalar_type()));
  const auto j = torch::arange(kc.size(2), s.position.options());
  auto allowed = j <= s.position;
  if (opts_.window > 0) allowed = allowed.logical_and(j > s.position - opts_.window);
  s.position.add_(1);
  s.pos += 1;
  auto o = at::scaled_dot_product_attention(q.transpose(1, 2), kc.to(q.scalar_type()), vc.to(q.scalar_type()),
                                            allowed.view({1, 1, 1, -1}));
  return o_proj(o.transpose(1, 2).reshape({B, shape_.hidden}));
}

torch::Tensor AttentionImpl::step(const torch::Tensor& x_t, MixerState& s) {
  if (s.position.defined()) return fixed_step(x_t, s);
  const int64_t B = x_t.size(0);
  auto [q, k, v] = qkv(x_t.unsqueeze(1), s.pos);
  auto& kc = s.tensors[kKeys];
  auto& vc = s.tensors[kValues];
  kc = torch::cat({kc, k.transpose(1, 2).to(kc.scalar_type())}, 2);
  vc = torch::cat({vc, v.transpose(1, 2).to(vc.scalar_type())}, 2);
  if (opts_.window > 0 && kc.size(2) > opts_.window) {
    kc = kc.narrow(2, kc.size(2) - opts_.window, opts_.window);
    vc = vc.narrow(2, vc.size(2) - opts_.window, opts_.window);
  }
  s.pos += 1;
  auto o = at::scaled_dot_product_attention(q.transpose(1, 2), kc.to(q.scalar_type()), vc.to(q.scalar_type()));
  return o_proj(o.transpose(1, 2).reshape({B, shape_.hidden}));
}

void register_attention_keys(Schema& s) {
  s.add_int("model.attention.window", 0, "sliding-window size in keys (current one included); 0 = full context", 0);
  s.add_string("model.attention.pos", "rope", "positional encoding of attention", {"rope", "none"});
  s.add_float("model.attention.rope_theta", 10000.0, "RoPE base", 1.0);
}

AttentionOptions attention_options(const Config& cfg) {
  AttentionOptions o;
  o.window = cfg.get_int("model.attention.window");
  o.rope = cfg.get_string("model.attention.pos") == "rope";
  o.rope_theta = cfg.get_float("model.attention.rope_theta");
  return o;
}

std::shared_ptr<MixerImpl> make_attention(const Config& cfg, const MixerShape& shape) {
  const AttentionOptions o = attention_options(cfg);
  if (o.rope && (shape.hidden / shape.heads) % 2)
    cfg.fail("model.attention.pos", "RoPE needs an even head dimension (model.hidden / model.heads)");
  return std::make_shared<AttentionImpl>(shape, o);
}

}  // namespace memlab
