// Chunkwise delta rule on tensor cores: see chunk.h for the scheme. Every matrix of a chunk sits in shared
// memory in fp32 (rows padded by kPad floats against bank conflicts); products are wmma TF32 tiles of 16×16×8
// spread over the block's warps; the phases of a chunk are separated by __syncthreads.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "ops/delta_rule/chunk.h"
#include "ops/delta_rule/rows.cuh"
#include "ops/float_conversion.cuh"
#include "ops/tf32_mm.cuh"

namespace memlab::kernels {
namespace {

constexpr int C = kDeltaRuleChunkLen;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kPad = 4;  // keeps every row start 16-byte aligned, as wmma needs, and shifts banks row to row
constexpr int LC = C + kPad;
// Below this many heads (B·H) the state's columns split into blocks of 16 (between the measured 64 and 128).
constexpr int kFewHeads = 96;

__host__ __device__ inline int chunks_of(int T) { return (T + C - 1) / C; }

// Loads columns [c0, c0 + D) of rows [t0, t0 + C) of head h of a [B, T, H, width] tensor into dst (C×ld),
// times mul; zeros beyond T and beyond width.
template <typename T, int D>
__device__ void load_rows(float* dst, int ld, const T* src, const DeltaRuleProblem& p, int width, int c0, int b,
                          int h, int t0, float mul) {
  // Rounds of loads issued together (out-of-range ones read element 0 and are zeroed after), as
  // fused_recurrent.cu's load_tile: a branch per element made each bf16 load wait for its conversion.
  constexpr int kPer = (C * D + kThreads - 1) / kThreads, kRound = kPer < 8 ? kPer : 8;
#pragma unroll 1
  for (int e0 = 0; e0 < C * D; e0 += kRound * kThreads) {
    T raw[kRound];
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      const int e = e0 + u * kThreads + threadIdx.x, r = e / D, c = e % D, t = t0 + r;
      raw[u] = src[(e < C * D && t < p.T && c0 + c < width) ? row_of(p, b, t, h) * width + c0 + c : 0];
    }
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      const int e = e0 + u * kThreads + threadIdx.x, r = e / D, c = e % D, t = t0 + r;
      if (e < C * D) dst[r * ld + c] = (t < p.T && c0 + c < width) ? to_float(raw[u]) * mul : 0.f;
    }
  }
}

// Stores src (C×ld, times mul) to the valid rows of columns [c0, c0 + D) of a [B, T, H, width] tensor.
template <typename T, int D>
__device__ void store_rows(T* dst, const float* src, int ld, const DeltaRuleProblem& p, int width, int c0, int b,
                           int h, int t0, float mul) {
  for (int e = threadIdx.x; e < C * D; e += kThreads) {
    const int r = e / D, c = e % D, t = t0 + r;
    if (t < p.T && c0 + c < width) dst[row_of(p, b, t, h) * width + c0 + c] = from_float<T>(src[r * ld + c] * mul);
  }
}

// Columns [j0, j0 + DV) of a [dk, dv] fp32 state of one head <-> its padded DK×ld tile.
template <int DK, int DV>
__device__ void load_state(float* dst, int ld, const float* src, const DeltaRuleProblem& p, int j0) {
  for (int e = threadIdx.x; e < DK * DV; e += kThreads) {
    const int i = e / DV, j = e % DV;
    dst[i * ld + j] = (src && i < p.dk && j0 + j < p.dv) ? src[i * p.dv + j0 + j] : 0.f;
  }
}
template <int DK, int DV>
__device__ void store_state(float* dst, const float* src, int ld, const DeltaRuleProblem& p, int j0) {
  for (int e = threadIdx.x; e < DK * DV; e += kThreads) {
    const int i = e / DV, j = e % DV;
    if (i < p.dk && j0 + j < p.dv) dst[i * p.dv + j0 + j] = src[i * ld + j];
  }
}

__device__ void load_beta(float* dst, const float* beta, const DeltaRuleProblem& p, int b, int h, int t0) {
  if (threadIdx.x < C) {
    const int t = t0 + threadIdx.x;
    dst[threadIdx.x] = t < p.T ? beta[row_of(p, b, t, h)] : 0.f;
  }
}

// Warp 0: dst[i] = G_i = Σ_{j<=i} g_j over the chunk's steps (an inclusive scan; g = 0 beyond T, so the rows
// past the end keep the last valid G and the chunk's total decay exp(G_{C-1}) is the valid steps').
static_assert(C == 32, "load_gates and invert_unit_lower give one lane a step");
__device__ void load_gates(float* dst, const float* g, const DeltaRuleProblem& p, int b, int h, int t0) {
  if (threadIdx.x < 32) {
    const int t = t0 + threadIdx.x;
    float x = t < p.T ? g[row_of(p, b, t, h)] : 0.f;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const float y = __shfl_up_sync(0xffffffffu, x, o);
      if (static_cast<int>(threadIdx.x) >= o) x += y;
    }
    dst[threadIdx.x] = x;
  }
}

// Row and column passes of the backward: each of a chunk's rows (columns) gets kRowThreads adjacent threads of
// one warp, which group_sum sums over.
constexpr int kRowThreads = kThreads / C;
static_assert(kRowThreads == 8, "group_sum reduces over 8 lanes");
__device__ __forceinline__ float group_sum(float s) {
  s += __shfl_xor_sync(0xffffffffu, s, 4);
  s += __shfl_xor_sync(0xffffffffu, s, 2);
  return s + __shfl_xor_sync(0xffffffffu, s, 1);
}

// Row i: Σ_c x_ic y_ic over D columns, summed over the row's kRowThreads threads (part = the thread's place among
// them); x's row is then scaled by f.
template <int D>
__device__ __forceinline__ float row_dot_then_scale(float* x, const float* y, int ld, int i, int part, float f) {
  float s = 0.f;
#pragma unroll
  for (int c = part; c < D; c += kRowThreads) {
    s += x[i * ld + c] * y[i * ld + c];
    x[i * ld + c] *= f;
  }
  return group_sum(s);
}

// exp(G_i − G_j) for j <= i (the decay from step j to step i), else 0: every exponent <= 0.
__device__ __forceinline__ float decay(const float* G, int i, int j) { return j <= i ? expf(G[i] - G[j]) : 0.f; }

// One warp: t = (I + a)⁻¹ for a strictly lower C×C (C = 32): lane c walks column c of t down the rows,
// t[i][c] = δ_ic − Σ_{j<i} a[i][j] t[j][c], the column in registers.
__device__ void invert_unit_lower(float* t, const float* a, int lane) {
  float col[C];
#pragma unroll
  for (int i = 0; i < C; ++i) {
    float s0 = i == lane ? 1.f : 0.f, s1 = 0.f;  // two chains: the FMA latency bounds the walk
#pragma unroll
    for (int j = 0; j + 1 < i; j += 2) {
      s0 -= a[i * LC + j] * col[j];
      s1 -= a[i * LC + j + 1] * col[j + 1];
    }
    if (i % 2 == 1) s0 -= a[i * LC + i - 1] * col[i - 1];
    col[i] = s0 + s1;
  }
#pragma unroll
  for (int i = 0; i < C; ++i) t[i * LC + lane] = col[i];
}

// Shared-memory plan of the forward: C×LK matrices q, k, w; C×LV matrices v, u, o; the DK×LV state columns;
// C×LC a (then T diag(βγ) when gated), t (then T diag β), m (lower Q Kᵀ); β; G when gated.
template <int DK, int DV, bool GATED>
struct ForwardSmem {
  static constexpr int LK = DK + kPad, LV = DV + kPad;
  static constexpr size_t floats = 3 * C * LK + 3 * C * LV + DK * LV + 3 * C * LC + C + (GATED ? C : 0);
  static constexpr size_t bytes = floats * sizeof(float);
};

// Block (bh, group): head bh, state columns [group·DV, +DV). The columns of the rule are independent given
// A, T and W, which every group recomputes. GATED, with G the chunk's cumulative log-decay, γ_i = exp(G_i),
// λ_j = exp(G_{C-1} − G_j), D_ij = exp(G_i − G_j) (j <= i): A and lower(Q Kᵀ) take ⊙ D, W = T diag(βγ) K,
// O = diag(γ) Q S + …, S ← γ_{C-1} S + (diag(λ) K)ᵀ U (reference.h's chunked form).
template <typename T, int DK, int DV, bool EXACT, bool GATED>
__global__ void __launch_bounds__(kThreads, 2) chunk_forward_kernel(DeltaRuleProblem p, DeltaRuleForwardArgs a) {
  constexpr int LK = ForwardSmem<DK, DV, GATED>::LK, LV = ForwardSmem<DK, DV, GATED>::LV;
  extern __shared__ __align__(128) float smem[];
  float *sQ = smem, *sK = sQ + C * LK, *sW = sK + C * LK, *sV = sW + C * LK, *sU = sV + C * LV, *sO = sU + C * LV;
  float *sS = sO + C * LV, *sA = sS + DK * LV, *sT = sA + C * LC, *sM = sT + C * LC, *sBeta = sM + C * LC;
  float* sGc = sBeta + C;  // GATED only
  const int bh = blockIdx.x, b = bh / p.H, h = bh % p.H, j0 = blockIdx.y * DV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T *q = static_cast<const T*>(a.q), *k = static_cast<const T*>(a.k), *v = static_cast<const T*>(a.v);
  const int chunks = chunks_of(p.T);
  const size_t state = static_cast<size_t>(p.dk) * p.dv;
  load_state<DK, DV>(sS, LV, a.h0 ? a.h0 + bh * state : nullptr, p, j0);
  for (int n = 0; n < chunks; ++n) {
    const int t0 = n * C;
    load_rows<T, DK>(sQ, LK, q, p, p.dk, 0, b, h, t0, p.scale);
    load_rows<T, DK>(sK, LK, k, p, p.dk, 0, b, h, t0, 1.f);
    load_rows<T, DV>(sV, LV, v, p, p.dv, j0, b, h, t0, 1.f);
    load_beta(sBeta, a.beta, p, b, h, t0);
    if constexpr (GATED) load_gates(sGc, a.g, p, b, h, t0);
    __syncthreads();  // also: the state update of the previous chunk is complete
    if (a.anchors) store_state<DK, DV>(a.anchors + (static_cast<size_t>(bh) * chunks + n) * state, sS, LV, p, j0);
    mm<EXACT, false, true>(sA, LC, sK, LK, sK, LK, C, C, DK, false, 1.f, warp, kWarps);  // K Kᵀ
    mm<EXACT, false, true>(sM, LC, sQ, LK, sK, LK, C, C, DK, false, 1.f, warp, kWarps);  // Q Kᵀ
    __syncthreads();
    for (int e = threadIdx.x; e < C * C; e += kThreads) {
      const int i = e / C, j = e % C;
      const float d = GATED ? decay(sGc, i, j) : (j <= i ? 1.f : 0.f);
      sA[i * LC + j] = j < i ? sBeta[i] * sA[i * LC + j] * d : 0.f;
      sM[i * LC + j] *= d;
    }
    __syncthreads();
    if (warp == 0) invert_unit_lower(sT, sA, lane);
    __syncthreads();
    for (int e = threadIdx.x; e < C * C; e += kThreads) {
      const int i = e / C, j = e % C;
      sT[i * LC + j] *= sBeta[j];
      if constexpr (GATED) sA[i * LC + j] = sT[i * LC + j] * expf(sGc[j]);  // T diag(βγ)
    }
    if constexpr (GATED) {  // Q's rows read S through γ: O = diag(γ) Q S + …
      for (int e = threadIdx.x; e < C * DK; e += kThreads) sQ[(e / DK) * LK + e % DK] *= expf(sGc[e / DK]);
    }
    __syncthreads();
    mm<EXACT, false, false>(sW, LK, GATED ? sA : sT, LC, sK, LK, C, DK, C, false, 1.f, warp, kWarps);  // W
    mm<EXACT, false, false>(sU, LV, sT, LC, sV, LV, C, DV, C, false, 1.f, warp, kWarps);  // T diag(β) V
    __syncthreads();
    mm<EXACT, false, false>(sU, LV, sW, LK, sS, LV, C, DV, DK, true, -1.f, warp, kWarps);  // U −= W S
    __syncthreads();
    mm<EXACT, false, false>(sO, LV, sQ, LK, sS, LV, C, DV, DK, false, 1.f, warp, kWarps);  // O = Q S
    mm<EXACT, false, false>(sO, LV, sM, LC, sU, LV, C, DV, C, true, 1.f, warp, kWarps);    //   + lower(Q Kᵀ) U
    __syncthreads();
    if constexpr (GATED) {  // S ← γ_{C-1} S + (diag(λ) K)ᵀ U
      const float last = sGc[C - 1];
      for (int e = threadIdx.x; e < DK * DV; e += kThreads) sS[(e / DV) * LV + e % DV] *= expf(last);
      for (int e = threadIdx.x; e < C * DK; e += kThreads) sK[(e / DK) * LK + e % DK] *= expf(last - sGc[e / DK]);
      __syncthreads();
    }
    mm<EXACT, true, false>(sS, LV, sK, LK, sU, LV, DK, DV, C, true, 1.f, warp, kWarps);  // S += Kᵀ U
    store_rows<T, DV>(static_cast<T*>(a.o), sO, LV, p, p.dv, j0, b, h, t0, 1.f);
    __syncthreads();  // before the next chunk's loads overwrite k and the update's reads of it
  }
  if (a.hT) store_state<DK, DV>(a.hT + bh * state, sS, LV, p, j0);
}

// Shared-memory plan of the backward: C×LK matrices q, k, w, dw, dq, dk; C×LV matrices v, do, u, du, dv;
// DK×LV s and ds; C×LC g (K Kᵀ), t (T), tb (A, then T diag β, then dA), m (lower Q Kᵀ, then dT diag β),
// dm (then Tᵀ dT); β and dβ. GATED adds C×LC tg (T diag(βγ)) and e (the decays' gradients dD ⊙ D), G, dG and
// the gradient of G_{C-1} gathered by atomics.
template <int DK, int DV, bool GATED>
struct BackwardSmem {
  static constexpr int LK = DK + kPad, LV = DV + kPad;
  static constexpr size_t floats =
      6 * C * LK + 5 * C * LV + 2 * DK * LV + 5 * C * LC + 2 * C + (GATED ? 2 * C * LC + 2 * C + 1 : 0);
  static constexpr size_t bytes = floats * sizeof(float);
};

// Block (bh, group) as the forward's. What the columns share (dq, dk, dβ, dg, through dW, dM and d(T diag β),
// all linear in the columns' terms) is written as the group's partial sum: dq, dk, dbeta, dg [groups, B, T, H, ...].
// GATED: the decays enter through γ (O's read of S and W), λ and γ_{C-1} (the state update) and D (A and
// lower(Q Kᵀ)); their gradients gather in dG_i, and dg is dG's reverse cumulative sum over the chunk.
template <typename T, int DK, int DV, bool EXACT, bool GATED>
__global__ void __launch_bounds__(kThreads, 2) chunk_backward_kernel(DeltaRuleProblem p, DeltaRuleBackwardArgs a) {
  constexpr int LK = BackwardSmem<DK, DV, GATED>::LK, LV = BackwardSmem<DK, DV, GATED>::LV;
  extern __shared__ __align__(128) float smem[];
  float *sQ = smem, *sK = sQ + C * LK, *sW = sK + C * LK, *sdW = sW + C * LK, *sdQ = sdW + C * LK;
  float *sdK = sdQ + C * LK, *sV = sdK + C * LK, *sdO = sV + C * LV, *sU = sdO + C * LV, *sdU = sU + C * LV;
  float *sdV = sdU + C * LV, *sS = sdV + C * LV, *sdS = sS + DK * LV;
  float *sG = sdS + DK * LV, *sT = sG + C * LC, *sTb = sT + C * LC, *sM = sTb + C * LC, *sdM = sM + C * LC;
  float *sBeta = sdM + C * LC, *sdBeta = sBeta + C;
  float *sTg = sdBeta + C, *sE = sTg + C * LC, *sGc = sE + C * LC, *sdG = sGc + C, *sdLast = sdG + C;  // GATED
  const int bh = blockIdx.x, b = bh / p.H, h = bh % p.H, j0 = blockIdx.y * DV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T *q = static_cast<const T*>(a.q), *k = static_cast<const T*>(a.k), *v = static_cast<const T*>(a.v),
          *d_o = static_cast<const T*>(a.d_o);
  const int chunks = chunks_of(p.T);
  const size_t state = static_cast<size_t>(p.dk) * p.dv, rows = static_cast<size_t>(p.B) * p.T * p.H;
  float *dq = static_cast<float*>(a.dq) + blockIdx.y * rows * p.dk,
        *dk = static_cast<float*>(a.dk) + blockIdx.y * rows * p.dk,
        *dbeta = a.dbeta + blockIdx.y * rows, *dg = GATED ? a.dg + blockIdx.y * rows : nullptr;
  load_state<DK, DV>(sdS, LV, a.dhT ? a.dhT + bh * state : nullptr, p, j0);
  for (int n = chunks - 1; n >= 0; --n) {
    const int t0 = n * C;
    load_rows<T, DK>(sQ, LK, q, p, p.dk, 0, b, h, t0, p.scale);
    load_rows<T, DK>(sK, LK, k, p, p.dk, 0, b, h, t0, 1.f);
    load_rows<T, DV>(sV, LV, v, p, p.dv, j0, b, h, t0, 1.f);
    load_rows<T, DV>(sdO, LV, d_o, p, p.dv, j0, b, h, t0, 1.f);
    load_beta(sBeta, a.beta, p, b, h, t0);
    load_state<DK, DV>(sS, LV, a.anchors + (static_cast<size_t>(bh) * chunks + n) * state, p, j0);
    if constexpr (GATED) {
      load_gates(sGc, a.g, p, b, h, t0);
      if (threadIdx.x < C) sdG[threadIdx.x] = 0.f;
      if (threadIdx.x == 0) *sdLast = 0.f;
    }
    __syncthreads();
    mm<EXACT, false, true>(sG, LC, sK, LK, sK, LK, C, C, DK, false, 1.f, warp, kWarps);  // K Kᵀ
    mm<EXACT, false, true>(sM, LC, sQ, LK, sK, LK, C, C, DK, false, 1.f, warp, kWarps);  // Q Kᵀ
    __syncthreads();
    for (int e = threadIdx.x; e < C * C; e += kThreads) {
      const int i = e / C, j = e % C;
      const float d = GATED ? decay(sGc, i, j) : (j <= i ? 1.f : 0.f);
      if constexpr (GATED) sG[i * LC + j] *= d;  // K Kᵀ ⊙ D
      sTb[i * LC + j] = j < i ? sBeta[i] * sG[i * LC + j] : 0.f;  // A
      sM[i * LC + j] *= d;
    }
    __syncthreads();
    if (warp == 0) {
      invert_unit_lower(sT, sTb, lane);
    } else {  // meanwhile, what needs only the loads: dU = K dS (+ Mᵀ dO below), dQ = dO Sᵀ (+ dM K below)
      mm<EXACT, false, false>(sdU, LV, sK, LK, sdS, LV, C, DV, DK, false, 1.f, warp - 1, kWarps - 1);
      mm<EXACT, false, true>(sdQ, LK, sdO, LV, sS, LV, C, DK, DV, false, 1.f, warp - 1, kWarps - 1);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < C * C; e += kThreads) {
      const int i = e / C, j = e % C;
      sTb[i * LC + j] = sT[i * LC + j] * sBeta[j];
      if constexpr (GATED) sTg[i * LC + j] = sTb[i * LC + j] * expf(sGc[j]);
    }
    if constexpr (GATED) {
      {  // row i: O's read diag(γ) Q S gives dG_i += γ_i Q_i·(dO Sᵀ)_i and dQ_i = γ_i (dO Sᵀ)_i
        const int i = threadIdx.x / kRowThreads, part = threadIdx.x % kRowThreads;
        const float gamma = expf(sGc[i]), lambda = expf(sGc[C - 1] - sGc[i]);
        const float s = row_dot_then_scale<DK>(sdQ, sQ, LK, i, part, gamma);
        if (part == 0) sdG[i] += gamma * s;
#pragma unroll
        for (int c = part; c < DV; c += kRowThreads) sdU[i * LV + c] *= lambda;  // dU = diag(λ) K dS
      }
      float s = 0.f;  // γ_{C-1} S: dG_{C-1} += γ_{C-1} <dS, S>
      for (int e = threadIdx.x; e < DK * DV; e += kThreads) s += sdS[(e / DV) * LV + e % DV] * sS[(e / DV) * LV + e % DV];
#pragma unroll
      for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0) atomicAdd(sdLast, s * expf(sGc[C - 1]));
    }
    __syncthreads();
    mm<EXACT, false, false>(sW, LK, GATED ? sTg : sTb, LC, sK, LK, C, DK, C, false, 1.f, warp, kWarps);  // W
    mm<EXACT, false, false>(sU, LV, sTb, LC, sV, LV, C, DV, C, false, 1.f, warp, kWarps);  // T diag(β) V
    __syncthreads();
    mm<EXACT, false, false>(sU, LV, sW, LK, sS, LV, C, DV, DK, true, -1.f, warp, kWarps);  // U −= W S
    __syncthreads();
    mm<EXACT, true, false>(sdU, LV, sM, LC, sdO, LV, C, DV, C, true, 1.f, warp, kWarps);    // dU += Mᵀ dO
    mm<EXACT, false, true>(sdM, LC, sdO, LV, sU, LV, C, C, DV, false, 1.f, warp, kWarps);   // dO Uᵀ
    mm<EXACT, false, true>(sdK, LK, sU, LV, sdS, LV, C, DK, DV, false, 1.f, warp, kWarps);  // dK = U dSᵀ
    __syncthreads();
    for (int e = threadIdx.x; e < C * C; e += kThreads) {
      const int i = e / C, j = e % C;
      const float x = j <= i ? sdM[i * LC + j] : 0.f;
      if constexpr (GATED) {  // M = Q Kᵀ ⊙ D: dD_ij D_ij = x M_ij (the diagonal's cancel in dG)
        sE[i * LC + j] = j < i ? x * sM[i * LC + j] : 0.f;
        sdM[i * LC + j] = x * decay(sGc, i, j);
      } else {
        sdM[i * LC + j] = x;  // dM
      }
    }
    if constexpr (GATED) {
      {  // row i of the update's (diag(λ) K)ᵀ U: dK_i = λ_i (U dSᵀ)_i, dλ_i = (U dSᵀ)_i·K_i
        const int i = threadIdx.x / kRowThreads, part = threadIdx.x % kRowThreads;
        const float lambda = expf(sGc[C - 1] - sGc[i]);
        const float s = row_dot_then_scale<DK>(sdK, sK, LK, i, part, lambda);
        if (part == 0) {
          sdG[i] -= lambda * s;
          atomicAdd(sdLast, lambda * s);
        }
      }
      // What follows reads dO only in dS += (diag(γ) Q)ᵀ dO, and the state's gradient only as γ_{C-1} dS.
      for (int e = threadIdx.x; e < C * DV; e += kThreads) sdO[(e / DV) * LV + e % DV] *= expf(sGc[e / DV]);
      const float last = expf(sGc[C - 1]);
      for (int e = threadIdx.x; e < DK * DV; e += kThreads) sdS[(e / DV) * LV + e % DV] *= last;
    }
    __syncthreads();
    mm<EXACT, false, false>(sdQ, LK, sdM, LC, sK, LK, C, DK, C, true, 1.f, warp, kWarps);   // dQ += dM K
    mm<EXACT, true, false>(sdK, LK, sdM, LC, sQ, LK, C, DK, C, true, 1.f, warp, kWarps);    // dK += dMᵀ Q
    mm<EXACT, true, false>(sdS, LV, sQ, LK, sdO, LV, DK, DV, C, true, 1.f, warp, kWarps);   // dS += Qᵀ dO
    mm<EXACT, true, false>(sdS, LV, sW, LK, sdU, LV, DK, DV, C, true, -1.f, warp, kWarps);  //    − Wᵀ dU
    mm<EXACT, false, true>(sdW, LK, sdU, LV, sS, LV, C, DK, DV, false, -1.f, warp, kWarps);  // dW = −dU Sᵀ
    mm<EXACT, true, false>(sdV, LV, sTb, LC, sdU, LV, C, DV, C, false, 1.f, warp, kWarps);  // dV = (T diag β)ᵀ dU
    __syncthreads();
    mm<EXACT, false, true>(sM, LC, sdU, LV, sV, LV, C, C, DV, false, 1.f, warp, kWarps);  // d(T diag β) = dU Vᵀ
    if constexpr (GATED) {
      mm<EXACT, false, true>(sdM, LC, sdW, LK, sK, LK, C, C, DK, false, 1.f, warp, kWarps);  // R = dW Kᵀ
      mm<EXACT, true, false>(sdK, LK, sTg, LC, sdW, LK, C, DK, C, true, 1.f, warp, kWarps);  // dK += (T diag βγ)ᵀ dW
    } else {
      mm<EXACT, false, true>(sM, LC, sdW, LK, sK, LK, C, C, DK, true, 1.f, warp, kWarps);    //   + dW Kᵀ
      mm<EXACT, true, false>(sdK, LK, sTb, LC, sdW, LK, C, DK, C, true, 1.f, warp, kWarps);  // dK += (T diag β)ᵀ dW
    }
    store_rows<float, DV>(static_cast<float*>(a.dv), sdV, LV, p, p.dv, j0, b, h, t0, 1.f);
    __syncthreads();
    {  // column j: dβ_j = Σ_i d(Tβ)_ij T_ij, dT_ij = d(Tβ)_ij β_j
      const int j = threadIdx.x / kRowThreads, part = threadIdx.x % kRowThreads;
      const float gamma = GATED ? expf(sGc[j]) : 0.f;
      float s = 0.f, sg = 0.f;
#pragma unroll
      for (int i = part; i < C; i += kRowThreads) {
        float x = sM[i * LC + j];
        if constexpr (GATED) {  // W's T diag(βγ): d(Tβ)_ij += γ_j R_ij, dG_j += Σ_i R_ij (T diag βγ)_ij
          x += gamma * sdM[i * LC + j];
          sg += sdM[i * LC + j] * sTg[i * LC + j];
        }
        s += x * sT[i * LC + j];
        sM[i * LC + j] = x * sBeta[j];
      }
      s = group_sum(s);
      if (part == 0) sdBeta[j] = s;
      if constexpr (GATED) {
        sg = group_sum(sg);
        if (part == 0) sdG[j] += sg;
      }
    }
    __syncthreads();
    mm<EXACT, true, false>(sdM, LC, sT, LC, sM, LC, C, C, C, false, 1.f, warp, kWarps);  // X = Tᵀ dT
    __syncthreads();
    mm<EXACT, false, true>(sTb, LC, sdM, LC, sT, LC, C, C, C, false, -1.f, warp, kWarps);  // dA = −X Tᵀ
    __syncthreads();
    {  // row i: dβ_i += Σ_{j<i} dA_ij G_ij; dG_ij = β_i dA_ij, strictly lower
      // (GATED: G = K Kᵀ ⊙ D, dG = β_i dA_ij D_ij, and dD_ij D_ij = β_i dA_ij G_ij)
      const int i = threadIdx.x / kRowThreads, part = threadIdx.x % kRowThreads;
      float s = 0.f;
#pragma unroll
      for (int j = part; j < C; j += kRowThreads) {
        const float da = j < i ? sTb[i * LC + j] : 0.f;
        s += da * sG[i * LC + j];
        if constexpr (GATED) {
          sE[i * LC + j] += da * sBeta[i] * sG[i * LC + j];
          sTb[i * LC + j] = da * sBeta[i] * decay(sGc, i, j);
        } else {
          sTb[i * LC + j] = da * sBeta[i];
        }
      }
      s = group_sum(s);
      if (part == 0) sdBeta[i] += s;
    }
    __syncthreads();
    mm<EXACT, false, false>(sdK, LK, sTb, LC, sK, LK, C, DK, C, true, 1.f, warp, kWarps);  // dK += dG K
    mm<EXACT, true, false>(sdK, LK, sTb, LC, sK, LK, C, DK, C, true, 1.f, warp, kWarps);   //    + dGᵀ K
    if constexpr (GATED) {
      if (warp == kWarps - 1) {  // lane c: dG_c += Σ_j E_cj − Σ_i E_ic; dg_c = Σ_{i>=c} dG_i
        float x = sdG[lane] + (lane == C - 1 ? *sdLast : 0.f);
        for (int j = 0; j < C; ++j) x += sE[lane * LC + j] - sE[j * LC + lane];
#pragma unroll
        for (int o = 1; o < 32; o *= 2) {
          const float y = __shfl_down_sync(0xffffffffu, x, o);
          if (lane + o < 32) x += y;
        }
        if (t0 + lane < p.T) dg[row_of(p, b, t0 + lane, h)] = x;
      }
    }
    __syncthreads();
    store_rows<float, DK>(dq, sdQ, LK, p, p.dk, 0, b, h, t0, p.scale);
    store_rows<float, DK>(dk, sdK, LK, p, p.dk, 0, b, h, t0, 1.f);
    if (threadIdx.x < C && t0 + static_cast<int>(threadIdx.x) < p.T)
      dbeta[row_of(p, b, t0 + threadIdx.x, h)] = sdBeta[threadIdx.x];
    // The next chunk writes dq, dk and dβ only after several more barriers.
  }
  __syncthreads();
  if (a.dh0) store_state<DK, DV>(a.dh0 + bh * state, sdS, LV, p, j0);
}

int padded(int d) { return d <= 16 ? 16 : d <= 32 ? 32 : 64; }

// Column-block width: all of dv in one block per head, unless there are few heads (fwd+bwd on an H200, blocks
// of 16 / one block: B8 H8 T2048 D64 3.70 / 4.64 ms, but B64 H2 T780 D50 2.88 / 1.83 ms), at the price of
// recomputing A, T and W per block and summing the blocks' dq, dk and dβ.
int column_block(const DeltaRuleProblem& p) { return p.B * p.H < kFewHeads ? 16 : padded(p.dv); }

// Runs Launch::run<T, DK, DV, EXACT, GATED> for the problem's element type (fp32 inputs: 3xTF32), padded dk,
// column-block width and whether a gate comes.
template <typename Launch, typename Args>
std::string dispatch(const DeltaRuleProblem& p, const Args& a, void* stream) {
  if (!delta_rule_chunk_applies(p)) return "chunkwise delta rule kernel: head dims out of range";
  if (p.B * p.T * p.H == 0) return "";
  auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(p.B * p.H, delta_rule_chunk_column_groups(p));
  auto gated = [&](auto t, auto dk, auto dv, auto exact) {
    using T = typename decltype(t)::type;
    constexpr int DK = decltype(dk)::value, DV = decltype(dv)::value;
    constexpr bool EXACT = decltype(exact)::value;
    if (a.g)
      Launch::template run<T, DK, DV, EXACT, true>(p, a, grid, s);
    else
      Launch::template run<T, DK, DV, EXACT, false>(p, a, grid, s);
  };
  auto typed = [&](auto dk, auto dv) {
    if (p.bf16)
      gated(std::common_type<__nv_bfloat16>{}, dk, dv, std::false_type{});
    else
      gated(std::common_type<float>{}, dk, dv, std::true_type{});
  };
  auto with_dk = [&](auto dv) {
    const int dk = padded(p.dk);
    if (dk == 16)
      typed(std::integral_constant<int, 16>{}, dv);
    else if (dk == 32)
      typed(std::integral_constant<int, 32>{}, dv);
    else
      typed(std::integral_constant<int, 64>{}, dv);
  };
  const int dv = column_block(p);
  if (dv == 16)
    with_dk(std::integral_constant<int, 16>{});
  else if (dv == 32)
    with_dk(std::integral_constant<int, 32>{});
  else
    with_dk(std::integral_constant<int, 64>{});
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? std::string() : std::string("chunkwise delta rule kernel: ") + cudaGetErrorString(e);
}

// Launches a kernel with its dynamic shared memory (beyond the default 48 KB, so set per kernel).
template <typename Args>
void launch(void (*kernel)(DeltaRuleProblem, Args), size_t bytes, dim3 grid, cudaStream_t s,
            const DeltaRuleProblem& p, const Args& a) {
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  kernel<<<grid, kThreads, bytes, s>>>(p, a);
}

struct Forward {
  template <typename T, int DK, int DV, bool EXACT, bool GATED>
  static void run(const DeltaRuleProblem& p, const DeltaRuleForwardArgs& a, dim3 grid, cudaStream_t s) {
    launch(chunk_forward_kernel<T, DK, DV, EXACT, GATED>, ForwardSmem<DK, DV, GATED>::bytes, grid, s, p, a);
  }
};

struct Backward {
  template <typename T, int DK, int DV, bool EXACT, bool GATED>
  static void run(const DeltaRuleProblem& p, const DeltaRuleBackwardArgs& a, dim3 grid, cudaStream_t s) {
    launch(chunk_backward_kernel<T, DK, DV, EXACT, GATED>, BackwardSmem<DK, DV, GATED>::bytes, grid, s, p, a);
  }
};

}  // namespace

bool delta_rule_chunk_applies(const DeltaRuleProblem& p) {
  return p.dk >= 1 && p.dv >= 1 && p.dk <= kDeltaRuleChunkMaxHeadDim && p.dv <= kDeltaRuleChunkMaxHeadDim;
}

int delta_rule_chunk_count(int T) { return chunks_of(T); }

int delta_rule_chunk_column_groups(const DeltaRuleProblem& p) {
  const int w = column_block(p);
  return (p.dv + w - 1) / w;
}

std::string delta_rule_chunk_forward(const DeltaRuleProblem& p, const DeltaRuleForwardArgs& a, void* stream) {
  if (p.qk_l2norm) return "chunkwise delta rule kernel: q and k must arrive normalised";
  return dispatch<Forward>(p, a, stream);
}

std::string delta_rule_chunk_backward(const DeltaRuleProblem& p, const DeltaRuleBackwardArgs& a, void* stream) {
  if (p.qk_l2norm) return "chunkwise delta rule kernel: q and k must arrive normalised";
  return dispatch<Backward>(p, a, stream);
}

}  // namespace memlab::kernels
