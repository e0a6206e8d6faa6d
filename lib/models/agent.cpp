#include "models/agent.h"

#include <ATen/autocast_mode.h>

#include <stdexcept>

#include "core/config.h"
#include "ops/kernels.h"
#include "envs/visual_match.h"

namespace memlab {

MlpHeadImpl::MlpHeadImpl(int64_t in, int64_t hidden, int64_t n_out) {
  fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
  fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden));
  out = register_module("out", torch::nn::Linear(hidden, n_out));
}

namespace {

// y = x Wᵀ + b on rows x [N, in], as torch::linear, ReLU'd where asked, in one GEMM with its epilogue
// (_addmm_activation: cuBLASLt adds the bias and applies the ReLU); the bias gradient is dZᵀ 1 by GEMV, where ATen's
// column sum over the N = 50k rows of a SAC update ran at about a tenth of the memory bandwidth (0.59 ms of a 6.5 ms
// update on an H200). GEMV is not a tensor-core product, so TF32 leaves the bias gradient in fp32.
class RowsLinearFunction : public torch::autograd::Function<RowsLinearFunction> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& w,
                               const torch::Tensor& b, bool relu) {
    auto y = relu ? at::_addmm_activation(b, x, w.t()) : torch::addmm(b, x, w.t());
    ctx->save_for_backward({x, w, relu ? y : torch::Tensor()});
    return y;
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& w = saved[1];
    auto dz = grads[0].contiguous();
    if (saved[2].defined()) dz = torch::threshold_backward(dz, saved[2], 0.0);  // ReLU: through where y > 0
    torch::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) dx = dz.mm(w);
    if (ctx->needs_input_grad(1)) dw = dz.t().mm(x);
    if (ctx->needs_input_grad(2)) db = dz.t().mv(torch::ones({dz.size(0)}, dz.options()));
    return {dx, dw, db, torch::Tensor()};
  }
};

torch::Tensor rows_linear(const torch::Tensor& x, const torch::nn::Linear& l, bool relu) {
  // Autocast would run the forward's GEMM in bf16 and hand the backward bf16 gradients for fp32 weights: the heads
  // run outside it (agent.h).
  if (at::autocast::is_autocast_enabled(x.device().type()))
    throw std::logic_error("the actor and critic heads run outside autocast");
  return RowsLinearFunction::apply(x, l->weight, l->bias, relu);
}

}  // namespace

torch::Tensor MlpHeadImpl::forward(const torch::Tensor& x) {
  // On rows [N, in]: each layer is then one addmm with its bias in the GEMM (on [B, T, in] ATen ran a matmul, a
  // bias add and, backward, a row sum per layer).
  auto lead = x.sizes().vec();
  lead.back() = out->weight.size(0);
  const auto rows = x.reshape({-1, x.size(-1)});
  return rows_linear(rows_linear(rows_linear(rows, fc1, true), fc2, true), out, false).view(lead);
}

TwinQImpl::TwinQImpl(int64_t in, int64_t hidden, int64_t actions) {
  q1 = register_module("q1", MlpHead(in, hidden, actions));
  q2 = register_module("q2", MlpHead(in, hidden, actions));
}

std::pair<torch::Tensor, torch::Tensor> TwinQImpl::forward(const torch::Tensor& h) { return {q1(h), q2(h)}; }

void register_agent_keys(Schema& s) {
  s.add_float("rl.obs_dropout", 0.1, "dropout on the observation embedding", 0.0, 0.99);
  s.add_float("rl.dropout", 0.1, "dropout on each block's mixer and MLP outputs", 0.0, 0.99);
  s.add_int("rl.head_hidden", 256, "width of the actor's and critics' two hidden layers", 1, 1 << 16);
}

namespace {

// A valid, stride-1 convolution of O filters [C, k, k] over a [C, S, S] input as a dense map from the flattened
// input (c, y, x) to the flattened output (o, i, j): the placement of each weight entry in that matrix.
AgentImpl::ConvPlacement conv_placement(int64_t O, int64_t C, int64_t S, int64_t k) {
  const int64_t n = S - k + 1;
  AgentImpl::ConvPlacement p;
  p.rows = O * n * n;
  p.cols = C * S * S;
  p.positions = n * n;
  std::vector<int64_t> dest, src;
  for (int64_t o = 0; o < O; ++o)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j)
        for (int64_t c = 0; c < C; ++c)
          for (int64_t a = 0; a < k; ++a)
            for (int64_t b = 0; b < k; ++b) {
              dest.push_back(((o * n + i) * n + j) * p.cols + (c * S + i + a) * S + j + b);
              src.push_back(((o * C + c) * k + a) * k + b);
            }
  p.dest = torch::tensor(dest, torch::kLong);
  p.src = torch::tensor(src, torch::kLong);
  return p;
}

// conv(x) for x [N, C*S*S]: the dense matrix of the weight (each output pixel meets each input pixel through
// at most one weight entry) times x, plus the bias per output channel.
torch::Tensor conv_as_matmul(const torch::Tensor& x, const torch::nn::Conv2d& conv, AgentImpl::ConvPlacement& p) {
  const auto& w = conv->weight;
  if (p.dest.device() != w.device()) {
    c10::InferenceMode normal(false);  // kept for training, where inference tensors cannot be saved for backward
    p.dest = p.dest.to(w.device()), p.src = p.src.to(w.device());
  }
  const auto dense = torch::zeros({p.rows * p.cols}, w.options())
                         .index_put({p.dest}, w.flatten().index_select(0, p.src))
                         .view({p.rows, p.cols});
  return torch::linear(x, dense, conv->bias.repeat_interleave(p.positions));
}

}  // namespace

AgentImpl::AgentImpl(const Config& cfg) : obs_dropout(cfg.get_float("rl.obs_dropout")) {
  const int64_t D = cfg.get_int("model.hidden");
  // The blocks first, so that fla's initialisation below reaches them only; the encoder and the heads keep
  // torch's default initialisation, as in the reference.
  blocks = make_blocks(cfg, *this, cfg.get_float("rl.dropout"));
  norm = register_module("norm", RMSNorm(D, cfg.get_float("model.norm_eps"), kernels_option(cfg)));
  init_fla_weights(*this, blocks, cfg.get_float("model.init_std"));
  conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(kObsChannels, 8, 2)));
  conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 16, 2)));
  constexpr int64_t side = kView - 2;  // two 2x2 convolutions without padding: 5 -> 4 -> 3
  place1 = conv_placement(8, kObsChannels, kView, 2);
  place2 = conv_placement(16, 8, kView - 1, 2);
  embed = register_module("embed", torch::nn::Linear(16 * side * side, D));
  const int64_t hid = cfg.get_int("rl.head_hidden");
  actor = register_module("actor", MlpHead(D, hid, kNumActions));
  critic = register_module("critic", TwinQ(D, hid, kNumActions));
}

torch::Tensor AgentImpl::encode(const torch::Tensor& obs) {
  auto lead = obs.sizes().vec();
  lead.pop_back();
  auto x = obs.reshape({-1, kObsSize}).to(conv1->weight.scalar_type()).div(255.0);
  x = torch::relu(conv_as_matmul(torch::relu(conv_as_matmul(x, conv1, place1)), conv2, place2));
  lead.push_back(-1);
  return embed(x).reshape(lead);
}

torch::Tensor AgentImpl::forward(const torch::Tensor& obs) {
  auto h = torch::dropout(encode(obs), obs_dropout, is_training());
  for (auto& b : blocks) h = b(h);
  return norm(h);
}

torch::Tensor AgentImpl::forward_reference(const torch::Tensor& obs) {
  auto h = torch::dropout(encode(obs), obs_dropout, is_training());
  for (auto& b : blocks) h = b->forward_reference(h);
  return norm(h);
}

std::vector<MixerState> AgentImpl::init_state(int64_t batch, const torch::TensorOptions& opts) const {
  std::vector<MixerState> s;
  for (const auto& b : blocks) s.push_back(b->mixer->init_state(batch, opts));
  return s;
}

std::vector<MixerState> AgentImpl::init_fixed_state(int64_t batch, const torch::TensorOptions& opts,
                                                    int64_t capacity) const {
  std::vector<MixerState> s;
  for (const auto& b : blocks) s.push_back(b->mixer->init_fixed_state(batch, opts, capacity));
  return s;
}

torch::Tensor AgentImpl::step(const torch::Tensor& obs_t, std::vector<MixerState>& state) {
  auto h = torch::dropout(encode(obs_t), obs_dropout, is_training());
  for (size_t l = 0; l < blocks.size(); ++l) h = blocks[l]->step(h, state[l]);
  return norm(h);
}

int64_t AgentImpl::num_params() const {
  int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

}  // namespace memlab
