#pragma once
// DeltaNet (Schlag et al. 2021; Yang et al. 2024): q, k = L2(SiLU(conv(W x))), v = SiLU(conv(W x)),
// β = sigmoid(W_β x) per head, times 2 for eigenvalues in [-1, 1] (Grazzi et al.); delta-rule memory;
// per-head RMSNorm output, optionally gated by SiLU(W_g x); output projection.
#include "mixers/mixer.h"
#include "mixers/ops.h"
#include "ops/delta_rule/delta_rule.h"
#include "ops/kernels.h"

namespace memlab {

struct DeltaNetOptions {
  bool neg_eigval{};  // β = 2 sigmoid(.) instead of sigmoid(.)
  bool short_conv{};
  int64_t conv_size{};
  bool out_gate{};
  int64_t chunk{};
  Kernels kernels{};
};

// model.deltanet.* keys, the DeltaNet options they give, and the mixer built from them (checked against
// the shape). The schema holds the defaults; tests build options from it too.
void register_deltanet_keys(Schema& s);
DeltaNetOptions deltanet_options(const Config& cfg);
std::shared_ptr<MixerImpl> make_deltanet(const Config& cfg, const MixerShape& shape);

class DeltaNetImpl : public MixerImpl {
 public:
  DeltaNetImpl(const MixerShape& shape, const DeltaNetOptions& opts);
  torch::Tensor forward(const torch::Tensor& x) override;
  torch::Tensor forward_reference(const torch::Tensor& x) override;
  // State: S [B, H, d, d] (fp32), then the three conv tails when short_conv.
  MixerState init_state(int64_t batch, const torch::TensorOptions& opts) const override;
  torch::Tensor step(const torch::Tensor& x_t, MixerState& state) override;
  torch::Tensor output_weight() override { return o_proj->weight; }
  bool input_feeds_projections_only() const override { return true; }

 private:
  struct Inputs {
    torch::Tensor q, k, v, beta;  // [B, T, H, d] (q, k raw: the delta rule L2-normalises them), beta [B, T, H]
    torch::Tensor gate;           // W_g x [B, T, D] with out_gate
  };
  // Every projection of x in one matmul (fused_linear), so that x has one consumer and one gradient.
  Inputs project(const torch::Tensor& x);
  // norm [gated by SiLU(gate)], o_proj; x gives the output dtype
  torch::Tensor finish(const torch::Tensor& o, const torch::Tensor& x, const torch::Tensor& gate);
  double scale() const;

  MixerShape shape_;
  DeltaNetOptions opts_;
  int64_t head_dim_;
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, b_proj{nullptr}, g_proj{nullptr},
      o_proj{nullptr};
  ShortConv q_conv{nullptr}, k_conv{nullptr}, v_conv{nullptr};
  torch::Tensor o_norm;  // [d]
};

}  // namespace memlab
