#include "mixers/mlstm.h"

#include <fmt/format.h>

#include "core/config.h"
#include "ops/norm/norm.h"

#include <cmath>

namespace memlab {

torch::Tensor head_layer_norm(const torch::Tensor& x, const torch::Tensor& w, Kernels kernels, torch::ScalarType out,
                              const torch::Tensor& gate, const NormSkip& skip) {
  return layer_norm(x, (1.0 + w).view({x.size(-2), x.size(-1)}), 1e-5, kernels, out, gate, skip);
}

MLstmImpl::MLstmImpl(const MixerShape& shape, const MLstmOptions& opts)
    : shape_(shape),
      opts_(opts),
      inner_(shape.members *
             std::llround(opts.proj_factor * static_cast<double>(shape.hidden / shape.members))) {
  const int64_t D = shape.hidden, H = shape.heads, I = inner_, bs = opts.qkv_block, K = shape.members;
  TORCH_CHECK((I / K) % (H / K) == 0 && (I / K) % bs == 0,
              "mLSTM inner width must be divisible by heads and qkv_block");
  head_dim_ = I / H;
  proj_up = register_module("proj_up", Linear(D, 2 * I, shape.members));
  proj_down = register_module("proj_down", Linear(I, D, shape.members));
  if (opts.conv_size > 0) conv = register_module("conv", ShortConv(I, opts.conv_size, shape.init_std, opts.kernels));
  const double qkv_std = std::sqrt(2.0 / (5.0 * static_cast<double>(D)));  // xlstm small_init_init_(dim=hidden)
  q_weight = register_parameter("q_weight", torch::randn({I / bs, bs, bs}) * qkv_std);
  k_weight = register_parameter("k_weight", torch::randn({I / bs, bs, bs}) * qkv_std);
  v_weight = register_parameter("v_weight", torch::randn({I / bs, bs, bs}) * qkv_std);
  igate_weight = register_parameter("igate_weight", torch::zeros({H, 3 * I / K}));  // a head reads its member's
  fgate_weight = register_parameter("fgate_weight", torch::zeros({H, 3 * I / K}));
  igate_bias = register_no_decay("igate_bias", torch::randn({H}) * 0.1);
  fgate_bias = register_no_decay("fgate_bias", torch::linspace(3.0, 6.0, H / K).repeat({K}));
  learnable_skip = register_no_decay("learnable_skip", torch::ones({I}));
  norm_weight = register_parameter("norm_weight", torch::zeros({I}));
}

MLstmImpl::Inputs MLstmImpl::project(const torch::Tensor& x_m, const torch::Tensor& c, const torch::Tensor& z) {
  Inputs in;
  in.c = c;
  in.z = z;
  auto pr = mlstm_project(c, x_m, q_weight, k_weight, v_weight, igate_weight, fgate_weight, igate_bias, fgate_bias,
                          opts_.kernels);
  in.ig = pr.ig;
  in.fg = pr.fg;
  auto heads = [&](const torch::Tensor& t) {
    auto sizes = t.sizes().vec();
    sizes.back() = shape_.heads;
    sizes.push_back(head_dim_);
    return t.reshape(sizes);
  };
  in.q = heads(pr.q);
  in.k = heads(pr.k);
  in.v = heads(pr.v);
  return in;
}

torch::Tensor MLstmImpl::finish(const torch::Tensor& h, const Inputs& in, const torch::Tensor& x) {
  // (LN(h) (1 + w) + skip ⊙ c) SiLU(z) in one pass of the norm (kernel), in x's dtype for proj_down
  const auto heads = h.sizes();
  auto out = head_layer_norm(h, norm_weight, opts_.kernels, x.scalar_type(), in.z.reshape(heads),
                             {learnable_skip.view({shape_.heads, head_dim_}), in.c.reshape(heads)});
  return proj_down(out.reshape(in.c.sizes()));
}

std::pair<torch::Tensor, torch::Tensor> MLstmImpl::up(const torch::Tensor& x) {
  // Two products with the weight's halves rather than one and two narrows: both come out contiguous, and the
  // backward adds two small weight gradients instead of padding each half's gradient to the whole output.
  namespace F = torch::nn::functional;
  const int64_t K = shape_.members, I1 = inner_ / K;
  if (K == 1) return {F::linear(x, proj_up->weight.narrow(0, 0, I1)), F::linear(x, proj_up->weight.narrow(0, I1, I1))};
  const auto& w = proj_up->weight;  // [K, 2 I1, D1]
  return {member_matmul(x, w.narrow(1, 0, I1)).flatten(-2), member_matmul(x, w.narrow(1, I1, I1)).flatten(-2)};
}

torch::Tensor MLstmImpl::forward(const torch::Tensor& x) {
  auto [x_m, z] = up(x);
  auto c = silu_after(conv, x_m);
  auto in = project(x_m, c, z);
  const auto ct = compute_type(in.v.scalar_type());  // h enters the norm unrounded
  auto h = mlstm(in.q, in.k, in.v, in.ig, in.fg, opts_.chunk, {}, opts_.kernels, 1e-6, ct).h;
  return finish(h, in, x);
}

torch::Tensor MLstmImpl::forward_reference(const torch::Tensor& x) {
  auto [x_m, z] = up(x);
  auto c = silu_after(conv, x_m);
  auto in = project(x_m, c, z);
  auto h = mlstm_recurrent(in.q, in.k, in.v, in.ig, in.fg).h;
  return finish(h, in, x);
}

namespace {
// MixerState::tensors: C [B, H, d, d], n [B, H, d], m [B, H], then the conv's tail where the layer has one
enum StateSlot : size_t { kC, kN, kM, kConvTail };
}  // namespace

MixerState MLstmImpl::init_state(int64_t batch, const torch::TensorOptions& opts) const {
  auto z = mlstm_zero_state(batch, shape_.heads, head_dim_, head_dim_, opts);
  MixerState s;
  s.tensors = {z.C, z.n, z.m};
  if (conv) s.tensors.push_back(conv->init_tail(batch, opts));
  return s;
}

torch::Tensor MLstmImpl::step(const torch::Tensor& x_t, MixerState& s) {
  auto [x_m, z] = up(x_t);  // [B, inner] each
  auto c = torch::silu(conv ? conv->step(x_m, s.tensors[kConvTail]) : x_m);
  auto in = project(x_m, c, z);
  MLstmState st{s.tensors[kC], s.tensors[kN], s.tensors[kM]};
  auto h = mlstm_step(in.q, in.k, in.v, in.ig, in.fg, st);  // [B, H, d]
  s.tensors[kC] = st.C;
  s.tensors[kN] = st.n;
  s.tensors[kM] = st.m;
  s.pos += 1;
  return finish(h, in, x_t);
}

void register_mlstm_keys(Schema& s) {
  s.add_int("model.mlstm.chunk", 64, "chunk size of the tensor-op chunkwise mLSTM (the kernels use 32)", 1, 1024);
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
  const int64_t K = shape.members, inner = std::llround(o.proj_factor * static_cast<double>(shape.hidden / K));
  if (inner < 1 || inner % (shape.heads / K) || inner % o.qkv_block)
    cfg.fail("model.mlstm.proj_factor",
             fmt::format("inner width round(proj_factor * hidden) = {} must be positive and divisible by model.heads "
                         "= {} and model.mlstm.qkv_block = {}",
                         inner, shape.heads / K, o.qkv_block));
  return std::make_shared<MLstmImpl>(shape, o);
}

}  // namespace memlab
