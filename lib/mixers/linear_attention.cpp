#include "mixers/linear_attention.h"

#include <fmt/format.h>

#include "core/config.h"
#include "core/errors.h"
#include "ops/delta_rule/delta_rule.h"
#include "ops/norm/norm.h"

#include <cmath>

namespace memlab {

namespace {
constexpr double kNormEps = 1e-10;  // fla's, added to scale * q·z
}  // namespace

torch::Tensor elu_plus_one(const torch::Tensor& x) { return torch::elu(x) + 1.0; }

LinearAttentionOut linear_attention_chunked(const torch::Tensor& q_in, const torch::Tensor& k_in,
                                            const torch::Tensor& v_in, int64_t C, double scale, bool normalize,
                                            const torch::Tensor& initial_state, const torch::Tensor& initial_z) {
  AutocastOff no_autocast;
  namespace F = torch::nn::functional;
  const auto ct = compute_type(v_in);
  const int64_t B = q_in.size(0), T = q_in.size(1), H = q_in.size(2), dk = q_in.size(3), dv = v_in.size(3);
  auto q = q_in.to(ct).transpose(1, 2) * scale;  // [B, H, T, dk]
  auto k = k_in.to(ct).transpose(1, 2);
  auto v = v_in.to(ct).transpose(1, 2);
  auto opts = q.options();
  auto z0 = initial_z.defined() ? initial_z.to(ct) : torch::zeros({B, H, dk}, opts);
  auto kc = k.cumsum(2) + z0.unsqueeze(2);  // z_t [B, H, T, dk]
  C = std::min<int64_t>(C, T);
  const int64_t N = (T + C - 1) / C, Tp = N * C;
  auto qp = q, kp = k, vp = v;
  if (Tp != T) {  // zero keys pad the tail: no-ops for the state
    qp = F::pad(q, F::PadFuncOptions({0, 0, 0, Tp - T}));
    kp = F::pad(k, F::PadFuncOptions({0, 0, 0, Tp - T}));
    vp = F::pad(v, F::PadFuncOptions({0, 0, 0, Tp - T}));
  }
  qp = qp.view({B, H, N, C, dk});
  kp = kp.view({B, H, N, C, dk});
  vp = vp.view({B, H, N, C, dv});
  // Chunk-start states: S_0 + exclusive prefix sum over chunks of K_n^T V_n.
  auto S0 = initial_state.defined() ? initial_state.to(ct) : torch::zeros({B, H, dk, dv}, opts);
  auto kv = torch::cumsum(torch::matmul(kp.transpose(-1, -2), vp), 2);  // inclusive [B, H, N, dk, dv]
  auto starts = F::pad(kv.narrow(2, 0, N - 1), F::PadFuncOptions({0, 0, 0, 0, 1, 0})) + S0.unsqueeze(2);
  auto causal = torch::ones({C, C}, opts.dtype(torch::kBool)).tril(0);
  auto QK = torch::matmul(qp, kp.transpose(-1, -2)).masked_fill(causal.logical_not(), 0.0);
  auto o = torch::matmul(qp, starts) + torch::matmul(QK, vp);
  o = o.view({B, H, Tp, dv}).narrow(2, 0, T);
  if (normalize) o = o / ((q * kc).sum(-1, true) + kNormEps);
  return {o.transpose(1, 2).to(v_in.scalar_type()), S0 + kv.select(2, N - 1), kc.select(2, T - 1)};
}

std::pair<torch::Tensor, torch::Tensor> linear_attention_normalise(const torch::Tensor& o, const torch::Tensor& q,
                                                                   const torch::Tensor& k, double scale,
                                                                   const torch::Tensor& initial_z) {
  AutocastOff no_autocast;
  const auto ct = compute_type(o);
  auto z = k.to(ct).cumsum(1);  // [B, T, H, dk]
  if (initial_z.defined()) z = z + initial_z.to(ct).unsqueeze(1);
  auto den = (q.to(ct) * z).sum(-1, true) * scale + kNormEps;
  return {(o.to(ct) / den).to(o.scalar_type()), z.select(1, z.size(1) - 1)};
}

LinearAttentionOut linear_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                    int64_t chunk, double scale, bool normalize, Kernels kernels,
                                    const torch::Tensor& initial_state, const torch::Tensor& initial_z) {
  DeltaRuleForm form;
  form.scale = scale;
  form.kernels = kernels;
  std::string why;
  if (!linear_rule_kernel_applies(q, v, form, &why)) {
    if (kernels == Kernels::Cuda) throw UserError("model.kernels=cuda: no linear-attention kernel for this call: " + why);
    return linear_attention_chunked(q, k, v, chunk, scale, normalize, initial_state, initial_z);
  }
  // The kernel reads and writes the compute type, so the numerator and the normaliser meet unrounded and the output
  // is rounded once (rounding each to bf16 doubled dq's error, their gradients partly cancelling).
  const auto ct = compute_type(v);
  auto qc = q.to(ct), kc = k.to(ct);
  auto r = linear_rule(qc, kc, v.to(ct), form, initial_state);
  if (!normalize) {
    auto z = kc.sum(1);
    return {r.o.to(v.scalar_type()), r.state, initial_z.defined() ? z + initial_z.to(ct) : z};
  }
  auto [o, z] = linear_attention_normalise(r.o, qc, kc, scale, initial_z);
  return {o.to(v.scalar_type()), r.state, z};
}

LinearAttentionOut linear_attention_recurrent(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                              double scale, bool normalize, const torch::Tensor& initial_state,
                                              const torch::Tensor& initial_z) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), dk = q.size(3), dv = v.size(3);
  const auto ct = compute_type(v);
  auto opts = q.options().dtype(ct);
  auto S = initial_state.defined() ? initial_state.to(ct) : torch::zeros({B, H, dk, dv}, opts);
  auto z = initial_z.defined() ? initial_z.to(ct) : torch::zeros({B, H, dk}, opts);
  std::vector<torch::Tensor> outs;
  for (int64_t t = 0; t < T; ++t) {
    auto qt = q.select(1, t).to(ct) * scale, kt = k.select(1, t).to(ct), vt = v.select(1, t).to(ct);
    S = S + torch::einsum("bhk,bhv->bhkv", {kt, vt});
    z = z + kt;
    auto ot = torch::einsum("bhkv,bhk->bhv", {S, qt});
    if (normalize) ot = ot / ((qt * z).sum(-1, true) + kNormEps);
    outs.push_back(ot);
  }
  return {torch::stack(outs, 1).to(v.scalar_type()), S, z};
}

torch::Tensor linear_attention_step(const torch::Tensor& q_t, const torch::Tensor& k_t, const torch::Tensor& v_t,
                                    double scale, bool normalize, torch::Tensor& S, torch::Tensor& z) {
  const auto ct = compute_type(v_t);
  auto qt = q_t.to(ct) * scale, kt = k_t.to(ct);
  S = S + kt.unsqueeze(-1) * v_t.to(ct).unsqueeze(-2);
  z = z + kt;
  auto o = torch::matmul(qt.unsqueeze(-2), S).squeeze(-2);  // [B, H, dv]
  if (normalize) o = o / ((qt * z).sum(-1, true) + kNormEps);
  return o.to(v_t.scalar_type());
}

LinearAttentionImpl::LinearAttentionImpl(const MixerShape& shape, const LinearAttentionOptions& opts)
    : shape_(shape), opts_(opts), head_dim_(shape.hidden / shape.heads) {
  const int64_t D = shape.hidden;
  auto lin = [&](const char* name, int64_t out) {
    return register_module(name, Linear(D, out, shape.members));
  };
  q_proj = lin("q_proj", D);
  k_proj = lin("k_proj", D);
  v_proj = lin("v_proj", D);
  if (opts.out_gate) g_proj = lin("g_proj", D);
  o_proj = lin("o_proj", D);
  o_norm = register_parameter("o_norm", torch::ones({shape.members * head_dim_}));  // shared by a member's heads
}

double LinearAttentionImpl::scale() const { return 1.0 / std::sqrt(static_cast<double>(head_dim_)); }

torch::Tensor LinearAttentionImpl::finish(const torch::Tensor& o, const torch::Tensor& x) {
  auto y = rms_norm(o, rows_per_head(o_norm, shape_.members, shape_.heads / shape_.members), shape_.norm_eps, opts_.kernels,
                    opts_.out_gate ? g_proj(x).view(o.sizes()) : torch::Tensor(), x.scalar_type());
  return o_proj(y.reshape(x.sizes()));
}

torch::Tensor LinearAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), H = shape_.heads;
  const auto ct = compute_type(x);
  auto q = elu_plus_one(q_proj(x).view({B, T, H, head_dim_}).to(ct));
  auto k = elu_plus_one(k_proj(x).view({B, T, H, head_dim_}).to(ct));
  auto v = v_proj(x).view({B, T, H, head_dim_});
  return finish(linear_attention(q, k, v, opts_.chunk, scale(), opts_.normalize, opts_.kernels).o, x);
}

torch::Tensor LinearAttentionImpl::forward_reference(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), H = shape_.heads;
  const auto ct = compute_type(x);
  auto q = elu_plus_one(q_proj(x).view({B, T, H, head_dim_}).to(ct));
  auto k = elu_plus_one(k_proj(x).view({B, T, H, head_dim_}).to(ct));
  auto v = v_proj(x).view({B, T, H, head_dim_});
  return finish(linear_attention_recurrent(q, k, v, scale(), opts_.normalize).o, x);
}

namespace {
enum StateSlot : size_t { kMemory, kNormaliser };  // MixerState::tensors: [B, H, d, d] and [B, H, d]
}  // namespace

MixerState LinearAttentionImpl::init_state(int64_t batch, const torch::TensorOptions& opts) const {
  MixerState s;
  const auto ct = compute_type(opts.dtype());
  s.tensors.push_back(torch::zeros({batch, shape_.heads, head_dim_, head_dim_}, opts.dtype(ct)));
  s.tensors.push_back(torch::zeros({batch, shape_.heads, head_dim_}, opts.dtype(ct)));
  return s;
}

torch::Tensor LinearAttentionImpl::step(const torch::Tensor& x_t, MixerState& s) {
  const int64_t B = x_t.size(0), H = shape_.heads;
  const auto ct = compute_type(x_t);
  auto q = elu_plus_one(q_proj(x_t).view({B, H, head_dim_}).to(ct));
  auto k = elu_plus_one(k_proj(x_t).view({B, H, head_dim_}).to(ct));
  auto v = v_proj(x_t).view({B, H, head_dim_});
  auto o = linear_attention_step(q, k, v, scale(), opts_.normalize, s.tensors[kMemory], s.tensors[kNormaliser]);
  s.pos += 1;
  return finish(o.unsqueeze(1), x_t.unsqueeze(1)).squeeze(1);
}

void register_linear_attention_keys(Schema& s) {
  s.add_bool("model.linear_attention.normalize", true,
             "divide by phi(q).sum phi(k) (Katharopoulos normaliser, fla's normalize=True)");
  s.add_bool("model.linear_attention.out_gate", false, "gate the per-head output norm with SiLU(W_g x)");
  s.add_int("model.linear_attention.chunk", 64, "chunk size of the chunkwise training form", 1, 1024);
}

LinearAttentionOptions linear_attention_options(const Config& cfg) {
  LinearAttentionOptions o;
  o.normalize = cfg.get_bool("model.linear_attention.normalize");
  o.out_gate = cfg.get_bool("model.linear_attention.out_gate");
  o.chunk = cfg.get_int("model.linear_attention.chunk");
  o.kernels = kernels_option(cfg);
  return o;
}

std::shared_ptr<MixerImpl> make_linear_attention(const Config& cfg, const MixerShape& shape) {
  const LinearAttentionOptions o = linear_attention_options(cfg);
  return std::make_shared<LinearAttentionImpl>(shape, o);
}

}  // namespace memlab
