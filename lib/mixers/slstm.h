#pragma once
// sLSTM (Beck et al. 2024, xLSTM): a scalar memory cell per unit with recurrent ("memory mixing") weights R,
// block-diagonal with one block per head. Per unit, with gate pre-activations from the input (W x + b) plus
// R h_{t-1}:  ĩ, f̃, z̃, õ;  log f = logsigmoid(f̃)
//   m_t = max(ĩ_t, log f_t + m_{t-1})  (m_t = ĩ_t while n_{t-1} = 0, i.e. at the first token of a zero state)
//   i' = exp(ĩ_t - m_t), f' = exp(log f_t + m_{t-1} - m_t)
//   c_t = f' c_{t-1} + i' tanh(z̃_t),  n_t = f' n_{t-1} + i',  h_t = sigmoid(õ_t) c_t / n_t
// The stabiliser cancels exactly in c_t / n_t. The zero-state rule is xlstm's vanilla backend
// (xlstm/blocks/slstm/src/vanilla/slstm.py: m = ĩ when n == 0), applied per unit: it keeps n_t >= 1, and the
// all-zero state stays a valid fresh state (resets by zeroing work).
//
// Layout: pre [B, T, H, 4, dh] (gates in the order i, f, z, o; input part and bias only), R [H, dh, 4 dh]
// (row = unit of h_{t-1} in the head, column = gate * dh + unit). fla has no sLSTM. Everything runs in fp32
// (fp64 for fp64 inputs); h comes back in pre's dtype.
#include <torch/torch.h>

#include "mixers/mixer.h"
#include "mixers/ops.h"

namespace memlab {

struct SLstmState {
  torch::Tensor h, c, n, m;  // [B, H, dh] each
};

struct SLstmOut {
  torch::Tensor h;  // [B, T, H, dh]
  SLstmState state;
};

SLstmState slstm_zero_state(int64_t B, int64_t H, int64_t dh, const torch::TensorOptions& opts);

// Training form: the input part is precomputed for all t by the caller; per step one batched matmul over heads
// with R and the pointwise cell update. Inherently sequential (R makes the recurrence nonlinear).
SLstmOut slstm_forward(const torch::Tensor& pre, const torch::Tensor& R, const SLstmState& init = {});
// Independent plain implementation of the same equations (per time step, per head); tests only.
SLstmOut slstm_reference(const torch::Tensor& pre, const torch::Tensor& R, const SLstmState& init = {});
// One token: pre_t [B, H, 4, dh]; updates the state, returns h_t [B, H, dh].
torch::Tensor slstm_step(const torch::Tensor& pre_t, const torch::Tensor& R, SLstmState& state);

struct SLstmOptions {
  int64_t conv_size{};  // causal conv + SiLU feeding the i and f gates; 0 = none
  Kernels kernels{};  // the short conv's form
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
  torch::nn::Linear if_proj{nullptr}, zo_proj{nullptr}, o_proj{nullptr};
  ShortConv conv{nullptr};
};

}  // namespace memlab
