#pragma once
// Hybrid quadratic-linear transformer layer (Irie, Yau, Gershman 2025): a KV-memory (softmax attention
// over a short window of raw q, k, optionally RoPE) and an FW-memory (DeltaNet on L2(SiLU(q)), L2(SiLU(k)),
// or Katharopoulos linear attention), mixed per token, then per-head RMSNorm (optionally SiLU-gated) and
// an output projection. v = SiLU(conv(W_v x)) feeds both memories.
//   Synchronous:     (k_t, v_t) goes to both memories; KV sees keys t-S+1..t.
//   Delayed-Stream:  KV sees keys t-S+1..t; the pair evicted from the window, (k_{t-S}, v_{t-S}), updates
//                    the FW-memory at step t with β_t (paper Eq. 13 and the reference code agree).
//   Delayed-Chunk:   KV is causal attention inside the current chunk of S tokens; FW is read with the state
//                    at the start of the chunk. The reference code reads FW state at 64-token block starts
//                    whatever S is; `fw_block` = 64 reproduces that, 0 (default) follows the paper.
#include "mixers/mixer.h"
#include "ops/kernels.h"
#include "mixers/ops.h"

namespace memlab {

enum class HqltVariant { Synchronous, DelayedStream, DelayedChunk };
enum class HqltMixing { Sum, Scalar, Vector };  // y = FW + KV; α_FW FW + α_KV KV (per head); γ FW + (1-γ) KV
enum class HqltFastWeight { DeltaNet, LinearAttention };

struct HqltOptions {
  HqltVariant variant{};
  HqltMixing mixing{};
  HqltFastWeight fw{};
  int64_t window{};    // S: KV window (Synchronous, Delayed-Stream) or chunk (Delayed-Chunk)
  int64_t fw_block{};  // Delayed-Chunk: FW read-state block; 0 = the chunk S (paper)
  bool evicted_beta{};  // Delayed-Stream: use β_{t-S} with the evicted pair instead of β_t
  bool rope{};
  double rope_theta{};
  bool neg_eigval{};  // β = 2 sigmoid(.)
  bool short_conv{};
  int64_t conv_size{};
  bool out_gate{};
  int64_t chunk{};  // chunk of the FW chunkwise form (Synchronous, Delayed-Stream)
  Kernels kernels{};
};

// model.hqlt.* keys, the Hqlt options they give, and the mixer built from them (checked against
// the shape). The schema holds the defaults; tests build options from it too.
void register_hqlt_keys(Schema& s);
HqltOptions hqlt_options(const Config& cfg);
std::shared_ptr<MixerImpl> make_hqlt(const Config& cfg, const MixerShape& shape);

class HqltImpl : public MixerImpl {
 public:
  HqltImpl(const MixerShape& shape, const HqltOptions& opts);
  torch::Tensor forward(const torch::Tensor& x) override;
  torch::Tensor forward_reference(const torch::Tensor& x) override;
  // State: FW state [B, H, d, d] (DeltaNet) or {C [B, H, d, d], z [B, H, d]} (linear attention), FW read
  // state (Delayed-Chunk), KV window of raw keys, values and β [B, W, H, (d)], then the conv tails.
  MixerState init_state(int64_t batch, const torch::TensorOptions& opts) const override;
  MixerState init_fixed_state(int64_t batch, const torch::TensorOptions& opts, int64_t capacity) const override;
  torch::Tensor step(const torch::Tensor& x_t, MixerState& state) override;
  torch::Tensor output_weight() override { return o_proj->weight; }
  bool input_feeds_projections_only() const override { return true; }

 private:
  struct Inputs {
    torch::Tensor q, k, v, beta;  // raw q, k, v [B, T, H, d]; β [B, T, H] (compute dtype)
    torch::Tensor mix, gate;      // W_mix x and W_g x [B, T, *] where the layer has them
  };
  // Every projection of x in one matmul (fused_linear), so that x has one consumer and one gradient.
  Inputs project(const torch::Tensor& x, std::vector<torch::Tensor>* conv_tails);
  torch::Tensor fw_query(const torch::Tensor& q) const;  // feature map of the FW-memory
  torch::Tensor mix(const torch::Tensor& o_fw, const torch::Tensor& o_kv, const torch::Tensor& mix_pre);
  // norm [gated by SiLU(gate)], o_proj; x gives the output shape and dtype
  torch::Tensor finish(const torch::Tensor& o, const torch::Tensor& x, const torch::Tensor& gate);
  int64_t fw_block() const { return opts_.fw_block > 0 ? opts_.fw_block : opts_.window; }

  MixerShape shape_;
  HqltOptions opts_;
  int64_t head_dim_;
  double scale_;
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, b_proj{nullptr}, mix_proj{nullptr},
      g_proj{nullptr}, o_proj{nullptr};
  ShortConv q_conv{nullptr}, k_conv{nullptr}, v_conv{nullptr};
  torch::Tensor o_norm;  // [d]
};

}  // namespace memlab
