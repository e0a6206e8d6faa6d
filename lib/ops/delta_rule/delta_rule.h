#pragma once
// The delta rule as layers call it: one entry point per use (a sequence, one token) that picks the form, a
// CUDA kernel (chunk.cu for sequences of few heads with head dims up to 64, fused_recurrent.cu for the rest and
// the one-token step) or the tensor-op reference (reference.h, which also trains head dims past 64 under
// model.kernels=auto: faster there than the recurrent kernel), and owns the dtype policy:
// states are fp32 always; the kernel reads q, k, v in bf16 when all three are bf16, else in fp32, and the
// tensor-op form computes in fp32 (fp64 for fp64 inputs); outputs come back in v's dtype.
#include "ops/delta_rule/reference.h"
#include "ops/kernels.h"

namespace memlab {

struct DeltaRuleForm {
  int64_t chunk = 64;  // chunk of the tensor-op chunkwise form
  double scale = 1.0;  // applied to q
  // false: Delayed-Chunk HQLT's read (reference.h); the kernels run it as delta_rule_delayed_read_interleaved.
  bool with_intra = true;
  // q and k arrive raw and the rule L2-normalises them (l2_normalize, norm.h): inside the recurrent kernel where
  // it can (delta_rule.cpp: the one-token step; sequences with dv <= 32), else by the norm op before the kernel or
  // the tensor-op form.
  bool qk_l2norm = false;
  Kernels kernels = Kernels::Auto;
};

// The form the layers pass: their scale, chunk and kernels, with q and k raw (qk_l2norm).
DeltaRuleForm layer_rule_form(double scale, int64_t chunk, Kernels kernels);

// q, k [B, T, H, dk] (L2-normalised, or raw with form.qk_l2norm), v [B, T, H, dv], beta [B, T, H] in [0, 2],
// g [B, T, H] log-decay <= 0 or undefined (ungated), initial_state [B, H, dk, dv] or undefined (zeros).
// Differentiable in all of them.
DeltaRuleOut delta_rule(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                        const torch::Tensor& beta, const DeltaRuleForm& form, const torch::Tensor& g = {},
                        const torch::Tensor& initial_state = {});

// The Delayed-Chunk read (form.with_intra false) as the full rule on twice the tokens: each chunk of form.chunk
// steps becomes its reads (β = 0, k = 0, v = 0, no decay: the state stays the chunk's starting one, which each
// read token reads with its q_t, times exp(G_t) when gated) followed by its updates (q = 0); the outputs are the
// reads'. Exact, so gradients come from the same kernels; delta_rule runs it where a kernel applies (CPU tests use
// it with the tensor-op form).
DeltaRuleOut delta_rule_delayed_read_interleaved(const torch::Tensor& q, const torch::Tensor& k,
                                                 const torch::Tensor& v, const torch::Tensor& beta,
                                                 const DeltaRuleForm& form, const torch::Tensor& g = {},
                                                 const torch::Tensor& initial_state = {});

// The Delayed-Chunk read (form.with_intra false) from the rule's states: the recurrent kernel walks the T tokens once
// with no outputs and returns the state before each chunk of form.chunk steps (differentiably; their gradient joins
// its backward walk), and each token's read is scale q_t · (its chunk's starting state), one product. Where
// delayed_read_by_states_applies: ungated, form.chunk = 16 (the kernel's stored-state spacing), a kernel, and the
// recurrent one (512+ heads, or head dims past the chunkwise kernel's); delta_rule picks it there, else the
// interleaved form. Throws elsewhere.
DeltaRuleOut delta_rule_delayed_read_states(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                            const torch::Tensor& beta, const DeltaRuleForm& form,
                                            const torch::Tensor& initial_state = {});
bool delayed_read_by_states_applies(const torch::Tensor& q, const torch::Tensor& v, const DeltaRuleForm& form,
                                    const torch::Tensor& g = {});
// The reads themselves: o_t = scale q_t · states[:, :, t / C] for q [B, T, H, dk] (unit, as the rule reads it) and
// states [B, H, ceil(T / C), dk, dv], the state before each chunk; [B, T, H, dv] in the states' type.
torch::Tensor delta_rule_read_states(const torch::Tensor& q, const torch::Tensor& states, int64_t C, double scale);

// One token (rollouts): q_t, k_t [B, H, dk], v_t [B, H, dv], beta_t, g_t [B, H]; updates state [B, H, dk, dv].
// Uses form's scale, qk_l2norm and kernels.
torch::Tensor delta_rule_step(const torch::Tensor& q_t, const torch::Tensor& k_t, const torch::Tensor& v_t,
                              const torch::Tensor& beta_t, torch::Tensor& state, const DeltaRuleForm& form,
                              const torch::Tensor& g_t = {});

// Whether a fused kernel can run for these inputs, and if not, why (for errors and bench). `delta_rule` runs it
// where this says yes, except training head dims past 64 under model.kernels=auto (the tensor-op form: faster there).
bool delta_rule_kernel_applies(const torch::Tensor& q, const torch::Tensor& v, const DeltaRuleForm& form,
                               std::string* why = nullptr);

// The linear-attention rule on the recurrent kernel: S_t = S_{t-1} + k_t v_t^T from initial_state (zeros when
// undefined), o_t = form.scale q_t^T S_t, the numerator of linear attention (linear_attention.h adds the
// normaliser). q, k [B, T, H, dk] as given (form.qk_l2norm and with_intra are not read), v [B, T, H, dv];
// differentiable in q, k, v and initial_state. Its tensor-op form is linear_attention_chunked; this throws where
// linear_rule_kernel_applies says no.
DeltaRuleOut linear_rule(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         const DeltaRuleForm& form, const torch::Tensor& initial_state = {});
// Where the delta rule's kernel applies, with at least kLinearRuleMinHeads (batch x heads) unless form.kernels is
// Cuda: fewer heads walking T steps leave the GPU idle (the delta rule's chunkwise kernel takes those; the linear
// rule has none).
constexpr int64_t kLinearRuleMinHeads = 512;
bool linear_rule_kernel_applies(const torch::Tensor& q, const torch::Tensor& v, const DeltaRuleForm& form,
                                std::string* why = nullptr);

}  // namespace memlab
