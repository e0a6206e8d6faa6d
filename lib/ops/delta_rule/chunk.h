#pragma once
// Chunkwise (gated) delta rule on tensor cores, torch-free: the launch interface of chunk.cu.
//
// For each chunk of kDeltaRuleChunkLen steps, with S (dk×dv, fp32) the state entering it, Q (scaled), K, V, β:
//   A = strict_lower(diag(β) K Kᵀ),  T = (I + A)⁻¹,  W = T diag(β) K,  U = T diag(β) V − W S,
//   O = Q S + lower(Q Kᵀ) U,  S ← S + Kᵀ U
// (the WY form of the rule: U holds the steps' β(v − Sᵀk) corrections). Gated, the chunk's cumulative log-decay
// G scales A and lower(Q Kᵀ) by exp(G_i − G_j), W's and Q's rows by exp(G_i) and the update's K rows by
// exp(G_last − G_j), and S by exp(G_last) (reference.h's chunked form). One block per (batch, head, column
// block) walks its chunks in order; every product is a TF32 mma from shared memory, split into high and low
// halves (three mmas) when the inputs are fp32 so that fp32 keeps fp32 accuracy (one pass when p.tf32: the caller
// computes in bf16), with the next chunk's fp32 inputs copied in (cp.async) during each chunk; T comes from forward
// substitution in one warp. The forward stores S before each chunk (anchors); the backward walks the chunks in
// reverse, recomputing each chunk's A, T, W and U from its anchor. The state's columns split into blocks of 16
// where B·H is small. Same layouts and argument structs as fused_recurrent.h, with p.qk_l2norm false (q and k
// arrive normalised); forward a.u unused; backward a.u, a.hT unused, and dq, dk, dbeta, dg partial sums per
// column group ([groups, B, T, H, ...], delta_rule_chunk_column_groups).
#include <string>

#include "ops/delta_rule/fused_recurrent.h"

namespace memlab::kernels {

constexpr int kDeltaRuleChunkLen = 32;
constexpr int kDeltaRuleChunkMaxHeadDim = 64;

bool delta_rule_chunk_applies(const DeltaRuleProblem& p);  // dk, dv <= 64 (both padded to 16, 32 or 64)
int delta_rule_chunk_count(int T);                         // chunks (anchors) per head
int delta_rule_chunk_column_groups(const DeltaRuleProblem& p);  // blocks per head along dv

// Tests: false runs the one-set plan (no copies of the next chunk in flight), which devices with less shared memory
// than an H100's (A100) get for the backward, on any device. Default true.
void delta_rule_chunk_set_prefetch(bool on);

std::string delta_rule_chunk_forward(const DeltaRuleProblem& p, const DeltaRuleForwardArgs& a, void* stream);
std::string delta_rule_chunk_backward(const DeltaRuleProblem& p, const DeltaRuleBackwardArgs& a, void* stream);

}  // namespace memlab::kernels
