#include "mixers/hqlt.h"

#include <fmt/format.h>

#include "core/config.h"
#include "ops/norm/norm.h"

#include <cmath>
#include <limits>

#include "ops/delta_rule/delta_rule.h"
#include "ops/local_attention/local_attention.h"
#include "ops/vector_mix/vector_mix.h"
#include "mixers/linear_attention.h"

namespace memlab {

namespace {

// x [B, T, ...] delayed by s steps along time, zeros first (zero keys make delta-rule updates no-ops).
torch::Tensor delay(const torch::Tensor& x, int64_t s) {
  const int64_t T = x.size(1);
  if (s >= T) return torch::zeros_like(x);
  return torch::cat({torch::zeros_like(x.narrow(1, 0, s)), x.narrow(1, 0, T - s)}, 1);
}

// Softmax attention of q [B, H, d] over n window slots k, v [B, n, H, d]; slots before `first` (int64 [1] or a
// number) are empty.
torch::Tensor window_read(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                          const torch::Tensor& first, double scale) {
  const auto ct = compute_type(v);
  auto scores = torch::einsum("bhd,bnhd->bhn", {q.to(ct), k.to(ct)}) * scale;
  scores = scores.masked_fill(torch::arange(k.size(1), first.options()) < first,
                              -std::numeric_limits<double>::infinity());
  auto p = torch::softmax(scores, -1);
  return torch::einsum("bhn,bnhd->bhd", {p, v.to(ct)}).to(v.scalar_type());
}

}  // namespace

HqltImpl::HqltImpl(const MixerShape& shape, const HqltOptions& opts)
    : shape_(shape), opts_(opts), head_dim_(shape.hidden / shape.heads) {
  const int64_t D = shape.hidden, H = shape.heads;
  scale_ = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  auto lin = [&](const char* name, int64_t out) {
    return register_module(name, Linear(D, out, shape.members));
  };
  q_proj = lin("q_proj", D);
  k_proj = lin("k_proj", D);
  v_proj = lin("v_proj", D);
  if (opts.fw == HqltFastWeight::DeltaNet) b_proj = lin("b_proj", H);
  if (opts.mixing == HqltMixing::Vector) mix_proj = lin("mix_proj", D);
  if (opts.mixing == HqltMixing::Scalar) mix_proj = lin("mix_proj", 2 * H);
  if (opts.out_gate) g_proj = lin("g_proj", D);
  o_proj = lin("o_proj", D);
  if (opts.short_conv) {
    q_conv = register_module("q_conv", ShortConv(D, opts.conv_size, shape.init_std, opts.kernels));
    k_conv = register_module("k_conv", ShortConv(D, opts.conv_size, shape.init_std, opts.kernels));
    v_conv = register_module("v_conv", ShortConv(D, opts.conv_size, shape.init_std, opts.kernels));
  }
  o_norm = register_parameter("o_norm", torch::ones({shape.members * head_dim_}));  // shared by a member's heads
}

// Raw q, k (after the short conv, no activation), v = SiLU(conv(W_v x)), β. With conv_tails, x is one token
// [B, 1, D] and the convolutions step through their tails.
HqltImpl::Inputs HqltImpl::project(const torch::Tensor& x, std::vector<torch::Tensor>* tails) {
  const int64_t B = x.size(0), T = x.size(1), H = shape_.heads;
  std::vector<Linear> layers{q_proj, k_proj, v_proj};
  auto add = [&](const Linear& l) -> int {
    if (!l) return -1;
    layers.push_back(l);
    return static_cast<int>(layers.size()) - 1;
  };
  const int at_b = add(b_proj), at_mix = add(mix_proj), at_g = add(g_proj);
  const auto p = fused_linear(x, layers);
  auto q = p[0], k = p[1], v = p[2];
  if (opts_.short_conv && tails) {
    q = q_conv->step(q.squeeze(1), (*tails)[0]).unsqueeze(1);
    k = k_conv->step(k.squeeze(1), (*tails)[1]).unsqueeze(1);
    v = torch::silu(v_conv->step(v.squeeze(1), (*tails)[2]).unsqueeze(1));
  } else {
    if (opts_.short_conv) {
      q = q_conv(q, false);
      k = k_conv(k, false);
    }
    v = silu_after(v_conv, v);
  }
  Inputs in;
  in.q = q.view({B, T, H, head_dim_});
  in.k = k.view({B, T, H, head_dim_});
  in.v = v.view({B, T, H, head_dim_});
  if (at_mix >= 0) in.mix = p[at_mix];
  if (at_g >= 0) in.gate = p[at_g];
  if (b_proj) {
    in.beta = torch::sigmoid(p[at_b].to(compute_type(x)));
    if (opts_.neg_eigval) in.beta = in.beta * 2.0;
  }
  return in;
}

// φ(q) = φ(k): L2(SiLU(.)) for DeltaNet; ELU + 1 for linear attention. Computed in fp32 (fp64 in tests).
torch::Tensor HqltImpl::fw_query(const torch::Tensor& q) const {
  if (opts_.fw == HqltFastWeight::DeltaNet) return l2_normalize(torch::silu(q), compute_type(q), opts_.kernels);
  return torch::elu(q.to(compute_type(q))) + 1.0;
}

torch::Tensor HqltImpl::mix(const torch::Tensor& o_fw, const torch::Tensor& o_kv, const torch::Tensor& mix_pre) {
  // o_fw, o_kv [B, T, H, d]; mix_pre = W_mix x [B, T, 2H or D]
  const auto ct = compute_type(o_fw);
  switch (opts_.mixing) {
    case HqltMixing::Sum:
      return o_fw.to(ct) + o_kv.to(ct);
    case HqltMixing::Scalar: {
      auto fw = o_fw.to(ct), kv = o_kv.to(ct);
      // per member: the two gates' H heads each
      const int64_t K = shape_.members, B = mix_pre.size(0), T = mix_pre.size(1);
      auto a = torch::sigmoid(mix_pre.to(ct)).view({B, T, K, 2, shape_.heads / K, 1});
      return a.select(3, 0).reshape({B, T, shape_.heads, 1}) * fw + a.select(3, 1).reshape({B, T, shape_.heads, 1}) * kv;
    }
    case HqltMixing::Vector:
      return vector_mix(o_fw, o_kv, mix_pre, opts_.kernels);
  }
  return o_fw.to(ct) + o_kv.to(ct);
}

torch::Tensor HqltImpl::finish(const torch::Tensor& o, const torch::Tensor& x, const torch::Tensor& gate) {
  // The norm rounds once to x's dtype (bf16 under autocast, as o_proj reads it): no cast after it.
  auto y = rms_norm(o, rows_per_head(o_norm, shape_.members, shape_.heads / shape_.members), shape_.norm_eps,
                    opts_.kernels, gate.defined() ? gate.view(o.sizes()) : torch::Tensor(), x.scalar_type());
  return o_proj(y.reshape(x.sizes()));
}

torch::Tensor HqltImpl::forward(const torch::Tensor& x) {
  const int64_t S = opts_.window;
  auto in = project(x, nullptr);
  // FW-memory
  torch::Tensor o_fw;
  {
    AutocastOff no_autocast;
    // The delta rule L2-normalises SiLU(q), SiLU(k) itself (in its kernel where it can).
    const bool delta = opts_.fw == HqltFastWeight::DeltaNet;
    auto fq = delta ? torch::silu(in.q) : fw_query(in.q), fk = delta ? torch::silu(in.k) : fw_query(in.k);
    if (!delta) {
      // Synchronous only (checked by the registry): Katharopoulos' normalised linear attention.
      o_fw = linear_attention(fq, fk, in.v, opts_.chunk, scale_, /*normalize=*/true, opts_.kernels).o;
    } else {
      auto form = layer_rule_form(scale_, opts_.chunk, opts_.kernels);
      if (opts_.variant == HqltVariant::Synchronous) {
        o_fw = delta_rule(fq, fk, in.v, in.beta, form).o;
      } else if (opts_.variant == HqltVariant::DelayedStream) {
        auto beta = opts_.evicted_beta ? delay(in.beta, S) : in.beta;
        o_fw = delta_rule(fq, delay(fk, S), delay(in.v, S), beta, form).o;
      } else {
        form.chunk = fw_block();
        form.with_intra = false;
        o_fw = delta_rule(fq, fk, in.v, in.beta, form).o;
      }
    }
  }
  // KV-memory: sliding window (current key included) or the current chunk.
  auto qa = in.q, ka = in.k;
  if (opts_.rope) {
    qa = apply_rope(qa, 0, opts_.rope_theta);
    ka = apply_rope(ka, 0, opts_.rope_theta);
  }
  auto o_kv = local_attention(qa, ka, in.v, S, opts_.variant == HqltVariant::DelayedChunk, opts_.kernels);
  return finish(mix(o_fw, o_kv, in.mix), x, in.gate);
}

// Plain per-token recurrence, written from the paper's equations (tests only).
torch::Tensor HqltImpl::forward_reference(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), H = shape_.heads, d = head_dim_, S = opts_.window;
  const auto ct = compute_type(x);
  auto in = project(x, nullptr);
  auto qa = in.q, ka = in.k;
  if (opts_.rope) {
    qa = apply_rope(qa, 0, opts_.rope_theta);
    ka = apply_rope(ka, 0, opts_.rope_theta);
  }
  auto fq = fw_query(in.q), fk = fw_query(in.k), v = in.v.to(ct);
  auto W = torch::zeros({B, H, d, d}, x.options().dtype(ct));  // W[k, v]: read o = W^T q
  auto z = torch::zeros({B, H, d}, x.options().dtype(ct));     // linear-attention normaliser
  auto W_read = W;
  std::vector<torch::Tensor> fws, kvs;
  for (int64_t t = 0; t < T; ++t) {
    // FW update with the pair this variant writes at step t.
    int64_t src = opts_.variant == HqltVariant::DelayedStream ? t - S : t;
    if (opts_.variant == HqltVariant::DelayedChunk && t % fw_block() == 0) W_read = W;
    if (src >= 0) {
      auto kt = fk.select(1, src), vt = v.select(1, src);
      if (opts_.fw == HqltFastWeight::LinearAttention) {
        W = W + kt.unsqueeze(-1) * vt.unsqueeze(-2);
        z = z + kt;
      } else {
        auto b = in.beta.select(1, opts_.evicted_beta ? src : t).unsqueeze(-1);
        auto retrieved = torch::einsum("bhkv,bhk->bhv", {W, kt});
        W = W + kt.unsqueeze(-1) * (b * (vt - retrieved)).unsqueeze(-2);
      }
    }
    auto qt = fq.select(1, t);
    if (opts_.fw == HqltFastWeight::LinearAttention) {
      fws.push_back(torch::einsum("bhkv,bhk->bhv", {W, qt * scale_}) / ((qt * scale_ * z).sum(-1, true) + 1e-10));
    } else {
      const auto& Wr = opts_.variant == HqltVariant::DelayedChunk ? W_read : W;
      fws.push_back(torch::einsum("bhkv,bhk->bhv", {Wr, qt * scale_}));
    }
    const int64_t lo = opts_.variant == HqltVariant::DelayedChunk ? t - t % S : std::max<int64_t>(0, t - S + 1);
    kvs.push_back(window_read(qa.select(1, t), ka.narrow(1, lo, t - lo + 1), in.v.narrow(1, lo, t - lo + 1),
                              torch::zeros({1}, x.options().dtype(torch::kLong)), scale_));
  }
  return finish(mix(torch::stack(fws, 1), torch::stack(kvs, 1), in.mix), x, in.gate);
}

namespace {
// MixerState::tensors: the fast-weight state W [B, H, d, d]; its normaliser z [B, H, d] (linear attention's FW;
// unused by the delta rule); W as the Delayed-Chunk read sees it; the window's raw keys, values [B, S, H, d] and
// β [B, S, H]; then the short convs' tails where the layer has them.
enum StateSlot : size_t { kFw, kNormaliser, kFwRead, kWindowKeys, kWindowValues, kWindowBeta, kQTail, kKTail, kVTail };
}  // namespace

MixerState HqltImpl::init_state(int64_t batch, const torch::TensorOptions& opts) const {
  const int64_t H = shape_.heads, d = head_dim_, S = opts_.window;
  const auto ct = compute_type(opts.dtype());
  MixerState s;
  s.tensors.push_back(torch::zeros({batch, H, d, d}, opts.dtype(ct)));  // kFw
  s.tensors.push_back(torch::zeros({batch, H, d}, opts.dtype(ct)));     // kNormaliser
  s.tensors.push_back(torch::zeros({batch, H, d, d}, opts.dtype(ct)));  // kFwRead
  s.tensors.push_back(torch::zeros({batch, S, H, d}, opts));            // kWindowKeys
  s.tensors.push_back(torch::zeros({batch, S, H, d}, opts));            // kWindowValues
  s.tensors.push_back(torch::zeros({batch, S, H}, opts.dtype(ct)));     // kWindowBeta
  if (opts_.short_conv)
    for (auto* c : {&q_conv, &k_conv, &v_conv}) s.tensors.push_back((*c)->init_tail(batch, opts));
  return s;
}

MixerState HqltImpl::init_fixed_state(int64_t batch, const torch::TensorOptions& opts, int64_t capacity) const {
  (void)capacity;  // the window is fixed already
  MixerState s = init_state(batch, opts);
  s.position = torch::zeros({1}, opts.dtype(torch::kLong));
  return s;
}

torch::Tensor HqltImpl::step(const torch::Tensor& x_t, MixerState& s) {
  // One form for both states: the position as a tensor (the fixed form's own; the dynamic form's made from pos, a
  // fill kernel, no copy from the host), so nothing below reads the position on the host.
  const int64_t S = opts_.window;
  const auto pt = s.position.defined() ? s.position
                                       : torch::full({1}, s.pos, x_t.options().dtype(torch::kLong));
  auto& W = s.tensors[kFw];
  auto& z = s.tensors[kNormaliser];
  auto& W_read = s.tensors[kFwRead];
  auto& kwin = s.tensors[kWindowKeys];
  auto& vwin = s.tensors[kWindowValues];
  auto& bwin = s.tensors[kWindowBeta];
  std::vector<torch::Tensor> tails;
  if (opts_.short_conv) tails = {s.tensors[kQTail], s.tensors[kKTail], s.tensors[kVTail]};
  auto x = x_t.unsqueeze(1);
  auto in = project(x, opts_.short_conv ? &tails : nullptr);
  if (opts_.short_conv)
    for (size_t i = 0; i < 3; ++i) s.tensors[kQTail + i] = tails[i];
  auto k1 = in.k.squeeze(1), v1 = in.v.squeeze(1);  // [B, H, d]
  auto b1 = in.beta.defined() ? in.beta.squeeze(1) : torch::Tensor();
  // Delayed-Chunk reads the FW state as it was at the start of its block (a copy: the step kernel updates W in
  // place).
  const bool chunked = opts_.variant == HqltVariant::DelayedChunk;
  if (chunked) W_read = torch::where(pt.remainder(fw_block()) == 0, W, W_read);
  // FW update: the current pair, or (Delayed-Stream) the pair leaving the window, slot 0; before step S that slot
  // holds zeros, and a zero key writes nothing.
  torch::Tensor fk, fv, fb;
  if (opts_.variant != HqltVariant::DelayedStream) {
    fk = fw_query(k1), fv = v1, fb = b1;
  } else {
    fk = fw_query(kwin.select(1, 0)), fv = vwin.select(1, 0), fb = opts_.evicted_beta ? bwin.select(1, 0) : b1;
  }
  // Slide the window: drop slot 0, append the current token.
  kwin = torch::cat({kwin.narrow(1, 1, S - 1), k1.unsqueeze(1).to(kwin.scalar_type())}, 1);
  vwin = torch::cat({vwin.narrow(1, 1, S - 1), v1.unsqueeze(1).to(vwin.scalar_type())}, 1);
  if (b1.defined()) bwin = torch::cat({bwin.narrow(1, 1, S - 1), b1.unsqueeze(1)}, 1);

  auto fq = fw_query(in.q.squeeze(1));
  DeltaRuleForm step_form;  // fq and fk arrive normalised (fw_query): the reads below use fq as it is
  step_form.scale = scale_;
  step_form.kernels = opts_.kernels;
  torch::Tensor o_fw;
  if (opts_.fw == HqltFastWeight::LinearAttention) {
    o_fw = linear_attention_step(fq, fk, fv, scale_, /*normalize=*/true, W, z);  // Synchronous: update, then read
  } else if (chunked) {
    o_fw = torch::matmul((fq * scale_).unsqueeze(-2), W_read).squeeze(-2);  // the state at the block start
    delta_rule_step(fq, fk, fv, fb, W, step_form);
  } else {
    o_fw = delta_rule_step(fq, fk, fv, fb, W, step_form);  // update with this step's pair, then read W_t
  }
  // KV read over the filled slots; slot i holds position t - S + 1 + i.
  auto qa = in.q, ka = kwin;
  if (opts_.rope) {
    qa = apply_rope(qa, pt, opts_.rope_theta);
    ka = apply_rope(ka, pt - (S - 1), opts_.rope_theta);
  }
  const auto filled = chunked ? pt.remainder(S) + 1 : torch::clamp_max(pt + 1, S);
  auto o_kv = window_read(qa.squeeze(1), ka, vwin, S - filled, scale_);
  s.pos += 1;
  if (s.position.defined()) s.position.add_(1);
  return finish(mix(o_fw.unsqueeze(1), o_kv.unsqueeze(1), in.mix), x, in.gate).squeeze(1);
}

void register_hqlt_keys(Schema& s) {
  // HQLT defaults: the paper's synthetic-task setting (Synchronous, dynamic vector mixing, window 8, no PE).
  s.add_string("model.hqlt.variant", "synchronous", "how the two memories share the input stream",
               {"synchronous", "delayed_stream", "delayed_chunk"});
  s.add_string("model.hqlt.mixing", "vector", "memory mixing: sum, per-head scalar gates, per-channel vector gate",
               {"sum", "scalar", "vector"});
  s.add_string("model.hqlt.fw_memory", "deltanet", "fast-weight memory (linear_attention: the paper's ablation)",
               {"deltanet", "linear_attention"});
  s.add_int("model.hqlt.window", 8, "KV-memory window S (keys t-S+1..t); Delayed-Chunk: the chunk size", 1, 1 << 20);
  s.add_int("model.hqlt.fw_block", 0,
            "Delayed-Chunk: FW-memory read-state block; 0 = the chunk (paper), 64 = the reference code", 0, 1 << 20);
  s.add_string("model.hqlt.delayed_beta", "current",
               "Delayed-Stream: beta paired with the evicted pair: current = beta_t (paper and code), evicted = beta_{t-S}",
               {"current", "evicted"});
  s.add_string("model.hqlt.pos", "none", "positional encoding of the KV-memory", {"rope", "none"});
  s.add_float("model.hqlt.rope_theta", 10000.0, "RoPE base", 1.0);
  s.add_bool("model.hqlt.neg_eigval", true, "beta = 2*sigmoid (eigenvalues in [-1,1]); false = sigmoid");
  s.add_bool("model.hqlt.short_conv", true, "short causal depthwise conv on q, k, v");
  s.add_int("model.hqlt.conv_size", 4, "short conv kernel size", 2, 16);
  s.add_bool("model.hqlt.out_gate", true, "gate the per-head output norm with SiLU(W_g x)");
  s.add_int("model.hqlt.chunk", 64, "chunk size of the FW-memory chunkwise form", 1, 1024);
}

HqltOptions hqlt_options(const Config& cfg) {
  HqltOptions o;
  const auto variant = cfg.get_string("model.hqlt.variant"), mixing = cfg.get_string("model.hqlt.mixing");
  o.variant = variant == "synchronous"      ? HqltVariant::Synchronous
              : variant == "delayed_stream" ? HqltVariant::DelayedStream
                                            : HqltVariant::DelayedChunk;
  o.mixing = mixing == "sum" ? HqltMixing::Sum : mixing == "scalar" ? HqltMixing::Scalar : HqltMixing::Vector;
  o.fw = cfg.get_string("model.hqlt.fw_memory") == "deltanet" ? HqltFastWeight::DeltaNet : HqltFastWeight::LinearAttention;
  o.window = cfg.get_int("model.hqlt.window");
  o.fw_block = cfg.get_int("model.hqlt.fw_block");
  o.evicted_beta = cfg.get_string("model.hqlt.delayed_beta") == "evicted";
  o.rope = cfg.get_string("model.hqlt.pos") == "rope";
  o.rope_theta = cfg.get_float("model.hqlt.rope_theta");
  o.neg_eigval = cfg.get_bool("model.hqlt.neg_eigval");
  o.short_conv = cfg.get_bool("model.hqlt.short_conv");
  o.conv_size = cfg.get_int("model.hqlt.conv_size");
  o.out_gate = cfg.get_bool("model.hqlt.out_gate");
  o.chunk = cfg.get_int("model.hqlt.chunk");
  o.kernels = kernels_option(cfg);
  return o;
}

std::shared_ptr<MixerImpl> make_hqlt(const Config& cfg, const MixerShape& shape) {
  const HqltOptions o = hqlt_options(cfg);
  if (o.fw == HqltFastWeight::LinearAttention && o.variant != HqltVariant::Synchronous)
    cfg.fail("model.hqlt.fw_memory", "linear_attention is only available with model.hqlt.variant=synchronous");
  if (o.rope && (shape.hidden / shape.heads) % 2)
    cfg.fail("model.hqlt.pos", "RoPE needs an even head dimension (model.hidden / model.heads)");
  return std::make_shared<HqltImpl>(shape, o);
}

}  // namespace memlab
