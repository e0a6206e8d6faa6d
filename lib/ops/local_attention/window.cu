// Local-window attention, forward and backward: see window.h. A block's work is a __host__ __device__ function
// whose phases are loops over the block's threads with a barrier between them, so the CPU tests run the very code
// with one thread.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/local_attention/window.h"
#include "ops/mma_f16.cuh"
#include "ops/tile.cuh"

#ifdef __CUDA_ARCH__
#define MEMLAB_BLOCK_SYNC() __syncthreads()
#else
#define MEMLAB_BLOCK_SYNC()
#endif

namespace memlab::kernels {
namespace {

using P = WindowAttentionProblem;

__host__ __device__ inline int queries_per_block(const P& p) { return p.S > 32 ? 64 : 32; }
__host__ __device__ inline int tiles(const P& p) { return (p.T + queries_per_block(p) - 1) / queries_per_block(p); }
// Rows of keys (forward, backward) or of queries (backward) a block holds at most.
__host__ __device__ inline int rows_max(const P& p) { return queries_per_block(p) + p.S - 1; }
// The first key query t reads (negative: the window starts before the sequence), and the last query reading key j
// (past T: the sequence ends first).
__host__ __device__ inline int first_key(const P& p, int t) { return p.chunked ? t - t % p.S : t - p.S + 1; }
__host__ __device__ inline int last_query(const P& p, int j) { return p.chunked ? j - j % p.S + p.S - 1 : j + p.S - 1; }
__host__ __device__ inline int64_t row_of(int64_t given, const P& p) { return given ? given : int64_t{p.H} * p.d; }

__host__ __device__ inline float dot(const float* a, const float* b, int n) {
  float acc = 0.f;
  for (int c = 0; c < n; ++c) acc = fmaf(a[c], b[c], acc);
  return acc;
}

// The block's (b, h) and its queries [t0, t1).
struct Tile {
  int b, h, t0, t1;
  __host__ __device__ Tile(const P& p, int64_t blk) {
    const int n = tiles(p);
    t0 = static_cast<int>(blk % n) * queries_per_block(p);
    h = static_cast<int>(blk / n % p.H);
    b = static_cast<int>(blk / n / p.H);
    t1 = t0 + queries_per_block(p) < p.T ? t0 + queries_per_block(p) : p.T;
  }
};

// Where N tensors' rows of head tl.h come from: x[i]'s token rows row[i] elements apart, into s[i] ([n][d + 1]
// fp32). The rows of every tensor hold the same tokens [first, first + n).
template <typename E, int N>
struct Rows {
  const E* x[N];
  int64_t row[N];
  float* s[N];
};

// The rows into shared memory, V elements a load (V divides d and every row's start: the launcher checks). Each
// thread issues kBatch loads of each tensor before it stores any, so that they are in flight together.
constexpr int kBatch = 2;
template <typename E, int V, int N>
__host__ __device__ void load_rows(const P& p, const Tile& tl, int first, int n, const Rows<E, N>& in, int tid, int nt) {
  const int dv = p.d / V, total = n * dv, dp = p.d + 1;
  const int64_t tok = int64_t{tl.b} * p.T + first, col = int64_t{tl.h} * p.d;
  for (int i0 = tid; i0 < total; i0 += kBatch * nt) {
    Pack<E, V> buf[kBatch][N];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = i0 + u * nt;
      if (i >= total) break;
#pragma unroll
      for (int m = 0; m < N; ++m)
        buf[u][m] = *reinterpret_cast<const Pack<E, V>*>(in.x[m] + (tok + i / dv) * in.row[m] + col + (i % dv) * V);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = i0 + u * nt;
      if (i >= total) break;
#pragma unroll
      for (int m = 0; m < N; ++m)
#pragma unroll
        for (int e = 0; e < V; ++e) in.s[m][(i / dv) * dp + (i % dv) * V + e] = to_float(buf[u][m].x[e]);
    }
  }
}

__host__ __device__ inline int64_t dense_at(const P& p, const Tile& tl, int t, int c) {
  return ((int64_t{tl.b} * p.T + t) * p.H + tl.h) * p.d + c;
}

template <typename E, int V>
__host__ __device__ void forward_block(const P& p, const WindowAttentionForwardArgs& a, int64_t blk, int tid, int nt,
                                       float* sm) {
  const Tile tl(p, blk);
  const int d = p.d, dp = d + 1, S = p.S, TQ = queries_per_block(p), R = rows_max(p);
  const int kb = first_key(p, tl.t0) > 0 ? first_key(p, tl.t0) : 0;  // keys [kb, t1)
  const int nq = tl.t1 - tl.t0, nk = tl.t1 - kb;
  float *sQ = sm, *sK = sQ + TQ * dp, *sV = sK + R * dp, *sP = sV + R * dp;  // sP [TQ][S]
  load_rows<E, V, 1>(p, tl, tl.t0, nq, {{static_cast<const E*>(a.q)}, {row_of(p.q_row, p)}, {sQ}}, tid, nt);
  load_rows<E, V, 2>(p, tl, kb, nk,
                     {{static_cast<const E*>(a.k), static_cast<const E*>(a.v)}, {row_of(p.k_row, p), row_of(p.v_row, p)},
                      {sK, sV}},
                     tid, nt);
  MEMLAB_BLOCK_SYNC();
  for (int i = tid; i < nq * S; i += nt) {
    const int r = i / S, t = tl.t0 + r, j = first_key(p, t) + i % S;
    sP[i] = j >= 0 && j <= t ? p.scale * dot(sQ + r * dp, sK + (j - kb) * dp, d) : -INFINITY;
  }
  MEMLAB_BLOCK_SYNC();
  for (int r = tid; r < nq; r += nt) {  // softmax; key t itself is always there, so m is finite and l >= 1
    float* row = sP + r * S;
    float m = -INFINITY, l = 0.f;
    for (int w = 0; w < S; ++w) m = fmaxf(m, row[w]);
    for (int w = 0; w < S; ++w) l += (row[w] = expf(row[w] - m));
    for (int w = 0; w < S; ++w) row[w] /= l;
    a.lse[(int64_t{tl.b} * p.H + tl.h) * p.T + tl.t0 + r] = m + logf(l);
  }
  MEMLAB_BLOCK_SYNC();
  for (int i = tid; i < nq * d; i += nt) {
    const int r = i / d, c = i % d, t = tl.t0 + r, f = first_key(p, t);
    float acc = 0.f;
    for (int w = f < 0 ? -f : 0; w <= t - f; ++w) acc = fmaf(sP[r * S + w], sV[(f + w - kb) * dp + c], acc);
    static_cast<E*>(a.o)[dense_at(p, tl, t, c)] = from_float<E>(acc);
  }
}

template <typename E, int V>
__host__ __device__ void backward_block(const P& p, const WindowAttentionBackwardArgs& a, int64_t blk, int tid, int nt,
                                        float* sm) {
  const Tile tl(p, blk);
  const int d = p.d, dp = d + 1, S = p.S, R = rows_max(p);
  // Queries [t0, qe): the tile's and those past it that read the tile's keys. Keys [kb, t1): those its queries read.
  const int qe = last_query(p, tl.t1 - 1) + 1 < p.T ? last_query(p, tl.t1 - 1) + 1 : p.T;
  const int kb = first_key(p, tl.t0) > 0 ? first_key(p, tl.t0) : 0;
  const int nq = qe - tl.t0, nk = tl.t1 - kb, own = tl.t1 - tl.t0;
  float *sQ = sm, *sG = sQ + R * dp, *sO = sG + R * dp, *sK = sO + R * dp, *sV = sK + R * dp;  // sG: dout
  float *sP = sV + R * dp, *sS = sP + R * S, *sD = sS + R * S;  // p, ds [R][S]; D [R]
  const int64_t dense_row = row_of(0, p);
  load_rows<E, V, 3>(p, tl, tl.t0, nq,
                     {{static_cast<const E*>(a.q), static_cast<const E*>(a.dout), static_cast<const E*>(a.o)},
                      {row_of(p.q_row, p), dense_row, dense_row},
                      {sQ, sG, sO}},
                     tid, nt);
  load_rows<E, V, 2>(p, tl, kb, nk,
                     {{static_cast<const E*>(a.k), static_cast<const E*>(a.v)}, {row_of(p.k_row, p), row_of(p.v_row, p)},
                      {sK, sV}},
                     tid, nt);
  MEMLAB_BLOCK_SYNC();
  const float* lse = a.lse + (int64_t{tl.b} * p.H + tl.h) * p.T + tl.t0;
  for (int r = tid; r < nq; r += nt) sD[r] = dot(sG + r * dp, sO + r * dp, d);  // D_t = dout_t · o_t
  MEMLAB_BLOCK_SYNC();
  // p and ds = p (dout·v - D) of every pair (query of [t0, qe), key of [kb, t1)); 0 elsewhere
  for (int i = tid; i < nq * S; i += nt) {
    const int r = i / S, t = tl.t0 + r, j = first_key(p, t) + i % S;
    float pv = 0.f, ds = 0.f;
    if (j >= 0 && j <= t && j < tl.t1) {
      pv = expf(p.scale * dot(sQ + r * dp, sK + (j - kb) * dp, d) - lse[r]);
      ds = pv * (dot(sG + r * dp, sV + (j - kb) * dp, d) - sD[r]);
    }
    sP[i] = pv;
    sS[i] = ds;
  }
  MEMLAB_BLOCK_SYNC();
  for (int i = tid; i < own * d; i += nt) {  // dq of the tile's queries: all their keys are in [kb, t1)
    const int r = i / d, c = i % d, t = tl.t0 + r, f = first_key(p, t);
    float acc = 0.f;
    for (int w = f < 0 ? -f : 0; w <= t - f; ++w) acc = fmaf(sS[r * S + w], sK[(f + w - kb) * dp + c], acc);
    static_cast<E*>(a.dq)[dense_at(p, tl, t, c)] = from_float<E>(p.scale * acc);
  }
  for (int i = tid; i < own * d; i += nt) {  // dk, dv of the tile's keys, from the queries [j, last_query(j)]
    const int j = tl.t0 + i / d, c = i % d, te = last_query(p, j) < p.T - 1 ? last_query(p, j) : p.T - 1;
    float gk = 0.f, gv = 0.f;
    for (int t = j; t <= te; ++t) {
      const int r = t - tl.t0, w = j - first_key(p, t);
      gk = fmaf(sS[r * S + w], sQ[r * dp + c], gk);
      gv = fmaf(sP[r * S + w], sG[r * dp + c], gv);
    }
    static_cast<E*>(a.dk)[dense_at(p, tl, j, c)] = from_float<E>(p.scale * gk);
    static_cast<E*>(a.dv)[dense_at(p, tl, j, c)] = from_float<E>(gv);
  }
}

constexpr int kThreads = kTileThreads;

template <typename E, int V>
__global__ void __launch_bounds__(kThreads) window_forward_kernel(P p, WindowAttentionForwardArgs a) {
  extern __shared__ float sm[];
  forward_block<E, V>(p, a, blockIdx.x, threadIdx.x, kThreads, sm);
}

template <typename E, int V>
__global__ void __launch_bounds__(kThreads) window_backward_kernel(P p, WindowAttentionBackwardArgs a) {
  extern __shared__ float sm[];
  backward_block<E, V>(p, a, blockIdx.x, threadIdx.x, kThreads, sm);
}

// ---- The tensor-core form (bf16) ----
// A block of kTcWarps warps owns the 64 positions [t0, t0 + 64) of one (b, h). With R = S - 1 rounded up to 16, its
// queries read keys of [t0 - R, t0 + 64), and its keys are read by queries of [t0, t0 + 64 + R). The forward takes
// the scores of its 64 queries against those 64 + R keys as bf16 mma products from shared memory, masks them to the
// window in registers, and writes P (bf16) back for O = P V. The backward takes the (64 + R) x (64 + R) grid of
// queries [t0, t0 + 64 + R) against keys [t0 - R, t0 + 64): p from lse, dp = dout vᵀ, ds = p (dp - D), then
// dq = ds k of its queries and dk = dsᵀ q, dv = pᵀ dout of its keys. Shared-memory rows are padded by 8 elements so
// that ldmatrix's eight rows fall on distinct banks.
constexpr int kTcRows = 64, kTcWarps = 4, kTcThreads = 32 * kTcWarps;
using B16 = __nv_bfloat16;

__host__ __device__ inline int tc_reach(int S) { return (S - 1 + 15) / 16 * 16; }
__host__ __device__ inline int tc_tiles(const P& p) { return (p.T + kTcRows - 1) / kTcRows; }

// rows [first, first + n) of x's head h (token rows `row` apart) into s ([n][LD] bf16), zeros outside [0, T) and
// past d; 16-byte loads where `vec` (d and every row start a multiple of 8 elements).
template <int DP, int LD>
__device__ void tc_load(const P& p, const B16* x, int64_t row, int b, int h, int first, int n, bool vec, B16* s) {
  const B16 zero = __float2bfloat16(0.f);
  for (int i = threadIdx.x; i < n * (DP / 8); i += kTcThreads) {
    const int r = i / (DP / 8), c = (i % (DP / 8)) * 8, t = first + r;
    const bool in = t >= 0 && t < p.T;
    const B16* src = x + (int64_t{b} * p.T + t) * row + int64_t{h} * p.d + c;
    if (in && vec && c + 8 <= p.d) {
      *reinterpret_cast<uint4*>(s + r * LD + c) = *reinterpret_cast<const uint4*>(src);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) s[r * LD + c + e] = in && c + e < p.d ? src[e] : zero;
    }
  }
}

__device__ inline float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(kAllLanes, x, 1));
  return fmaxf(x, __shfl_xor_sync(kAllLanes, x, 2));
}
__device__ inline float quad_sum(float x) {
  x += __shfl_xor_sync(kAllLanes, x, 1);
  return x + __shfl_xor_sync(kAllLanes, x, 2);
}

// A warp's 16 x (8 NT) fp32 tile into bf16 shared memory at rows m0.., columns from 0 (pitch ld), times f.
template <int NT>
__device__ void tc_store_tile(const float (&acc)[NT][4], B16* s, int ld, int m0, int lane, float f0, float f1) {
  const int g = lane / 4, q = lane % 4;
  each_pair<NT>(m0 + g, m0 + g + 8, q, [&](int n, int hh, int row, int col) {
    const float f = hh ? f1 : f0;
    *reinterpret_cast<__nv_bfloat162*>(s + row * ld + col) =
        __floats2bfloat162_rn(acc[n][2 * hh] * f, acc[n][2 * hh + 1] * f);
  });
}

// A warp's 16 x DP output tile (rows m0.. of positions t0 + row) to dense [B, T, H, d] bf16, times f.
template <int NT>
__device__ void tc_store_out(const P& p, const float (&acc)[NT][4], B16* out, int b, int h, int t0, int m0, int lane,
                             float f) {
  const int g = lane / 4, q = lane % 4;
  each_entry<NT>(m0 + g, m0 + g + 8, q, [&](int n, int e, int row, int col) {
    const int t = t0 + row;
    if (t < p.T && col < p.d) out[((int64_t{b} * p.T + t) * p.H + h) * p.d + col] = __float2bfloat16(acc[n][e] * f);
  });
}

template <int DP, int R>
__global__ void __launch_bounds__(kTcThreads) window_forward_tc_kernel(P p, WindowAttentionForwardArgs a, bool vec) {
  constexpr int G = kTcRows + R, LD = DP + 8, LG = G + 8;
  extern __shared__ __align__(16) unsigned char raw[];
  B16 *sQ = reinterpret_cast<B16*>(raw), *sK = sQ + kTcRows * LD, *sV = sK + G * LD, *sP = sV + G * LD;
  const int tiles = tc_tiles(p), h = blockIdx.x / tiles % p.H, b = blockIdx.x / tiles / p.H;
  const int t0 = blockIdx.x % tiles * kTcRows, k0 = t0 - R;  // grid column c is key k0 + c
  const int lane = threadIdx.x % 32, m0 = 16 * (threadIdx.x / 32), g = lane / 4, q = lane % 4;
  tc_load<DP, LD>(p, static_cast<const B16*>(a.q), row_of(p.q_row, p), b, h, t0, kTcRows, vec, sQ);
  tc_load<DP, LD>(p, static_cast<const B16*>(a.k), row_of(p.k_row, p), b, h, k0, G, vec, sK);
  tc_load<DP, LD>(p, static_cast<const B16*>(a.v), row_of(p.v_row, p), b, h, k0, G, vec, sV);
  __syncthreads();
  float s[G / 8][4] = {};
  warp_mm_f16<DP, G / 8, false, false, B16>(s, sQ, LD, m0, sK, LD, 0, lane);
  float mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  each_entry<G / 8>(m0 + g, m0 + g + 8, q, [&](int n, int e, int row, int col) {
    const int t = t0 + row, j = k0 + col;
    const bool ok = t < p.T && j >= 0 && j >= first_key(p, t) && j <= t;
    s[n][e] = ok ? s[n][e] * p.scale : -INFINITY;
    mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
  });
  for (int hh = 0; hh < 2; ++hh) {
    mx[hh] = quad_max(mx[hh]);
    if (mx[hh] == -INFINITY) mx[hh] = 0.f;  // a row past T: p = 0 throughout
  }
  each_entry<G / 8>(m0 + g, m0 + g + 8, q, [&](int n, int e, int, int) {
    s[n][e] = expf(s[n][e] - mx[e >> 1]);
    l[e >> 1] += s[n][e];
  });
  for (int hh = 0; hh < 2; ++hh) {
    l[hh] = quad_sum(l[hh]);
    const int t = t0 + m0 + g + 8 * hh;
    if (q == 0 && t < p.T) a.lse[(int64_t{b} * p.H + h) * p.T + t] = mx[hh] + logf(l[hh]);
  }
  tc_store_tile<G / 8>(s, sP, LG, m0, lane, l[0] > 0.f ? 1.f / l[0] : 0.f, l[1] > 0.f ? 1.f / l[1] : 0.f);
  __syncwarp();
  float o[DP / 8][4] = {};
  warp_mm_f16<G, DP / 8, false, true, B16>(o, sP, LG, m0, sV, LD, 0, lane);
  tc_store_out<DP / 8>(p, o, static_cast<B16*>(a.o), b, h, t0, m0, lane, 1.f);
}

template <int DP, int R>
__global__ void __launch_bounds__(kTcThreads) window_backward_tc_kernel(P p, WindowAttentionBackwardArgs a, bool vec) {
  constexpr int G = kTcRows + R, LD = DP + 8, LG = G + 8;
  extern __shared__ __align__(16) unsigned char raw[];
  // queries [t0, t0 + G) in sQ, sO (dout); keys [t0 - R, t0 + 64) in sK, sV; p and ds on the grid; lse, D per query
  B16 *sQ = reinterpret_cast<B16*>(raw), *sO = sQ + G * LD, *sK = sO + G * LD, *sV = sK + G * LD;
  B16 *sP = sV + G * LD, *sS = sP + G * LG;
  float *sL = reinterpret_cast<float*>(sS + G * LG), *sD = sL + G;
  const int tiles = tc_tiles(p), h = blockIdx.x / tiles % p.H, b = blockIdx.x / tiles / p.H;
  const int t0 = blockIdx.x % tiles * kTcRows, k0 = t0 - R;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, q = lane % 4;
  const auto* dout = static_cast<const B16*>(a.dout);
  const auto* o = static_cast<const B16*>(a.o);
  tc_load<DP, LD>(p, static_cast<const B16*>(a.q), row_of(p.q_row, p), b, h, t0, G, vec, sQ);
  tc_load<DP, LD>(p, dout, row_of(0, p), b, h, t0, G, vec, sO);
  tc_load<DP, LD>(p, static_cast<const B16*>(a.k), row_of(p.k_row, p), b, h, k0, G, vec, sK);
  tc_load<DP, LD>(p, static_cast<const B16*>(a.v), row_of(p.v_row, p), b, h, k0, G, vec, sV);
  for (int r = warp; r < G; r += kTcWarps) {  // D_t = dout_t · o_t (a warp a row), lse_t
    const int t = t0 + r;
    float acc = 0.f;
    if (t < p.T)
      for (int c = lane; c < p.d; c += 32) {
        const int64_t at = ((int64_t{b} * p.T + t) * p.H + h) * p.d + c;
        acc += __bfloat162float(dout[at]) * __bfloat162float(o[at]);
      }
    acc = warp_sum(acc);
    if (lane == 0) {
      sD[r] = acc;
      sL[r] = t < p.T ? a.lse[(int64_t{b} * p.H + h) * p.T + t] : 0.f;
    }
  }
  __syncthreads();
  for (int m0 = 16 * warp; m0 < G; m0 += 16 * kTcWarps) {
    float s[G / 8][4] = {}, dp[G / 8][4] = {};
    warp_mm_f16<DP, G / 8, false, false, B16>(s, sQ, LD, m0, sK, LD, 0, lane);
    warp_mm_f16<DP, G / 8, false, false, B16>(dp, sO, LD, m0, sV, LD, 0, lane);
    each_entry<G / 8>(m0 + g, m0 + g + 8, q, [&](int n, int e, int row, int col) {
      const int t = t0 + row, j = k0 + col;
      const bool ok = t < p.T && j >= 0 && j >= first_key(p, t) && j <= t;
      const float pv = ok ? expf(s[n][e] * p.scale - sL[row]) : 0.f;
      s[n][e] = pv;
      dp[n][e] = pv * (dp[n][e] - sD[row]);
    });
    tc_store_tile<G / 8>(s, sP, LG, m0, lane, 1.f, 1.f);
    tc_store_tile<G / 8>(dp, sS, LG, m0, lane, 1.f, 1.f);
  }
  __syncthreads();
  const int m0 = 16 * warp;
  B16 *dq = static_cast<B16*>(a.dq), *dk = static_cast<B16*>(a.dk), *dv = static_cast<B16*>(a.dv);
  {  // dq of the block's queries (grid rows 0..63) against every key column
    float acc[DP / 8][4] = {};
    warp_mm_f16<G, DP / 8, false, true, B16>(acc, sS, LG, m0, sK, LD, 0, lane);
    tc_store_out<DP / 8>(p, acc, dq, b, h, t0, m0, lane, p.scale);
  }
  {  // dk, dv of the block's keys (grid columns R..R+63) from every query row
    float acc[DP / 8][4] = {};
    warp_mm_f16<G, DP / 8, true, true, B16>(acc, sS, LG, R + m0, sQ, LD, 0, lane);
    tc_store_out<DP / 8>(p, acc, dk, b, h, t0, m0, lane, p.scale);
    float accv[DP / 8][4] = {};
    warp_mm_f16<G, DP / 8, true, true, B16>(accv, sP, LG, R + m0, sO, LD, 0, lane);
    tc_store_out<DP / 8>(p, accv, dv, b, h, t0, m0, lane, 1.f);
  }
}

// Head dims padded to 32, 64 or 128; R to 0, 16, 32 or 64.
int tc_dim(int d) { return d <= 32 ? 32 : d <= 64 ? 64 : 128; }
int tc_r(int S) { const int r = tc_reach(S); return r <= 32 ? r : 64; }

size_t tc_forward_smem(int DP, int R) {
  const size_t G = kTcRows + R, LD = DP + 8, LG = G + 8;
  return 2 * (kTcRows * LD + 2 * G * LD + kTcRows * LG);
}
size_t tc_backward_smem(int DP, int R) {
  const size_t G = kTcRows + R, LD = DP + 8, LG = G + 8;
  return 2 * (4 * G * LD + 2 * G * LG) + 8 * G;
}

template <int DP, int R>
std::string tc_launch(const P& p, const void* args, bool backward, bool vec, void* stream) {
  const int blocks = p.B * p.H * tc_tiles(p);
  if (backward)
    return launch_shared("window attention backward (tensor cores)", window_backward_tc_kernel<DP, R>, blocks,
                         kTcThreads, tc_backward_smem(DP, R), stream, p,
                         *static_cast<const WindowAttentionBackwardArgs*>(args), vec);
  return launch_shared("window attention forward (tensor cores)", window_forward_tc_kernel<DP, R>, blocks, kTcThreads,
                       tc_forward_smem(DP, R), stream, p, *static_cast<const WindowAttentionForwardArgs*>(args), vec);
}

template <int DP>
std::string tc_launch_r(const P& p, const void* args, bool backward, bool vec, void* stream) {
  switch (tc_r(p.S)) {
    case 0: return tc_launch<DP, 0>(p, args, backward, vec, stream);
    case 16: return tc_launch<DP, 16>(p, args, backward, vec, stream);
    case 32: return tc_launch<DP, 32>(p, args, backward, vec, stream);
    default: return tc_launch<DP, 64>(p, args, backward, vec, stream);
  }
}

std::string tc_dispatch(const P& p, const void* args, bool backward, bool vec, void* stream) {
  switch (tc_dim(p.d)) {
    case 32: return tc_launch_r<32>(p, args, backward, vec, stream);
    case 64: return tc_launch_r<64>(p, args, backward, vec, stream);
    default: return tc_launch_r<128>(p, args, backward, vec, stream);
  }
}

std::string check(const P& p) {
  if (p.B < 0 || p.T < 0 || p.H < 1 || p.d < 1 || p.d > kWindowMaxDim)
    return "window attention: head dim 1 to " + std::to_string(kWindowMaxDim) + " and at least one head";
  if (p.S < 1 || p.S > kWindowMaxS) return "window attention: a window of 1 to " + std::to_string(kWindowMaxS);
  const int64_t hd = int64_t{p.H} * p.d;
  if ((p.q_row && p.q_row < hd) || (p.k_row && p.k_row < hd) || (p.v_row && p.v_row < hd))
    return "window attention: token rows overlap (a row stride under H d)";
  if (int64_t{p.B} * p.H * tiles(p) >= (int64_t{1} << 31)) return "window attention: too many blocks";
  return "";
}

int64_t blocks(const P& p) { return int64_t{p.B} * p.H * tiles(p); }

// Whether every row the kernel reads starts on a 16-byte boundary holding whole vectors of `width` elements: then
// it loads vectors of 16 bytes.
bool vectors_fit(const P& p, int width, std::initializer_list<const void*> ptrs) {
  if (p.d % width) return false;
  for (int64_t r : {p.q_row, p.k_row, p.v_row})
    if (r % width) return false;
  for (const void* x : ptrs)
    if (reinterpret_cast<uintptr_t>(x) % 16) return false;
  return true;
}

template <typename E>
constexpr int kVector = 16 / sizeof(E);

}  // namespace

size_t window_attention_forward_smem(const P& p) {
  if (p.bf16 && p.tensor_cores) return tc_forward_smem(tc_dim(p.d), tc_r(p.S));
  const size_t dp = p.d + 1;
  return sizeof(float) * ((queries_per_block(p) + 2 * rows_max(p)) * dp + static_cast<size_t>(queries_per_block(p)) * p.S);
}

size_t window_attention_backward_smem(const P& p) {
  if (p.bf16 && p.tensor_cores) return tc_backward_smem(tc_dim(p.d), tc_r(p.S));
  const size_t dp = p.d + 1, R = rows_max(p);
  return sizeof(float) * (5 * R * dp + 2 * R * p.S + R);
}

template <typename E, int V>
std::string launch_forward(const P& p, const WindowAttentionForwardArgs& a, void* stream) {
  return launch_tiles("window attention forward", window_forward_kernel<E, V>, static_cast<int>(blocks(p)),
                      window_attention_forward_smem(p) / sizeof(float), stream, p, a);
}

template <typename E, int V>
std::string launch_backward(const P& p, const WindowAttentionBackwardArgs& a, void* stream) {
  return launch_tiles("window attention backward", window_backward_kernel<E, V>, static_cast<int>(blocks(p)),
                      window_attention_backward_smem(p) / sizeof(float), stream, p, a);
}

std::string window_attention_forward(const P& p, const WindowAttentionForwardArgs& a, void* stream) {
  if (auto e = check(p); !e.empty()) return e;
  if (blocks(p) == 0) return "";
  const bool vec = vectors_fit(p, p.bf16 ? kVector<B16> : kVector<float>, {a.q, a.k, a.v});
  if (p.bf16 && p.tensor_cores) return tc_dispatch(p, &a, false, vec, stream);
  if (p.bf16) return vec ? launch_forward<B16, kVector<B16>>(p, a, stream) : launch_forward<B16, 1>(p, a, stream);
  return vec ? launch_forward<float, kVector<float>>(p, a, stream) : launch_forward<float, 1>(p, a, stream);
}

std::string window_attention_backward(const P& p, const WindowAttentionBackwardArgs& a, void* stream) {
  if (auto e = check(p); !e.empty()) return e;
  if (blocks(p) == 0) return "";
  const bool vec = vectors_fit(p, p.bf16 ? kVector<B16> : kVector<float>, {a.q, a.k, a.v, a.o, a.dout});
  if (p.bf16 && p.tensor_cores) return tc_dispatch(p, &a, true, vec, stream);
  if (p.bf16) return vec ? launch_backward<B16, kVector<B16>>(p, a, stream) : launch_backward<B16, 1>(p, a, stream);
  return vec ? launch_backward<float, kVector<float>>(p, a, stream) : launch_backward<float, 1>(p, a, stream);
}

// The host runs fp32 in vectors of 4 where the rows allow, as the GPU would, so the CPU tests cover both loads.
std::string window_attention_forward_host(const P& p, const WindowAttentionForwardArgs& a) {
  if (auto e = check(p); !e.empty()) return e;
  if (p.bf16) return "window attention on the host: fp32 only";
  std::vector<float> sm(window_attention_forward_smem(p) / sizeof(float));
  const bool vectors = vectors_fit(p, kVector<float>, {a.q, a.k, a.v});
  for (int64_t blk = 0; blk < blocks(p); ++blk)
    vectors ? forward_block<float, kVector<float>>(p, a, blk, 0, 1, sm.data())
            : forward_block<float, 1>(p, a, blk, 0, 1, sm.data());
  return "";
}

std::string window_attention_backward_host(const P& p, const WindowAttentionBackwardArgs& a) {
  if (auto e = check(p); !e.empty()) return e;
  if (p.bf16) return "window attention on the host: fp32 only";
  std::vector<float> sm(window_attention_backward_smem(p) / sizeof(float));
  const bool vectors = vectors_fit(p, kVector<float>, {a.q, a.k, a.v, a.o, a.dout});
  for (int64_t blk = 0; blk < blocks(p); ++blk)
    vectors ? backward_block<float, kVector<float>>(p, a, blk, 0, 1, sm.data())
            : backward_block<float, 1>(p, a, blk, 0, 1, sm.data());
  return "";
}

}  // namespace memlab::kernels
