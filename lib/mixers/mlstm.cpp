#include "mixers/mlstm.h"

#include <fmt/format.h>

#include "core/config.h"

#include <cmath>
#include <limits>

namespace memlab {

namespace {

MLstmState defaults(const MLstmState& init, int64_t B, int64_t H, int64_t dk, int64_t dv, torch::ScalarType ct,
                    const torch::Device& dev) {
  auto z = mlstm_zero_state(B, H, dk, dv, torch::TensorOptions().dtype(ct).device(dev));
  return {init.C.defined() ? init.C.to(ct) : z.C, init.n.defined() ? init.n.to(ct) : z.n,
          init.m.defined() ? init.m.to(ct) : z.m};
}
}  // namespace

MLstmState mlstm_zero_state(int64_t B, int64_t H, int64_t dk, int64_t dv, const torch::TensorOptions& opts) {
  auto o = opts.dtype(compute_type(opts.dtype().toScalarType()));
  return {torch::zeros({B, H, dk, dv}, o), torch::zeros({B, H, dk}, o), torch::zeros({B, H}, o)};
}

MLstmOut mlstm_chunked(const torch::Tensor& q_in, const torch::Tensor& k_in, const torch::Tensor& v_in,
                       const torch::Tensor& ig_in, const torch::Tensor& fg_in, int64_t L, double eps,
                       const MLstmState& init) {
  AutocastOff no_autocast;
  namespace F = torch::nn::functional;
  const auto ct = compute_type(v_in.scalar_type());
  const int64_t B = q_in.size(0), T = q_in.size(1), H = q_in.size(2), dk = q_in.size(3), dv = v_in.size(3);
  const double inf = std::numeric_limits<double>::infinity();
  L = std::max<int64_t>(1, std::min<int64_t>(L, T));
  const int64_t N = (T + L - 1) / L, Tp = N * L;
  // [B, H, T, .] in the compute type
  auto q = q_in.to(ct).transpose(1, 2);
  auto k = k_in.to(ct).transpose(1, 2) / std::sqrt(static_cast<double>(dk));
  auto v = v_in.to(ct).transpose(1, 2);
  auto logf = F::logsigmoid(fg_in.to(ct)).transpose(1, 2);  // [B, H, T]
  auto ig = ig_in.to(ct).transpose(1, 2);
  if (Tp != T) {  // padded tokens neither forget (log f = 0) nor write (ĩ = -inf): the final state is exact
    q = F::pad(q, F::PadFuncOptions({0, 0, 0, Tp - T}));
    k = F::pad(k, F::PadFuncOptions({0, 0, 0, Tp - T}));
    v = F::pad(v, F::PadFuncOptions({0, 0, 0, Tp - T}));
    logf = F::pad(logf, F::PadFuncOptions({0, Tp - T}));
    ig = F::pad(ig, F::PadFuncOptions({0, Tp - T}).value(-inf));
  }
  q = q.reshape({B, H, N, L, dk});
  k = k.reshape({B, H, N, L, dk});
  v = v.reshape({B, H, N, L, dv});
  ig = ig.reshape({B, H, N, L});
  auto b = logf.reshape({B, H, N, L}).cumsum(-1);  // b_t = Σ_{chunk start < l <= t} log f_l
  auto bL = b.select(-1, L - 1);                    // [B, H, N]

  // Chunk summaries: write j is weighted exp(b_L - b_j + ĩ_j) at the chunk end; stabilised by its max.
  auto a = bL.unsqueeze(-1) - b + ig;  // [B, H, N, L]
  auto m_loc = std::get<0>(a.max(-1));  // [B, H, N]
  auto kw = k * torch::exp(a - m_loc.unsqueeze(-1)).unsqueeze(-1);
  auto C_loc = torch::matmul(kw.transpose(-1, -2), v);  // [B, H, N, dk, dv]
  auto n_loc = kw.sum(-2);                              // [B, H, N, dk]

  // Inter-chunk recurrence of the stabilised states (a loop over chunks, not time steps).
  auto s = defaults(init, B, H, dk, dv, ct, q.device());
  std::vector<torch::Tensor> Cs, ns, ms;
  for (int64_t c = 0; c < N; ++c) {
    Cs.push_back(s.C);
    ns.push_back(s.n);
    ms.push_back(s.m);
    auto decay = bL.select(-1, c) + s.m;
    auto m_new = torch::maximum(decay, m_loc.select(-1, c));
    auto fw = torch::exp(decay - m_new), iw = torch::exp(m_loc.select(-1, c) - m_new);
    s.C = fw.unsqueeze(-1).unsqueeze(-1) * s.C + iw.unsqueeze(-1).unsqueeze(-1) * C_loc.select(2, c);
    s.n = fw.unsqueeze(-1) * s.n + iw.unsqueeze(-1) * n_loc.select(2, c);
    s.m = m_new;
  }
  auto C_prev = torch::stack(Cs, 2), n_prev = torch::stack(ns, 2), m_prev = torch::stack(ms, 2);

  // Intra-chunk log weights log D_tj = b_t - b_j + ĩ_j (j <= t); the carried state enters with m_prev + b_t.
  auto causal = torch::ones({L, L}, torch::TensorOptions().dtype(torch::kBool).device(q.device())).tril();
  auto logD = (b.unsqueeze(-1) - b.unsqueeze(-2) + ig.unsqueeze(-2)).masked_fill(causal.logical_not(), -inf);
  auto inter = m_prev.unsqueeze(-1) + b;                                 // [B, H, N, L]
  auto stab = torch::maximum(std::get<0>(logD.max(-1)), inter);         // == recurrent m_t
  auto S = torch::matmul(q, k.transpose(-1, -2)) * torch::exp(logD - stab.unsqueeze(-1));  // [B, H, N, L, L]
  auto w_inter = torch::exp(inter - stab).unsqueeze(-1);                // [B, H, N, L, 1]
  auto num = torch::matmul(S, v) + w_inter * torch::matmul(q, C_prev);
  auto den = S.sum(-1, true) + w_inter * torch::matmul(q, n_prev.unsqueeze(-1));
  auto h = num / (torch::maximum(den.abs(), torch::exp(-stab).unsqueeze(-1)) + eps);
  h = h.reshape({B, H, Tp, dv}).narrow(2, 0, T).transpose(1, 2);
  return {h.to(v_in.scalar_type()), s};
}

torch::Tensor mlstm_step(const torch::Tensor& q_t, const torch::Tensor& k_t, const torch::Tensor& v_t,
                         const torch::Tensor& ig_t, const torch::Tensor& fg_t, MLstmState& s, double eps) {
  AutocastOff no_autocast;
  const auto ct = compute_type(v_t.scalar_type());
  const int64_t dk = q_t.size(-1);
  auto q = q_t.to(ct), k = k_t.to(ct) / std::sqrt(static_cast<double>(dk)), v = v_t.to(ct);
  auto a = torch::nn::functional::logsigmoid(fg_t.to(ct)) + s.m.to(ct);  // [B, H]
  auto ig = ig_t.to(ct);
  auto m = torch::maximum(a, ig);
  auto fp = torch::exp(a - m), ip = torch::exp(ig - m);
  s.C = fp.unsqueeze(-1).unsqueeze(-1) * s.C.to(ct) + ip.unsqueeze(-1).unsqueeze(-1) * k.unsqueeze(-1) * v.unsqueeze(-2);
  s.n = fp.unsqueeze(-1) * s.n.to(ct) + ip.unsqueeze(-1) * k;
  s.m = m;
  auto num = (q.unsqueeze(-1) * s.C).sum(-2);       // [B, H, dv]
  auto den = (q * s.n).sum(-1);                      // [B, H]
  auto h = num / (torch::maximum(den.abs(), torch::exp(-m)) + eps).unsqueeze(-1);
  return h.to(v_t.scalar_type());
}

MLstmOut mlstm_recurrent(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         const torch::Tensor& ig, const torch::Tensor& fg, double eps, const MLstmState& init) {
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), dk = q.size(3), dv = v.size(3);
  auto s = defaults(init, B, H, dk, dv, compute_type(v.scalar_type()), q.device());
  std::vector<torch::Tensor> hs;
  for (int64_t t = 0; t < T; ++t)
    hs.push_back(mlstm_step(q.select(1, t), k.select(1, t), v.select(1, t), ig.select(1, t), fg.select(1, t), s, eps));
  return {torch::stack(hs, 1), s};
}

torch::Tensor head_layer_norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  const auto ct = compute_type(x.scalar_type());
  auto xf = x.to(ct);
  auto mu = xf.mean(-1, true);
  auto var = (xf - mu).pow(2).mean(-1, true);
  auto y = (xf - mu) * torch::rsqrt(var + eps);
  return (y * (1.0 + w.to(ct).view({x.size(-2), x.size(-1)}))).to(x.scalar_type());
}

MLstmImpl::MLstmImpl(const MixerShape& shape, const MLstmOptions& opts)
    : shape_(shape), opts_(opts), inner_(std::llround(opts.proj_factor * static_cast<double>(shape.hidden))) {
  const int64_t D = shape.hidden, H = shape.heads, I = inner_, bs = opts.qkv_block;
  TORCH_CHECK(I % H == 0 && I % bs == 0, "mLSTM inner width must be divisible by heads and qkv_block");
  head_dim_ = I / H;
  proj_up = register_module("proj_up", torch::nn::Linear(torch::nn::LinearOptions(D, 2 * I).bias(false)));
  proj_down = register_module("proj_down", torch::nn::Linear(torch::nn::LinearOptions(I, D).bias(false)));
  if (opts.conv_size > 0) conv = register_module("conv", ShortConv(I, opts.conv_size, shape.init_std, opts.kernels));
  const double qkv_std = std::sqrt(2.0 / (5.0 * static_cast<double>(D)));  // xlstm small_init_init_(dim=hidden)
  q_weight = register_parameter("q_weight", torch::randn({I / bs, bs, bs}) * qkv_std);
  k_weight = register_parameter("k_weight", torch::randn({I / bs, bs, bs}) * qkv_std);
  v_weight = register_parameter("v_weight", torch::randn({I / bs, bs, bs}) * qkv_std);
  igate_weight = register_parameter("igate_weight", torch::zeros({H, 3 * I}));
  fgate_weight = register_parameter("fgate_weight", torch::zeros({H, 3 * I}));
  igate_bias = register_no_decay("igate_bias", torch::randn({H}) * 0.1);
  fgate_bias = register_no_decay("fgate_bias", torch::linspace(3.0, 6.0, H));
  learnable_skip = register_no_decay("learnable_skip", torch::ones({I}));
  norm_weight = register_parameter("norm_weight", torch::zeros({I}));
}

torch::Tensor MLstmImpl::block_diag_apply(const torch::Tensor& w, const torch::Tensor& x) const {
  auto sizes = x.sizes().vec();
  const int64_t bs = w.size(1);
  sizes.back() = inner_ / bs;
  sizes.push_back(bs);
  auto y = torch::einsum("...hd,hod->...ho", {x.reshape(sizes), w.to(x.scalar_type())});
  return y.reshape(x.sizes());
}

MLstmImpl::Inputs MLstmImpl::project(const torch::Tensor& x_m, const torch::Tensor& c, const torch::Tensor& z) {
  Inputs in;
  in.c = c;
  in.z = z;
  auto q = block_diag_apply(q_weight, c), k = block_diag_apply(k_weight, c), v = block_diag_apply(v_weight, x_m);
  {
    // gate pre-activations feed exponentials: compute them in fp32 (fp64)
    AutocastOff no_autocast;
    const auto ct = compute_type(x_m.scalar_type());
    auto qkv = torch::cat({q, k, v}, -1).to(ct);
    in.ig = torch::matmul(qkv, igate_weight.to(ct).t()) + igate_bias.to(ct);
    in.fg = torch::matmul(qkv, fgate_weight.to(ct).t()) + fgate_bias.to(ct);
  }
  auto heads = [&](const torch::Tensor& t) {
    auto sizes = t.sizes().vec();
    sizes.back() = shape_.heads;
    sizes.push_back(head_dim_);
    return t.reshape(sizes);
  };
  in.q = heads(q);
  in.k = heads(k);
  in.v = heads(v);
  return in;
}

torch::Tensor MLstmImpl::finish(const torch::Tensor& h, const Inputs& in, const torch::Tensor& x) {
  auto hn = head_layer_norm(h, norm_weight).reshape(in.c.sizes());
  auto out = (hn + learnable_skip.to(hn.scalar_type()) * in.c) * torch::silu(in.z);
  return proj_down(out.to(x.scalar_type()));
}

torch::Tensor MLstmImpl::forward(const torch::Tensor& x) {
  auto up = proj_up(x);
  auto x_m = up.narrow(-1, 0, inner_), z = up.narrow(-1, inner_, inner_);
  auto c = silu_after(conv, x_m);
  auto in = project(x_m, c, z);
  auto h = mlstm_chunked(in.q, in.k, in.v, in.ig, in.fg, opts_.chunk).h;
  return finish(h, in, x);
}

torch::Tensor MLstmImpl::forward_reference(const torch::Tensor& x) {
  auto up = proj_up(x);
  auto x_m = up.narrow(-1, 0, inner_), z = up.narrow(-1, inner_, inner_);
  auto c = silu_after(conv, x_m);
  auto in = project(x_m, c, z);
  auto h = mlstm_recurrent(in.q, in.k, in.v, in.ig, in.fg).h;
  return finish(h, in, x);
}

MixerState MLstmImpl::init_state(int64_t batch, const torch::TensorOptions& opts) const {
  auto z = mlstm_zero_state(batch, shape_.heads, head_dim_, head_dim_, opts);
  MixerState s;
  s.tensors = {z.C, z.n, z.m};
  if (conv) s.tensors.push_back(conv->init_tail(batch, opts));
  return s;
}

torch::Tensor MLstmImpl::step(const torch::Tensor& x_t, MixerState& s) {
  auto up = proj_up(x_t);  // [B, 2 inner]
  auto x_m = up.narrow(-1, 0, inner_), z = up.narrow(-1, inner_, inner_);
  auto c = torch::silu(conv ? conv->step(x_m, s.tensors[3]) : x_m);
  auto in = project(x_m, c, z);
  MLstmState st{s.tensors[0], s.tensors[1], s.tensors[2]};
  auto h = mlstm_step(in.q, in.k, in.v, in.ig, in.fg, st);  // [B, H, d]
  s.tensors[0] = st.C;
  s.tensors[1] = st.n;
  s.tensors[2] = st.m;
  s.pos += 1;
  return finish(h, in, x_t);
}

void register_mlstm_keys(Schema& s) {
  s.add_int("model.mlstm.chunk", 64, "chunk size of the chunkwise mLSTM training form", 1, 1024);
  s.add_float("model.mlstm.proj_factor", 2.0, "mLSTM up-projection: inner width = round(proj_factor * hidden)", 0.01,
              64.0);
  s.add_int("model.mlstm.conv_size", 4, "mLSTM causal conv kernel on the q/k path; 0 = none", 0, 16);
  s.add_int("model.mlstm.qkv_block", 4, "block size of the block-diagonal q, k, v projections (must divide inner)", 1,
            1 << 16);
}

MLstmOptions mlstm_options(const Config& cfg) {
  MLstmOptions o;
  o.chunk = cfg.get_int("model.mlstm.chunk");
  o.proj_factor = cfg.get_float("model.mlstm.proj_factor");
  o.conv_size = cfg.get_int("model.mlstm.conv_size");
  o.qkv_block = cfg.get_int("model.mlstm.qkv_block");
  o.kernels = kernels_option(cfg);
  return o;
}

std::shared_ptr<MixerImpl> make_mlstm(const Config& cfg, const MixerShape& shape) {
  const MLstmOptions o = mlstm_options(cfg);
  const int64_t inner = std::llround(o.proj_factor * static_cast<double>(shape.hidden));
  if (inner < 1 || inner % shape.heads || inner % o.qkv_block)
    cfg.fail("model.mlstm.proj_factor",
             fmt::format("inner width round(proj_factor * hidden) = {} must be positive and divisible by model.heads "
                         "= {} and model.mlstm.qkv_block = {}",
                         inner, shape.heads, o.qkv_block));
  return std::make_shared<MLstmImpl>(shape, o);
}

}  // namespace memlab
