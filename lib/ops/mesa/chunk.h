#pragma once
// The chunk-level parts of Mesa's op around its CG solve (cg.h), on CUDA, torch-free: the launch interface of
// chunk.cu. Each is the tensor-op form's function of the same name in mixers/mesa.cpp, for all chunks at once:
//   mesa_chunk_contrib  X_n = (L ⊙ s)ᵀ R over a chunk's tokens, s_t = exp(b_last - b_t) β_t (the chunk's part of
//                       the state after it) or exp(b_t) (a read's part of the state entering it);
//   mesa_chunk_scan     S_{n+1} = exp(a_n) S_n + X_n from S_0 (forward), or S_n = exp(a_n) S_{n+1} + X_n from S_N
//                       (the adjoints' scan, backward); a_n = b_last of chunk n;
//   mesa_chunk_walk     the two above in one launch, one block per (batch, head) walking its chunks;
//   mesa_chunk_read     Y = (A ⊙ γ) S + ((A Bᵀ) ⊙ D) U, γ_t = exp(b_t), D_ts = exp(b_t - b_s) β_s for s <= t;
//   mesa_chunk_adjoint  gla_adjoint's chunk-local part: P, ∂/∂u, ∂/∂β and ∂/∂c from the state entering the chunk
//                       and the adjoint of the state after it.
// b is the chunk's running Σ log γ (b_last its last token's). But for the walk, one block per (batch, head, chunk)
// keeps the chunk's tiles in shared memory and multiplies them on the tensor cores: 3xTF32 (fp32 accuracy,
// ops/tf32_mm.cuh) when `exact`; else (the inputs were bf16) fp16 operands with fp32 accumulators (ops/mma_f16.cuh),
// each tile scaled by a power of two into fp16's range, for chunks of 33-64 and head dims of 17-64, and TF32 for the
// rest. Everything is fp32 in memory: the statistics never drop below it.
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
  int T = 0, H = 0;  // of the op's [B, T, H, d] tensors (MesaRows::native)
  bool exact = true;
};

// Token rows, read chunk by chunk: the op's own [B, T, H, d] tensors as they are (`native`: fp32 or bf16; the last
// chunk's tokens past T read as zeros), or its intermediates in dense chunked fp32 [B, H, N, C, d]. Read-only while a
// kernel runs: no output of the same launch (MesaRowsOut, states, x) may overlap them (the loads take the
// non-coherent path).
struct MesaRows {
  const void* at = nullptr;
  int d = 0;
  bool native = false, bf16 = false;
};
// Token rows written chunk by chunk, as MesaRows: native ones only for tokens before T, chunked ones all C rows
// (zeros past T). accumulate: add to what is there.
struct MesaRowsOut {
  void* at = nullptr;
  int d = 0;
  bool native = false, bf16 = false, accumulate = false;
};

// The state of chunk (bh, n) lies at at + ((bh) Ns + n + offset) rows x cols.
struct MesaStates {
  const float* at = nullptr;
  int Ns = 0, offset = 0;
};

// X [chunks, dl, dr] = (L ⊙ s)ᵀ R, L rows of dl, R rows of dr, s as above times `scale`. logdecay, beta [chunks, C].
struct MesaContribArgs {
  MesaRows L, R;
  const float *logdecay = nullptr, *beta = nullptr;
  bool to_end = true;  // s_t = exp(b_last - b_t) β_t, else exp(b_t)
  float scale = 1.f;
  float* X = nullptr;
};
std::string mesa_chunk_contrib(const MesaChunkProblem& p, const MesaContribArgs& a, void* stream);

// out [BH, N + 1, dd]: forward out_0 = S0, out_{n+1} = exp(a_n) out_n + X_n; reverse out_N = S0, out_n =
// exp(a_n) out_{n+1} + X_n. X [BH, N, dd], logdecay [BH, N, C], S0 [BH, dd] (null: zeros).
struct MesaScanArgs {
  const float *X = nullptr, *logdecay = nullptr, *S0 = nullptr;
  int BH = 0, dd = 0;
  bool reverse = false;
  float* out = nullptr;
};
std::string mesa_chunk_scan(const MesaChunkProblem& p, const MesaScanArgs& a, void* stream);

// mesa_chunk_contrib's X_n summed into mesa_chunk_scan's walk in one launch, one block per (batch, head), that writes
// only the scan's output (s.X and s.logdecay are not read: the gates are a's): for inexact products (TF32; the inputs were bf16) at head dims 17-32
// (mesa_chunk_walk_supported). It pays where many (batch, head) pairs walk few chunks each (mesa_chunk_walk_pays:
// 512 pairs or more): on an H200, 0.43 against 0.72 ms for the four scans at B1024 H4 N4 d32; with few pairs a walk is
// slower than the contributions' parallel launch and the scan (its d-64 form: 0.29 against 0.22 ms at B8 H8 N32).
bool mesa_chunk_walk_supported(const MesaChunkProblem& p, int dl, int dr);
bool mesa_chunk_walk_pays(const MesaChunkProblem& p, int dl, int dr);
std::string mesa_chunk_walk(const MesaChunkProblem& p, const MesaContribArgs& a, const MesaScanArgs& s, void* stream);

// Y = (A ⊙ γ) S + ((A Bᵀ) ⊙ D) U: A, B rows of da, U and Y rows of du, S [da, du] per chunk, or [du, da] read
// transposed.
struct MesaReadArgs {
  MesaRows A, B, U;
  const float *logdecay = nullptr, *beta = nullptr;
  MesaStates S;
  bool S_transposed = false;
  MesaRowsOut Y;
};
std::string mesa_chunk_read(const MesaChunkProblem& p, const MesaReadArgs& a, void* stream);

// For F = Σ_t a_t · M_tᵀ b_t, M_t = Σ_{s<=t} ζ_ts β_s k_s u_sᵀ (+ the state entering the chunk), per chunk: A rows
// of du (a_t), Bq rows of dk (b_t, times bq_scale), K rows of dk, U rows of du, S [dk, du] the state entering the
// chunk, R [dk, du] the adjoint of the state after it. Out: dkey = β ⊙ P (P_s = Σ_{t>=s} ζ_ts (u_s·a_t) b_t), du,
// dbeta [chunks, C] = Σ_i k_si P_si, dc [chunks, C] = a_t · o_t - β_t dbeta_t (o_t = M_tᵀ b_t). With du_into_dkey
// (U = K) dkey gets β ⊙ P + du and du is not written; with accumulate, dbeta and dc are added to. Where rowdot is set
// (du = dk), rowdot [chunks, dk] = Σ_t a_t ⊙ b_t over the chunk's tokens (b_t times bq_scale): λ's gradient, summed
// over batch and chunks by the caller.
struct MesaAdjointArgs {
  MesaRows A, Bq, K, U;
  const float *logdecay = nullptr, *beta = nullptr;
  MesaStates S, R;
  float bq_scale = 1.f;
  MesaRowsOut dkey, du;
  bool du_into_dkey = false, accumulate = false;
  float *dbeta = nullptr, *dc = nullptr, *rowdot = nullptr;
};
std::string mesa_chunk_adjoint(const MesaChunkProblem& p, const MesaAdjointArgs& a, void* stream);

}  // namespace memlab::kernels
