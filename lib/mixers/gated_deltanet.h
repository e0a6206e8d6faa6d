#pragma once
// Gated DeltaNet (Yang, Kautz, Hatamizadeh 2025), as fla/layers/gated_deltanet.py:
//   q, k = L2(SiLU(conv(W x))), v = SiLU(conv(W x)) (SiLU without conv when short_conv is off),
//   g_t = -exp(A_log) softplus(W_a x_t + dt_bias) per head (log-decay, α_t = exp(g_t)),
//   β_t = sigmoid(W_b x_t), times 2 for eigenvalues in [-1, 1] (Grazzi et al.),
//   S_t = α_t (I - β_t k_t k_t^T) S_{t-1} + β_t k_t v_t^T, o_t = S_t^T q_t / sqrt(dk)  (gated delta rule),
//   per-head RMSNorm gated by SiLU(W_g x) (fla's FusedRMSNormGated), o_proj.
// Init as fla: A = U(0, 16] stored as A_log = log A; dt log-uniform in [1e-3, 0.1] floored at 1e-4,
// dt_bias = softplus^{-1}(dt). Both are exempt from weight decay (registry: leaf names A_log, dt_bias).
// Head dims: dk = hidden / heads, dv = dk * expand_v (fla defaults to expand_v = 2 and head_dim 256).
#include "mixers/mixer.h"
#include "ops/delta_rule/delta_rule.h"
#include "ops/kernels.h"
#include "mixers/ops.h"

namespace memlab {

struct GatedDeltaNetOptions {
  bool neg_eigval{};  // β = 2 sigmoid(.) instead of sigmoid(.)
  bool short_conv{};
  int64_t conv_size{};
  bool out_gate{};
  int64_t expand_v{};
  int64_t chunk{};
  Kernels kernels{};
};

// model.gated_deltanet.* keys, the GatedDeltaNet options they give, and the mixer built from them (checked against
// the shape). The schema holds the defaults; tests build options from it too.
void register_gated_deltanet_keys(Schema& s);
GatedDeltaNetOptions gated_deltanet_options(const Config& cfg);
std::shared_ptr<MixerImpl> make_gated_deltanet(const Config& cfg, const MixerShape& shape);

class GatedDeltaNetImpl : public MixerImpl {
 public:
  GatedDeltaNetImpl(const MixerShape& shape, const GatedDeltaNetOptions& opts);
  torch::Tensor forward(const torch::Tensor& x) override;
  torch::Tensor forward_reference(const torch::Tensor& x) override;
  // State: S [B, H, dk, dv] (fp32, or fp64), then the three conv tails when short_conv.
  MixerState init_state(int64_t batch, const torch::TensorOptions& opts) const override;
  torch::Tensor step(const torch::Tensor& x_t, MixerState& state) override;
  torch::Tensor output_weight() override { return o_proj->weight; }
  bool input_feeds_projections_only() const override { return true; }

  torch::Tensor A_log, dt_bias;  // [H]

 private:
  struct Inputs {
    torch::Tensor q, k, v, beta, g;  // [B, T, H, d] (q, k raw: the delta rule L2-normalises them); beta, g [B, T, H]
    torch::Tensor gate;              // W_g x [B, T, Dv] with out_gate
  };
  // x [B, T, D]; with tails (step), x has T = 1 and the convs advance their tails. Every projection of x in one
  // matmul (fused_linear), so that x has one consumer and one gradient.
  Inputs project(const torch::Tensor& x, std::vector<torch::Tensor>* tails);
  // norm [gated by SiLU(gate)], o_proj; x gives the output dtype
  torch::Tensor finish(const torch::Tensor& o, const torch::Tensor& x, const torch::Tensor& gate);
  double scale() const;

  MixerShape shape_;
  GatedDeltaNetOptions opts_;
  int64_t dk_, dv_;
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, a_proj{nullptr}, b_proj{nullptr},
      g_proj{nullptr}, o_proj{nullptr};
  ShortConv q_conv{nullptr}, k_conv{nullptr}, v_conv{nullptr};
  torch::Tensor o_norm;  // [dv]
};

}  // namespace memlab
