#pragma once
// The xLSTM mLSTM layer around the mLSTM op (ops/mlstm/mlstm.h).
#include <torch/torch.h>

#include "mixers/mixer.h"
#include "mixers/ops.h"
#include "ops/mlstm/mlstm.h"
#include "ops/norm/norm.h"

namespace memlab {

struct MLstmOptions {
  int64_t chunk{};
  double proj_factor{};  // inner width = round(proj_factor * hidden)
  int64_t conv_size{};     // 0 = no conv (SiLU only)
  int64_t qkv_block{};     // block size of the block-diagonal q, k, v projections
  Kernels kernels{};  // the mLSTM's and the short conv's form
};

// model.mlstm.* keys, the MLstm options they give, and the mixer built from them (checked against
// the shape). The schema holds the defaults; tests build options from it too.
void register_mlstm_keys(Schema& s);
MLstmOptions mlstm_options(const Config& cfg);
std::shared_ptr<MixerImpl> make_mlstm(const Config& cfg, const MixerShape& shape);

// The xLSTM mLSTM layer (pre-up-projection, xlstm/blocks/mlstm/layer.py):
//   [x_m, z] = proj_up(x);  c = SiLU(conv(x_m));  q = W_q c, k = W_k c, v = W_v x_m (block-diagonal, blocks of 4)
//   ĩ, f̃ = Linear(concat(q, k, v)) per head (q, k, v and the gates in one op: mlstm_project)
//   h = headwise LayerNorm(mLSTM(q, k, v))
//   y = proj_down((h + learnable_skip ⊙ c) ⊙ SiLU(z))   (norm, skip and gate one layer_norm call)
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
  // x feeds proj_up and sets the dtype of the head norm's output, which feeds proj_down: in bf16 under autocast,
  // neither product casts its input (nor its backward the gradient)
  bool input_feeds_projections_only() const override { return true; }

  int64_t inner() const { return inner_; }
  torch::Tensor q_weight, k_weight, v_weight;             // [inner / qkv_block, qkv_block, qkv_block] (out, in)
  torch::Tensor igate_weight, fgate_weight;               // [H, 3 inner / members]: a head reads its member's q, k, v
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
  std::pair<torch::Tensor, torch::Tensor> up(const torch::Tensor& x);  // [x_m, z]

  MixerShape shape_;
  MLstmOptions opts_;
  int64_t inner_, head_dim_;
  Linear proj_up{nullptr}, proj_down{nullptr};
  ShortConv conv{nullptr};
};

// LayerNorm over each head's features (xlstm's MultiHeadLayerNorm: group norm with one group per head, no bias,
// eps 1e-5), weight used as 1 + w. x [..., H, d], w [H * d]; computed in fp32/fp64, returned in `out` (x's dtype
// when Undefined); the norm kernel (ops/norm) where model.kernels lets it. The mLSTM layer adds its skip term and
// SiLU gate in the same pass (layer_norm's gate and skip).
torch::Tensor head_layer_norm(const torch::Tensor& x, const torch::Tensor& w, Kernels kernels,
                              torch::ScalarType out = torch::ScalarType::Undefined, const torch::Tensor& gate = {},
                              const NormSkip& skip = {});

}  // namespace memlab
