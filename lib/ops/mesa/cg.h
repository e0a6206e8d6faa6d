#pragma once
// Mesa's chunked conjugate-gradient solve on CUDA, torch-free: the launch interface of cg.cu.
//
// For every token t of a chunk of C tokens the system (H_t + diag(λ)) x_t = b_t, where H_t = γ_t S + Σ_{s<=t} D_ts
// k_s k_sᵀ: S the state entering the chunk, γ_t its decay to t, D_ts the decay from s to t times β_s. The
// mat-vec of all C tokens at once is (P ⊙ γ) S + ((P Kᵀ) ⊙ D) K + P ⊙ λ (H_t is never formed), the CG updates are
// those of the tensor-op form (mixers/mesa.cpp, cg_solve) with eps in both denominators. One block per (batch,
// head, chunk); each warp runs the whole CG of one sub-chunk of 16 tokens from the state entering it (formed once).
// Its products run on the tensor cores: in TF32 with split operands, so at fp32 accuracy (`exact`, fp32 inputs), or,
// where the inputs were bf16, on fp16 operands scaled into fp16's range (as fine as TF32, at twice its rate; three
// mantissa bits above bf16). The Mesa layer calls it twice, for its forward solve and for the backward's adjoint solve
// of the same system; the statistics stay fp32 in memory and in the accumulators.
#include <string>

#include "ops/mesa/chunk.h"

namespace memlab::kernels {

// The head dims and chunk lengths it takes are mesa_chunk_supported's (chunk.h).

struct MesaCgProblem {
  int chunks = 0;  // B * H * N blocks, laid out [B, H, N]
  int H = 0, N = 0, C = 0, dk = 0;
  int T = 0;  // tokens of the op's [B, T, H, d] tensors (MesaRows::native)
  int steps = 0;
  float eps = 0.f;
  int init = 0;  // 0: x_0 = 0, 1: x_0 = b, 2: Jacobi b / diag(H_t + λ)
  bool normalize = true;  // solve for b / |b| and scale back
  bool exact = true;      // products to fp32 accuracy (3xTF32), else on scaled fp16 operands
};

// rhs, K: rows of dk (chunk.h); S and x 8-byte aligned; x: dense chunked fp32 [chunks, C, dk], and, where x_rows.at
// is set, also into those rows; logdecay, beta [chunks, C] (logdecay the chunk's running Σ log γ, so D_ts = exp(logdecay_t - logdecay_s) β_s);
// lam [H, dk]. S: the state entering chunk (bh, n) at S + ((bh) Ns + n) dk², Ns states per (batch, head) (N, or N + 1
// for a scan's output with the final state).
struct MesaCgArgs {
  MesaRows rhs, K;
  const float *S = nullptr, *beta = nullptr, *logdecay = nullptr, *lam = nullptr;
  int Ns = 0;
  float* x = nullptr;
  MesaRowsOut x_rows;
};

// Returns an empty string on success, else the error. stream is a cudaStream_t.
std::string mesa_cg_solve(const MesaCgProblem& p, const MesaCgArgs& a, void* stream);

}  // namespace memlab::kernels
