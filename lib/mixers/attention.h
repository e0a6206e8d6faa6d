#pragma once
// Causal softmax attention (the Transformer's mixer): optional sliding window of S keys (the current one
// included), RoPE or no positional encoding, scale 1/sqrt(d), output projection.
#include "mixers/mixer.h"
#include "mixers/ops.h"

namespace memlab {

struct AttentionOptions {
  int64_t window{};  // 0 = full causal context
  bool rope{};
  double rope_theta{};
};

// model.attention.* keys, the Attention options they give, and the mixer built from them (checked against
// the shape). The schema holds the defaults; tests build options from it too.
void register_attention_keys(Schema& s);
AttentionOptions attention_options(const Config& cfg);
std::shared_ptr<MixerImpl> make_attention(const Config& cfg, const MixerShape& shape);

class AttentionImpl : public MixerImpl {
 public:
  AttentionImpl(const MixerShape& shape, const AttentionOptions& opts);
  torch::Tensor forward(const torch::Tensor& x) override;
  torch::Tensor forward_reference(const torch::Tensor& x) override;
  MixerState init_state(int64_t batch, const torch::TensorOptions& opts) const override;
  // Fixed form: keys and values [B, H, capacity, d], slot t written at step t, read under a mask.
  MixerState init_fixed_state(int64_t batch, const torch::TensorOptions& opts, int64_t capacity) const override;
  // State: cached keys and values [B, H, n, d] (n <= window when windowed), already rotated.
  torch::Tensor step(const torch::Tensor& x_t, MixerState& state) override;
  torch::Tensor output_weight() override { return o_proj->weight; }

 private:
  // q, k, v as [B, T, H, d] with RoPE applied from position `offset`, or from `offset_t` where defined.
  std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> qkv(const torch::Tensor& x, int64_t offset,
                                                              const torch::Tensor& offset_t = {});
  torch::Tensor fixed_step(const torch::Tensor& x_t, MixerState& state);

  MixerShape shape_;
  AttentionOptions opts_;
  int64_t head_dim_;
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
};

}  // namespace memlab
