// Local-window attention, forward and backward: see window.h. A block's work is a __host__ __device__ function
// whose phases are loops over the block's threads with a barrier between them, so the CPU tests run the very code
// with one thread.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/local_attention/window.h"
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
  const size_t dp = p.d + 1;
  return sizeof(float) * ((queries_per_block(p) + 2 * rows_max(p)) * dp + static_cast<size_t>(queries_per_block(p)) * p.S);
}

size_t window_attention_backward_smem(const P& p) {
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
  using B16 = __nv_bfloat16;
  const bool vec = vectors_fit(p, p.bf16 ? kVector<B16> : kVector<float>, {a.q, a.k, a.v});
  if (p.bf16) return vec ? launch_forward<B16, kVector<B16>>(p, a, stream) : launch_forward<B16, 1>(p, a, stream);
  return vec ? launch_forward<float, kVector<float>>(p, a, stream) : launch_forward<float, 1>(p, a, stream);
}

std::string window_attention_backward(const P& p, const WindowAttentionBackwardArgs& a, void* stream) {
  if (auto e = check(p); !e.empty()) return e;
  if (blocks(p) == 0) return "";
  using B16 = __nv_bfloat16;
  const bool vec = vectors_fit(p, p.bf16 ? kVector<B16> : kVector<float>, {a.q, a.k, a.v, a.o, a.dout});
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
