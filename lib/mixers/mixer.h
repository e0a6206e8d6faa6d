#pragma once
// A sequence mixer maps x [B, T, D] to y [B, T, D] causally. Each one has three forms that tests compare:
// forward (training: parallel or chunkwise), step (O(1) per token with an explicit state) and
// forward_reference (a plain per-time-step recurrence, for tests only).
#include <torch/torch.h>

#include <string>
#include <vector>

namespace memlab {

class Config;
class Schema;

// Recurrent state of one mixer: its tensors (matrix memory, KV window, conv tails) and the position.
struct MixerState {
  std::vector<torch::Tensor> tensors;
  int64_t pos = 0;
  // Fixed-shape form only (init_fixed_state): the position as an int64 [1] tensor beside the tensors, for mixers
  // whose step reads it. Undefined in the dynamic form, whose steps read `pos`.
  torch::Tensor position;
};

class MixerImpl : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
  virtual torch::Tensor forward_reference(const torch::Tensor& x) = 0;
  virtual MixerState init_state(int64_t batch, const torch::TensorOptions& opts) const = 0;
  virtual torch::Tensor step(const torch::Tensor& x_t, MixerState& state) = 0;  // x_t [B, D] -> [B, D]
  // The state in fixed-shape form for up to `capacity` steps: step() then never changes a tensor's shape and reads
  // the position from state.position, never from the host, so that one CUDA graph of it serves every step of an
  // episode (rollouts). The default, init_state, suits mixers whose step neither grows a tensor nor reads the
  // position.
  virtual MixerState init_fixed_state(int64_t batch, const torch::TensorOptions& opts, int64_t capacity) const {
    (void)capacity;
    return init_state(batch, opts);
  }
  // Weights that the model's output-layer rescaling applies to (the mixer's output projection).
  virtual torch::Tensor output_weight() = 0;
  // True where the input only feeds linear projections: the block's norm then hands it over in the autocast
  // dtype, saving the projections' casts (and their backward's).
  virtual bool input_feeds_projections_only() const { return false; }
  // Parameters AdamW's weight decay leaves alone: decay rates, time-step biases, gate biases and skip gains
  // (decaying them would drift the memory's time scales), as fla, mamba_ssm and xlstm do.
  const std::vector<torch::Tensor>& no_decay() const { return no_decay_; }

 protected:
  torch::Tensor& register_no_decay(const std::string& name, torch::Tensor t) {
    auto& p = register_parameter(name, std::move(t));
    no_decay_.push_back(p);
    return p;
  }

 private:
  std::vector<torch::Tensor> no_decay_;
};

// Shape of a mixer, read from the config by the registry. A packed run's layer (SequenceModel with K members) holds
// `members` runs' layers side by side: hidden and heads count all members' (member k owns channels
// [k hidden/K, (k+1) hidden/K) and the heads in them), and no channel of one member reads another's.
struct MixerShape {
  int64_t hidden = 0, heads = 0;
  double init_std = 0.02, norm_eps = 1e-6;
  int64_t layer = 0, layers = 1;  // this block's index in the stack (stacks such as xLSTM[m:s] alternate mixers)
  int64_t members = 1;
};

void register_mixer_keys(Schema& schema);
std::vector<std::string> mixer_names();  // names accepted by model.name / --model
// Per parameter of `model`, in the order of model.parameters(): false for its mixers' no_decay() ones.
std::vector<bool> weight_decay_mask(torch::nn::Module& model);
std::shared_ptr<MixerImpl> make_mixer(const std::string& name, const Config& cfg, const MixerShape& shape);

}  // namespace memlab
