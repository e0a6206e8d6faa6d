#pragma once
// The sLSTM mixer: the xLSTM sLSTM layer around the recurrence of ops/slstm/slstm.h.
#include <torch/torch.h>

#include "mixers/mixer.h"
#include "mixers/ops.h"
#include "ops/slstm/slstm.h"

namespace memlab {

struct SLstmOptions {
  int64_t conv_size{};  // causal conv + SiLU feeding the i and f gates; 0 = none
  Kernels kernels{};  // the forms of the recurrence and the short conv
};

// model.slstm.* keys, the SLstm options they give, and the mixer built from them (checked against
// the shape). The schema holds the defaults; tests build options from it too.
void register_slstm_keys(Schema& s);
SLstmOptions slstm_options(const Config& cfg);
std::shared_ptr<MixerImpl> make_slstm(const Config& cfg, const MixerShape& shape);

// The xLSTM sLSTM layer (xlstm/blocks/slstm/layer.py), plus an output projection:
//   x_c = SiLU(conv(x));  [ĩ, f̃] = W_if x_c,  [z̃, õ] = W_zo x  (+ bias);  h = sLSTM(...)
//   y = o_proj(headwise LayerNorm(h))
// Initialisation as xlstm's defaults: R = 0 ("zeros" recurrent_weight_init), biases 0 except the forget gate's
// "powerlaw_blockdependent" init: unit j of each head gets -(-5 + 12 (j / (dh - 1))^(0.3 + 1.3 l / (L - 1)))
// for block l of L, i.e. from 5 down to -7 (a spread of time scales, shallower blocks forgetting faster).
// Differences from xlstm: W_if, W_zo are dense (xlstm: block-diagonal per head), the conv has no bias, and the
// layer ends in o_proj (xlstm's sLSTM block follows the layer with a gated MLP instead; memlab's block has its
// own optional MLP). The head norm's weight is stored as w and used as 1 + w, as in xlstm.
class SLstmImpl : public MixerImpl {
 public:
  SLstmImpl(const MixerShape& shape, const SLstmOptions& opts);
  torch::Tensor forward(const torch::Tensor& x) override;
  torch::Tensor forward_reference(const torch::Tensor& x) override;
  // State: h, c, n, m [B, H, dh] (compute type), then the conv tail when conv_size > 0.
  MixerState init_state(int64_t batch, const torch::TensorOptions& opts) const override;
  torch::Tensor step(const torch::Tensor& x_t, MixerState& state) override;
  torch::Tensor output_weight() override { return o_proj->weight; }

  torch::Tensor recurrent_kernel;  // R [H, dh, 4 dh]
  torch::Tensor gate_bias;         // [H, 4, dh]
  torch::Tensor norm_weight;       // [hidden], used as 1 + w

 private:
  torch::Tensor pre_activations(const torch::Tensor& x, const torch::Tensor& x_c);  // [..., H, 4, dh]
  torch::Tensor finish(const torch::Tensor& h, const torch::Tensor& x);

  MixerShape shape_;
  SLstmOptions opts_;
  int64_t head_dim_;
  Linear if_proj{nullptr}, zo_proj{nullptr}, o_proj{nullptr};
  ShortConv conv{nullptr};
};

}  // namespace memlab
