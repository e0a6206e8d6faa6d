#include "models/agent.h"

#include "core/config.h"
#include "ops/kernels.h"
#include "envs/visual_match.h"

namespace memlab {

MlpHeadImpl::MlpHeadImpl(int64_t in, int64_t hidden, int64_t n_out) {
  fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
  fc2 = register_module("fc2", torch::nn::Linear(hidden, hidden));
  out = register_module("out", torch::nn::Linear(hidden, n_out));
}

torch::Tensor MlpHeadImpl::forward(const torch::Tensor& x) {
  return out(torch::relu(fc2(torch::relu(fc1(x)))));
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
  embed = register_module("embed", torch::nn::Linear(16 * side * side, D));
  const int64_t hid = cfg.get_int("rl.head_hidden");
  actor = register_module("actor", MlpHead(D, hid, kNumActions));
  critic = register_module("critic", TwinQ(D, hid, kNumActions));
}

torch::Tensor AgentImpl::encode(const torch::Tensor& obs) {
  auto lead = obs.sizes().vec();
  lead.pop_back();
  auto x = obs.reshape({-1, kObsChannels, kView, kView}).to(conv1->weight.scalar_type()).div(255.0);
  x = torch::relu(conv2(torch::relu(conv1(x))));
  lead.push_back(-1);
  return embed(x.flatten(1)).reshape(lead);
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
