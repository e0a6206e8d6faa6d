#pragma once
// Mamba-2 (Dao & Gu 2024): in_proj -> [z, x, B, C, dt]; causal depthwise conv (kernel 4, bias) + SiLU over
// xBC; per head a scalar decay A = -exp(A_log) and step dt = softplus(dt_raw + dt_bias); the SSD recurrence
// below; D skip; gated RMSNorm(y * SiLU(z)) over the whole inner width (mamba's norm_before_gate=False);
// out_proj. With neg_eigval the transition exp(dt A) ∈ (0, 1] is mapped to 2 exp(dt A) - 1 ∈ (-1, 1]
// (Grazzi et al. 2025, "negative-eigenvalue Mamba"), which lets a diagonal SSM track parity. The SSD itself is
// ops/ssd/ssd.h. Packed (MixerShape::members K > 1): each member's in_proj output is [z, xBC, dt] of its own widths,
// its heads and B, C groups follow one another, and the gated norm runs over each member's inner width.
#include "mixers/mixer.h"
#include "mixers/ops.h"
#include "ops/ssd/ssd.h"

namespace memlab {

struct Mamba2Options {
  int64_t d_state{};   // N
  int64_t expand{};     // inner width = expand * hidden
  int64_t head_dim{};   // P; 0 = expand * hidden / model.heads (so model.heads is the number of SSM heads)
  int64_t d_conv{};
  bool conv_bias{};  // mamba's conv1d has a bias (fla initialises it to zero, as here)
  int64_t chunk{};
  int64_t ngroups{};    // groups of B, C shared by heads
  bool neg_eigval{};
  Kernels kernels{};  // the forms of the SSD, the short conv and the norm
};

// model.mamba2.* keys, the Mamba2 options they give, and the mixer built from them (checked against
// the shape). The schema holds the defaults; tests build options from it too.
void register_mamba2_keys(Schema& s);
Mamba2Options mamba2_options(const Config& cfg);
std::shared_ptr<MixerImpl> make_mamba2(const Config& cfg, const MixerShape& shape);

class Mamba2Impl : public MixerImpl {
 public:
  Mamba2Impl(const MixerShape& shape, const Mamba2Options& opts);
  torch::Tensor forward(const torch::Tensor& x) override;
  torch::Tensor forward_reference(const torch::Tensor& x) override;
  // State: h [B, H, P, N] (fp32, fp64 for fp64), then the conv tail [B, conv_dim, d_conv - 1].
  MixerState init_state(int64_t batch, const torch::TensorOptions& opts) const override;
  torch::Tensor step(const torch::Tensor& x_t, MixerState& state) override;
  torch::Tensor output_weight() override { return out_proj->weight; }

  int64_t heads() const { return heads_; }
  int64_t head_dim() const { return head_dim_; }

  torch::Tensor A_log, dt_bias, D;  // [H]: A = -exp(A_log); dt = softplus(dt_raw + dt_bias); y += D x
  torch::Tensor conv_bias;          // [conv_dim] (undefined without conv_bias)
  torch::Tensor norm;               // [inner] gated RMSNorm weight

 private:
  struct Inputs {
    torch::Tensor z, x, Bm, Cm, dt;  // z [B,T,inner], x [B,T,H,P], Bm/Cm [B,T,G,N], dt [B,T,H] (softplus'ed)
  };
  Inputs project(const torch::Tensor& u);
  torch::Tensor skip(const torch::Tensor& y, const Inputs& in) const;  // y + D x
  torch::Tensor finish(const torch::Tensor& yd, const Inputs& in, const torch::Tensor& u);  // gate, norm, out_proj
  torch::Tensor A() const;

  MixerShape shape_;
  Mamba2Options opts_;
  int64_t inner_, heads_, head_dim_, conv_dim_;
  Linear in_proj{nullptr}, out_proj{nullptr};
  ShortConv conv{nullptr};  // one depthwise conv over the concatenation [x, B, C], as mamba's conv1d
};

}  // namespace memlab
