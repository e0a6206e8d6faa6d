#include "models/sequence_model.h"

#include "ops/kernels.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <utility>

#include "core/config.h"
#include "mixers/ops.h"
#include "ops/norm/norm.h"
#include "ops/swiglu/swiglu.h"

namespace memlab {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, Kernels kernels, int64_t members)
    : eps_(eps), kernels_(kernels), members_(members) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x, torch::ScalarType out) {
  if (members_ == 1) return rms_norm(x, weight, eps_, kernels_, {}, out);
  // each member's channels as a row of their own, with that member's weight row
  return rms_norm(x.unflatten(-1, {members_, -1}), weight.view({members_, -1}), eps_, kernels_, {}, out).flatten(-2);
}

SwiGLUImpl::SwiGLUImpl(int64_t dim, int64_t inner, Kernels kernels, int64_t members) : kernels_(kernels) {
  gate = register_module("gate", Linear(dim, inner, members));
  up = register_module("up", Linear(dim, inner, members));
  down = register_module("down", Linear(inner, dim, members));
}

torch::Tensor SwiGLUImpl::forward(const torch::Tensor& x) {
  auto gu = linear_stack(x, {gate, up});  // [..., 2 inner (+ padding)], or [..., K, 2 inner (+ padding)]
  const int64_t inner = gate->out_per_member();
  if (gu.size(-1) != 2 * inner) gu = gu.narrow(-1, 0, 2 * inner);  // drop linear_stack's padding columns
  auto h = swiglu(gu, kernels_);
  return down(gate->members() > 1 ? h.flatten(-2) : h);
}

BlockImpl::BlockImpl(std::shared_ptr<MixerImpl> m, int64_t dim, int64_t mlp_inner, double eps, Kernels kernels,
                     double p, int64_t members)
    : mixer(std::move(m)), dropout(p) {
  register_module("mixer", mixer);
  norm1 = register_module("norm1", RMSNorm(dim, eps, kernels, members));
  if (mlp_inner > 0) {
    norm2 = register_module("norm2", RMSNorm(dim, eps, kernels, members));
    mlp = register_module("mlp", SwiGLU(dim, mlp_inner, kernels, members));
  }
}

torch::Tensor BlockImpl::mixer_input(const torch::Tensor& x) {
  return norm1->forward(x, mixer->input_feeds_projections_only() ? projection_input_type(x) : x.scalar_type());
}

torch::Tensor BlockImpl::finish(const torch::Tensor& h) {
  return mlp ? h + drop(mlp(norm2->forward(h, projection_input_type(h)))) : h;
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) { return finish(x + drop(mixer->forward(mixer_input(x)))); }

torch::Tensor BlockImpl::forward_rows(const torch::Tensor& x, const torch::Tensor& rows, int64_t members) {
  auto h = x + drop(mixer->forward(mixer_input(x)));  // [B, T, K D]
  const int64_t B = h.size(0), W = h.size(2) / members;
  auto at = h.view({B, h.size(1), members, W}).gather(1, rows.view({B, 1, members, 1}).expand({B, 1, members, W}));
  return finish(at.view({B, members * W}));
}

torch::Tensor BlockImpl::forward_reference(const torch::Tensor& x) {
  return finish(x + drop(mixer->forward_reference(mixer_input(x))));
}

torch::Tensor BlockImpl::step(const torch::Tensor& x_t, MixerState& s) {
  return finish(x_t + drop(mixer->step(mixer_input(x_t), s)));
}

int64_t default_mlp_inner(int64_t hidden, int64_t ratio) {
  const int64_t raw = static_cast<int64_t>(hidden * ratio * 2.0 / 3.0);
  return 256 * ((raw + 255) / 256);
}

// Built-in defaults are the quick CPU setting (configs/quick/parity_deltanet_neg.yaml); the paper settings
// live in configs/.
void register_model_keys(Schema& s) {
  {
    std::string names;
    for (const auto& n : mixer_names()) names += (names.empty() ? "" : ", ") + n;
    s.add_string("model.name", "deltanet", "sequence mixer used in every block: " + names, mixer_names());
  }
  s.add_int("model.hidden", 32, "model width", 1, 1 << 16);
  s.add_int("model.heads", 2, "heads per mixer", 1, 1024);
  s.add_int("model.layers", 2, "number of blocks", 1, 1024);
  s.add_bool("model.mlp", true, "SwiGLU MLP after each mixer");
  s.add_int("model.mlp_ratio", 4, "MLP width ratio (inner = 256*ceil(int(hidden*ratio*2/3)/256))", 1, 64);
  s.add_int("model.mlp_inner", 64, "MLP inner width; 0 = from mlp_ratio", 0, 1 << 20);
  s.add_float("model.init_std", 0.006, "std of the normal initialisation of linear and embedding weights", 0.0, 1.0);
  s.add_float("model.norm_eps", 1e-6, "RMSNorm epsilon", 0.0, 1.0);
  s.add_string("model.head", "lm",
               "lm: next-token logits per position; autoencoder: MAD's AutoEncoder (pool the last token, "
               "decode every position with an MLP; for mad_compression)",
               {"lm", "autoencoder"});
  register_kernels_key(s);
  register_mixer_keys(s);
}

std::vector<Block> make_blocks(const Config& cfg, torch::nn::Module& owner, double dropout, int64_t members) {
  const int64_t D = cfg.get_int("model.hidden"), H = cfg.get_int("model.heads"), L = cfg.get_int("model.layers");
  if (D % H != 0) cfg.fail("model.heads", fmt::format("must divide model.hidden = {}", D));
  const double eps = cfg.get_float("model.norm_eps"), std = cfg.get_float("model.init_std");
  int64_t inner = 0;
  if (cfg.get_bool("model.mlp"))
    inner = cfg.get_int("model.mlp_inner") > 0 ? cfg.get_int("model.mlp_inner")
                                               : default_mlp_inner(D, cfg.get_int("model.mlp_ratio"));
  MixerShape shape{members * D, members * H, std, eps};
  shape.layers = L;
  shape.members = members;
  const std::string name = cfg.get_string("model.name");
  std::vector<Block> blocks;
  for (int64_t l = 0; l < L; ++l) {
    shape.layer = l;
    blocks.push_back(
        owner.register_module(fmt::format("block{}", l), Block(make_mixer(name, cfg, shape), members * D, members * inner,
                                                               eps, kernels_option(cfg), dropout, members)));
  }
  return blocks;
}

double min_block_params(const Config& cfg) {
  const double D = static_cast<double>(cfg.get_int("model.hidden")), L = static_cast<double>(cfg.get_int("model.layers"));
  double inner = 0;
  if (cfg.get_bool("model.mlp"))
    inner = cfg.get_int("model.mlp_inner") > 0
                ? static_cast<double>(cfg.get_int("model.mlp_inner"))
                : static_cast<double>(default_mlp_inner(cfg.get_int("model.hidden"), cfg.get_int("model.mlp_ratio")));
  return L * (4 * D * D + 3 * D * inner);
}

// fla's initialisation: N(0, std) for linear, embedding and short-conv weights (linear biases zero), then
// the residual-output projections (mixer output and MLP down) re-drawn kaiming-uniform and scaled by
// 1/sqrt(2 * layers). Other parameters (gate biases, decay rates, norms) keep their mixer's own init.
void init_fla_weights(torch::nn::Module& owner, const std::vector<Block>& blocks, double std) {
  torch::NoGradGuard ng;
  for (auto& m : owner.modules(/*include_self=*/false)) {
    if (auto* lin = dynamic_cast<LinearImpl*>(m.get())) {
      lin->weight.normal_(0.0, std);
      if (lin->bias.defined()) lin->bias.zero_();
    } else if (auto* emb = dynamic_cast<torch::nn::EmbeddingImpl*>(m.get())) {
      emb->weight.normal_(0.0, std);
    } else if (auto* conv = dynamic_cast<ShortConvImpl*>(m.get())) {
      conv->weight.normal_(0.0, std);
    }
  }
  const double L = static_cast<double>(blocks.size());
  for (const auto& b : blocks) {
    std::vector<torch::Tensor> outs{b->mixer->output_weight()};
    if (b->mlp) outs.push_back(b->mlp->down->weight);
    for (auto& w : outs) {
      torch::nn::init::kaiming_uniform_(w, std::sqrt(5.0));
      w.div_(std::sqrt(2.0 * L));
    }
  }
}

SequenceModelImpl::SequenceModelImpl(const Config& cfg, int64_t vocab, int64_t members) : members_(members) {
  const int64_t D = cfg.get_int("model.hidden"), K = members;
  const double eps = cfg.get_float("model.norm_eps");
  if (K > 1 && cfg.get_string("model.head") == "autoencoder")
    cfg.fail("model.head", "autoencoder runs cannot be packed yet (packed runs take model.head lm)");
  embed = register_module("embed", torch::nn::Embedding(K * vocab, D));
  blocks = make_blocks(cfg, *this, 0.0, K);
  norm = register_module("norm", RMSNorm(K * D, eps, kernels_option(cfg), K));
  head = register_module("head", Linear(K * D, K * vocab, K));
  if (cfg.get_string("model.head") == "autoencoder") {
    dec_norm1 = register_module("dec_norm1", RMSNorm(D, eps, kernels_option(cfg)));
    dec_fc1 = register_module("dec_fc1", Linear(D, D, 1, /*bias=*/true));
    dec_norm2 = register_module("dec_norm2", RMSNorm(D, eps, kernels_option(cfg)));
    dec_fc2 = register_module("dec_fc2", Linear(D, D, 1, /*bias=*/true));
  }
  init_fla_weights(*this, blocks, cfg.get_float("model.init_std"));
}

torch::Tensor sincos_positions(int64_t T, int64_t D, const torch::TensorOptions& opts) {
  const int64_t half = D / 2;
  auto t = torch::arange(T, opts).unsqueeze(1);
  auto w = torch::exp(torch::arange(half, opts) * (-std::log(10000.0) / std::max<int64_t>(half, 1)));
  auto pe = torch::cat({torch::sin(t * w), torch::cos(t * w)}, 1);
  return D % 2 ? torch::cat({pe, torch::zeros({T, 1}, opts)}, 1) : pe;
}

namespace {

// Vocabularies up to this size take the one-hot backward below (its [tokens, V] fp32 one-hot stays small).
constexpr int64_t kOneHotVocab = 64;

// The token embedding, with a backward that suits the tasks' small vocabularies: dW = onehot(tokens)ᵀ dY as
// one matmul per member (member_weight_grad), where ATen's embedding backward sorts the tokens first (29 kernel
// launches per step). A member's NaN never meets another's rows, not even as 0 x NaN.
class TokenEmbeddingFunction : public torch::autograd::Function<TokenEmbeddingFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor weight, torch::Tensor tokens,
                               int64_t members) {
    ctx->save_for_backward({tokens});
    ctx->saved_data["vocab"] = weight.size(0) / members;
    ctx->saved_data["members"] = members;
    ctx->saved_data["dtype"] = static_cast<int64_t>(weight.scalar_type());
    return lookup(weight, tokens, members);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const int64_t V = ctx->saved_data["vocab"].toInt(), K = ctx->saved_data["members"].toInt();
    auto tokens = ctx->get_saved_variables()[0].reshape({-1, K});  // [N, K]
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    if (!grads[0].defined()) return {torch::Tensor(), torch::Tensor(), torch::Tensor()};
    auto dy = grads[0].reshape({tokens.size(0), K, -1});  // [N, K, D]
    auto onehot = tokens.unsqueeze(-1).eq(torch::arange(V, tokens.options())).to(dy.scalar_type());  // [N, K, V]
    auto dw = member_weight_grad(onehot.transpose(0, 1), dy.transpose(0, 1)).reshape({K * V, -1});
    return {dw.to(dtype), torch::Tensor(), torch::Tensor()};
  }

  // weight [K V, D], tokens [...] (K = 1) or [..., K] -> [..., D] or [..., K D]
  static torch::Tensor lookup(const torch::Tensor& weight, const torch::Tensor& tokens, int64_t K) {
    if (K == 1) {
      auto sizes = tokens.sizes().vec();
      sizes.push_back(weight.size(1));
      return weight.index_select(0, tokens.reshape(-1)).view(sizes);
    }
    return torch::embedding(weight, member_rows(weight, tokens, K)).flatten(-2);
  }

  // member k's token ids as rows of its own table
  static torch::Tensor member_rows(const torch::Tensor& weight, const torch::Tensor& tokens, int64_t K) {
    return tokens + torch::arange(K, tokens.options()) * (weight.size(0) / K);
  }
};

}  // namespace

torch::Tensor token_embedding(const torch::Tensor& weight, const torch::Tensor& tokens, int64_t members) {
  TORCH_CHECK(members == 1 || tokens.size(-1) == members, "token_embedding: tokens [..., ", members, "] expected");
  if (weight.size(0) / members > kOneHotVocab || !torch::GradMode::is_enabled() || !weight.requires_grad())
    return members == 1 ? torch::embedding(weight, tokens)
                        : torch::embedding(weight, TokenEmbeddingFunction::member_rows(weight, tokens, members))
                              .flatten(-2);
  return TokenEmbeddingFunction::apply(weight, tokens, members);
}

torch::Tensor SequenceModelImpl::embed_tokens(const torch::Tensor& tokens) {
  return token_embedding(embed->weight, tokens, members_);
}

torch::Tensor SequenceModelImpl::output(const torch::Tensor& tokens, const torch::Tensor& h) {
  if (!autoencoder()) {
    auto logits = head(norm->forward(h, projection_input_type(h)));
    return members_ == 1 ? logits : logits.unflatten(-1, {members_, -1});
  }
  const int64_t B = h.size(0), T = h.size(1), D = h.size(2);
  // the last real token of each row: batches are right-padded with id 0, which no task uses otherwise
  auto last = (tokens != 0).sum(1).sub(1).clamp_min(0);
  auto pooled = h.gather(1, last.view({B, 1, 1}).expand({B, 1, D}));  // [B, 1, D]
  // positions in fp32 at least: bf16 cannot count past 256
  const auto pos_type = h.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  auto x = pooled + sincos_positions(T, D, h.options().dtype(pos_type)).unsqueeze(0);
  x = torch::gelu(dec_fc1(dec_norm1(x)));
  x = torch::gelu(dec_fc2(dec_norm2(x)));
  return head(norm(x));
}

torch::Tensor SequenceModelImpl::forward(const torch::Tensor& tokens) {
  auto h = embed_tokens(tokens);
  for (auto& b : blocks) h = b(h);
  return output(tokens, h);
}

torch::Tensor SequenceModelImpl::forward_rows(const torch::Tensor& tokens, const torch::Tensor& rows) {
  if (autoencoder()) throw std::logic_error("forward_rows: the autoencoder head decodes every position");
  auto h = embed_tokens(tokens);
  for (size_t l = 0; l + 1 < blocks.size(); ++l) h = blocks[l](h);
  return output(tokens, blocks.back()->forward_rows(h, rows, members_));
}

torch::Tensor SequenceModelImpl::forward_reference(const torch::Tensor& tokens) {
  auto h = embed_tokens(tokens);
  for (auto& b : blocks) h = b->forward_reference(h);
  return output(tokens, h);
}

std::vector<MixerState> SequenceModelImpl::init_state(int64_t batch, const torch::TensorOptions& opts) const {
  if (members_ > 1) throw std::logic_error("a packed model has no one-token step(): unpack a member (member_parameters)");
  std::vector<MixerState> s;
  for (const auto& b : blocks) s.push_back(b->mixer->init_state(batch, opts));
  return s;
}

torch::Tensor SequenceModelImpl::step(const torch::Tensor& token_t, std::vector<MixerState>& state) {
  if (autoencoder())
    throw std::logic_error("model.head autoencoder has no one-token step(): every output reads the last input token");
  auto h = embed_tokens(token_t);
  for (size_t l = 0; l < blocks.size(); ++l) h = blocks[l]->step(h, state[l]);
  return head(norm->forward(h, projection_input_type(h)));
}

int64_t SequenceModelImpl::num_params() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n / members_;
}

std::vector<torch::Tensor> member_parameters(const SequenceModel& packed, int64_t k) {
  const int64_t K = packed->members();
  std::vector<torch::Tensor> out;
  for (const auto& p : packed->parameters()) out.push_back(p.view({K, -1}).select(0, k));
  return out;
}

namespace {
// Member k's slices and the one-member model's parameters, checked to match.
std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>> member_and_solo(const SequenceModel& packed,
                                                                                    int64_t k,
                                                                                    const SequenceModel& solo) {
  auto slices = member_parameters(packed, k);
  auto params = solo->parameters();
  TORCH_CHECK(params.size() == slices.size(), "packed model: the member's parameters do not match the packed model's");
  for (size_t i = 0; i < params.size(); ++i)
    TORCH_CHECK(params[i].numel() == slices[i].numel(), "packed model: parameter ", i, " has ", params[i].numel(),
                " elements, its packed slice ", slices[i].numel());
  return {slices, params};
}
}  // namespace

void pack_members(SequenceModel& packed, const std::vector<SequenceModel>& solo) {
  TORCH_CHECK(static_cast<int64_t>(solo.size()) == packed->members(), "pack_members: ", packed->members(),
              " members, ", solo.size(), " models");
  torch::NoGradGuard ng;
  for (size_t k = 0; k < solo.size(); ++k) {
    auto [slices, params] = member_and_solo(packed, static_cast<int64_t>(k), solo[k]);
    for (size_t i = 0; i < params.size(); ++i) slices[i].copy_(params[i].reshape(-1));
  }
}

void unpack_member(const SequenceModel& packed, int64_t k, SequenceModel& solo) {
  torch::NoGradGuard ng;
  auto [slices, params] = member_and_solo(packed, k, solo);
  for (size_t i = 0; i < params.size(); ++i) params[i].view(-1).copy_(slices[i]);
}

}  // namespace memlab
