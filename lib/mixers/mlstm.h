#pragma once
// mLSTM (Beck et al. 2024, xLSTM): matrix memory with an exponential input gate and a sigmoid forget gate,
// stabilised in log space. Per head, with ĩ_t, f̃_t the gate pre-activations and log f_t = logsigmoid(f̃_t):
//   m_t = max(log f_t + m_{t-1}, ĩ_t),   f'_t = exp(log f_t + m_{t-1} - m_t),   i'_t = exp(ĩ_t - m_t)
//   C_t = f'_t C_{t-1} + i'_t (k_t / sqrt(d)) v_t^T,   n_t = f'_t n_{t-1} + i'_t k_t / sqrt(d)
//   h_t = C_t^T q_t / (max(|n_t^T q_t|, exp(-m_t)) + eps)
// In closed form m_t = max(m_0 + Σ_{l<=t} log f_l, max_{j<=t} (ĩ_j + Σ_{l=j+1..t} log f_l)), and with
// C̃_t = exp(m_t) C_t, ñ_t = exp(m_t) n_t (the unstabilised memory) h_t = C̃_t^T q / (max(|ñ_t^T q|, 1) +
// eps exp(m_t)): the stabiliser cancels except in the eps term, so every form must produce the same m_t.
// Initial state: C = 0, n = 0, m_0 = 0, as in xlstm's recurrent_step_stabilized_simple and chunkwise_simple
// (xlstm's parallel_stabilized_simple uses m_0 = -inf; the two differ only through eps, relative <= eps).
//
// Layout as in fla: q, k [B, T, H, dk], v [B, T, H, dv], gate pre-activations [B, T, H]. fla has no mLSTM;
// the reference is xlstm/blocks/mlstm/backends.py (same equations and eps, keys scaled by 1/sqrt(dk) inside).
// Everything runs in fp32 (fp64 for fp64 inputs); h comes back in v's dtype, the state in the compute type.
#include <torch/torch.h>

#include "mixers/mixer.h"
#include "mixers/ops.h"

namespace memlab {

struct MLstmState {
  torch::Tensor C;  // [B, H, dk, dv]
  torch::Tensor n;  // [B, H, dk]
  torch::Tensor m;  // [B, H]
};

struct MLstmOut {
  torch::Tensor h;  // [B, T, H, dv]
  MLstmState state;  // after the last token
};

// Zero state (m_0 = 0) in the compute type of `opts` (fp64 stays fp64, anything else becomes fp32).
MLstmState mlstm_zero_state(int64_t B, int64_t H, int64_t dk, int64_t dv, const torch::TensorOptions& opts);

// Chunkwise form: inside a chunk the stabilised parallel form, across chunks (a loop over chunks) the
// stabilised states (C, n, m); each position's stabiliser is max(m_{chunk start} + Σ log f, row max of the
// intra-chunk log weights), which is exactly the recurrent m_t. `init` undefined tensors = zero state.
MLstmOut mlstm_chunked(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& igate, const torch::Tensor& fgate, int64_t chunk, double eps = 1e-6,
                       const MLstmState& init = {});

// The stabilised recurrence, one time step after the other (tests only).
MLstmOut mlstm_recurrent(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         const torch::Tensor& igate, const torch::Tensor& fgate, double eps = 1e-6,
                         const MLstmState& init = {});

// One token: q_t, k_t [B, H, dk], v_t [B, H, dv], gates [B, H]; updates the state; returns h_t [B, H, dv].
torch::Tensor mlstm_step(const torch::Tensor& q_t, const torch::Tensor& k_t, const torch::Tensor& v_t,
                         const torch::Tensor& igate_t, const torch::Tensor& fgate_t, MLstmState& state,
                         double eps = 1e-6);

struct MLstmOptions {
  int64_t chunk{};
  double proj_factor{};  // inner width = round(proj_factor * hidden)
  int64_t conv_size{};     // 0 = no conv (SiLU only)
  int64_t qkv_block{};     // block size of the block-diagonal q, k, v projections
  Kernels kernels{};  // the short conv's form
};

// model.mlstm.* keys, the MLstm options they give, and the mixer built from them (checked against
// the shape). The schema holds the defaults; tests build options from it too.
void register_mlstm_keys(Schema& s);
MLstmOptions mlstm_options(const Config& cfg);
std::shared_ptr<MixerImpl> make_mlstm(const Config& cfg, const MixerShape& shape);

// The xLSTM mLSTM layer (pre-up-projection, xlstm/blocks/mlstm/layer.py):
//   [x_m, z] = proj_up(x);  c = SiLU(conv(x_m));  q = W_q c, k = W_k c, v = W_v x_m (block-diagonal, blocks of 4)
//   ĩ, f̃ = Linear(concat(q, k, v)) per head;  h = headwise LayerNorm(mLSTM(q, k, v))
//   y = proj_down((h + learnable_skip ⊙ c) ⊙ SiLU(z))
// Initialisation as in xlstm: gate weights 0, f̃ bias linspace(3, 6) over heads, ĩ bias N(0, 0.1), skip 1,
// q/k/v blocks N(0, sqrt(2 / (5 hidden))). Gates and q/k/v blocks are plain parameters, not Linear modules, so
// the model's Linear re-initialisation leaves them alone. Differences from xlstm: the conv has no bias, the
// inner width is not rounded up to a multiple of 64, the head norm's weight is stored as w and used as 1 + w
// (xlstm's residual_weight LayerNorm, so weight decay pulls it towards 1).
class MLstmImpl : public MixerImpl {
 public:
  MLstmImpl(const MixerShape& shape, const MLstmOptions& opts);
  torch::Tensor forward(const torch::Tensor& x) override;
  torch::Tensor forward_reference(const torch::Tensor& x) override;
  // State: C [B, H, d, d], n [B, H, d], m [B, H] (compute type), then the conv tail when conv_size > 0.
  MixerState init_state(int64_t batch, const torch::TensorOptions& opts) const override;
  torch::Tensor step(const torch::Tensor& x_t, MixerState& state) override;
  torch::Tensor output_weight() override { return proj_down->weight; }

  int64_t inner() const { return inner_; }
  torch::Tensor q_weight, k_weight, v_weight;             // [inner / qkv_block, qkv_block, qkv_block] (out, in)
  torch::Tensor igate_weight, fgate_weight;               // [H, 3 inner]
  torch::Tensor igate_bias, fgate_bias;                   // [H]
  torch::Tensor learnable_skip;                           // [inner]
  torch::Tensor norm_weight;                              // [inner], used as 1 + w

 private:
  struct Inputs {
    torch::Tensor q, k, v;   // [B, T, H, d]
    torch::Tensor ig, fg;    // [B, T, H] (compute type)
    torch::Tensor c, z;      // [B, T, inner]
  };
  Inputs project(const torch::Tensor& x_m, const torch::Tensor& c, const torch::Tensor& z);
  torch::Tensor finish(const torch::Tensor& h, const Inputs& in, const torch::Tensor& x);
  torch::Tensor block_diag_apply(const torch::Tensor& w, const torch::Tensor& x) const;

  MixerShape shape_;
  MLstmOptions opts_;
  int64_t inner_, head_dim_;
  torch::nn::Linear proj_up{nullptr}, proj_down{nullptr};
  ShortConv conv{nullptr};
};

// LayerNorm over each head's features (xlstm's MultiHeadLayerNorm: group norm with one group per head, no bias,
// eps 1e-5), weight used as 1 + w. x [..., H, d], w [H * d]; computed in fp32/fp64, returned in x's dtype.
torch::Tensor head_layer_norm(const torch::Tensor& x, const torch::Tensor& w, double eps = 1e-5);

}  // namespace memlab
