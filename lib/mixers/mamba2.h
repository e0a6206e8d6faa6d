#pragma once
// Mamba-2 (Dao & Gu 2024): in_proj -> [z, x, B, C, dt]; causal depthwise conv (kernel 4, bias) + SiLU over
// xBC; per head a scalar decay A = -exp(A_log) and step dt = softplus(dt_raw + dt_bias); the SSD recurrence
// below; D skip; gated RMSNorm(y * SiLU(z)) over the whole inner width (mamba's norm_before_gate=False);
// out_proj. With neg_eigval the transition exp(dt A) ∈ (0, 1] is mapped to 2 exp(dt A) - 1 ∈ (-1, 1]
// (Grazzi et al. 2025, "negative-eigenvalue Mamba"), which lets a diagonal SSM track parity.
//
// SSD recurrence per head h (state h_t ∈ R^{P×N}, mamba's [headdim, d_state] layout):
//   alpha_t = exp(dt_t A)            or  2 exp(dt_t A) - 1 with neg_eigval
//   h_t = alpha_t h_{t-1} + dt_t x_t B_t^T,    y_t = h_t C_t        (the D x_t skip is added by the layer)
// Layout (fla/mamba): x [B, T, H, P], dt [B, T, H] (already softplus'ed, > 0), A [H] (< 0),
// Bm, Cm [B, T, G, N] with G groups shared by H/G consecutive heads (head h reads group h / (H/G));
// states [B, H, P, N].
// Correspondence (without neg_eigval):
//   - mamba_ssm ssd_minimal_discrete(X = x*dt, A = dt*A, B, C, block_len) returns (y, final_state) with the
//     same y and the same [b, h, p, n] state (B, C expanded to heads).
//   - fla naive_chunk_simple_gla(q = C, k = B, v = x*dt, g = dt*A, scale = 1.0) gives the same y; fla's state
//     there is [B, H, K=N, V=P], the transpose of ours. fla has no separate naive Mamba-2 op; its layer's
//     torch_forward uses the same SSD and the [b, h, p, n] state.
// All of it computes in fp32 (fp64 for fp64 inputs) with autocast off; y comes back in x's dtype.
#include "mixers/mixer.h"
#include "mixers/ops.h"

namespace memlab {

struct SsdOut {
  torch::Tensor y;      // [B, T, H, P]
  torch::Tensor state;  // [B, H, P, N] after the last token
};

// Smallest |alpha| whose log the chunked form takes (neg_eigval only): a product over a segment with alpha = 0
// exactly becomes 1e-30 times the rest instead of 0 (a negligible leak), log stays finite, and the floor is
// straight-through so the gradient w.r.t. that alpha is exact.
constexpr double kSsdAbsAlphaFloor = 1e-30;

// Per-step transition alpha_t [B, T, H] (or [B, H]) from dt and A, in dt's dtype.
torch::Tensor ssd_transition(const torch::Tensor& dt, const torch::Tensor& A, bool neg_eigval);

// Chunkwise SSD (Mamba-2 paper, Listing 1), exact for signed transitions: the product of alphas over a
// segment (j, i] is S_i S_j exp(sum_{j<k<=i} log|alpha_k|), S_t = prod_{k<=t} sign(alpha_k) ∈ {±1} (a rank-1
// sign pattern), log|alpha| = dt A without neg_eigval. Segment sums use the stable masked cumsum (no
// differences of cumsums, so strong decays lose no precision). Within a chunk: L = exp(segsum) masked, states
// at chunk ends; across chunks the same segsum over chunk totals (no loop); then the off-diagonal read.
SsdOut ssd_chunked(const torch::Tensor& x, const torch::Tensor& dt, const torch::Tensor& A, const torch::Tensor& Bm,
                   const torch::Tensor& Cm, int64_t chunk, bool neg_eigval, const torch::Tensor& initial_state = {});

// Plain recurrence over time steps, written from the equations above; tests only.
SsdOut ssd_recurrent(const torch::Tensor& x, const torch::Tensor& dt, const torch::Tensor& A, const torch::Tensor& Bm,
                     const torch::Tensor& Cm, bool neg_eigval, const torch::Tensor& initial_state = {});

// One token: x_t [B, H, P], dt_t [B, H], B_t, C_t [B, G, N]; updates state [B, H, P, N]; returns y_t [B, H, P].
torch::Tensor ssd_step(const torch::Tensor& x_t, const torch::Tensor& dt_t, const torch::Tensor& A,
                       const torch::Tensor& B_t, const torch::Tensor& C_t, bool neg_eigval, torch::Tensor& state);

struct Mamba2Options {
  int64_t d_state{};   // N
  int64_t expand{};     // inner width = expand * hidden
  int64_t head_dim{};   // P; 0 = expand * hidden / model.heads (so model.heads is the number of SSM heads)
  int64_t d_conv{};
  bool conv_bias{};  // mamba's conv1d has a bias (fla initialises it to zero, as here)
  int64_t chunk{};
  int64_t ngroups{};    // groups of B, C shared by heads
  bool neg_eigval{};
  Kernels kernels{};  // the short conv's form
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
  torch::Tensor finish(const torch::Tensor& y, const Inputs& in, const torch::Tensor& u);  // D skip, norm, out_proj
  torch::Tensor A() const;

  MixerShape shape_;
  Mamba2Options opts_;
  int64_t inner_, heads_, head_dim_, conv_dim_;
  torch::nn::Linear in_proj{nullptr}, out_proj{nullptr};
  ShortConv conv{nullptr};  // one depthwise conv over the concatenation [x, B, C], as mamba's conv1d
};

}  // namespace memlab
