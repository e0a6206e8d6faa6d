// The chunk-level parts of Mesa's op on tensor cores, one block per (batch, head, chunk): see chunk.h.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/mesa/chunk.h"
#include "ops/mesa/rows.cuh"
#include "ops/mma_f16.cuh"
#include "ops/tf32_mm.cuh"
#include "ops/tile.cuh"

namespace memlab::kernels {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
// The adjoint kernel's block fills an SM's shared memory at C = d = 64 (one block per SM): more warps hide latency.
constexpr int kAdjointThreads = 512, kAdjointWarps = kAdjointThreads / 32;

// Tiles of a block: [CM, DP] token rows and [DP, DP] states with pitch DP + 4, [CM, CM] token pairs with pitch CM + 4
// (rows 16-byte aligned; a pitch of 4 x odd floats, whose banks delta_rule/chunk.cu's kPad describes).
template <int CM, int DP>
struct Dims {
  static constexpr int P = DP + 4, PC = CM + 4;
  static constexpr int row_tile = CM * P, pair_tile = CM * PC, state_tile = DP * P;
};

// A state: dst[r][c] = src[r][c] for r < rows, c < width (a dense [rows, width] source; TRANSPOSED: src[c][r] of a
// dense [width, rows] one), 0 elsewhere in [R, W), by NT threads. Each thread's loads go out together before any is
// stored.
template <int R, int W, int NT, bool TRANSPOSED = false>
__device__ inline void load_state(float* dst, int pitch, const float* src, int rows, int width) {
  if constexpr (!TRANSPOSED) {
    load_span<R, W, NT>(dst, pitch, RowSpan{src, width, rows, false}, width);
  } else {  // consecutive threads read consecutive source entries
    constexpr int PER = (R * W + NT - 1) / NT;
    float v[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int idx = threadIdx.x + i * NT, r = idx % R, c = idx / R;
      v[i] = idx < R * W && r < rows && c < width ? src[static_cast<int64_t>(c) * rows + r] : 0.f;
    }
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int idx = threadIdx.x + i * NT;
      if (idx < R * W) dst[idx % R * pitch + idx / R] = v[i];
    }
  }
}

template <int R, int W>
__device__ inline void store_state(float* dst, const float* src, int pitch, int rows, int width) {
  for (int idx = threadIdx.x; idx < R * W; idx += blockDim.x) {
    const int r = idx / W, c = idx % W;
    if (r < rows && c < width) dst[static_cast<int64_t>(r) * width + c] = src[r * pitch + c];
  }
}

// The chunk's running log decay and β into shared memory: past C, b stays at b_{C-1} and β is 0 (no-op tokens).
template <int CM>
__device__ inline void load_gates(float* sb, float* sbeta, const float* logdecay, const float* beta, int64_t blk,
                                  int C) {
  for (int t = threadIdx.x; t < CM; t += blockDim.x) {
    sb[t] = logdecay[blk * C + (t < C ? t : C - 1)];
    sbeta[t] = beta && t < C ? beta[blk * C + t] : 0.f;
  }
}

__device__ inline const float* state_of(const MesaStates& s, const ChunkAt& at, int size) {
  return s.at + (static_cast<int64_t>(at.bh) * s.Ns + at.n + s.offset) * size;
}

__device__ inline ChunkAt chunk_of(const MesaChunkProblem& p, int64_t blk) { return chunk_at(blk, p.N, p.C, p.T, p.H); }

// ---- contributions to the scan: X = (L ⊙ s)ᵀ R ----
template <int CM, int DP, bool EXACT>
__global__ void __launch_bounds__(kThreads) mesa_contrib_kernel(MesaChunkProblem p, MesaContribArgs a) {
  using Dm = Dims<CM, DP>;
  extern __shared__ float smem[];
  float *sL = smem, *sR = sL + Dm::row_tile, *sX = sR + Dm::row_tile, *sb = sX + Dm::state_tile, *sbeta = sb + CM;
  const int64_t blk = blockIdx.x;
  const ChunkAt at = chunk_of(p, blk);
  const int C = p.C, warp = threadIdx.x / 32;
  load_gates<CM>(sb, sbeta, a.logdecay, a.beta, blk, C);
  load_span<CM, DP, kThreads>(sL, Dm::P, span_of(a.L, at), a.L.d, a.scale);
  load_span<CM, DP, kThreads>(sR, Dm::P, span_of(a.R, at), a.R.d);
  __syncthreads();
  const float last = sb[CM - 1];
  for (int idx = threadIdx.x; idx < CM * DP; idx += kThreads) {
    const int t = idx / DP;
    sL[t * Dm::P + idx % DP] *= a.to_end ? expf(last - sb[t]) * sbeta[t] : expf(sb[t]);
  }
  __syncthreads();
  mm<EXACT, true, false, Tf32::Truncate>(sX, Dm::P, sL, Dm::P, sR, Dm::P, DP, DP, CM, false, 1.f, warp, kWarps);
  __syncthreads();
  store_state<DP, DP>(a.X + blk * a.L.d * a.R.d, sX, Dm::P, a.L.d, a.R.d);
}

// ---- the scan over chunks, one thread per state entry ----
__global__ void mesa_scan_kernel(MesaChunkProblem p, MesaScanArgs a) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(a.BH) * a.dd) return;
  const int64_t bh = idx / a.dd, e = idx % a.dd, N = p.N, dd = a.dd;
  float s = a.S0 ? a.S0[idx] : 0.f;
  float* out = a.out + bh * (N + 1) * dd + e;
  const float* X = a.X + bh * N * dd + e;
  const float* dec = a.logdecay + bh * N * p.C + p.C - 1;
  if (!a.reverse) {
    out[0] = s;
    for (int64_t n = 0; n < N; ++n) {
      s = fmaf(expf(dec[n * p.C]), s, X[n * dd]);
      out[(n + 1) * dd] = s;
    }
  } else {
    out[N * dd] = s;
    for (int64_t n = N - 1; n >= 0; --n) {
      s = fmaf(expf(dec[n * p.C]), s, X[n * dd]);
      out[n * dd] = s;
    }
  }
}

// ---- contributions and scan in one walk over the chunks (TF32 products; the inputs were bf16, d in 17-32) ----
//
// One block per (batch, head). Its four warps own the state's [16, 16] tiles (one each at d 32) in m16n8k8
// accumulators across the chunks: each chunk, acc = exp(a_n) acc + (L ⊙ s)ᵀ R over the chunk's
// tokens, then acc to the scan's output. A chunk's rows are loaded into registers while the chunk before is
// multiplied, and go to shared memory (two buffers, so one barrier a chunk) rounded to TF32 (nearest, as the walk sums
// N chunks' products). Two threads a token row; no contribution tensor goes through memory.
constexpr int kWalkThreads = 128, kWalkWarps = kWalkThreads / 32;

template <int DP>
struct WalkDims {
  // pitch ≡ 8 (mod 32) floats: a fragment's eight columns g and four rows q fall on 32 distinct banks
  static constexpr int CM = 64, P = DP + 8, NV = DP / 8;  // NV: float4s a thread loads of its row of L and of R
  static constexpr int TPW = (DP / 16) * (DP / 16) / kWalkWarps;
  static constexpr size_t floats = 4 * CM * P;
};

// A thread's share of one chunk: its token row t's columns 8 i + 4 h (i < NV) of a row span, as loaded (bf16 bits
// where raw_bf16, until widened), zero past the rows and width.
template <int NV>
struct RowQuads {
  float4 v[NV];
  bool raw_bf16;
  __device__ void load(const RowSpan& src, int t, int h, int width) {
    raw_bf16 = false;
    const bool in = t < src.rows;
    if (width % 4 == 0 && src.aligned()) {
      raw_bf16 = src.bf16;
      with_dtype(src, [&](auto bf16) {
#pragma unroll
        for (int i = 0; i < NV; ++i) {
          const int c = 8 * i + 4 * h;
          v[i] = in && c < width ? src.template raw4_as<decltype(bf16)::value>(t, c) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
      });
      return;
    }
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int c = 8 * i + 4 * h;
      v[i].x = in && c < width ? src.at(t, c) : 0.f;
      v[i].y = in && c + 1 < width ? src.at(t, c + 1) : 0.f;
      v[i].z = in && c + 2 < width ? src.at(t, c + 2) : 0.f;
      v[i].w = in && c + 3 < width ? src.at(t, c + 3) : 0.f;
    }
  }
  // f times the entries, rounded to TF32, into dst's row (dst points at the row's column 0)
  __device__ void store(float* dst, int h, float f) const {
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      float4 x = raw_bf16 ? RowSpan::widen4<true>(v[i]) : v[i];
      x = make_float4(tf32_nearest(f * x.x), tf32_nearest(f * x.y), tf32_nearest(f * x.z), tf32_nearest(f * x.w));
      *reinterpret_cast<float4*>(dst + 8 * i + 4 * h) = x;
    }
  }
};

// A tile's accumulators (rows i0 + g, + 8; columns j0 + each_pair's) into X [dl, dr] (bounds checked), a pair of
// columns a store where dr allows.
__device__ __forceinline__ void put_tile(float* X, int dl, int dr, int i0, int j0, const float (&acc)[2][4], int lane) {
  const bool pairs = dr % 2 == 0 && (reinterpret_cast<uintptr_t>(X) & 7) == 0;
  const int g = lane / 4;
  each_pair<2>(i0 + g, i0 + g + 8, lane % 4, [&](int n, int h, int i, int c) {
    const int j = j0 + c;
    if (i >= dl || j >= dr) return;
    float* at = X + static_cast<int64_t>(i) * dr + j;
    if (pairs) {
      *reinterpret_cast<float2*>(at) = make_float2(acc[n][2 * h], acc[n][2 * h + 1]);
    } else {
      at[0] = acc[n][2 * h];
      if (j + 1 < dr) at[1] = acc[n][2 * h + 1];
    }
  });
}

template <int DP>
__global__ void __launch_bounds__(kWalkThreads)
    mesa_walk_kernel(MesaChunkProblem p, MesaContribArgs a, MesaScanArgs s) {
  using Wd = WalkDims<DP>;
  constexpr int CM = Wd::CM, P = Wd::P, JT = DP / 16;
  extern __shared__ __align__(16) float wsm[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const int bh = blockIdx.x, t = threadIdx.x / 2, h = threadIdx.x % 2;
  const int N = p.N, C = p.C, dl = a.L.d, dr = a.R.d, dd = dl * dr;
  float* const out = s.out + static_cast<int64_t>(bh) * (N + 1) * dd;
  const float* const gates = a.logdecay + static_cast<int64_t>(bh) * N * C;

  RowQuads<Wd::NV> qL, qR;
  float b_t = 0.f, beta_t = 0.f, b_last = 0.f;
  auto fetch = [&](int n) {  // chunk n's row t and gates, loads only
    const ChunkAt at = chunk_of(p, static_cast<int64_t>(bh) * N + n);
    qL.load(span_of(a.L, at), t, h, dl);
    qR.load(span_of(a.R, at), t, h, dr);
    b_t = gates[n * C + (t < C ? t : C - 1)];
    b_last = gates[n * C + C - 1];
    beta_t = a.beta && t < C ? a.beta[static_cast<int64_t>(bh) * N * C + n * C + t] : 0.f;
  };
  const int first = s.reverse ? N - 1 : 0, step = s.reverse ? -1 : 1;
  fetch(first);

  // the initial state (zero where S0 is null) into the accumulators and the scan's first entry (out_0, or out_N)
  float acc[Wd::TPW][2][4];
  const float* S0 = s.S0 ? s.S0 + static_cast<int64_t>(bh) * dd : nullptr;
#pragma unroll
  for (int k = 0; k < Wd::TPW; ++k) {
    const int tile = warp + kWalkWarps * k, i0 = 16 * (tile / JT), j0 = 16 * (tile % JT);
    each_entry<2>(i0 + g, i0 + g + 8, q, [&](int n, int e, int i, int c) {
      const int j = j0 + c;
      acc[k][n][e] = S0 && i < dl && j < dr ? S0[i * dr + j] : 0.f;
    });
    put_tile(out + static_cast<int64_t>(s.reverse ? N : 0) * dd, dl, dr, i0, j0, acc[k], lane);
  }

  for (int k = 0, n = first; k < N; ++k, n += step) {
    float* const L = wsm + (k & 1) * CM * P;
    float* const R = wsm + (2 + (k & 1)) * CM * P;
    const float f = (a.to_end ? expf(b_last - b_t) * beta_t : expf(b_t)) * a.scale, decay = expf(b_last);
    qL.store(L + t * P, h, f);
    qR.store(R + t * P, h, 1.f);
    if (k + 1 < N) fetch(n + step);  // in flight while this chunk is multiplied
    __syncthreads();
    float* const X = out + static_cast<int64_t>(s.reverse ? n : n + 1) * dd;
#pragma unroll
    for (int j = 0; j < Wd::TPW; ++j) {
      const int tile = warp + kWalkWarps * j, i0 = 16 * (tile / JT), j0 = 16 * (tile % JT);
#pragma unroll
      for (int nn = 0; nn < 2; ++nn)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][nn][e] *= decay;
      // A = (L ⊙ s)ᵀ (rows i, k = tokens), B = R (k = tokens, columns j)
#pragma unroll
      for (int k0 = 0; k0 < CM; k0 += 8) {
        const float* l0 = L + (k0 + q) * P + i0 + g;
        const float* l4 = l0 + 4 * P;
        const uint32_t fa[4] = {__float_as_uint(l0[0]), __float_as_uint(l0[8]), __float_as_uint(l4[0]),
                                __float_as_uint(l4[8])};
        const float* r0 = R + (k0 + q) * P + j0 + g;
#pragma unroll
        for (int nn = 0; nn < 2; ++nn)
          mma_tf32(acc[j][nn], fa, __float_as_uint(r0[8 * nn]), __float_as_uint(r0[4 * P + 8 * nn]));
      }
      put_tile(X, dl, dr, i0, j0, acc[j], lane);
    }
  }
}

// W[t][s] *= D_ts (with β) or E_ts (without) over the [CM, CM] pair tile.
template <int CM>
__device__ inline void mask_decay(float* W, int pitch, const float* sb, const float* sbeta) {
  for (int idx = threadIdx.x; idx < CM * CM; idx += blockDim.x) {
    const int t = idx / CM, s = idx % CM;
    W[t * pitch + s] *= s <= t ? expf(sb[t] - sb[s]) * (sbeta ? sbeta[s] : 1.f) : 0.f;
  }
}

// ---- reads: Y = (A ⊙ γ) S + ((A Bᵀ) ⊙ D) U ----
template <int CM, int DP, bool EXACT>
__global__ void __launch_bounds__(kThreads) mesa_read_kernel(MesaChunkProblem p, MesaReadArgs a) {
  using Dm = Dims<CM, DP>;
  extern __shared__ float smem[];
  float *sA = smem, *sB = sA + Dm::row_tile, *sU = sB + Dm::row_tile, *sY = sU + Dm::row_tile;
  float *sS = sY + Dm::row_tile, *sW = sS + Dm::state_tile, *sb = sW + Dm::pair_tile, *sbeta = sb + CM;
  const int64_t blk = blockIdx.x;
  const ChunkAt at = chunk_of(p, blk);
  const int C = p.C, warp = threadIdx.x / 32;
  load_gates<CM>(sb, sbeta, a.logdecay, a.beta, blk, C);
  const int da = a.A.d, du = a.U.d;
  load_span<CM, DP, kThreads>(sA, Dm::P, span_of(a.A, at), da);
  load_span<CM, DP, kThreads>(sB, Dm::P, span_of(a.B, at), da);
  load_span<CM, DP, kThreads>(sU, Dm::P, span_of(a.U, at), du);
  const float* S = state_of(a.S, at, da * du);
  if (a.S_transposed)
    load_state<DP, DP, kThreads, true>(sS, Dm::P, S, da, du);
  else
    load_state<DP, DP, kThreads>(sS, Dm::P, S, da, du);
  __syncthreads();
  mm<EXACT, false, true, Tf32::Truncate>(sW, Dm::PC, sA, Dm::P, sB, Dm::P, CM, CM, DP, false, 1.f, warp, kWarps);
  mm<EXACT, false, false, Tf32::Truncate>(sY, Dm::P, sA, Dm::P, sS, Dm::P, CM, DP, DP, false, 1.f, warp, kWarps);
  __syncthreads();
  mask_decay<CM>(sW, Dm::PC, sb, sbeta);
  for (int idx = threadIdx.x; idx < CM * DP; idx += kThreads) sY[(idx / DP) * Dm::P + idx % DP] *= expf(sb[idx / DP]);
  __syncthreads();
  mm<EXACT, false, false, Tf32::Truncate>(sY, Dm::P, sW, Dm::PC, sU, Dm::P, CM, DP, CM, true, 1.f, warp, kWarps);
  __syncthreads();
  store_span<CM, DP>(span_of(a.Y, at), sY, Dm::P, du);
}

// ---- the adjoints' chunk-local part ----
template <int CM, int DP, bool EXACT>
__global__ void __launch_bounds__(kAdjointThreads) mesa_adjoint_kernel(MesaChunkProblem p, MesaAdjointArgs a) {
  using Dm = Dims<CM, DP>;
  extern __shared__ float smem[];
  float *sA = smem, *sBq = sA + Dm::row_tile, *sK = sBq + Dm::row_tile, *sU = sK + Dm::row_tile;
  float *sP = sU + Dm::row_tile, *sDu = sP + Dm::row_tile, *sY = sDu + Dm::row_tile;
  float *sS = sY + Dm::row_tile, *sR = sS + Dm::state_tile, *sM1 = sR + Dm::state_tile, *sM2 = sM1 + Dm::pair_tile;
  float *sb = sM2 + Dm::pair_tile, *sbeta = sb + CM;
  const int64_t blk = blockIdx.x;
  const ChunkAt at = chunk_of(p, blk);
  const int C = p.C, warp = threadIdx.x / 32, dk = a.K.d, du = a.U.d;
  load_gates<CM>(sb, sbeta, a.logdecay, a.beta, blk, C);
  load_span<CM, DP, kAdjointThreads>(sA, Dm::P, span_of(a.A, at), du);
  load_span<CM, DP, kAdjointThreads>(sBq, Dm::P, span_of(a.Bq, at), dk, a.bq_scale);
  load_span<CM, DP, kAdjointThreads>(sK, Dm::P, span_of(a.K, at), dk);
  load_span<CM, DP, kAdjointThreads>(sU, Dm::P, span_of(a.U, at), du);
  load_state<DP, DP, kAdjointThreads>(sS, Dm::P, state_of(a.S, at, dk * du), dk, du);
  load_state<DP, DP, kAdjointThreads>(sR, Dm::P, state_of(a.R, at, dk * du), dk, du);
  __syncthreads();
  if (a.rowdot)
    for (int i = threadIdx.x; i < dk; i += kAdjointThreads) {
      float sum = 0.f;
      for (int t = 0; t < CM; ++t) sum = fmaf(sA[t * Dm::P + i], sBq[t * Dm::P + i], sum);
      a.rowdot[blk * dk + i] = sum;
    }
  constexpr int nw = kAdjointWarps;
  // M1 = A Uᵀ, M2 = Bq Kᵀ; the state terms P = U Rᵀ, Du = K R and Y = Bq S
  mm<EXACT, false, true, Tf32::Truncate>(sM1, Dm::PC, sA, Dm::P, sU, Dm::P, CM, CM, DP, false, 1.f, warp, nw);
  mm<EXACT, false, true, Tf32::Truncate>(sM2, Dm::PC, sBq, Dm::P, sK, Dm::P, CM, CM, DP, false, 1.f, warp, nw);
  mm<EXACT, false, true, Tf32::Truncate>(sP, Dm::P, sU, Dm::P, sR, Dm::P, CM, DP, DP, false, 1.f, warp, nw);
  mm<EXACT, false, false, Tf32::Truncate>(sDu, Dm::P, sK, Dm::P, sR, Dm::P, CM, DP, DP, false, 1.f, warp, nw);
  mm<EXACT, false, false, Tf32::Truncate>(sY, Dm::P, sBq, Dm::P, sS, Dm::P, CM, DP, DP, false, 1.f, warp, nw);
  __syncthreads();
  mask_decay<CM>(sM1, Dm::PC, sb, nullptr);
  mask_decay<CM>(sM2, Dm::PC, sb, sbeta);
  const float last = sb[CM - 1];
  for (int idx = threadIdx.x; idx < CM * DP; idx += kAdjointThreads) {
    const int t = idx / DP, at = t * Dm::P + idx % DP;
    const float to_end = expf(last - sb[t]);
    sP[at] *= to_end;
    sDu[at] *= to_end * sbeta[t];
    sY[at] *= expf(sb[t]);
  }
  __syncthreads();
  // P += (M1 ⊙ E)ᵀ Bq, Du += (M2 ⊙ D)ᵀ A, Y += (M2 ⊙ D) U
  mm<EXACT, true, false, Tf32::Truncate>(sP, Dm::P, sM1, Dm::PC, sBq, Dm::P, CM, DP, CM, true, 1.f, warp, nw);
  mm<EXACT, true, false, Tf32::Truncate>(sDu, Dm::P, sM2, Dm::PC, sA, Dm::P, CM, DP, CM, true, 1.f, warp, nw);
  mm<EXACT, false, false, Tf32::Truncate>(sY, Dm::P, sM2, Dm::PC, sU, Dm::P, CM, DP, CM, true, 1.f, warp, nw);
  __syncthreads();
  // per token: a warp per row, its lanes over the columns
  for (int t = warp; t < C; t += kAdjointWarps) {
    float kp = 0.f, ay = 0.f;
    for (int i = threadIdx.x % 32; i < DP; i += 32) {
      kp += sK[t * Dm::P + i] * sP[t * Dm::P + i];
      ay += sA[t * Dm::P + i] * sY[t * Dm::P + i];
    }
    kp = warp_sum(kp);
    ay = warp_sum(ay);
    if (threadIdx.x % 32 == 0) {
      const float dc = ay - sbeta[t] * kp;
      a.dbeta[blk * C + t] = a.accumulate ? a.dbeta[blk * C + t] + kp : kp;
      a.dc[blk * C + t] = a.accumulate ? a.dc[blk * C + t] + dc : dc;
    }
  }
  // dkey = β P (+ Du with du_into_dkey), du = Du, formed in P's tile once the rows' sums above have read it
  __syncthreads();
  for (int idx = threadIdx.x; idx < CM * DP; idx += kAdjointThreads) {
    const int at = idx / DP * Dm::P + idx % DP;
    sP[at] = a.du_into_dkey ? sbeta[idx / DP] * sP[at] + sDu[at] : sbeta[idx / DP] * sP[at];
  }
  __syncthreads();
  store_span<CM, DP>(span_of(a.dkey, at), sP, Dm::P, dk);
  if (!a.du_into_dkey) store_span<CM, DP>(span_of(a.du, at), sDu, Dm::P, du);
}

// ---- the adjoints' chunk-local part on fp16 operands (the inputs were bf16; C in 33-64, d in 17-64) ----
//
// The same products as mesa_adjoint_kernel on m16n8k16 fp16 tensor cores with fp32 accumulators. Each tile goes into
// shared memory as fp16 scaled by a power of two that brings its largest entry to [2^14, 2^15): fp16's 11 significant
// bits (TF32's) over 29 binades below it. The scales are undone in fp32. A warp owns 16 rows and half the columns of
// P, Du and Y through both rounds of products, so they stay in registers and go from there to memory; only the
// token-pair tiles (M1 ⊙ E, M2 ⊙ D) pass through shared memory. 76 KB at d = 64, so two blocks share an SM.

constexpr int kHalfAdjointThreads = 256;

// 2^e bringing m (a tile's largest magnitude) into [2^14, 2^15); 1 for a zero or non-finite m.
__device__ inline float fp16_scale(unsigned m_bits) {
  const float m = __uint_as_float(m_bits);
  if (!(m > 0.f) || !isfinite(m)) return 1.f;
  int k;
  frexpf(m, &k);  // m = f 2^k, f in [0.5, 1)
  return ldexpf(1.f, max(-126, min(126, 15 - k)));
}

// slot = max(slot, the warp's largest x): x >= 0, so its bits order as the floats do.
__device__ inline void block_max(unsigned* slot, float x) {
  x = warp_max(x);
  if (threadIdx.x % 32 == 0) atomicMax(slot, __float_as_uint(x));
}

// NT threads' share of a tile [R, W) of src (zeros past its rows and width) on its way to fp16 in shared memory.
template <int R, int W, int NT>
struct Staged {
  static constexpr int V = R * W / 4, PER = (V + NT - 1) / NT;
  float4 v[PER];
  bool raw_bf16;  // v holds bf16 pairs' bits in .x, .y until finish()
  float raw_scale;
  // Issues the loads; finish() makes them floats. Between the two a kernel issues its other tiles' loads, so that their
  // latencies overlap (a load in a branch of its own costs nothing until its value is used).
  __device__ void load(const RowSpan& src, int width, float scale) {
    raw_bf16 = false, raw_scale = scale;
    if (width % 4 == 0 && src.aligned()) {
      raw_bf16 = src.bf16;
#pragma unroll
      for (int i = 0; i < PER; ++i) {
        const int idx = threadIdx.x + i * NT, t = idx / (W / 4), c = idx % (W / 4) * 4;
        v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (idx < V && t < src.rows && c < width) {
          if (src.bf16)
            v[i] = src.raw4_as<true>(t, c);
          else
            v[i] = src.raw4_as<false>(t, c);
        }
      }
      return;
    }
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int idx = threadIdx.x + i * NT, t = idx / (W / 4), c = idx % (W / 4) * 4;
      v[i] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (idx < V && t < src.rows && c < width) {
        v[i].x = src.at(t, c);
        v[i].y = c + 1 < width ? src.at(t, c + 1) : 0.f;
        v[i].z = c + 2 < width ? src.at(t, c + 2) : 0.f;
        v[i].w = c + 3 < width ? src.at(t, c + 3) : 0.f;
      }
    }
  }
  __device__ void finish() {
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      if (raw_bf16) v[i] = RowSpan::widen4<true>(v[i]);
      v[i] = make_float4(raw_scale * v[i].x, raw_scale * v[i].y, raw_scale * v[i].z, raw_scale * v[i].w);
    }
  }
  __device__ float amax() const {
    float m = 0.f;
#pragma unroll
    for (int i = 0; i < PER; ++i)
      m = fmaxf(m, fmaxf(fmaxf(fabsf(v[i].x), fabsf(v[i].y)), fmaxf(fabsf(v[i].z), fabsf(v[i].w))));
    return m;
  }
  __device__ void store(__half* dst, int pitch, float s) const {
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int idx = threadIdx.x + i * NT;
      if (idx < V)
        *reinterpret_cast<uint2*>(dst + idx / (W / 4) * pitch + idx % (W / 4) * 4) =
            make_uint2(half2_bits(s * v[i].x, s * v[i].y), half2_bits(s * v[i].z, s * v[i].w));
    }
  }
};

// Each tile's largest magnitude into its slot of smax (slots zeroed before the caller's last barrier), a barrier, then
// each tile into its fp16 destination at its slot's scale.
template <class... Tiles>
__device__ inline void store_half(unsigned* smax, int pitch, __half* const* dst, const Tiles&... tiles) {
  int i = 0;
  (block_max(smax + i++, tiles.amax()), ...);
  __syncthreads();
  i = 0;
  ((tiles.store(dst[i], pitch, fp16_scale(smax[i])), ++i), ...);
}

// A warp's accumulator rows r0, r1 at columns c0 + 8 n + 2q (+ 1), n < NR, as value(n, h) (h: row r1) gives them,
// into out's first `width` columns, a pair a store.
template <int NR, class F>
__device__ inline void store_rows(const RowSpanOut& o, int width, int r0, int r1, int c0, int q, F value) {
  with_pairs(o, width, [&](const auto& out) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = h ? r1 : r0;
#pragma unroll
      for (int n = 0; n < NR; ++n) {
        const int c = c0 + 8 * n + 2 * q;
        if (t < out.rows && c < width) {
          const float2 v = value(n, h);
          out.put2(t, c, v.x, v.y, c + 1 < width);
        }
      }
    }
  });
}

template <int DP>
struct HalfAdjointShared {
  // pitches in halves: rows of whole 16-byte units, ldmatrix's eight rows on distinct banks
  static constexpr int CM = 64, HP = DP + 8, HC = CM + 8;
  static constexpr size_t bytes = sizeof(__half) * (4 * CM * HP + 2 * DP * HP + 2 * CM * HC) +
                                  sizeof(float) * (6 * CM + kHalfAdjointThreads / 32 * DP) + sizeof(unsigned) * 8;
};

// At d 32, four blocks an SM (64 registers, a few bytes spilled) where it was two: with the chunk's coordinates
// worked out once (ChunkAt), 1.57 -> 1.04 ms for the two launches at B1024 H4 T256 on an H200. At d 64 shared memory
// allows two.
template <int DP>
__global__ void __launch_bounds__(kHalfAdjointThreads, DP == 64 ? 2 : 4)
    mesa_adjoint_half_kernel(MesaChunkProblem p, MesaAdjointArgs a) {
  using Sh = HalfAdjointShared<DP>;
  constexpr int CM = Sh::CM, HP = Sh::HP, HC = Sh::HC, NT = kHalfAdjointThreads, NR = DP / 16;
  extern __shared__ __align__(16) unsigned char raw[];
  __half *hA = reinterpret_cast<__half*>(raw), *hBq = hA + CM * HP, *hK = hBq + CM * HP, *hU = hK + CM * HP;
  __half *hS = hU + CM * HP, *hR = hS + DP * HP, *hM1 = hR + DP * HP, *hM2 = hM1 + CM * HC;
  float *sb = reinterpret_cast<float*>(hM2 + CM * HC), *sbeta = sb + CM;
  float *kp_part = sbeta + CM, *ay_part = kp_part + 2 * CM;
  float* rowdot_part = ay_part + 2 * CM;  // [warps][DP]
  unsigned* smax = reinterpret_cast<unsigned*>(rowdot_part + NT / 32 * DP);  // A, Bq, K, U, S, R, M1 ⊙ E, M2 ⊙ D
  const int64_t blk = blockIdx.x;
  const ChunkAt at = chunk_of(p, blk);
  const int C = p.C, lane = threadIdx.x % 32, warp = threadIdx.x / 32, dk = a.K.d, du = a.U.d;

  {  // the tiles into shared memory, each at its own scale
    Staged<CM, DP, NT> tA, tBq, tK, tU;
    Staged<DP, DP, NT> tS, tR;
    tA.load(span_of(a.A, at), du, 1.f);
    tBq.load(span_of(a.Bq, at), dk, a.bq_scale);
    tK.load(span_of(a.K, at), dk, 1.f);
    tU.load(span_of(a.U, at), du, 1.f);
    tS.load(RowSpan{state_of(a.S, at, dk * du), du, dk, false}, du, 1.f);
    tR.load(RowSpan{state_of(a.R, at, dk * du), du, dk, false}, du, 1.f);
    load_gates<CM>(sb, sbeta, a.logdecay, a.beta, blk, C);
    tA.finish(), tBq.finish(), tK.finish(), tU.finish(), tS.finish(), tR.finish();
    if (a.rowdot) {  // a thread's float4s share their columns; so do the lanes DP / 4 apart
      float4 d = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int i = 0; i < tA.PER; ++i) {
        d.x = fmaf(tA.v[i].x, tBq.v[i].x, d.x), d.y = fmaf(tA.v[i].y, tBq.v[i].y, d.y);
        d.z = fmaf(tA.v[i].z, tBq.v[i].z, d.z), d.w = fmaf(tA.v[i].w, tBq.v[i].w, d.w);
      }
      for (int o = DP / 4; o < 32; o <<= 1) {
        d.x += __shfl_xor_sync(kAllLanes, d.x, o), d.y += __shfl_xor_sync(kAllLanes, d.y, o);
        d.z += __shfl_xor_sync(kAllLanes, d.z, o), d.w += __shfl_xor_sync(kAllLanes, d.w, o);
      }
      if (lane < DP / 4) *reinterpret_cast<float4*>(rowdot_part + warp * DP + 4 * lane) = d;
    }
    if (threadIdx.x < 8) smax[threadIdx.x] = 0u;
    __syncthreads();
    __half* const dst[] = {hA, hBq, hK, hU, hS, hR};
    store_half(smax, HP, dst, tA, tBq, tK, tU, tS, tR);
  }
  __syncthreads();
  const float sA = fp16_scale(smax[0]), sBq = fp16_scale(smax[1]), sK = fp16_scale(smax[2]);
  const float sU = fp16_scale(smax[3]), sS = fp16_scale(smax[4]), sR = fp16_scale(smax[5]);
  // warp: rows [row0, row0 + 16); lane: rows r0, r1 at columns 2q, 2q + 1 of each 8-column tile
  const int g = warp / 4, row0 = 16 * (warp % 4), r0 = row0 + lane / 4, r1 = r0 + 8, q = lane % 4;

  // M1 = A Uᵀ ⊙ E and M2 = Bq Kᵀ ⊙ D, the warp's 32 columns of each, to shared memory at their scales s1, s2
  float s1, s2;
  {
    float m1[4][4] = {}, m2[4][4] = {};
    warp_mm_f16<DP, 4, false, false>(m1, hA, HP, row0, hU, HP, 32 * g, lane);
    warp_mm_f16<DP, 4, false, false>(m2, hBq, HP, row0, hK, HP, 32 * g, lane);
    const float u1 = (1.f / sA) / sU, u2 = (1.f / sBq) / sK;
    float x1 = 0.f, x2 = 0.f;
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = e < 2 ? r0 : r1, s = 32 * g + 8 * n + 2 * q + (e & 1);
        const float dec = s <= t ? expf(sb[t] - sb[s]) : 0.f;
        m1[n][e] *= u1 * dec;
        m2[n][e] *= u2 * dec * sbeta[s];
        x1 = fmaxf(x1, fabsf(m1[n][e]));
        x2 = fmaxf(x2, fabsf(m2[n][e]));
      }
    block_max(smax + 6, x1);
    block_max(smax + 7, x2);
    __syncthreads();
    s1 = fp16_scale(smax[6]), s2 = fp16_scale(smax[7]);
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const int c = 32 * g + 8 * n + 2 * q;
      *reinterpret_cast<uint32_t*>(hM1 + r0 * HC + c) = half2_bits(s1 * m1[n][0], s1 * m1[n][1]);
      *reinterpret_cast<uint32_t*>(hM1 + r1 * HC + c) = half2_bits(s1 * m1[n][2], s1 * m1[n][3]);
      *reinterpret_cast<uint32_t*>(hM2 + r0 * HC + c) = half2_bits(s2 * m2[n][0], s2 * m2[n][1]);
      *reinterpret_cast<uint32_t*>(hM2 + r1 * HC + c) = half2_bits(s2 * m2[n][2], s2 * m2[n][3]);
    }
  }

  // the state terms P = U Rᵀ, Du = K R, Y = Bq S on the warp's DP / 2 columns, scaled as the second round's products
  const int c0 = g * DP / 2;
  float P[NR][4] = {}, Du[NR][4] = {}, Y[NR][4] = {};
  warp_mm_f16<DP, NR, false, false>(P, hU, HP, row0, hR, HP, c0, lane);
  warp_mm_f16<DP, NR, false, true>(Du, hK, HP, row0, hR, HP, c0, lane);
  warp_mm_f16<DP, NR, false, true>(Y, hBq, HP, row0, hS, HP, c0, lane);
  {
    const float last = sb[CM - 1];
    const float fP = (s1 / sU) * (sBq / sR), fD = (s2 / sK) * (sA / sR), fY = (s2 / sBq) * (sU / sS);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = h ? r1 : r0;
      const float to_end = expf(last - sb[t]), pt = fP * to_end, dt = fD * to_end * sbeta[t], yt = fY * expf(sb[t]);
#pragma unroll
      for (int n = 0; n < NR; ++n)
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) P[n][e] *= pt, Du[n][e] *= dt, Y[n][e] *= yt;
    }
  }
  __syncthreads();
  // P += (M1 ⊙ E)ᵀ Bq, Du += (M2 ⊙ D)ᵀ A, Y += (M2 ⊙ D) U, then back to their own units
  warp_mm_f16<CM, NR, true, true>(P, hM1, HC, row0, hBq, HP, c0, lane);
  warp_mm_f16<CM, NR, true, true>(Du, hM2, HC, row0, hA, HP, c0, lane);
  warp_mm_f16<CM, NR, false, true>(Y, hM2, HC, row0, hU, HP, c0, lane);
  {
    const float uP = (1.f / s1) / sBq, uD = (1.f / s2) / sA, uY = (1.f / s2) / sU;
#pragma unroll
    for (int n = 0; n < NR; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) P[n][e] *= uP, Du[n][e] *= uD, Y[n][e] *= uY;
  }

  // per token: k·P and a·Y, the warp's columns summed over its quads, the two column halves in shared memory
  float kp[2] = {0.f, 0.f}, ay[2] = {0.f, 0.f};
#pragma unroll
  for (int n = 0; n < NR; ++n) {
    const int c = c0 + 8 * n + 2 * q;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t = h ? r1 : r0;
      const float2 kv = __half22float2(*reinterpret_cast<const __half2*>(hK + t * HP + c));
      const float2 av = __half22float2(*reinterpret_cast<const __half2*>(hA + t * HP + c));
      kp[h] += kv.x * P[n][2 * h] + kv.y * P[n][2 * h + 1];
      ay[h] += av.x * Y[n][2 * h] + av.y * Y[n][2 * h + 1];
    }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    for (int o = 1; o < 4; o <<= 1) {
      kp[h] += __shfl_xor_sync(kAllLanes, kp[h], o);
      ay[h] += __shfl_xor_sync(kAllLanes, ay[h], o);
    }
    if (q == 0) {
      kp_part[g * CM + (h ? r1 : r0)] = kp[h] / sK;
      ay_part[g * CM + (h ? r1 : r0)] = ay[h] / sA;
    }
  }

  // dkey = β P (+ Du with du_into_dkey), du = Du, from the registers
  {
    const float b0 = sbeta[r0], b1 = sbeta[r1];
    const bool add = a.du_into_dkey;
    store_rows<NR>(span_of(a.dkey, at), dk, r0, r1, c0, q, [&](int n, int h) {
      const float bt = h ? b1 : b0;
      return make_float2(bt * P[n][2 * h] + (add ? Du[n][2 * h] : 0.f),
                         bt * P[n][2 * h + 1] + (add ? Du[n][2 * h + 1] : 0.f));
    });
    if (!a.du_into_dkey)
      store_rows<NR>(span_of(a.du, at), du, r0, r1, c0, q,
                     [&](int n, int h) { return make_float2(Du[n][2 * h], Du[n][2 * h + 1]); });
  }
  __syncthreads();
  for (int t = threadIdx.x; t < C; t += NT) {
    const float kpt = kp_part[t] + kp_part[CM + t], dc = ay_part[t] + ay_part[CM + t] - sbeta[t] * kpt;
    a.dbeta[blk * C + t] = a.accumulate ? a.dbeta[blk * C + t] + kpt : kpt;
    a.dc[blk * C + t] = a.accumulate ? a.dc[blk * C + t] + dc : dc;
  }
  if (a.rowdot)
    for (int i = threadIdx.x; i < dk; i += NT) {
      float sum = 0.f;
#pragma unroll
      for (int w = 0; w < NT / 32; ++w) sum += rowdot_part[w * DP + i];
      a.rowdot[blk * dk + i] = sum;
    }
}

// ---- contributions and reads on fp16 operands (the inputs were bf16; C in 33-64, d in 17-64), as the adjoint ----

// X = (L ⊙ s)ᵀ R: warp w < DP / 8 owns X's rows [16 (w % (DP / 16)), +16) and columns
// [DP / 2 (w / (DP / 16)), +DP / 2).
template <int DP>
__global__ void __launch_bounds__(kHalfAdjointThreads) mesa_contrib_half_kernel(MesaChunkProblem p, MesaContribArgs a) {
  constexpr int CM = 64, HP = DP + 8, NT = kHalfAdjointThreads, NR = DP / 16;
  extern __shared__ __align__(16) unsigned char raw[];
  __half *hL = reinterpret_cast<__half*>(raw), *hR = hL + CM * HP;
  float *sb = reinterpret_cast<float*>(hR + CM * HP), *sbeta = sb + CM;
  unsigned* smax = reinterpret_cast<unsigned*>(sbeta + CM);
  const int64_t blk = blockIdx.x;
  const ChunkAt at = chunk_of(p, blk);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, dl = a.L.d, dr = a.R.d;
  Staged<CM, DP, NT> tL, tR;
  tL.load(span_of(a.L, at), dl, a.scale);
  tR.load(span_of(a.R, at), dr, 1.f);
  load_gates<CM>(sb, sbeta, a.logdecay, a.beta, blk, p.C);
  tL.finish(), tR.finish();
  if (threadIdx.x < 2) smax[threadIdx.x] = 0u;
  __syncthreads();
  const float last = sb[CM - 1];
#pragma unroll
  for (int i = 0; i < tL.PER; ++i) {
    const int t = (threadIdx.x + i * NT) / (DP / 4);
    const float f = t < CM ? (a.to_end ? expf(last - sb[t]) * sbeta[t] : expf(sb[t])) : 0.f;
    tL.v[i] = make_float4(f * tL.v[i].x, f * tL.v[i].y, f * tL.v[i].z, f * tL.v[i].w);
  }
  __half* const dst[] = {hL, hR};
  store_half(smax, HP, dst, tL, tR);
  __syncthreads();
  const float sL = fp16_scale(smax[0]), sR = fp16_scale(smax[1]);
  if (warp >= DP / 8) return;
  const int row0 = 16 * (warp % (DP / 16)), c0 = DP / 2 * (warp / (DP / 16)), q = lane % 4;
  float x[NR][4] = {};
  warp_mm_f16<CM, NR, true, true>(x, hL, HP, row0, hR, HP, c0, lane);
  const float u = (1.f / sL) / sR;
  const RowSpanOut X{a.X + blk * dl * dr, dr, dl, false, false};
  store_rows<NR>(X, dr, row0 + lane / 4, row0 + lane / 4 + 8, c0, q,
                 [&](int n, int h) { return make_float2(u * x[n][2 * h], u * x[n][2 * h + 1]); });
}

// Y = (A ⊙ γ) S + ((A Bᵀ) ⊙ D) U: warp w owns Y's rows [16 (w % 4), +16) and columns [DP / 2 (w / 4), +DP / 2).
template <int DP>
__global__ void __launch_bounds__(kHalfAdjointThreads, 3) mesa_read_half_kernel(MesaChunkProblem p, MesaReadArgs a) {
  constexpr int CM = 64, HP = DP + 8, HC = CM + 8, NT = kHalfAdjointThreads, NR = DP / 16;
  extern __shared__ __align__(16) unsigned char raw[];
  __half *hA = reinterpret_cast<__half*>(raw), *hB = hA + CM * HP, *hU = hB + CM * HP, *hS = hU + CM * HP;
  __half* hW = hS + DP * HP;
  float *sb = reinterpret_cast<float*>(hW + CM * HC), *sbeta = sb + CM;
  unsigned* smax = reinterpret_cast<unsigned*>(sbeta + CM);  // A, B, U, S, (A Bᵀ) ⊙ D
  const int64_t blk = blockIdx.x;
  const ChunkAt at = chunk_of(p, blk);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, da = a.A.d, du = a.U.d;
  {
    Staged<CM, DP, NT> tA, tB, tU;
    Staged<DP, DP, NT> tS;
    tA.load(span_of(a.A, at), da, 1.f);
    tB.load(span_of(a.B, at), da, 1.f);
    tU.load(span_of(a.U, at), du, 1.f);
    const float* S = state_of(a.S, at, da * du);
    if (a.S_transposed)  // stored [du, da]: its rows are Y's columns
      tS.load(RowSpan{S, da, du, false}, da, 1.f);
    else
      tS.load(RowSpan{S, du, da, false}, du, 1.f);
    load_gates<CM>(sb, sbeta, a.logdecay, a.beta, blk, p.C);
    tA.finish(), tB.finish(), tU.finish(), tS.finish();
    if (threadIdx.x < 5) smax[threadIdx.x] = 0u;
    __syncthreads();
    __half* const dst[] = {hA, hB, hU, hS};
    store_half(smax, HP, dst, tA, tB, tU, tS);
  }
  __syncthreads();
  const float sA = fp16_scale(smax[0]), sB = fp16_scale(smax[1]), sU = fp16_scale(smax[2]), sS = fp16_scale(smax[3]);
  const int g = warp / 4, row0 = 16 * (warp % 4), r0 = row0 + lane / 4, r1 = r0 + 8, q = lane % 4;
  float sW;
  {  // W = (A Bᵀ) ⊙ D, the warp's 32 columns, to shared memory at its scale sW
    float w[4][4] = {};
    warp_mm_f16<DP, 4, false, false>(w, hA, HP, row0, hB, HP, 32 * g, lane);
    const float u = (1.f / sA) / sB;
    float xw = 0.f;
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = e < 2 ? r0 : r1, s = 32 * g + 8 * n + 2 * q + (e & 1);
        w[n][e] *= s <= t ? u * expf(sb[t] - sb[s]) * sbeta[s] : 0.f;
        xw = fmaxf(xw, fabsf(w[n][e]));
      }
    block_max(smax + 4, xw);
    __syncthreads();
    sW = fp16_scale(smax[4]);
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const int c = 32 * g + 8 * n + 2 * q;
      *reinterpret_cast<uint32_t*>(hW + r0 * HC + c) = half2_bits(sW * w[n][0], sW * w[n][1]);
      *reinterpret_cast<uint32_t*>(hW + r1 * HC + c) = half2_bits(sW * w[n][2], sW * w[n][3]);
    }
  }
  const int c0 = g * DP / 2;
  float Y[NR][4] = {};
  if (a.S_transposed)
    warp_mm_f16<DP, NR, false, false>(Y, hA, HP, row0, hS, HP, c0, lane);
  else
    warp_mm_f16<DP, NR, false, true>(Y, hA, HP, row0, hS, HP, c0, lane);
  {  // γ_t, in the units of W U
    const float f = (sW / sA) * (sU / sS);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float ft = f * expf(sb[h ? r1 : r0]);
#pragma unroll
      for (int n = 0; n < NR; ++n) Y[n][2 * h] *= ft, Y[n][2 * h + 1] *= ft;
    }
  }
  __syncthreads();
  warp_mm_f16<CM, NR, false, true>(Y, hW, HC, row0, hU, HP, c0, lane);
  const float u = (1.f / sW) / sU;
  store_rows<NR>(span_of(a.Y, at), du, r0, r1, c0, q,
                 [&](int n, int h) { return make_float2(u * Y[n][2 * h], u * Y[n][2 * h + 1]); });
}

template <int DP>
constexpr size_t contrib_half_bytes() {
  return sizeof(__half) * 2 * 64 * (DP + 8) + sizeof(float) * 2 * 64 + sizeof(unsigned) * 2;
}
template <int DP>
constexpr size_t read_half_bytes() {
  return sizeof(__half) * (3 * 64 * (DP + 8) + DP * (DP + 8) + 64 * 72) + sizeof(float) * 2 * 64 + sizeof(unsigned) * 5;
}

template <int CM, int DP>
constexpr size_t contrib_floats() {
  return 2 * Dims<CM, DP>::row_tile + Dims<CM, DP>::state_tile + 2 * CM;
}
template <int CM, int DP>
constexpr size_t read_floats() {
  return 4 * Dims<CM, DP>::row_tile + Dims<CM, DP>::state_tile + Dims<CM, DP>::pair_tile + 2 * CM;
}
template <int CM, int DP>
constexpr size_t adjoint_floats() {  // 188 KB at C = d = 64: more than an A100 gives a block (163 KB)
  return 7 * Dims<CM, DP>::row_tile + 2 * Dims<CM, DP>::state_tile + 2 * Dims<CM, DP>::pair_tile + 2 * CM;
}

// The kernel template instance for (C, d, exact), launched with its shared memory.
template <template <int, int, bool> class Launch, int CM, int DP>
std::string by_exact(const MesaChunkProblem& p, void* stream, const void* args) {
  return p.exact ? Launch<CM, DP, true>::go(p, stream, args) : Launch<CM, DP, false>::go(p, stream, args);
}
template <template <int, int, bool> class Launch, int CM>
std::string by_dim(const MesaChunkProblem& p, int d, void* stream, const void* args) {
  if (d <= 16) return by_exact<Launch, CM, 16>(p, stream, args);
  if (d <= 32) return by_exact<Launch, CM, 32>(p, stream, args);
  return by_exact<Launch, CM, 64>(p, stream, args);
}
template <template <int, int, bool> class Launch>
std::string dispatch(const MesaChunkProblem& p, int d, void* stream, const void* args) {
  if (p.C <= 16) return by_dim<Launch, 16>(p, d, stream, args);
  if (p.C <= 32) return by_dim<Launch, 32>(p, d, stream, args);
  return by_dim<Launch, 64>(p, d, stream, args);
}

template <int CM, int DP, bool EXACT>
struct ContribLaunch {
  static std::string go(const MesaChunkProblem& p, void* stream, const void* args) {
    if constexpr (!EXACT && CM == 64 && DP >= 32)
      return launch_shared("Mesa contrib", mesa_contrib_half_kernel<DP>, p.chunks, kHalfAdjointThreads,
                           contrib_half_bytes<DP>(), stream, p, *static_cast<const MesaContribArgs*>(args));
    else
      return launch_shared("Mesa contrib", mesa_contrib_kernel<CM, DP, EXACT>, p.chunks, kThreads,
                         contrib_floats<CM, DP>() * sizeof(float), stream, p,
                         *static_cast<const MesaContribArgs*>(args));
  }
};
template <int CM, int DP, bool EXACT>
struct ReadLaunch {
  static std::string go(const MesaChunkProblem& p, void* stream, const void* args) {
    if constexpr (!EXACT && CM == 64 && DP >= 32)
      return launch_shared("Mesa read", mesa_read_half_kernel<DP>, p.chunks, kHalfAdjointThreads,
                           read_half_bytes<DP>(), stream, p, *static_cast<const MesaReadArgs*>(args));
    else
      return launch_shared("Mesa read", mesa_read_kernel<CM, DP, EXACT>, p.chunks, kThreads,
                         read_floats<CM, DP>() * sizeof(float), stream, p, *static_cast<const MesaReadArgs*>(args));
  }
};
template <int CM, int DP, bool EXACT>
struct AdjointLaunch {
  static std::string go(const MesaChunkProblem& p, void* stream, const void* args) {
    if constexpr (!EXACT && CM == 64 && DP >= 32)
      return launch_shared("Mesa adjoint", mesa_adjoint_half_kernel<DP>, p.chunks, kHalfAdjointThreads,
                           HalfAdjointShared<DP>::bytes, stream, p, *static_cast<const MesaAdjointArgs*>(args));
    else
      return launch_shared("Mesa adjoint", mesa_adjoint_kernel<CM, DP, EXACT>, p.chunks, kAdjointThreads,
                         adjoint_floats<CM, DP>() * sizeof(float), stream, p,
                         *static_cast<const MesaAdjointArgs*>(args));
  }
};

std::string check(const MesaChunkProblem& p, int d) {
  if (!mesa_chunk_supported(d, p.C) || p.chunks < 0 || p.N < 1)
    return "Mesa chunk kernel: head dim " + std::to_string(d) + " or chunk " + std::to_string(p.C) +
           " out of range (1-64)";
  return "";
}

template <int CM>
size_t shared_bytes_by_dim(int d) {
  if (d <= 16) return adjoint_floats<CM, 16>() * sizeof(float);
  if (d <= 32) return adjoint_floats<CM, 32>() * sizeof(float);
  return adjoint_floats<CM, 64>() * sizeof(float);
}

}  // namespace

size_t mesa_chunk_shared_bytes(int d, int C) {
  if (C <= 16) return shared_bytes_by_dim<16>(d);
  return C <= 32 ? shared_bytes_by_dim<32>(d) : shared_bytes_by_dim<64>(d);
}

std::string mesa_chunk_contrib(const MesaChunkProblem& p, const MesaContribArgs& a, void* stream) {
  const int d = a.L.d > a.R.d ? a.L.d : a.R.d;
  if (auto e = check(p, d); !e.empty() || p.chunks == 0) return e;
  return dispatch<ContribLaunch>(p, d, stream, &a);
}

std::string mesa_chunk_scan(const MesaChunkProblem& p, const MesaScanArgs& a, void* stream) {
  const int64_t n = static_cast<int64_t>(a.BH) * a.dd;
  if (n == 0) return "";
  constexpr int threads = 256;
  const int blocks = static_cast<int>((n + threads - 1) / threads);
  mesa_scan_kernel<<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>(p, a);
  return launch_error("Mesa scan");
}

bool mesa_chunk_walk_supported(const MesaChunkProblem& p, int dl, int dr) {
  const int d = dl > dr ? dl : dr;
  return !p.exact && d > 16 && d <= 32 && p.C >= 1 && p.C <= 64 && p.N >= 1;
}

bool mesa_chunk_walk_pays(const MesaChunkProblem& p, int dl, int dr) {
  return mesa_chunk_walk_supported(p, dl, dr) && p.chunks / p.N >= 512;
}

std::string mesa_chunk_walk(const MesaChunkProblem& p, const MesaContribArgs& a, const MesaScanArgs& s, void* stream) {
  if (!mesa_chunk_walk_supported(p, a.L.d, a.R.d))
    return "Mesa walk kernel: inexact products at head dims 17-32 only (mesa_chunk_walk_supported)";
  if (s.BH == 0) return "";
  return launch_shared("Mesa walk", mesa_walk_kernel<32>, s.BH, kWalkThreads, WalkDims<32>::floats * sizeof(float),
                       stream, p, a, s);
}

std::string mesa_chunk_read(const MesaChunkProblem& p, const MesaReadArgs& a, void* stream) {
  const int d = a.A.d > a.U.d ? a.A.d : a.U.d;
  if (auto e = check(p, d); !e.empty() || p.chunks == 0) return e;
  return dispatch<ReadLaunch>(p, d, stream, &a);
}

std::string mesa_chunk_adjoint(const MesaChunkProblem& p, const MesaAdjointArgs& a, void* stream) {
  const int d = a.K.d > a.U.d ? a.K.d : a.U.d;
  if (auto e = check(p, d); !e.empty() || p.chunks == 0) return e;
  return dispatch<AdjointLaunch>(p, d, stream, &a);
}

}  // namespace memlab::kernels
