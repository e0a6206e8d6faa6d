#include "rl/policy_step.h"

#include <cstring>
#include <set>
#include <stdexcept>

#include "envs/visual_match.h"
#include "mixers/ops.h"

namespace memlab {

torch::Tensor choose_actions(const torch::Tensor& logits, ActMode mode) {
  if (mode == ActMode::Greedy) return logits.argmax(-1);
  const auto p = torch::softmax(logits, -1);
  return p.div(torch::empty_like(p).exponential_(1.0)).argmax(-1);
}

PolicyStep::PolicyStep(Agent agent, int64_t envs, int64_t capacity, ActMode mode, bool dropout, bool bf16,
                       const torch::Device& device, bool graph)
    : agent_(std::move(agent)),
      mode_(mode),
      dropout_(dropout),
      bf16_(bf16),
      device_(device),
      graph_(graph && device.is_cuda()) {
  if (mode == ActMode::Random) throw std::invalid_argument("PolicyStep: random actions need no agent");
  c10::InferenceMode inference;
  const auto dtype = agent_->norm->weight.scalar_type();
  initial_ = agent_->init_fixed_state(envs, torch::TensorOptions().dtype(dtype).device(device), capacity);
  state_ = initial_;
  for (auto& s : state_) {
    for (auto& t : s.tensors) t = t.clone();
    if (s.position.defined()) s.position = s.position.clone();
  }
  const auto host = torch::TensorOptions().pinned_memory(device.is_cuda());
  obs_host_ = torch::zeros({envs, kObsSize}, host.dtype(torch::kUInt8));
  obs_dev_ = device.is_cuda() ? obs_host_.to(device) : obs_host_;
  act_dev_ = torch::zeros({envs}, torch::TensorOptions().dtype(torch::kLong).device(device));
}

void PolicyStep::reset() {
  c10::InferenceMode inference;
  for (size_t l = 0; l < state_.size(); ++l) {
    for (size_t i = 0; i < state_[l].tensors.size(); ++i) state_[l].tensors[i].copy_(initial_[l].tensors[i]);
    if (state_[l].position.defined()) state_[l].position.copy_(initial_[l].position);
    state_[l].pos = 0;
  }
}

void PolicyStep::compute() {
  std::vector<MixerState> st = state_;  // the step may hand back new tensors: copied into the fixed ones below
  torch::Tensor h;
  {
    Bf16Autocast autocast(bf16_);
    h = agent_->step(obs_dev_, st);
  }
  act_dev_.copy_(choose_actions(agent_->actor(h.to(torch::kFloat)), mode_));
  for (size_t l = 0; l < st.size(); ++l)
    for (size_t i = 0; i < st[l].tensors.size(); ++i) {
      const auto& now = st[l].tensors[i];
      auto& fixed = state_[l].tensors[i];
      if (now.sizes() != fixed.sizes())
        throw std::logic_error("a mixer's fixed-shape step changed the shape of its state");
      if (now.data_ptr() != fixed.data_ptr()) fixed.copy_(now);
    }
  for (size_t l = 0; l < st.size(); ++l)  // positions advance in place: a new tensor would not be copied back
    if (st[l].position.defined() && !st[l].position.is_same(state_[l].position))
      throw std::logic_error("a mixer's fixed-shape step replaced its position tensor");
}

const int64_t* PolicyStep::act(const uint8_t* obs) {
  c10::InferenceMode inference;
  std::memcpy(obs_host_.data_ptr<uint8_t>(), obs, static_cast<size_t>(obs_host_.numel()));
  if (device_.is_cuda()) obs_dev_.copy_(obs_host_, /*non_blocking=*/true);
  const bool was_training = agent_->is_training();
  agent_->train(dropout_);
  graph_.run([this] { compute(); });
  agent_->train(was_training);
  act_host_ = act_dev_.to(torch::kCPU);  // waits for the step
  for (auto& s : state_) s.pos += 1;
  return act_host_.data_ptr<int64_t>();
}

PolicyStep& PolicySteps::get(int64_t envs, int64_t capacity, ActMode mode, bool dropout) {
  auto& p = steps_[{envs, capacity, static_cast<int>(mode), dropout}];
  if (!p) p = std::make_unique<PolicyStep>(agent_, envs, capacity, mode, dropout, bf16_, device_, graph_);
  return *p;
}

std::string PolicySteps::mode() const {
  std::set<std::string> modes;
  for (const auto& [key, step] : steps_) modes.insert(step->mode());
  std::string out;
  for (const auto& m : modes) out += (out.empty() ? "fixed-shape, " : " / ") + m;
  return out.empty() ? "fixed-shape (not used yet)" : out;
}

}  // namespace memlab
