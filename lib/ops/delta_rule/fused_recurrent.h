#pragma once
// Fused recurrent (gated) delta rule on CUDA, torch-free: the launch interface of fused_recurrent.cu.
//
// One thread owns one column j of one head's state S ∈ R^{dk×dv}: the delta rule updates each column
// independently (S[:, j] <- a S[:, j] + k β (v_j - k·a S[:, j])), so the forward walks time with no
// communication, the state in registers. The backward walks back in time; it gets S_{t-1} from S_t
// exactly as S_t - k u_t (u_t stored by the forward) and, when gated, divides by the decay only while the
// error amplification stays small, else recomputes from the state stored every kChunk steps. Gradients of
// q, k, β and g sum over columns: a warp-wide butterfly per step, then over column groups by the caller.
// Layout as lib/ops/delta_rule/reference.h: q, k [B, T, H, dk]; v, o [B, T, H, dv]; beta, g [B, T, H];
// states [B, H, dk, dv] fp32. q, k, v, o, do are all fp32 or all bf16; everything else is fp32.
// With qk_l2norm, q and k arrive raw and each row is scaled by rsqrt(Σx² + l2_eps) as it is loaded (fla's
// use_qk_l2norm_in_kernel), and dq, dk are the gradients of the raw rows: that needs the whole column sum in one
// block, so the backward takes it with one column group only (dv <= 32).
#include <string>

namespace memlab::kernels {

struct DeltaRuleProblem {
  int B = 0, T = 0, H = 0, dk = 0, dv = 0;
  float scale = 1.f;
  bool bf16 = false;
  bool tf32 = false;  // chunkwise kernel, fp32 inputs: products in one TF32 pass (the caller computes in bf16)
  bool qk_l2norm = false;
  float l2_eps = 1e-6f;
  // The linear-attention rule S_t = S_{t-1} + k_t (β_t v_t): no retrieval term (recurrent kernel only; ungated,
  // q and k as given). u stores β v as for the delta rule, so the backward steps back the same way.
  bool linear = false;
};

struct DeltaRuleForwardArgs {
  const void *q = nullptr, *k = nullptr, *v = nullptr;
  const float *beta = nullptr, *g = nullptr;  // g null: the ungated rule
  const float* h0 = nullptr;                  // null: zero initial state
  void* o = nullptr;         // null: no outputs (the states alone, for Delayed-Chunk's read from them)
  float* u = nullptr;        // [B, T, H, dv] β (v - k·S): null when no backward follows
  float* anchors = nullptr;  // [B, H, chunks, dk, dv] state before each chunk of kChunk steps; null likewise
  float* hT = nullptr;       // final state, may alias h0 (the one-token step); null: not wanted
};

struct DeltaRuleBackwardArgs {
  const void *q = nullptr, *k = nullptr, *v = nullptr, *d_o = nullptr;
  const float *beta = nullptr, *g = nullptr, *u = nullptr, *anchors = nullptr, *hT = nullptr;
  const float* dhT = nullptr;  // null: zero
  // null d_o: no outputs were read (dq is not written; q is still loaded, so it must point at a valid tensor).
  // d_anchors [B, H, chunks, dk, dv], or null: the gradient of the stored states, when the caller read them
  // (Delayed-Chunk's read), added as the walk reaches each.
  const float* d_anchors = nullptr;
  // Partial sums over column groups: dq, dk [groups, B, T, H, dk]; dbeta, dg [groups, B, T, H] fp32. With
  // qk_l2norm (one group, nothing left to sum) dq, dk and dv are in the type of q, k, v: no casts after the kernel.
  void *dq = nullptr, *dk = nullptr;
  float *dbeta = nullptr, *dg = nullptr;
  void* dv = nullptr;    // [B, T, H, dv]
  float *dh0 = nullptr;  // [B, H, dk, dv], null: not wanted
};

constexpr int kDeltaRuleChunk = 16;      // steps per shared-memory tile and between stored states
constexpr int kDeltaRuleMaxHeadDim = 128;

int delta_rule_column_groups(int dv);  // blocks per head along dv (32 columns each)
int delta_rule_chunks(int T);          // stored states per head

// Both return an empty string on success, else the CUDA error. stream is a cudaStream_t.
std::string delta_rule_forward(const DeltaRuleProblem& p, const DeltaRuleForwardArgs& a, void* stream);
std::string delta_rule_backward(const DeltaRuleProblem& p, const DeltaRuleBackwardArgs& a, void* stream);

}  // namespace memlab::kernels
