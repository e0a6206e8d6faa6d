#pragma once
// The chunk-level parts of Mesa's op around its CG solve (cg.h), on CUDA, torch-free: the launch interface of
// chunk.cu. Each is the tensor-op form's function of the same name in mixers/mesa.cpp, for all chunks at once:
//   mesa_chunk_contrib  X_n = (L ⊙ s)ᵀ R over a chunk's tokens, s_t = exp(b_last - b_t) β_t (the chunk's part of
//                       the state after it) or exp(b_t) (a read's part of the state entering it);
//   mesa_chunk_scan     S_{n+1} = exp(a_n) S_n + X_n from S_0 (forward), or S_n = exp(a_n) S_{n+1} + X_n from S_N
//                       (the adjoints' scan, backward); a_n = b_last of chunk n;
//   mesa_chunk_read     Y = (A ⊙ γ) S + ((A Bᵀ) ⊙ D) U, γ_t = exp(b_t), D_ts = exp(b_t - b_s) β_s for s <= t;
//   mesa_chunk_adjoint  gla_adjoint's chunk-local part: P, ∂/∂u, ∂/∂β and ∂/∂c from the state entering the chunk
//                       and the adjoint of the state after it.
// b is the chunk's running Σ log γ (b_last its last token's). One block per (batch, head, chunk) keeps the chunk's
// tiles in shared memory and multiplies them on the tensor cores (ops/tf32_mm.cuh): 3xTF32 (fp32 accuracy) when
// `exact`, else TF32 (the inputs were bf16). Everything is fp32 in memory: the statistics never drop below it.
#include <cstddef>
#include <string>

namespace memlab::kernels {

// Head dims (padded to 16, 32 or 64 inside) and chunk lengths these kernels and cg.h's take.
inline bool mesa_chunk_supported(int d, int C) { return d >= 1 && d <= 64 && C >= 1 && C <= 64; }
// The most shared memory one block of these kernels or of the CG kernel takes: the adjoint kernel's (188 KB at
// C = d = 64, which an A100 does not give; the op then runs in tensor ops).
size_t mesa_chunk_shared_bytes(int d, int C);

struct MesaChunkProblem {
  int chunks = 0;  // B * H * N, laid out [B, H, N]
  int N = 0, C = 0;
  bool exact = true;
};

// A chunk's rows [chunks, C, width] are dense. The state of chunk (bh, n) lies at at + ((bh) Ns + n + offset)
// rows x cols.
struct MesaStates {
  const float* at = nullptr;
  int Ns = 0, offset = 0;
};

// X [chunks, dl, dr] = (L ⊙ s)ᵀ R, L [chunks, C, dl], R [chunks, C, dr], s as above times `scale`.
struct MesaContribArgs {
  const float *L = nullptr, *R = nullptr, *logdecay = nullptr, *beta = nullptr;
  int dl = 0, dr = 0;
  bool to_end = true;  // s_t = exp(b_last - b_t) β_t, else exp(b_t)
  float scale = 1.f;
  float* X = nullptr;
};
std::string mesa_chunk_contrib(const MesaChunkProblem& p, const MesaContribArgs& a, void* stream);

// out [BH, N + 1, dd]: forward out_0 = S0, out_{n+1} = exp(a_n) out_n + X_n; reverse out_N = S0, out_n =
// exp(a_n) out_{n+1} + X_n. X [BH, N, dd], logdecay [BH, N, C], S0 [BH, dd].
struct MesaScanArgs {
  const float *X = nullptr, *logdecay = nullptr, *S0 = nullptr;
  int BH = 0, dd = 0;
  bool reverse = false;
  float* out = nullptr;
};
std::string mesa_chunk_scan(const MesaChunkProblem& p, const MesaScanArgs& a, void* stream);

// Y [chunks, C, du] = (A ⊙ γ) S + ((A Bᵀ) ⊙ D) U: A, B [chunks, C, da], U [chunks, C, du], S [da, du] per chunk, or
// [du, da] read transposed.
struct MesaReadArgs {
  const float *A = nullptr, *B = nullptr, *U = nullptr, *logdecay = nullptr, *beta = nullptr;
  MesaStates S;
  bool S_transposed = false;
  int da = 0, du = 0;
  float* Y = nullptr;
};
std::string mesa_chunk_read(const MesaChunkProblem& p, const MesaReadArgs& a, void* stream);

// For F = Σ_t a_t · M_tᵀ b_t, M_t = Σ_{s<=t} ζ_ts β_s k_s u_sᵀ (+ the state entering the chunk), per chunk: A
// [C, du] (a_t), Bq [C, dk] (b_t, times bq_scale), K [C, dk], U [C, du], S [dk, du] the state entering the chunk,
// R [dk, du] the adjoint of the state after it. Out: dkey [C, dk] = β ⊙ P (P_s = Σ_{t>=s} ζ_ts (u_s·a_t) b_t),
// du [C, du], dbeta [C] = Σ_i k_si P_si, dc [C] = a_t · o_t - β_t dbeta_t (o_t = M_tᵀ b_t).
struct MesaAdjointArgs {
  const float *A = nullptr, *Bq = nullptr, *K = nullptr, *U = nullptr, *logdecay = nullptr, *beta = nullptr;
  MesaStates S, R;
  float bq_scale = 1.f;
  int dk = 0, du = 0;
  float *dkey = nullptr, *du_out = nullptr, *dbeta = nullptr, *dc = nullptr;
};
std::string mesa_chunk_adjoint(const MesaChunkProblem& p, const MesaAdjointArgs& a, void* stream);

}  // namespace memlab::kernels
