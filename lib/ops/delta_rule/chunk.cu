// Chunkwise delta rule on tensor cores: see chunk.h for the scheme. Every matrix of a chunk sits in shared memory in
// fp32 (rows padded by kPad floats against bank conflicts); products are 16×16 tiles of m16n8k8 TF32 steps
// (tf32_mm.cuh) spread over the block's warps, their operands made tf32 without conversion instructions (kRound); the
// phases of a chunk are separated by __syncthreads. A chunk's inputs sit in one of two sets of buffers: fp32 inputs are
// copied by cp.async, the next chunk's while the block works on this one (one set, and no overlap, where two do not fit
// in shared memory or would take more waves of blocks); bf16 inputs are loaded and converted at the chunk's start.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <type_traits>

#include "ops/cp_async.cuh"
#include "ops/delta_rule/chunk.h"
#include "ops/delta_rule/rows.cuh"
#include "ops/float_conversion.cuh"
#include "ops/tf32_mm.cuh"

// Each compilation builds only some of the kernels (see delta_chunk below): the others' helpers go unreferenced.
#pragma nv_diag_suppress 177

namespace memlab::kernels {

// The kernels of one direction and padded dk (16, 32, 64), launched for a problem: each pair is built in its own
// compilation of this file (CMakeLists.txt sets MEMLAB_DELTA_CHUNK_PART), so that the 108 kernels compile in parallel;
// the plain compilation holds the entry points of chunk.h.
namespace delta_chunk {
template <int DK>
std::string forward(const DeltaRuleProblem& p, const DeltaRuleForwardArgs& a, void* stream);
template <int DK>
std::string backward(const DeltaRuleProblem& p, const DeltaRuleBackwardArgs& a, void* stream);
inline std::atomic<bool> prefetch{true};  // delta_rule_chunk_set_prefetch
}  // namespace delta_chunk

namespace {

constexpr int C = kDeltaRuleChunkLen;
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
// A pitch of 4 x (an odd number) floats puts a fragment read along rows (8 rows x 4 columns: A, or Bᵀ) in 32 banks;
// one read down columns (4 x 8: Aᵀ, B) and the accumulator's pairs go 2-way, which no single pitch avoids, but for
// Aᵀ B, whose k slots mm pairs (tf32_mm.cuh).
constexpr int kPad = 4;
constexpr int LC = C + kPad;
// Below this many heads (B·H) the state's columns split into blocks of 16 (between the measured 64 and 128).
constexpr int kFewHeads = 96;
// Products' operands: rounded to nearest tf32 (tf32_mm.cuh), as truncation's bias drifts over long sequences at
// β near 2 (bf16 inputs, T = 777: 1-2% off the fp64 reference); 3xTF32's split is exact either way.
constexpr Tf32 kRound = Tf32::Nearest;

__host__ __device__ inline int chunks_of(int T) { return (T + C - 1) / C; }

// Loads columns [c0, c0 + D) of rows [t0, t0 + C) of head h of a [B, T, H, width] tensor into dst (C×ld), in
// fp32; zeros beyond T and beyond width.
template <typename T, int D>
__device__ void load_rows(float* dst, int ld, const T* src, const DeltaRuleProblem& p, int width, int c0, int b,
                          int h, int t0) {
  // Rounds of loads issued together (out-of-range ones read element 0 and are zeroed after), as
  // fused_recurrent.cu's load_tile: a branch per element made each bf16 load wait for its conversion.
  constexpr int kPer = (C * D + kThreads - 1) / kThreads, kBatch = kPer < 8 ? kPer : 8;
#pragma unroll 1
  for (int e0 = 0; e0 < C * D; e0 += kBatch * kThreads) {
    T raw[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int e = e0 + u * kThreads + threadIdx.x, r = e / D, c = e % D, t = t0 + r;
      raw[u] = src[(e < C * D && t < p.T && c0 + c < width) ? row_of(p, b, t, h) * width + c0 + c : 0];
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int e = e0 + u * kThreads + threadIdx.x, r = e / D, c = e % D, t = t0 + r;
      if (e < C * D) dst[r * ld + c] = (t < p.T && c0 + c < width) ? to_float(raw[u]) : 0.f;
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

// The chunk's per-step scalars (β, or the raw log-decays g) of head h: dst[i] = x at step t0 + i, 0 beyond T.
__device__ void load_steps(float* dst, const float* x, const DeltaRuleProblem& p, int b, int h, int t0) {
  if (threadIdx.x < C) {
    const int t = t0 + threadIdx.x;
    dst[threadIdx.x] = t < p.T ? x[row_of(p, b, t, h)] : 0.f;
  }
}

// The cp.async forms of load_rows (fp32), load_state (src not null) and load_steps.
template <int D>
__device__ void copy_rows(float* dst, int ld, const float* src, const DeltaRuleProblem& p, int width, int c0, int b,
                          int h, int t0) {
  for (int e = threadIdx.x; e < C * D; e += kThreads) {
    const int r = e / D, c = e % D, t = t0 + r;
    const bool in = t < p.T && c0 + c < width;
    cp_async4(dst + r * ld + c, src + (in ? row_of(p, b, t, h) * width + c0 + c : 0), in);
  }
}
template <int DK, int DV>
__device__ void copy_state(float* dst, int ld, const float* src, const DeltaRuleProblem& p, int j0) {
  for (int e = threadIdx.x; e < DK * DV; e += kThreads) {
    const int i = e / DV, j = e % DV;
    const bool in = i < p.dk && j0 + j < p.dv;
    cp_async4(dst + i * ld + j, src + (in ? i * p.dv + j0 + j : 0), in);
  }
}
__device__ void copy_steps(float* dst, const float* x, const DeltaRuleProblem& p, int b, int h, int t0) {
  if (threadIdx.x < C) {
    const int t = t0 + threadIdx.x;
    cp_async4(dst + threadIdx.x, x + (t < p.T ? row_of(p, b, t, h) : 0), t < p.T);
  }
}

// Warp 0: dst[i] = G_i = Σ_{j<=i} g_j over the chunk's steps from the raw g (an inclusive scan; g = 0 beyond T, so
// the rows past the end keep the last valid G and the chunk's total decay exp(G_{C-1}) is the valid steps').
static_assert(C == 32, "scan_gates and invert_unit_lower give one lane a step");
__device__ void scan_gates(float* dst, const float* g) {
  if (threadIdx.x < 32) {
    float x = g[threadIdx.x];
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const float y = __shfl_up_sync(0xffffffffu, x, o);
      if (static_cast<int>(threadIdx.x) >= o) x += y;
    }
    dst[threadIdx.x] = x;
  }
}

// One chunk's inputs in shared memory: q, k (C×LK), v (C×LV), the raw β and g; the backward adds do (C×LV) and the
// state before the chunk (DK×LV). q arrives unscaled. floats(): the set's size; at(base): its buffers from base.
template <int DK, int DV, bool BACKWARD>
struct ChunkSet {
  static constexpr int LK = DK + kPad, LV = DV + kPad;
  static constexpr size_t floats = 2 * C * LK + C * LV + 2 * C + (BACKWARD ? C * LV + DK * LV : 0);
  float *q, *k, *v, *beta, *g, *d_o, *s;
  __device__ static ChunkSet at(float* base) {
    ChunkSet cur;
    cur.q = base;
    cur.k = cur.q + C * LK;
    cur.v = cur.k + C * LK;
    cur.beta = cur.v + C * LV;
    cur.g = cur.beta + C;
    cur.d_o = BACKWARD ? cur.g + C : nullptr;
    cur.s = BACKWARD ? cur.d_o + C * LV : nullptr;
    return cur;
  }
};

// The inputs of chunk n into `set`: by cp.async (committed as one group) for fp32, else loaded and converted now.
// The backward's state comes from the forward's anchors.
template <typename T, int DK, int DV, bool BACKWARD, typename Args>
__device__ void fetch_chunk(const ChunkSet<DK, DV, BACKWARD>& set, const Args& a, const DeltaRuleProblem& p, int b,
                            int h, int j0, int n) {
  constexpr int LK = DK + kPad, LV = DV + kPad;
  const int t0 = n * C, bh = b * p.H + h;
  const T *q = static_cast<const T*>(a.q), *k = static_cast<const T*>(a.k), *v = static_cast<const T*>(a.v);
  const float* anchor = nullptr;
  if constexpr (BACKWARD)
    anchor = a.anchors + (static_cast<size_t>(bh) * chunks_of(p.T) + n) * static_cast<size_t>(p.dk) * p.dv;
  if constexpr (std::is_same_v<T, float>) {
    copy_rows<DK>(set.q, LK, q, p, p.dk, 0, b, h, t0);
    copy_rows<DK>(set.k, LK, k, p, p.dk, 0, b, h, t0);
    copy_rows<DV>(set.v, LV, v, p, p.dv, j0, b, h, t0);
    copy_steps(set.beta, a.beta, p, b, h, t0);
    if (a.g) copy_steps(set.g, a.g, p, b, h, t0);
    if constexpr (BACKWARD) {
      copy_rows<DV>(set.d_o, LV, static_cast<const float*>(a.d_o), p, p.dv, j0, b, h, t0);
      copy_state<DK, DV>(set.s, LV, anchor, p, j0);
    }
    cp_async_commit();
  } else {
    load_rows<T, DK>(set.q, LK, q, p, p.dk, 0, b, h, t0);
    load_rows<T, DK>(set.k, LK, k, p, p.dk, 0, b, h, t0);
    load_rows<T, DV>(set.v, LV, v, p, p.dv, j0, b, h, t0);
    load_steps(set.beta, a.beta, p, b, h, t0);
    if (a.g) load_steps(set.g, a.g, p, b, h, t0);
    if constexpr (BACKWARD) {
      load_rows<T, DV>(set.d_o, LV, static_cast<const T*>(a.d_o), p, p.dv, j0, b, h, t0);
      load_state<DK, DV>(set.s, LV, anchor, p, j0);
    }
  }
}

// The set of chunk n: with two sets (ahead) they alternate from set0, else there is one.
template <int DK, int DV, bool BACKWARD>
__device__ __forceinline__ ChunkSet<DK, DV, BACKWARD> set_of(float* set0, bool ahead, int n) {
  return ChunkSet<DK, DV, BACKWARD>::at(set0 + (ahead ? (n & 1) * ChunkSet<DK, DV, BACKWARD>::floats : 0));
}

// Chunk n's inputs ready in its set after the caller's next barrier. With two sets and fp32 inputs the copies of
// chunk n + step go out now, into the set chunk n − step used (read by then: the caller's barrier ends each chunk),
// and those of chunk n were issued a chunk earlier (the first chunk's by the caller, before its loop); else
// chunk n's own.
template <typename T, int DK, int DV, bool BACKWARD, typename Args>
__device__ void next_chunk(float* set0, bool ahead, const Args& a, const DeltaRuleProblem& p, int b, int h, int j0,
                           int n, int step) {
  if (std::is_same_v<T, float> && ahead) {
    const int m = n + step;
    if (m >= 0 && m < chunks_of(p.T))
      fetch_chunk<T>(set_of<DK, DV, BACKWARD>(set0, true, m), a, p, b, h, j0, m);
    else
      cp_async_commit();  // an empty group keeps one group per chunk
    cp_async_wait<1>();
  } else {
    fetch_chunk<T>(set_of<DK, DV, BACKWARD>(set0, ahead, n), a, p, b, h, j0, n);
    if constexpr (std::is_same_v<T, float>) cp_async_wait_all();
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

// Where the input sets start, in floats after the kernel's other buffers: 128-byte aligned, so each set's rows fall in
// the same banks whatever comes before (wmma's loads, since replaced, needed 32 bytes).
constexpr size_t sets_start(size_t floats) { return (floats + 31) / 32 * 32; }

// Registers: with 64×64 states the unrolled products need more than 128 per thread (ptxas spilled 300-550 bytes), and
// the shared memory holds one block per SM in the backward anyway; smaller states (column blocks of 16 where heads
// are few) keep two blocks per SM, as B8 H8 T2048 D64's 256 blocks need to run in one wave.
constexpr int blocks_per_sm(int dk, int dv) { return dk == 64 && dv == 64 ? 1 : 2; }

// Shared-memory plan of the forward: one or two ChunkSets; C×LK w; C×LV u, o; the DK×LV state columns; C×LC a
// (then T diag(βγ) when gated), t (then T diag β), m (lower Q Kᵀ); G when gated.
template <int DK, int DV, bool GATED>
struct ForwardSmem {
  static constexpr int LK = DK + kPad, LV = DV + kPad;
  using Set = ChunkSet<DK, DV, false>;
  static constexpr size_t rest = sets_start(C * LK + 2 * C * LV + DK * LV + 3 * C * LC + (GATED ? C : 0));
  static constexpr size_t bytes(int sets) { return (rest + sets * Set::floats) * sizeof(float); }
};

// Block (bh, group): head bh, state columns [group·DV, +DV). The columns of the rule are independent given
// A, T and W, which every group recomputes. GATED, with G the chunk's cumulative log-decay, γ_i = exp(G_i),
// λ_j = exp(G_{C-1} − G_j), D_ij = exp(G_i − G_j) (j <= i): A and lower(Q Kᵀ) take ⊙ D, W = T diag(βγ) K,
// O = diag(γ) Q S + …, S ← γ_{C-1} S + (diag(λ) K)ᵀ U (reference.h's chunked form). sets: 2 to copy the next
// chunk's inputs during this one's work, else 1.
template <typename T, int DK, int DV, bool EXACT, bool GATED>
__global__ void __launch_bounds__(kThreads, blocks_per_sm(DK, DV))
    chunk_forward_kernel(DeltaRuleProblem p, DeltaRuleForwardArgs a, int sets) {
  using Plan = ForwardSmem<DK, DV, GATED>;
  using Set = typename Plan::Set;
  constexpr int LK = Plan::LK, LV = Plan::LV;
  extern __shared__ __align__(128) float smem[];
  float *sW = smem, *sU = sW + C * LK, *sO = sU + C * LV;
  float *sS = sO + C * LV, *sA = sS + DK * LV, *sT = sA + C * LC, *sM = sT + C * LC;
  float* sGc = sM + C * LC;  // GATED only
  float* set0 = smem + Plan::rest;
  const int bh = blockIdx.x, b = bh / p.H, h = bh % p.H, j0 = blockIdx.y * DV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunks = chunks_of(p.T);
  const bool ahead = sets == 2;
  const size_t state = static_cast<size_t>(p.dk) * p.dv;
  load_state<DK, DV>(sS, LV, a.h0 ? a.h0 + bh * state : nullptr, p, j0);
  if (std::is_same_v<T, float> && ahead) fetch_chunk<T>(set_of<DK, DV, false>(set0, true, 0), a, p, b, h, j0, 0);
  for (int n = 0; n < chunks; ++n) {
    const int t0 = n * C;
    const Set cur = set_of<DK, DV, false>(set0, ahead, n);
    next_chunk<T, DK, DV, false>(set0, ahead, a, p, b, h, j0, n, 1);
    __syncthreads();  // also: the state update of the previous chunk is complete
    if constexpr (GATED) scan_gates(sGc, cur.g);
    if (a.anchors) store_state<DK, DV>(a.anchors + (static_cast<size_t>(bh) * chunks + n) * state, sS, LV, p, j0);
    mm<EXACT, false, true, kRound>(sA, LC, cur.k, LK, cur.k, LK, C, C, DK, false, 1.f, warp, kWarps);        // K Kᵀ
    mm<EXACT, false, true, kRound>(sM, LC, cur.q, LK, cur.k, LK, C, C, DK, false, p.scale, warp, kWarps);    // Q Kᵀ
    __syncthreads();
    for (int e = threadIdx.x; e < C * C; e += kThreads) {
      const int i = e / C, j = e % C;
      const float d = GATED ? decay(sGc, i, j) : (j <= i ? 1.f : 0.f);
      sA[i * LC + j] = j < i ? cur.beta[i] * sA[i * LC + j] * d : 0.f;
      sM[i * LC + j] *= d;
    }
    // Q's rows read S scaled, and through γ when gated: O = diag(γ) Q S + …
    for (int e = threadIdx.x; e < C * DK; e += kThreads)
      cur.q[(e / DK) * LK + e % DK] *= GATED ? p.scale * expf(sGc[e / DK]) : p.scale;
    __syncthreads();
    if (warp == 0) invert_unit_lower(sT, sA, lane);
    __syncthreads();
    for (int e = threadIdx.x; e < C * C; e += kThreads) {
      const int i = e / C, j = e % C;
      sT[i * LC + j] *= cur.beta[j];
      if constexpr (GATED) sA[i * LC + j] = sT[i * LC + j] * expf(sGc[j]);  // T diag(βγ)
    }
    __syncthreads();
    mm<EXACT, false, false, kRound>(sW, LK, GATED ? sA : sT, LC, cur.k, LK, C, DK, C, false, 1.f, warp, kWarps);  // W
    mm<EXACT, false, false, kRound>(sU, LV, sT, LC, cur.v, LV, C, DV, C, false, 1.f, warp, kWarps);  // T diag(β) V
    __syncthreads();
    mm<EXACT, false, false, kRound>(sU, LV, sW, LK, sS, LV, C, DV, DK, true, -1.f, warp, kWarps);  // U −= W S
    __syncthreads();
    mm<EXACT, false, false, kRound>(sO, LV, cur.q, LK, sS, LV, C, DV, DK, false, 1.f, warp, kWarps);  // O = Q S
    mm<EXACT, false, false, kRound>(sO, LV, sM, LC, sU, LV, C, DV, C, true, 1.f, warp, kWarps);     //   + lower(Q Kᵀ) U
    __syncthreads();
    if constexpr (GATED) {  // S ← γ_{C-1} S + (diag(λ) K)ᵀ U
      const float last = sGc[C - 1];
      for (int e = threadIdx.x; e < DK * DV; e += kThreads) sS[(e / DV) * LV + e % DV] *= expf(last);
      for (int e = threadIdx.x; e < C * DK; e += kThreads) cur.k[(e / DK) * LK + e % DK] *= expf(last - sGc[e / DK]);
      __syncthreads();
    }
    mm<EXACT, true, false, kRound>(sS, LV, cur.k, LK, sU, LV, DK, DV, C, true, 1.f, warp, kWarps);  // S += Kᵀ U
    store_rows<T, DV>(static_cast<T*>(a.o), sO, LV, p, p.dv, j0, b, h, t0, 1.f);
    __syncthreads();  // before the next chunk's copies overwrite this chunk's inputs and the update's reads of them
  }
  if (a.hT) store_state<DK, DV>(a.hT + bh * state, sS, LV, p, j0);
}

// Shared-memory plan of the backward: one or two ChunkSets (q, k, v, do, the state S, β, g); C×LK matrices w, dw,
// dq, dk; C×LV matrices u, du, dv; DK×LV ds; C×LC g (K Kᵀ), t (T), tb (A, then T diag β, then dA), m (lower
// Q Kᵀ, then dT diag β), dm (then Tᵀ dT); dβ. GATED adds C×LC tg (T diag(βγ)) and e (the decays' gradients
// dD ⊙ D), G, dG and the gradient of G_{C-1} gathered by atomics.
template <int DK, int DV, bool GATED>
struct BackwardSmem {
  static constexpr int LK = DK + kPad, LV = DV + kPad;
  using Set = ChunkSet<DK, DV, true>;
  static constexpr size_t rest =
      sets_start(4 * C * LK + 3 * C * LV + DK * LV + 5 * C * LC + C + (GATED ? 2 * C * LC + 2 * C + 1 : 0));
  static constexpr size_t bytes(int sets) { return (rest + sets * Set::floats) * sizeof(float); }
};

// Block (bh, group) as the forward's. What the columns share (dq, dk, dβ, dg, through dW, dM and d(T diag β),
// all linear in the columns' terms) is written as the group's partial sum: dq, dk, dbeta, dg [groups, B, T, H, ...].
// GATED: the decays enter through γ (O's read of S and W), λ and γ_{C-1} (the state update) and D (A and
// lower(Q Kᵀ)); their gradients gather in dG_i, and dg is dG's reverse cumulative sum over the chunk.
template <typename T, int DK, int DV, bool EXACT, bool GATED>
__global__ void __launch_bounds__(kThreads, blocks_per_sm(DK, DV))
    chunk_backward_kernel(DeltaRuleProblem p, DeltaRuleBackwardArgs a, int sets) {
  using Plan = BackwardSmem<DK, DV, GATED>;
  using Set = typename Plan::Set;
  constexpr int LK = Plan::LK, LV = Plan::LV;
  extern __shared__ __align__(128) float smem[];
  float *sW = smem, *sdW = sW + C * LK, *sdQ = sdW + C * LK, *sdK = sdQ + C * LK;
  float *sU = sdK + C * LK, *sdU = sU + C * LV, *sdV = sdU + C * LV, *sdS = sdV + C * LV;
  float *sG = sdS + DK * LV, *sT = sG + C * LC, *sTb = sT + C * LC, *sM = sTb + C * LC, *sdM = sM + C * LC;
  float* sdBeta = sdM + C * LC;
  float *sTg = sdBeta + C, *sE = sTg + C * LC, *sGc = sE + C * LC, *sdG = sGc + C, *sdLast = sdG + C;  // GATED
  float* set0 = smem + Plan::rest;
  const int bh = blockIdx.x, b = bh / p.H, h = bh % p.H, j0 = blockIdx.y * DV;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int chunks = chunks_of(p.T);
  const bool ahead = sets == 2;
  const size_t state = static_cast<size_t>(p.dk) * p.dv, rows = static_cast<size_t>(p.B) * p.T * p.H;
  float *dq = static_cast<float*>(a.dq) + blockIdx.y * rows * p.dk,
        *dk = static_cast<float*>(a.dk) + blockIdx.y * rows * p.dk,
        *dbeta = a.dbeta + blockIdx.y * rows, *dg = GATED ? a.dg + blockIdx.y * rows : nullptr;
  load_state<DK, DV>(sdS, LV, a.dhT ? a.dhT + bh * state : nullptr, p, j0);
  if (std::is_same_v<T, float> && ahead)
    fetch_chunk<T>(set_of<DK, DV, true>(set0, true, chunks - 1), a, p, b, h, j0, chunks - 1);
  for (int n = chunks - 1; n >= 0; --n) {
    const int t0 = n * C;
    const Set cur = set_of<DK, DV, true>(set0, ahead, n);
    float *sQ = cur.q, *sK = cur.k, *sV = cur.v, *sdO = cur.d_o, *sS = cur.s, *sBeta = cur.beta;
    next_chunk<T, DK, DV, true>(set0, ahead, a, p, b, h, j0, n, -1);
    if constexpr (GATED) {
      if (threadIdx.x < C) sdG[threadIdx.x] = 0.f;
      if (threadIdx.x == 0) *sdLast = 0.f;
    }
    __syncthreads();
    if constexpr (GATED) scan_gates(sGc, cur.g);
    mm<EXACT, false, true, kRound>(sG, LC, sK, LK, sK, LK, C, C, DK, false, 1.f, warp, kWarps);      // K Kᵀ
    mm<EXACT, false, true, kRound>(sM, LC, sQ, LK, sK, LK, C, C, DK, false, p.scale, warp, kWarps);  // Q Kᵀ
    __syncthreads();
    for (int e = threadIdx.x; e < C * C; e += kThreads) {
      const int i = e / C, j = e % C;
      const float d = GATED ? decay(sGc, i, j) : (j <= i ? 1.f : 0.f);
      if constexpr (GATED) sG[i * LC + j] *= d;  // K Kᵀ ⊙ D
      sTb[i * LC + j] = j < i ? sBeta[i] * sG[i * LC + j] : 0.f;  // A
      sM[i * LC + j] *= d;
    }
    for (int e = threadIdx.x; e < C * DK; e += kThreads) sQ[(e / DK) * LK + e % DK] *= p.scale;
    __syncthreads();
    if (warp == 0) {
      invert_unit_lower(sT, sTb, lane);
    } else {  // meanwhile, what needs only the loads: dU = K dS (+ Mᵀ dO below), dQ = dO Sᵀ (+ dM K below)
      mm<EXACT, false, false, kRound>(sdU, LV, sK, LK, sdS, LV, C, DV, DK, false, 1.f, warp - 1, kWarps - 1);
      mm<EXACT, false, true, kRound>(sdQ, LK, sdO, LV, sS, LV, C, DK, DV, false, 1.f, warp - 1, kWarps - 1);
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
    mm<EXACT, false, false, kRound>(sW, LK, GATED ? sTg : sTb, LC, sK, LK, C, DK, C, false, 1.f, warp, kWarps);  // W
    mm<EXACT, false, false, kRound>(sU, LV, sTb, LC, sV, LV, C, DV, C, false, 1.f, warp, kWarps);  // T diag(β) V
    __syncthreads();
    mm<EXACT, false, false, kRound>(sU, LV, sW, LK, sS, LV, C, DV, DK, true, -1.f, warp, kWarps);  // U −= W S
    __syncthreads();
    mm<EXACT, true, false, kRound>(sdU, LV, sM, LC, sdO, LV, C, DV, C, true, 1.f, warp, kWarps);    // dU += Mᵀ dO
    mm<EXACT, false, true, kRound>(sdM, LC, sdO, LV, sU, LV, C, C, DV, false, 1.f, warp, kWarps);   // dO Uᵀ
    mm<EXACT, false, true, kRound>(sdK, LK, sU, LV, sdS, LV, C, DK, DV, false, 1.f, warp, kWarps);  // dK = U dSᵀ
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
    mm<EXACT, false, false, kRound>(sdQ, LK, sdM, LC, sK, LK, C, DK, C, true, 1.f, warp, kWarps);   // dQ += dM K
    mm<EXACT, true, false, kRound>(sdK, LK, sdM, LC, sQ, LK, C, DK, C, true, 1.f, warp, kWarps);    // dK += dMᵀ Q
    mm<EXACT, true, false, kRound>(sdS, LV, sQ, LK, sdO, LV, DK, DV, C, true, 1.f, warp, kWarps);   // dS += Qᵀ dO
    mm<EXACT, true, false, kRound>(sdS, LV, sW, LK, sdU, LV, DK, DV, C, true, -1.f, warp, kWarps);  //    − Wᵀ dU
    mm<EXACT, false, true, kRound>(sdW, LK, sdU, LV, sS, LV, C, DK, DV, false, -1.f, warp, kWarps);  // dW = −dU Sᵀ
    mm<EXACT, true, false, kRound>(sdV, LV, sTb, LC, sdU, LV, C, DV, C, false, 1.f, warp, kWarps);  // dV = (Tβ)ᵀ dU
    __syncthreads();
    mm<EXACT, false, true, kRound>(sM, LC, sdU, LV, sV, LV, C, C, DV, false, 1.f, warp, kWarps);  // d(T diag β) = dU Vᵀ
    if constexpr (GATED) {
      mm<EXACT, false, true, kRound>(sdM, LC, sdW, LK, sK, LK, C, C, DK, false, 1.f, warp, kWarps);  // R = dW Kᵀ
      mm<EXACT, true, false, kRound>(sdK, LK, sTg, LC, sdW, LK, C, DK, C, true, 1.f, warp, kWarps);  // dK += (Tβγ)ᵀ dW
    } else {
      mm<EXACT, false, true, kRound>(sM, LC, sdW, LK, sK, LK, C, C, DK, true, 1.f, warp, kWarps);    //   + dW Kᵀ
      mm<EXACT, true, false, kRound>(sdK, LK, sTb, LC, sdW, LK, C, DK, C, true, 1.f, warp, kWarps);  // dK += (Tβ)ᵀ dW
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
    mm<EXACT, true, false, kRound>(sdM, LC, sT, LC, sM, LC, C, C, C, false, 1.f, warp, kWarps);  // X = Tᵀ dT
    __syncthreads();
    mm<EXACT, false, true, kRound>(sTb, LC, sdM, LC, sT, LC, C, C, C, false, -1.f, warp, kWarps);  // dA = −X Tᵀ
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
    mm<EXACT, false, false, kRound>(sdK, LK, sTb, LC, sK, LK, C, DK, C, true, 1.f, warp, kWarps);  // dK += dG K
    mm<EXACT, true, false, kRound>(sdK, LK, sTb, LC, sK, LK, C, DK, C, true, 1.f, warp, kWarps);   //    + dGᵀ K
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

// Runs Launch::run<T, DK, DV, EXACT, GATED> for the problem's element type (fp32 inputs: 3xTF32 unless p.tf32),
// column-block width and whether a gate comes; DK is p.dk padded.
template <typename Launch, int DK, typename Args>
std::string dispatch(const DeltaRuleProblem& p, const Args& a, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  const dim3 grid(p.B * p.H, delta_rule_chunk_column_groups(p));
  auto gated = [&](auto t, auto dv, auto exact) {
    using T = typename decltype(t)::type;
    constexpr int DV = decltype(dv)::value;
    constexpr bool EXACT = decltype(exact)::value;
    if (a.g)
      Launch::template run<T, DK, DV, EXACT, true>(p, a, grid, s);
    else
      Launch::template run<T, DK, DV, EXACT, false>(p, a, grid, s);
  };
  auto typed = [&](auto dv) {
    if (p.bf16)
      gated(std::common_type<__nv_bfloat16>{}, dv, std::false_type{});
    else if (p.tf32)
      gated(std::common_type<float>{}, dv, std::false_type{});
    else
      gated(std::common_type<float>{}, dv, std::true_type{});
  };
  const int dv = column_block(p);
  if (dv == 16)
    typed(std::integral_constant<int, 16>{});
  else if (dv == 32)
    typed(std::integral_constant<int, 32>{});
  else
    typed(std::integral_constant<int, 64>{});
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? std::string() : std::string("chunkwise delta rule kernel: ") + cudaGetErrorString(e);
}

// Blocks per SM of a kernel with one and with two sets of chunk inputs (two: 0 where they do not fit in the device's
// shared memory, as on an A100 for the backward), and the device's SMs; found once per kernel and device.
struct Residency {
  int sms = 0, one = 0, two = 0;
};
template <typename Args>
Residency residency(void (*kernel)(DeltaRuleProblem, Args, int), size_t (*bytes)(int)) {
  static std::map<std::pair<const void*, int>, Residency> known;
  static std::mutex m;
  int device = 0;
  cudaGetDevice(&device);
  std::lock_guard<std::mutex> lock(m);
  const auto key = std::make_pair(reinterpret_cast<const void*>(kernel), device);
  if (auto it = known.find(key); it != known.end()) return it->second;
  Residency r;
  int limit = 0;
  cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  cudaDeviceGetAttribute(&r.sms, cudaDevAttrMultiProcessorCount, device);
  const bool two = bytes(2) <= static_cast<size_t>(limit);
  // Once, to the most any launch asks: lowering it per launch would race with another thread's launch of the same
  // kernel, and could fail a graph replay captured with the higher value.
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes(two ? 2 : 1)));
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.one, kernel, kThreads, bytes(1));
  if (two) cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r.two, kernel, kThreads, bytes(2));
  known[key] = r;
  return r;
}

// Launches a kernel with two sets of chunk inputs (the next chunk's copies in flight during this one) where the
// inputs are fp32 and two sets take no more waves of blocks than one (they can halve the blocks per SM: B8 H8's
// column blocks of 16), else with one. Its shared-memory limit (beyond the default 48 KB) is set by residency().
template <typename T, typename Args>
void launch(void (*kernel)(DeltaRuleProblem, Args, int), size_t (*bytes)(int), dim3 grid, cudaStream_t s,
            const DeltaRuleProblem& p, const Args& a) {
  const Residency r = residency(kernel, bytes);
  const int64_t blocks = int64_t{grid.x} * grid.y;
  auto waves = [&](int per_sm) {
    const int64_t at_once = std::max<int64_t>(1, int64_t{per_sm} * r.sms);
    return (blocks + at_once - 1) / at_once;
  };
  const bool two = std::is_same_v<T, float> && delta_chunk::prefetch && r.two > 0 && waves(r.two) <= waves(r.one);
  const int sets = two ? 2 : 1;
  kernel<<<grid, kThreads, bytes(sets), s>>>(p, a, sets);
}

struct Forward {
  template <typename T, int DK, int DV, bool EXACT, bool GATED>
  static void run(const DeltaRuleProblem& p, const DeltaRuleForwardArgs& a, dim3 grid, cudaStream_t s) {
    launch<T>(chunk_forward_kernel<T, DK, DV, EXACT, GATED>, ForwardSmem<DK, DV, GATED>::bytes, grid, s, p, a);
  }
};

struct Backward {
  template <typename T, int DK, int DV, bool EXACT, bool GATED>
  static void run(const DeltaRuleProblem& p, const DeltaRuleBackwardArgs& a, dim3 grid, cudaStream_t s) {
    launch<T>(chunk_backward_kernel<T, DK, DV, EXACT, GATED>, BackwardSmem<DK, DV, GATED>::bytes, grid, s, p, a);
  }
};

}  // namespace

#ifdef MEMLAB_DELTA_CHUNK_PART
namespace delta_chunk {
#if MEMLAB_DELTA_CHUNK_BACKWARD
template <int DK>
std::string backward(const DeltaRuleProblem& p, const DeltaRuleBackwardArgs& a, void* stream) {
  return dispatch<Backward, DK>(p, a, stream);
}
template std::string backward<MEMLAB_DELTA_CHUNK_PART>(const DeltaRuleProblem&, const DeltaRuleBackwardArgs&, void*);
#else
template <int DK>
std::string forward(const DeltaRuleProblem& p, const DeltaRuleForwardArgs& a, void* stream) {
  return dispatch<Forward, DK>(p, a, stream);
}
template std::string forward<MEMLAB_DELTA_CHUNK_PART>(const DeltaRuleProblem&, const DeltaRuleForwardArgs&, void*);
#endif
}  // namespace delta_chunk
#else
namespace {
// part<DK>(p, a, stream) for p's padded dk, where the kernels take p.
template <typename Args, typename Part>
std::string by_dk(const DeltaRuleProblem& p, const Args& a, void* stream, Part part) {
  if (p.qk_l2norm) return "chunkwise delta rule kernel: q and k must arrive normalised";
  if (!delta_rule_chunk_applies(p)) return "chunkwise delta rule kernel: head dims out of range";
  if (p.B * p.T * p.H == 0) return "";
  const int dk = padded(p.dk);
  return dk == 16 ? part(std::integral_constant<int, 16>{}) : dk == 32 ? part(std::integral_constant<int, 32>{})
                                                                         : part(std::integral_constant<int, 64>{});
}
}  // namespace

bool delta_rule_chunk_applies(const DeltaRuleProblem& p) {
  return p.dk >= 1 && p.dv >= 1 && p.dk <= kDeltaRuleChunkMaxHeadDim && p.dv <= kDeltaRuleChunkMaxHeadDim;
}

int delta_rule_chunk_count(int T) { return chunks_of(T); }

void delta_rule_chunk_set_prefetch(bool on) { delta_chunk::prefetch = on; }

int delta_rule_chunk_column_groups(const DeltaRuleProblem& p) {
  const int w = column_block(p);
  return (p.dv + w - 1) / w;
}

std::string delta_rule_chunk_forward(const DeltaRuleProblem& p, const DeltaRuleForwardArgs& a, void* stream) {
  return by_dk(p, a, stream, [&](auto dk) { return delta_chunk::forward<decltype(dk)::value>(p, a, stream); });
}

std::string delta_rule_chunk_backward(const DeltaRuleProblem& p, const DeltaRuleBackwardArgs& a, void* stream) {
  return by_dk(p, a, stream, [&](auto dk) { return delta_chunk::backward<decltype(dk)::value>(p, a, stream); });
}
#endif

}  // namespace memlab::kernels
