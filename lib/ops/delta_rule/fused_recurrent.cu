// Fused recurrent (gated) delta rule: see fused_recurrent.h for the scheme. One warp per block holds 32
// state columns of one head; the block's q, k, β and decay for kDeltaRuleChunk steps sit in shared memory.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "ops/delta_rule/fused_recurrent.h"
#include "ops/delta_rule/rows.cuh"
#include "ops/float_conversion.cuh"

// Each compilation builds only some of the kernels (see delta_recurrent below): the others' helpers go unreferenced.
#pragma nv_diag_suppress 177

namespace memlab::kernels {

// The kernels of one direction and input type, launched for a problem: each is built in its own compilation of this
// file (CMakeLists.txt sets MEMLAB_DELTA_RECURRENT_PART), so that they compile in parallel; the plain compilation
// holds the entry points of fused_recurrent.h.
namespace delta_recurrent {
template <typename T>
void forward(const DeltaRuleProblem& p, const DeltaRuleForwardArgs& a, cudaStream_t stream);
template <typename T>
void backward(const DeltaRuleProblem& p, const DeltaRuleBackwardArgs& a, cudaStream_t stream);
}  // namespace delta_recurrent

namespace {

constexpr int kLanes = 32;
constexpr int kChunk = kDeltaRuleChunk;
// Largest growth of rounding error the gated backward accepts when it divides by decays to step back in
// time; beyond it S_{t-1} is recomputed from the stored state (strong gates).
constexpr float kMaxAmplification = 64.f;

template <int DK>
struct Tile {
  float q[kChunk][DK];  // scaled; zero beyond dk
  float k[kChunk][DK];
  float beta[kChunk];
  float a[kChunk];  // exp(g); 1 when ungated
  float rq[kChunk], rk[kChunk];  // rsqrt(Σx² + eps) of the raw rows (qk_l2norm)
  // Each lane's own column values for the chunk (forward: v; backward: v, u, do), loaded together at the
  // chunk's start so that a step never waits on global memory.
  float col[3][kChunk][kLanes];
};

// Element idx of src for the tile loads, where `in` (idx is 0 otherwise): fp32 loads are predicated, which ptxas
// issues back to back; a bf16 load behind the same branch waited for its own conversion, so it loads element 0
// unconditionally and the caller zeroes it after converting (the unconditional form cost the fp32 kernels 4-10%,
// H200).
template <typename T>
__device__ __forceinline__ T tile_load(const T* src, size_t idx, bool in) {
  if constexpr (std::is_same_v<T, float>)
    return in ? src[idx] : 0.f;
  else
    return src[idx];
}

// Loads this lane's column j of `n` rows of a [B, T, H, dv] tensor into dst[tt][lane] (zero where inactive).
// Every load goes out before any is converted (see tile_load).
template <typename T>
__device__ __forceinline__ void load_column(float (&dst)[kChunk][kLanes], const DeltaRuleProblem& p, const T* src,
                                            int b, int h, int t0, int n, int j) {
  const bool active = j < p.dv;
  T raw[kChunk];
#pragma unroll
  for (int tt = 0; tt < kChunk; ++tt) {
    const bool in = tt < n && active;
    raw[tt] = tile_load(src, in ? row_of(p, b, t0 + tt, h) * p.dv + j : 0, in);
  }
#pragma unroll
  for (int tt = 0; tt < kChunk; ++tt) dst[tt][threadIdx.x] = (tt < n && active) ? to_float(raw[tt]) : 0.f;
}

static_assert(2 * kChunk == kLanes, "normalise_rows gives each lane one row of q or k");

// Scales the tile's raw q and k rows to unit length (q then by p.scale): lane L sums the squares of row L % kChunk
// of q (L < kChunk) or k, reading it from a lane-dependent start so that the lanes hit different banks.
template <int DK>
__device__ void normalise_rows(Tile<DK>& s, const DeltaRuleProblem& p) {
  __syncthreads();
  const int lane = threadIdx.x, tt = lane % kChunk;
  const float* row = lane < kChunk ? s.q[tt] : s.k[tt];
  // Once per tile, beside the state's registers: partial unrolling keeps the loads from taking more.
  float ss = 0.f;
#pragma unroll 4
  for (int i = 0; i < DK; ++i) {
    const float x = row[(i + lane) % DK];
    ss = fmaf(x, x, ss);
  }
  (lane < kChunk ? s.rq : s.rk)[tt] = rsqrtf(ss + p.l2_eps);
  __syncthreads();
#pragma unroll 2
  for (int e = lane; e < kChunk * DK; e += kLanes) {
    const int r = e / DK, i = e % DK;
    s.q[r][i] *= s.rq[r] * p.scale;
    s.k[r][i] *= s.rk[r];
  }
}

template <typename T, int DK, bool L2>
__device__ void load_tile(Tile<DK>& s, const DeltaRuleProblem& p, const T* q, const T* k, const float* beta,
                          const float* g, int b, int h, int t0, int n) {
  const float q_scale = L2 ? 1.f : p.scale;  // normalise_rows scales after the norm
  // Each lane's loads go out in rounds of up to 8 per tensor, all before the first conversion or store, so that
  // their latencies overlap (a loop of load-then-store waited on each: fp32 rule fwd+bwd 2.26 -> 2.00 ms, H200,
  // B1024 T256 H4 D32; bf16 2.77 -> 2.30 with tile_load).
  constexpr int kPerLane = kChunk * DK / kLanes, kMaxRound = DK <= 32 ? 8 : 4;  // wide heads: registers are short
  constexpr int kRound = kPerLane < kMaxRound ? kPerLane : kMaxRound;
#pragma unroll 1
  for (int r0 = 0; r0 < kPerLane; r0 += kRound) {
    T qv[kRound], kv[kRound];
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      const int e = (r0 + u) * kLanes + threadIdx.x, tt = e / DK, i = e % DK;
      const bool in = tt < n && i < p.dk;
      const size_t idx = in ? row_of(p, b, t0 + tt, h) * p.dk + i : 0;
      qv[u] = tile_load(q, idx, in);
      kv[u] = tile_load(k, idx, in);
    }
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      const int e = (r0 + u) * kLanes + threadIdx.x, tt = e / DK, i = e % DK;
      const bool in = tt < n && i < p.dk;
      s.q[tt][i] = in ? to_float(qv[u]) * q_scale : 0.f;
      s.k[tt][i] = in ? to_float(kv[u]) : 0.f;
    }
  }
  if (L2) normalise_rows(s, p);
  if (threadIdx.x < kChunk) {
    float bv = 0.f, av = 1.f;
    if (static_cast<int>(threadIdx.x) < n) {
      const size_t r = row_of(p, b, t0 + threadIdx.x, h);
      bv = beta[r];
      if (g) av = expf(g[r]);
    }
    s.beta[threadIdx.x] = bv;
    s.a[threadIdx.x] = av;
  }
}

template <int DK>
__device__ __forceinline__ float dot(const float* x, const float (&s)[DK]) {
  float acc[4] = {0.f, 0.f, 0.f, 0.f};  // four chains: the FMA latency, not the count, bounds a step
#pragma unroll
  for (int i = 0; i < DK; ++i) acc[i % 4] = fmaf(x[i], s[i], acc[i % 4]);
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int r = 1; r < kLanes; r *= 2) x += __shfl_xor_sync(0xffffffffu, x, r);
  return x;
}

// One round of the butterfly below: lanes with bit W set keep the upper half of x[0..2W), the others the lower
// half, and each adds its partner's copy of the half it keeps. Templated so every index is a constant and x
// stays in registers.
template <int W, int N>
__device__ __forceinline__ void butterfly_rounds(float (&x)[N], int lane) {
  if constexpr (W >= 1) {
    const bool upper = lane & W;
#pragma unroll
    for (int i = 0; i < W; ++i) {
      const float lo = x[i], hi = x[i + W];
      const float send = upper ? lo : hi;
      const float keep = upper ? hi : lo;
      x[i] = keep + __shfl_xor_sync(0xffffffffu, send, W);
    }
    butterfly_rounds<W / 2, N>(x, lane);
  }
}

// Sums x[0..N) over the warp; lane L returns the sum of entry L % N (N = 16 or 32): N - 1 shuffles instead of
// N full reductions.
template <int N>
__device__ __forceinline__ float warp_sum_scatter(float (&x)[N]) {
  const int lane = threadIdx.x % kLanes;
  if constexpr (N < kLanes) {
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] += __shfl_xor_sync(0xffffffffu, x[i], N);
  }
  butterfly_rounds<N / 2, N>(x, lane);
  return x[0];
}

// Entries of a DK-vector that one lane holds in column_sum_to: DK / 32, or 1 (DK = 16, held twice over).
template <int DK>
struct LaneSlots {
  static constexpr int N = DK < kLanes ? DK : kLanes;  // entries summed per round
  static constexpr int count = DK / N;
};

// Stores the column sum of f(i) over the warp for i < dk as store(i, sum): f is evaluated 32 entries at a time.
// With l2 (qk_l2norm), the sums are the gradient dy of a row y = x r normalised in the kernel, and the raw row x's
// gradient r (dy - y (y·dy)) is stored; y(i) = y_weight * tile row[i].
template <int DK, bool L2 = false, typename Store, typename F>
__device__ __forceinline__ void column_sum_to(Store store, int dk, F f, const float* row = nullptr,
                                              float y_weight = 1.f, float r = 1.f) {
  constexpr int N = LaneSlots<DK>::N, S = LaneSlots<DK>::count;
  const int lane = threadIdx.x % kLanes;
  float sums[S];
#pragma unroll
  for (int g = 0; g < S; ++g) {
    float x[N];
#pragma unroll
    for (int i = 0; i < N; ++i) x[i] = f(g * N + i);
    sums[g] = warp_sum_scatter<N>(x);
  }
  float dot = 0.f;
  if (L2) {
#pragma unroll
    for (int g = 0; g < S; ++g)
      if (lane < N) dot = fmaf(row[g * N + lane] * y_weight, sums[g], dot);
    dot = warp_sum(dot);
  }
#pragma unroll
  for (int g = 0; g < S; ++g) {
    const int i = g * N + lane;
    if (lane < N && i < dk) store(i, L2 ? r * (sums[g] - row[i] * y_weight * dot) : sums[g]);
  }
}

template <typename T, int DK, bool GATED, bool L2, bool LINEAR>
__global__ void __launch_bounds__(kLanes) delta_rule_forward_kernel(DeltaRuleProblem p, DeltaRuleForwardArgs a) {
  __shared__ Tile<DK> tile;
  const int bh = blockIdx.x, b = bh / p.H, h = bh % p.H;
  const int j = blockIdx.y * kLanes + threadIdx.x;
  const bool active = j < p.dv;
  const int chunks = (p.T + kChunk - 1) / kChunk;
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  T* o = static_cast<T*>(a.o);
  float s[DK];
#pragma unroll
  for (int i = 0; i < DK; ++i)
    s[i] = (a.h0 && active && i < p.dk) ? a.h0[(static_cast<size_t>(bh) * p.dk + i) * p.dv + j] : 0.f;
  for (int c = 0; c < chunks; ++c) {
    const int t0 = c * kChunk, n = min(kChunk, p.T - t0);
    if (a.anchors && active) {
#pragma unroll
      for (int i = 0; i < DK; ++i)
        if (i < p.dk) a.anchors[((static_cast<size_t>(bh) * chunks + c) * p.dk + i) * p.dv + j] = s[i];
    }
    __syncthreads();
    load_tile<T, DK, L2>(tile, p, q, k, a.beta, GATED ? a.g : nullptr, b, h, t0, n);
    load_column(tile.col[0], p, v, b, h, t0, n, j);
    __syncthreads();
    for (int tt = 0; tt < n; ++tt) {
      const size_t r = row_of(p, b, t0 + tt, h) * p.dv + j;
      const float vj = tile.col[0][tt][threadIdx.x];
      if (GATED) {
        const float decay = tile.a[tt];
#pragma unroll
        for (int i = 0; i < DK; ++i) s[i] *= decay;
      }
      const float u = LINEAR ? tile.beta[tt] * vj : tile.beta[tt] * (vj - dot<DK>(tile.k[tt], s));
#pragma unroll
      for (int i = 0; i < DK; ++i) s[i] = fmaf(tile.k[tt][i], u, s[i]);
      if (o) {
        const float out = dot<DK>(tile.q[tt], s);
        if (active) o[r] = from_float<T>(out);
      }
      if (active && a.u) a.u[r] = u;
    }
  }
  if (a.hT && active) {
#pragma unroll
    for (int i = 0; i < DK; ++i)
      if (i < p.dk) a.hT[(static_cast<size_t>(bh) * p.dk + i) * p.dv + j] = s[i];
  }
}

// Up to DK = 32 the backward fits 128 registers (a few bytes spill), which doubles the warps an SM holds: the
// step chain is latency-bound, so occupancy pays (H200, B1024 T256 H4 D32). Wider heads keep all registers.
template <typename T, int DK, bool GATED, bool L2, bool LINEAR>
__global__ void __launch_bounds__(kLanes, DK <= 32 ? 16 : 1) delta_rule_backward_kernel(DeltaRuleProblem p, DeltaRuleBackwardArgs a) {
  __shared__ Tile<DK> tile;
  const int bh = blockIdx.x, b = bh / p.H, h = bh % p.H;
  const int j = blockIdx.y * kLanes + threadIdx.x;
  const bool active = j < p.dv;
  const int chunks = (p.T + kChunk - 1) / kChunk;
  const size_t rows = static_cast<size_t>(p.B) * p.T * p.H;
  const size_t group = static_cast<size_t>(blockIdx.y) * rows;  // this block's slice of the partial sums
  const T* q = static_cast<const T*>(a.q);
  const T* k = static_cast<const T*>(a.k);
  const T* v = static_cast<const T*>(a.v);
  const T* d_o = static_cast<const T*>(a.d_o);
  auto col = [&](const float* m, int i) { return m[(static_cast<size_t>(bh) * p.dk + i) * p.dv + j]; };
  // Gradient stores: into this group's fp32 partial sums, or with L2 (one group) in T. Fixed at compile time: a
  // runtime choice cost the bf16 backward 16% (registers; H200, B1024 T256 H4 D32).
  auto store = [&](void* base, size_t idx, float x) {
    if constexpr (L2)
      static_cast<T*>(base)[idx] = from_float<T>(x);
    else
      static_cast<float*>(base)[idx] = x;
  };
  // f(i, x) for the column j of chunk c's [dk, dv] matrix in m [B, H, chunks, dk, dv] (a stored state or its
  // gradient), x = 0 past dk and dv. Every lane loads (a valid element, then dropped): selects, not branches.
  auto each_anchor = [&](const float* m, int c, auto f) {
    const float* col0 = m + (static_cast<size_t>(bh) * chunks + c) * p.dk * p.dv + (active ? j : 0);
#pragma unroll
    for (int i = 0; i < DK; ++i) {
      const float x = col0[static_cast<size_t>(i < p.dk ? i : 0) * p.dv];
      f(i, (active && i < p.dk) ? x : 0.f);
    }
  };
  float s[DK], ds[DK];  // S_t[:, j] and dL/dS_t[:, j]
#pragma unroll
  for (int i = 0; i < DK; ++i) {
    const bool in = active && i < p.dk;
    s[i] = in ? col(a.hT, i) : 0.f;
    ds[i] = (in && a.dhT) ? col(a.dhT, i) : 0.f;
  }
  for (int c = chunks - 1; c >= 0; --c) {
    const int t0 = c * kChunk, n = min(kChunk, p.T - t0);
    __syncthreads();
    load_tile<T, DK, L2>(tile, p, q, k, a.beta, GATED ? a.g : nullptr, b, h, t0, n);
    load_column(tile.col[0], p, v, b, h, t0, n, j);
    load_column(tile.col[1], p, a.u, b, h, t0, n, j);
    if (d_o) load_column(tile.col[2], p, d_o, b, h, t0, n, j);
    __syncthreads();
    float amplification = 1.f;
    for (int tt = n - 1; tt >= 0; --tt) {
      const size_t row = row_of(p, b, t0 + tt, h);
      const size_t r = row * p.dv + j;
      const float vj = tile.col[0][tt][threadIdx.x];
      const float u = tile.col[1][tt][threadIdx.x];
      const float dout = d_o ? tile.col[2][tt][threadIdx.x] : 0.f;
      const float* kt = tile.k[tt];
      const float* qt = tile.q[tt];
      const float beta = tile.beta[tt];
      // o = (scale q)·S_t: dS_t += (scale q) do, dq = scale Σ_j S_t[:, j] do_j.
      const size_t grad_row = (group + row) * p.dk;  // of dq and dk
      if (d_o) {
#pragma unroll
        for (int i = 0; i < DK; ++i) ds[i] = fmaf(qt[i], dout, ds[i]);
        const float dq_scale = dout * p.scale;
        column_sum_to<DK, L2>([&](int i, float x) { store(a.dq, grad_row + i, x); }, p.dk,
                              [&](int i) { return s[i] * dq_scale; }, qt, 1.f / p.scale, tile.rq[tt]);
      }
      // S_t = S' + k u, S' = a S_{t-1}: step back to S'.
#pragma unroll
      for (int i = 0; i < DK; ++i) s[i] = fmaf(-kt[i], u, s[i]);
      // u = β (v - k·S'): du = k·dS_t. The linear rule's u = β v has no k·S' term (dr = 0).
      const float du = dot<DK>(kt, ds);
      const float retrieved = LINEAR ? 0.f : dot<DK>(kt, s);
      const float dbeta = du * (vj - retrieved);
      if (active) store(a.dv, r, du * beta);
      const float dr = LINEAR ? 0.f : -du * beta;
      column_sum_to<DK, L2>([&](int i, float x) { store(a.dk, grad_row + i, x); }, p.dk,
                            [&](int i) { return LINEAR ? ds[i] * u : fmaf(ds[i], u, dr * s[i]); }, kt, 1.f,
                            tile.rk[tt]);
      if (!LINEAR) {
#pragma unroll
        for (int i = 0; i < DK; ++i) ds[i] = fmaf(dr, kt[i], ds[i]);  // now dL/dS'
      }
      const float dbeta_sum = warp_sum(dbeta);
      if (threadIdx.x == 0) a.dbeta[group + row] = dbeta_sum;
      if (GATED) {
        const float dg_sum = warp_sum(dot<DK>(s, ds));  // dL/dg = a S_{t-1}·dS' = S'·dS'
        if (threadIdx.x == 0) a.dg[group + row] = dg_sum;
        const float decay = tile.a[tt];
#pragma unroll
        for (int i = 0; i < DK; ++i) ds[i] *= decay;
      }
      // S_{t-1}: S'/a while the error stays small; else recompute. At the chunk's start (below the loop) the
      // stored state.
      if (GATED && tt > 0) {
        const float decay = tile.a[tt];
        amplification /= decay;
        if (decay > 0.f && amplification <= kMaxAmplification) {
          const float inv = 1.f / decay;
#pragma unroll
          for (int i = 0; i < DK; ++i) s[i] *= inv;
        } else {
          each_anchor(a.anchors, c, [&](int i, float x) { s[i] = x; });
          for (int tau = 0; tau < tt; ++tau) {
            const float ut = tile.col[1][tau][threadIdx.x];
            const float dt = tile.a[tau];
#pragma unroll
            for (int i = 0; i < DK; ++i) s[i] = fmaf(tile.k[tau][i], ut, s[i] * dt);
          }
          amplification = 1.f;
        }
      }
    }
    // Out of the step loop: in it, these guarded loads tripled the loop's code (1,053 to 3,489 instructions) and
    // the backward ran 33% slower, stalled on instruction fetch (H200, B1024 T256 H4 D32).
    each_anchor(a.anchors, c, [&](int i, float x) { s[i] = x; });
    if (a.d_anchors)  // the caller read the state before this chunk: its gradient joins here
      each_anchor(a.d_anchors, c, [&](int i, float x) { ds[i] += x; });
  }
  if (a.dh0 && active) {
#pragma unroll
    for (int i = 0; i < DK; ++i)
      if (i < p.dk) a.dh0[(static_cast<size_t>(bh) * p.dk + i) * p.dv + j] = ds[i];
  }
}

// Launchers per input type and instantiated head width, for dispatch below: the gated, the L2 and the linear
// variants are instantiations of their own, so that none costs the others registers. The linear rule comes ungated
// with q and k as given (entry points below).
template <template <typename, int, bool, bool, bool> class Kernel, typename T, int DK, typename Args>
void launch(const DeltaRuleProblem& p, const Args& a, cudaStream_t stream) {
  const dim3 grid(p.B * p.H, delta_rule_column_groups(p.dv));
  if (p.linear)
    Kernel<T, DK, false, false, true>::launch(grid, stream, p, a);
  else if (a.g && p.qk_l2norm)
    Kernel<T, DK, true, true, false>::launch(grid, stream, p, a);
  else if (a.g)
    Kernel<T, DK, true, false, false>::launch(grid, stream, p, a);
  else if (p.qk_l2norm)
    Kernel<T, DK, false, true, false>::launch(grid, stream, p, a);
  else
    Kernel<T, DK, false, false, false>::launch(grid, stream, p, a);
}

template <typename T, int DK, bool GATED, bool L2, bool LINEAR>
struct ForwardKernel {
  static void launch(dim3 grid, cudaStream_t s, const DeltaRuleProblem& p, const DeltaRuleForwardArgs& a) {
    delta_rule_forward_kernel<T, DK, GATED, L2, LINEAR><<<grid, kLanes, 0, s>>>(p, a);
  }
};

template <typename T, int DK, bool GATED, bool L2, bool LINEAR>
struct BackwardKernel {
  static void launch(dim3 grid, cudaStream_t s, const DeltaRuleProblem& p, const DeltaRuleBackwardArgs& a) {
    delta_rule_backward_kernel<T, DK, GATED, L2, LINEAR><<<grid, kLanes, 0, s>>>(p, a);
  }
};

// Head dims round up to the next instantiated width; the padding is zeros in shared memory.
template <template <typename, int, bool, bool, bool> class Kernel, typename T, typename Args>
void by_dk(const DeltaRuleProblem& p, const Args& a, cudaStream_t s) {
  if (p.dk <= 16)
    launch<Kernel, T, 16>(p, a, s);
  else if (p.dk <= 32)
    launch<Kernel, T, 32>(p, a, s);
  else if (p.dk <= 64)
    launch<Kernel, T, 64>(p, a, s);
  else
    launch<Kernel, T, 128>(p, a, s);
}

}  // namespace

#ifdef MEMLAB_DELTA_RECURRENT_PART
namespace delta_recurrent {
using Part = std::conditional_t<MEMLAB_DELTA_RECURRENT_PART == 1, __nv_bfloat16, float>;
#if MEMLAB_DELTA_RECURRENT_BACKWARD
template <typename T>
void backward(const DeltaRuleProblem& p, const DeltaRuleBackwardArgs& a, cudaStream_t s) {
  by_dk<BackwardKernel, T>(p, a, s);
}
template void backward<Part>(const DeltaRuleProblem&, const DeltaRuleBackwardArgs&, cudaStream_t);
#else
template <typename T>
void forward(const DeltaRuleProblem& p, const DeltaRuleForwardArgs& a, cudaStream_t s) {
  by_dk<ForwardKernel, T>(p, a, s);
}
template void forward<Part>(const DeltaRuleProblem&, const DeltaRuleForwardArgs&, cudaStream_t);
#endif
}  // namespace delta_recurrent
#else
namespace {
// run(T{}) for p's input type, where the kernels take p; the launches' error.
template <typename Args, typename Run>
std::string by_type(const DeltaRuleProblem& p, const Args& a, Run run) {
  if (p.dk < 1 || p.dk > kDeltaRuleMaxHeadDim || p.dv < 1) return "delta rule kernel: head dims out of range";
  if (p.linear && (a.g || p.qk_l2norm)) return "delta rule kernel: the linear rule is ungated, without the L2 norm";
  if (p.B * p.T * p.H == 0) return "";
  if (p.bf16)
    run(__nv_bfloat16{});
  else
    run(float{});
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? std::string() : std::string("delta rule kernel: ") + cudaGetErrorString(e);
}
}  // namespace

int delta_rule_column_groups(int dv) { return (dv + kLanes - 1) / kLanes; }
int delta_rule_chunks(int T) { return (T + kChunk - 1) / kChunk; }

std::string delta_rule_forward(const DeltaRuleProblem& p, const DeltaRuleForwardArgs& a, void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  return by_type(p, a, [&](auto t) { delta_recurrent::forward<decltype(t)>(p, a, s); });
}

std::string delta_rule_backward(const DeltaRuleProblem& p, const DeltaRuleBackwardArgs& a, void* stream) {
  if (p.qk_l2norm && delta_rule_column_groups(p.dv) > 1)
    return "delta rule kernel: the backward of the in-kernel q/k L2 norm needs dv <= 32";
  auto s = static_cast<cudaStream_t>(stream);
  return by_type(p, a, [&](auto t) { delta_recurrent::backward<decltype(t)>(p, a, s); });
}
#endif

}  // namespace memlab::kernels
