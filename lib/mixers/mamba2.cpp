#include "mixers/mamba2.h"

#include <fmt/format.h>

#include "core/config.h"
#include "ops/norm/norm.h"

#include <cmath>

namespace memlab {

namespace {

namespace F = torch::nn::functional;

// [.., G, N] along `dim` -> [.., H, N]: head h reads group h / (H / G), as in mamba_ssm.
torch::Tensor groups_to_heads(const torch::Tensor& t, int64_t heads, int64_t dim) {
  const int64_t G = t.size(dim);
  TORCH_CHECK(heads % G == 0, "ssd: heads (", heads, ") must be a multiple of the groups of B and C (", G, ")");
  return G == heads ? t : t.repeat_interleave(heads / G, dim);
}

// Stable segment sums: out[.., i, j] = sum_{j < k <= i} a[.., k] for i >= j (0 above the diagonal). A masked
// cumsum, not differences of one cumsum, so long or strong decays keep their precision.
torch::Tensor segsum(const torch::Tensor& a) {
  const int64_t C = a.size(-1);
  auto strict = torch::ones({C, C}, a.options().dtype(torch::kBool)).tril(-1);  // i > j
  auto sizes = a.sizes().vec();
  sizes.push_back(C);
  auto rep = a.unsqueeze(-1).expand(sizes);  // rep[i, j] = a_i
  return rep.masked_fill(strict.logical_not(), 0.0).cumsum(-2);
}

// Segment products of the transitions, lower-triangular: S_i S_j exp(segsum(log|alpha|)) (S undefined = all +1).
torch::Tensor decay_matrix(const torch::Tensor& log_abs, const torch::Tensor& sign_prefix) {
  const int64_t C = log_abs.size(-1);
  auto causal = torch::ones({C, C}, log_abs.options().dtype(torch::kBool)).tril(0);
  auto L = torch::exp(segsum(log_abs)).masked_fill(causal.logical_not(), 0.0);
  if (sign_prefix.defined()) L = L * (sign_prefix.unsqueeze(-1) * sign_prefix.unsqueeze(-2));
  return L;
}

}  // namespace

torch::Tensor ssd_transition(const torch::Tensor& dt, const torch::Tensor& A, bool neg_eigval) {
  auto a = torch::exp(dt * A.to(dt.scalar_type()));
  return neg_eigval ? a * 2.0 - 1.0 : a;
}

SsdOut ssd_chunked(const torch::Tensor& x_in, const torch::Tensor& dt_in, const torch::Tensor& A_in,
                   const torch::Tensor& B_in, const torch::Tensor& C_in, int64_t chunk, bool neg_eigval,
                   const torch::Tensor& initial_state) {
  AutocastOff no_autocast;
  const auto out_dtype = x_in.scalar_type();
  const auto ct = compute_type(x_in);
  const int64_t B = x_in.size(0), T = x_in.size(1), H = x_in.size(2), P = x_in.size(3), N = B_in.size(3);
  auto dt = dt_in.to(ct);
  auto xdt = x_in.to(ct) * dt.unsqueeze(-1);        // [B, T, H, P]
  auto Bm = groups_to_heads(B_in.to(ct), H, 2);     // [B, T, H, N]
  auto Cm = groups_to_heads(C_in.to(ct), H, 2);
  auto dA = dt * A_in.to(ct);                       // [B, T, H]
  torch::Tensor log_abs, sign;                      // log|alpha|; sign(alpha) ∈ {±1} (neg_eigval only)
  if (neg_eigval) {
    auto alpha = torch::exp(dA) * 2.0 - 1.0;
    {
      torch::NoGradGuard ng;  // a sign has no gradient
      sign = torch::where(alpha < 0, -1.0, 1.0).to(ct);
    }
    // |alpha| = sign * alpha, so d|alpha|/dalpha = +1 at alpha = 0 too. The floor is straight-through: value
    // max(|alpha|, floor), gradient 1, so at alpha = 0 the gradient floor * R / floor of a product floor * R is the
    // exact R. (alpha is 0 or at least ~1e-16 away from it in fp64, so the floor changes no other value.)
    auto mag = alpha * sign;
    log_abs = torch::log(mag + (mag.clamp_min(kSsdAbsAlphaFloor) - mag).detach());
  } else {
    log_abs = dA;
  }
  const int64_t C = std::max<int64_t>(1, std::min<int64_t>(chunk, T));
  const int64_t Nc = (T + C - 1) / C, Tp = Nc * C;
  if (Tp != T) {  // padded steps have dt = 0: alpha = 1 (log 0, sign +1) and no input, so they change nothing
    xdt = F::pad(xdt, F::PadFuncOptions({0, 0, 0, 0, 0, Tp - T}));
    Bm = F::pad(Bm, F::PadFuncOptions({0, 0, 0, 0, 0, Tp - T}));
    Cm = F::pad(Cm, F::PadFuncOptions({0, 0, 0, 0, 0, Tp - T}));
    log_abs = F::pad(log_abs, F::PadFuncOptions({0, 0, 0, Tp - T}));
    if (sign.defined()) sign = F::pad(sign, F::PadFuncOptions({0, 0, 0, Tp - T}).value(1.0));
  }
  // [B, H, Nc, C, d]
  xdt = xdt.transpose(1, 2).reshape({B, H, Nc, C, P});
  Bm = Bm.transpose(1, 2).reshape({B, H, Nc, C, N});
  Cm = Cm.transpose(1, 2).reshape({B, H, Nc, C, N});
  log_abs = log_abs.transpose(1, 2).reshape({B, H, Nc, C});
  torch::Tensor sign_prefix;  // S_t within each chunk
  if (sign.defined()) sign_prefix = sign.transpose(1, 2).reshape({B, H, Nc, C}).cumprod(-1);

  // 1. intra-chunk (diagonal blocks): y_l = sum_{s<=l} alpha(s, l] (C_l . B_s) dt_s x_s
  auto L = decay_matrix(log_abs, sign_prefix);  // [B, H, Nc, C, C]
  auto y = torch::matmul(torch::matmul(Cm, Bm.transpose(-1, -2)) * L, xdt);
  // 2. each chunk's own end state (zero start): sum_s alpha(s, end] dt_s x_s B_s^T
  auto to_end = L.select(-2, C - 1).unsqueeze(-1);                               // [B, H, Nc, C, 1]
  auto states = torch::matmul((xdt * to_end).transpose(-1, -2), Bm);            // [B, H, Nc, P, N]
  // 3. across chunks: the same segment products over chunk totals, index 0 = the initial state
  auto log_cum = log_abs.cumsum(-1);                                            // log|alpha(start, t]|
  auto chunk_log = F::pad(log_cum.select(-1, C - 1), F::PadFuncOptions({1, 0}));  // [B, H, Nc + 1]
  torch::Tensor chunk_sign;
  if (sign_prefix.defined())
    chunk_sign = F::pad(sign_prefix.select(-1, C - 1), F::PadFuncOptions({1, 0}).value(1.0)).cumprod(-1);
  auto Lc = decay_matrix(chunk_log, chunk_sign);                                // [B, H, Nc + 1, Nc + 1]
  auto h0 = initial_state.defined() ? initial_state.to(ct) : torch::zeros({B, H, P, N}, xdt.options());
  auto all = torch::cat({h0.unsqueeze(2), states}, 2).reshape({B, H, Nc + 1, P * N});
  auto entering = torch::matmul(Lc, all).view({B, H, Nc + 1, P, N});          // state before chunk z; last = final
  // 4. off-diagonal read: y_l += alpha(start, l] C_l h_start
  auto from_start = torch::exp(log_cum);
  if (sign_prefix.defined()) from_start = from_start * sign_prefix;
  y = y + torch::matmul(Cm, entering.narrow(2, 0, Nc).transpose(-1, -2)) * from_start.unsqueeze(-1);
  y = y.reshape({B, H, Tp, P}).narrow(2, 0, T).transpose(1, 2);
  return {y.to(out_dtype), entering.select(2, Nc)};
}

SsdOut ssd_recurrent(const torch::Tensor& x, const torch::Tensor& dt_in, const torch::Tensor& A,
                     const torch::Tensor& B_in, const torch::Tensor& C_in, bool neg_eigval,
                     const torch::Tensor& initial_state) {
  const auto ct = compute_type(x);
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), P = x.size(3), N = B_in.size(3);
  auto dt = dt_in.to(ct);
  auto alpha = ssd_transition(dt, A.to(ct), neg_eigval);  // [B, T, H]
  auto Bm = groups_to_heads(B_in.to(ct), H, 2), Cm = groups_to_heads(C_in.to(ct), H, 2);
  auto h = initial_state.defined() ? initial_state.to(ct) : torch::zeros({B, H, P, N}, x.options().dtype(ct));
  std::vector<torch::Tensor> ys;
  for (int64_t t = 0; t < T; ++t) {
    auto xt = x.select(1, t).to(ct) * dt.select(1, t).unsqueeze(-1);  // dt_t x_t [B, H, P]
    h = alpha.select(1, t).view({B, H, 1, 1}) * h + torch::einsum("bhp,bhn->bhpn", {xt, Bm.select(1, t)});
    ys.push_back(torch::einsum("bhpn,bhn->bhp", {h, Cm.select(1, t)}));
  }
  return {torch::stack(ys, 1).to(x.scalar_type()), h};
}

torch::Tensor ssd_step(const torch::Tensor& x_t, const torch::Tensor& dt_t, const torch::Tensor& A,
                       const torch::Tensor& B_t, const torch::Tensor& C_t, bool neg_eigval, torch::Tensor& state) {
  const auto ct = compute_type(x_t);
  const int64_t H = x_t.size(1);
  auto dt = dt_t.to(ct);
  auto alpha = ssd_transition(dt, A.to(ct), neg_eigval);  // [B, H]
  auto Bh = groups_to_heads(B_t.to(ct), H, 1), Ch = groups_to_heads(C_t.to(ct), H, 1);
  auto xdt = x_t.to(ct) * dt.unsqueeze(-1);
  state = alpha.unsqueeze(-1).unsqueeze(-1) * state + xdt.unsqueeze(-1) * Bh.unsqueeze(-2);
  return torch::matmul(state, Ch.unsqueeze(-1)).squeeze(-1).to(x_t.scalar_type());
}

// ---------------------------------------------------------------------------------------------------------------

Mamba2Impl::Mamba2Impl(const MixerShape& shape, const Mamba2Options& opts) : shape_(shape), opts_(opts) {
  const int64_t hidden = shape.hidden;
  inner_ = opts.expand * hidden;
  heads_ = opts.head_dim > 0 ? inner_ / opts.head_dim : shape.heads;
  head_dim_ = opts.head_dim > 0 ? opts.head_dim : inner_ / shape.heads;
  TORCH_CHECK(heads_ * head_dim_ == inner_, "mamba2: heads * head_dim must equal expand * hidden");
  TORCH_CHECK(heads_ % opts.ngroups == 0, "mamba2: ngroups must divide the number of heads");
  const int64_t GN = opts.ngroups * opts.d_state;
  conv_dim_ = inner_ + 2 * GN;
  in_proj = register_module(
      "in_proj", torch::nn::Linear(torch::nn::LinearOptions(hidden, 2 * inner_ + 2 * GN + heads_).bias(false)));
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
  out_proj = register_module("out_proj", torch::nn::Linear(torch::nn::LinearOptions(inner_, hidden).bias(false)));
}

torch::Tensor Mamba2Impl::A() const { return -torch::exp(A_log.to(compute_type(A_log))); }

namespace {
// Splits the conv output [.., conv_dim] into x [.., H, P], B and C [.., G, N].
void split_xbc(const torch::Tensor& xbc, int64_t inner, int64_t H, int64_t P, int64_t G, int64_t N, torch::Tensor& x,
               torch::Tensor& Bm, torch::Tensor& Cm) {
  auto parts = xbc.split_with_sizes({inner, G * N, G * N}, -1);
  auto lead = xbc.sizes().vec();
  lead.pop_back();
  auto shaped = [&](const torch::Tensor& t, int64_t a, int64_t b) {
    auto s = lead;
    s.push_back(a);
    s.push_back(b);
    return t.reshape(s);
  };
  x = shaped(parts[0], H, P);
  Bm = shaped(parts[1], G, N);
  Cm = shaped(parts[2], G, N);
}
}  // namespace

Mamba2Impl::Inputs Mamba2Impl::project(const torch::Tensor& u) {
  auto parts = in_proj(u).split_with_sizes({inner_, conv_dim_, heads_}, -1);
  auto xbc = conv(parts[1], false);  // the bias comes before the SiLU
  if (conv_bias.defined()) xbc = xbc + conv_bias.to(xbc.scalar_type());
  Inputs in;
  in.z = parts[0];
  split_xbc(torch::silu(xbc), inner_, heads_, head_dim_, opts_.ngroups, opts_.d_state, in.x, in.Bm, in.Cm);
  const auto ct = compute_type(u);
  in.dt = torch::softplus(parts[2].to(ct) + dt_bias.to(ct));
  return in;
}

torch::Tensor Mamba2Impl::finish(const torch::Tensor& y, const Inputs& in, const torch::Tensor& u) {
  // y, in.x [.., H, P]; in.z [.., inner]
  const auto ct = compute_type(u);
  auto yd = y.to(ct) + D.to(ct).view({heads_, 1}) * in.x.to(ct);
  auto g = yd.reshape(in.z.sizes()) * torch::silu(in.z.to(ct));  // norm_before_gate = False: gate, then norm
  return out_proj(rms_norm(g, norm, shape_.norm_eps, opts_.kernels).to(u.scalar_type()));
}

torch::Tensor Mamba2Impl::forward(const torch::Tensor& u) {
  auto in = project(u);
  auto r = ssd_chunked(in.x, in.dt, A(), in.Bm, in.Cm, opts_.chunk, opts_.neg_eigval);
  return finish(r.y, in, u);
}

torch::Tensor Mamba2Impl::forward_reference(const torch::Tensor& u) {
  auto in = project(u);
  auto r = ssd_recurrent(in.x, in.dt, A(), in.Bm, in.Cm, opts_.neg_eigval);
  return finish(r.y, in, u);
}

MixerState Mamba2Impl::init_state(int64_t batch, const torch::TensorOptions& opts) const {
  MixerState s;
  const auto ct = compute_type(opts.dtype());
  s.tensors.push_back(torch::zeros({batch, heads_, head_dim_, opts_.d_state}, opts.dtype(ct)));
  s.tensors.push_back(conv->init_tail(batch, opts));
  return s;
}

torch::Tensor Mamba2Impl::step(const torch::Tensor& u_t, MixerState& s) {
  auto parts = in_proj(u_t).split_with_sizes({inner_, conv_dim_, heads_}, -1);
  auto xbc = conv->step(parts[1], s.tensors[1]);
  if (conv_bias.defined()) xbc = xbc + conv_bias.to(xbc.scalar_type());
  Inputs in;
  in.z = parts[0];
  split_xbc(torch::silu(xbc), inner_, heads_, head_dim_, opts_.ngroups, opts_.d_state, in.x, in.Bm, in.Cm);
  const auto ct = compute_type(u_t);
  in.dt = torch::softplus(parts[2].to(ct) + dt_bias.to(ct));
  auto y = ssd_step(in.x, in.dt, A(), in.Bm, in.Cm, opts_.neg_eigval, s.tensors[0]);  // [B, H, P]
  s.pos += 1;
  return finish(y, in, u_t);
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
