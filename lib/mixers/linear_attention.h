#pragma once
// Linear attention (Katharopoulos et al. 2020) with fla's conventions. Features φ (ELU+1 in the mixer) are
// applied by the CALLER of the free functions: q, k arrive as φ(q), φ(k).
//   S_t = S_{t-1} + k_t v_t^T (S ∈ R^{dk×dv}),  z_t = z_{t-1} + k_t
//   normalize = false: o_t = scale q_t^T S_t
//   normalize = true : o_t = scale q_t^T S_t / (scale q_t·z_t + 1e-10)
// This is fla's chunk_linear_attn / naive_recurrent_linear_attn (fla/ops/linear_attn, HEAD bc3b101): the kernel
// multiplies the numerator by scale (default 1/sqrt(dk)) and normalize_with_z_state divides by
// (q * scale * cumsum_t(k)).sum(-1) + 1e-10. So scale cancels with the normaliser except against the 1e-10.
// Differences from fla: the normaliser state z is [B, H, dk] (fla's z_state is [B, 1, H, dk]); the returned
// states are in the compute type (fp32, or fp64 for fp64 inputs).
// NOTE on HQLT: the hybrid-memory fork of fla (HQLT's "w. Linear Attn." ablation) predates fla commit 1d48579a
// (2025-09-15, "Correct cumsum dimension in normalize_output"): its normaliser is k.cumsum(-2) on [B, T, H, K],
// i.e. a cumsum over HEADS, not time. We implement the intended (and current fla) cumsum over time.
#include <torch/torch.h>

#include "mixers/mixer.h"
#include "mixers/ops.h"

namespace memlab {

struct LinearAttentionOut {
  torch::Tensor o;      // [B, T, H, dv], in v's dtype
  torch::Tensor state;  // S [B, H, dk, dv] after the last token
  torch::Tensor z;      // [B, H, dk] after the last token (Σ k; carried even when normalize = false)
};

// Chunkwise form: per chunk of C tokens, O = scale (Q S_{chunk start} + (Q K^T ⊙ M) V), where the chunk-start
// states are an exclusive prefix sum of K_n^T V_n over chunks (no loop); the normaliser uses cumsum_t(k).
// q, k [B, T, H, dk] (features applied), v [B, T, H, dv]; initial_state [B, H, dk, dv], initial_z [B, H, dk].
LinearAttentionOut linear_attention_chunked(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                            int64_t chunk, double scale, bool normalize,
                                            const torch::Tensor& initial_state = {},
                                            const torch::Tensor& initial_z = {});

// Linear attention as the layers call it: the numerator on the delta rule's recurrent kernel where
// linear_rule_kernel_applies (delta_rule.h: CUDA, many heads), its normaliser beside it
// (linear_attention_normalise); else linear_attention_chunked. kernels = Cuda promises the kernel.
LinearAttentionOut linear_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                    int64_t chunk, double scale, bool normalize, Kernels kernels,
                                    const torch::Tensor& initial_state = {}, const torch::Tensor& initial_z = {});

// o_t / (scale q_t·z_t + 1e-10), z_t = z_0 + Σ_{s<=t} k_s, in the compute type; o is the numerator scale q_t^T S_t.
// Returns the normalised output in o's dtype and z_T.
std::pair<torch::Tensor, torch::Tensor> linear_attention_normalise(const torch::Tensor& o, const torch::Tensor& q,
                                                                   const torch::Tensor& k, double scale,
                                                                   const torch::Tensor& initial_z = {});

// Plain recurrence over time steps; tests only.
LinearAttentionOut linear_attention_recurrent(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                              double scale, bool normalize, const torch::Tensor& initial_state = {},
                                              const torch::Tensor& initial_z = {});

// One token: q_t, k_t [B, H, dk], v_t [B, H, dv]; updates S [B, H, dk, dv] and z [B, H, dk] in place of the handles.
torch::Tensor linear_attention_step(const torch::Tensor& q_t, const torch::Tensor& k_t, const torch::Tensor& v_t,
                                    double scale, bool normalize, torch::Tensor& state, torch::Tensor& z);

// φ(x) = ELU(x) + 1 > 0, the Katharopoulos feature map.
torch::Tensor elu_plus_one(const torch::Tensor& x);

// The mixer: q, k, v = bias-free projections per head, φ = ELU+1 on q and k, (normalised) linear attention,
// per-head RMSNorm (optionally gated by SiLU(W_g x)), o_proj. As fla's LinearAttention(feature_map='elu',
// output_norm='rmsnorm') with the normaliser on (HQLT's linear-attention FW memory).
struct LinearAttentionOptions {
  bool normalize{};
  bool out_gate{};
  int64_t chunk{};
  Kernels kernels{};  // model.kernels: the rule's form (linear_attention) and the output norm's
};

// model.linear_attention.* keys, the LinearAttention options they give, and the mixer built from them (checked against
// the shape). The schema holds the defaults; tests build options from it too.
void register_linear_attention_keys(Schema& s);
LinearAttentionOptions linear_attention_options(const Config& cfg);
std::shared_ptr<MixerImpl> make_linear_attention(const Config& cfg, const MixerShape& shape);

class LinearAttentionImpl : public MixerImpl {
 public:
  LinearAttentionImpl(const MixerShape& shape, const LinearAttentionOptions& opts);
  torch::Tensor forward(const torch::Tensor& x) override;
  torch::Tensor forward_reference(const torch::Tensor& x) override;
  // State: S [B, H, d, d] and z [B, H, d] (fp32, or fp64).
  MixerState init_state(int64_t batch, const torch::TensorOptions& opts) const override;
  torch::Tensor step(const torch::Tensor& x_t, MixerState& state) override;
  torch::Tensor output_weight() override { return o_proj->weight; }

 private:
  torch::Tensor finish(const torch::Tensor& o, const torch::Tensor& x);  // norm, gate, o_proj
  double scale() const;

  MixerShape shape_;
  LinearAttentionOptions opts_;
  int64_t head_dim_;
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, g_proj{nullptr}, o_proj{nullptr};
  torch::Tensor o_norm;  // [d]
};

}  // namespace memlab
