// The chunkwise SSD, forward and backward, each one launch with a block per (batch row, head): see chunk.h.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "ops/ssd/chunk.h"
#include "ops/tile.cuh"

namespace memlab::kernels {
namespace {

constexpr int L = kSsdChunk;
constexpr int LP = L + 1;  // padded row of an L x L tile (conflict-free column reads)
constexpr int kThreads = kTileThreads;

__device__ inline int64_t token_at(const SsdProblem& p, int bi, int t, int hi) {
  return (int64_t{bi} * p.T + t) * p.H + hi;
}
// Where x's row of (b, t, h) and B's, C's row of (b, t, h's group) start.
template <int P>
__device__ inline int64_t x_at(const SsdProblem& p, int bi, int t, int hi) {
  return (int64_t{bi} * p.T + t) * p.x_row + int64_t{hi} * P;
}
template <int N>
__device__ inline int64_t bc_at(const SsdProblem& p, int bi, int t, int hi) {
  return (int64_t{bi} * p.T + t) * p.bc_row + int64_t{hi / (p.H / p.G)} * N;
}

// A chunk's inputs into shared memory, rows padded by one: V = dt x [L][P], B and C [L][N]; zeros past T.
template <int P, int N, typename E>
__device__ inline void load_chunk(const SsdProblem& p, const E* x, const float* dt, const E* Bm, const E* Cm, int bi,
                                  int hi, int t0, float* sV, float* sB, float* sC) {
  for (int idx = threadIdx.x; idx < L * P; idx += kThreads) {
    const int t = idx / P, i = idx % P;
    const bool ok = t0 + t < p.T;
    const int tt = ok ? t0 + t : 0;
    sV[t * (P + 1) + i] = ok ? dt[token_at(p, bi, tt, hi)] * to_float(x[x_at<P>(p, bi, tt, hi) + i]) : 0.f;
  }
  for (int idx = threadIdx.x; idx < L * N; idx += kThreads) {
    const int t = idx / N, i = idx % N;
    const bool ok = t0 + t < p.T;
    const int64_t r = bc_at<N>(p, bi, ok ? t0 + t : 0, hi) + i;
    sB[t * (N + 1) + i] = ok ? to_float(Bm[r]) : 0.f;
    sC[t * (N + 1) + i] = ok ? to_float(Cm[r]) : 0.f;
  }
}

// A state [P, N] between global memory (dense; null = zeros on load, skipped on store) and shared memory (rows
// padded by one).
template <int P, int N>
__device__ inline void load_state(const float* h, float* sh) {
  for (int idx = threadIdx.x; idx < P * N; idx += kThreads) sh[(idx / N) * (N + 1) + idx % N] = h ? h[idx] : 0.f;
}
template <int P, int N>
__device__ inline void store_state(const float* sh, float* h) {
  if (h)
    for (int idx = threadIdx.x; idx < P * N; idx += kThreads) h[idx] = sh[(idx / N) * (N + 1) + idx % N];
}

// Per-token decays of a chunk in shared memory: G_t, S_t, dec_t = S_t exp(G_t) (from the chunk start) and
// end_t = S_L S_t exp(G_L - G_t) (to the chunk end); total = S_L exp(G_L).
struct Decays {
  float *G, *S, *dec, *end, *total;
  __device__ float pair(int t, int j) const { return j <= t ? S[t] * S[j] * expf(G[t] - G[j]) : 0.f; }
  static constexpr int kFloats = 4 * L + 1;
  __device__ static Decays at(float* p) { return {p, p + L, p + 2 * L, p + 3 * L, p + 4 * L}; }
};

// Warp 0, lane = token: the scans of g and of the signs. Tokens past T keep the state (g = 0, sign +1).
__device__ inline void chunk_decays(const SsdProblem& p, const float* g, const float* sign, int bi, int hi, int t0,
                                    int lane, const Decays& d) {
  const bool ok = t0 + lane < p.T;
  const int64_t r = token_at(p, bi, ok ? t0 + lane : 0, hi);
  float G = ok ? g[r] : 0.f;
  int neg = ok && sign && sign[r] < 0.f;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float y = __shfl_up_sync(kAllLanes, G, o);
    const int n = __shfl_up_sync(kAllLanes, neg, o);
    if (lane >= o) {
      G += y;
      neg += n;
    }
  }
  const float S = (neg & 1) ? -1.f : 1.f;
  const float GL = __shfl_sync(kAllLanes, G, 31), SL = __shfl_sync(kAllLanes, S, 31);
  d.G[lane] = G;
  d.S[lane] = S;
  d.dec[lane] = S * expf(G);
  d.end[lane] = SL * S * expf(GL - G);
  if (lane == 0) *d.total = SL * expf(GL);
}

// M <- total M + Σ_t a(i, t) b(t, n) for a [P, N] tile M in shared memory (rows padded by one): a chunk's step
// of the state, and of its gradient in the backward.
template <int P, int N, class A, class B>
__device__ inline void decay_and_add(float* M, float total, int ty, int tx, A a, B b) {
  constexpr int TP = P / 16, TN = N / 16;
  float acc[TP][TN];
#pragma unroll
  for (int r = 0; r < TP; ++r)
#pragma unroll
    for (int cc = 0; cc < TN; ++cc) acc[r][cc] = total * M[(ty + 16 * r) * (N + 1) + tx + 16 * cc];
  tile<L>(acc, ty, tx, a, b);
#pragma unroll
  for (int r = 0; r < TP; ++r)
#pragma unroll
    for (int cc = 0; cc < TN; ++cc) M[(ty + 16 * r) * (N + 1) + tx + 16 * cc] = acc[r][cc];
}

struct ForwardShared {
  float *V, *B, *C, *S, *h;
  Decays d;
  template <int P, int N>
  __device__ static ForwardShared at(float* s) {
    ForwardShared f;
    f.V = s;
    f.B = f.V + L * (P + 1);
    f.C = f.B + L * (N + 1);
    f.S = f.C + L * (N + 1);
    f.h = f.S + L * LP;
    f.d = Decays::at(f.h + P * (N + 1));
    return f;
  }
  template <int P, int N>
  static constexpr size_t floats() {
    return L * (P + 1) + 2 * L * (N + 1) + L * LP + P * (N + 1) + Decays::kFloats;
  }
};

template <int P, int N, typename E>
__global__ void __launch_bounds__(kThreads) ssd_forward_kernel(SsdProblem p, SsdForwardArgs a) {
  constexpr int PP = P + 1, NP = N + 1, TP = P / 16;
  extern __shared__ float smem[];
  const ForwardShared s = ForwardShared::at<P, N>(smem);
  const E *x = static_cast<const E*>(a.x), *Bm = static_cast<const E*>(a.Bm), *Cm = static_cast<const E*>(a.Cm);
  const int bh = blockIdx.x, bi = bh / p.H, hi = bh % p.H;
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16, warp = tid / 32, lane = tid % 32;
  const int chunks = (p.T + L - 1) / L;

  load_state<P, N>(shifted(a.h0, int64_t{bh} * P * N), s.h);
  __syncthreads();
  for (int c = 0; c < chunks; ++c) {
    const int t0 = c * L;
    if (a.hs) store_state<P, N>(s.h, a.hs + (int64_t{bh} * chunks + c) * P * N);
    load_chunk<P, N>(p, x, a.dt, Bm, Cm, bi, hi, t0, s.V, s.B, s.C);
    if (warp == 0) chunk_decays(p, a.g, a.sign, bi, hi, t0, lane, s.d);
    __syncthreads();
    {  // S = (C Bᵀ) ⊙ the pair decays
      float acc[2][2];
      zero(acc);
      tile<N>(acc, ty, tx, [&](int t, int i) { return s.C[t * NP + i]; }, [&](int i, int j) { return s.B[j * NP + i]; });
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int t = ty + 16 * r, j = tx + 16 * cc;
          s.S[t * LP + j] = acc[r][cc] * s.d.pair(t, j);
        }
    }
    __syncthreads();
    {  // y = S V + dec ⊙ (C hᵀ) + D x
      const float skip = a.D ? a.D[hi] : 0.f;
      float sv[2][TP], ch[2][TP];
      zero(sv);
      zero(ch);
      tile<L>(sv, ty, tx, [&](int t, int j) { return s.S[t * LP + j]; }, [&](int j, int i) { return s.V[j * PP + i]; });
      tile<N>(ch, ty, tx, [&](int t, int n) { return s.C[t * NP + n]; }, [&](int n, int i) { return s.h[i * NP + n]; });
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int t = ty + 16 * r;
        if (t0 + t >= p.T) continue;
        const int64_t g = token_at(p, bi, t0 + t, hi) * P, xr = x_at<P>(p, bi, t0 + t, hi);
#pragma unroll
        for (int cc = 0; cc < TP; ++cc) {
          const int i = tx + 16 * cc;
          a.y[g + i] = sv[r][cc] + s.d.dec[t] * ch[r][cc] + (a.D ? skip * to_float(x[xr + i]) : 0.f);
        }
      }
    }
    __syncthreads();
    // h <- total h + Σ_j end_j V_j B_jᵀ
    decay_and_add<P, N>(s.h, *s.d.total, ty, tx, [&](int i, int j) { return s.d.end[j] * s.V[j * PP + i]; },
                        [&](int j, int n) { return s.B[j * NP + n]; });
    __syncthreads();
  }
  store_state<P, N>(s.h, shifted(a.hT, int64_t{bh} * P * N));
}

struct BackwardShared {
  float *V, *dY, *B, *C, *S, *W, *h, *dh, *cdc, *bdb;
  Decays d;
  template <int P, int N>
  __device__ static BackwardShared at(float* s) {
    BackwardShared f;
    f.V = s;
    f.dY = f.V + L * (P + 1);
    f.B = f.dY + L * (P + 1);
    f.C = f.B + L * (N + 1);
    f.S = f.C + L * (N + 1);
    f.W = f.S + L * LP;
    f.h = f.W + L * LP;
    f.dh = f.h + P * (N + 1);
    f.cdc = f.dh + P * (N + 1);
    f.bdb = f.cdc + L;
    f.d = Decays::at(f.bdb + L);
    return f;
  }
  template <int P, int N>
  static constexpr size_t floats() {
    return 2 * L * (P + 1) + 2 * L * (N + 1) + 2 * L * LP + 2 * P * (N + 1) + 2 * L + Decays::kFloats;
  }
};

// A [L, N] gradient of B or C from its two tile products, a1 + w_t a2 in thread (ty, tx)'s rows t = ty + 16 r:
// stored (per head) for tokens before T, and each row's dot with the input M into dots[t] (for the decays).
template <int N, int TN>
__device__ inline void store_key_grad(const SsdProblem& p, int bi, int hi, int t0, int ty, int tx,
                                      const float (&a1)[2][TN], const float (&a2)[2][TN], const float* w,
                                      const float* M, float* out, float* dots) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int t = ty + 16 * r;
    const bool ok = t0 + t < p.T;
    const int64_t g = token_at(p, bi, ok ? t0 + t : 0, hi) * N;
    float dot = 0.f;
#pragma unroll
    for (int cc = 0; cc < TN; ++cc) {
      const int n = tx + 16 * cc;
      const float d = a1[r][cc] + w[t] * a2[r][cc];
      dot += d * M[t * (N + 1) + n];
      if (ok) out[g + n] = d;
    }
    dot = row_sum(dot);
    if (tx == 0) dots[t] = dot;
  }
}

template <int P, int N, typename E>
__global__ void __launch_bounds__(kThreads) ssd_backward_kernel(SsdProblem p, SsdBackwardArgs a) {
  constexpr int PP = P + 1, NP = N + 1, TP = P / 16, TN = N / 16;
  extern __shared__ float smem[];
  const BackwardShared s = BackwardShared::at<P, N>(smem);
  const E *x = static_cast<const E*>(a.x), *Bm = static_cast<const E*>(a.Bm), *Cm = static_cast<const E*>(a.Cm);
  const int bh = blockIdx.x, bi = bh / p.H, hi = bh % p.H;
  const float skip = a.D ? a.D[hi] : 0.f;
  float dskip = 0.f;  // this thread's share of Σ dy·x
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16, warp = tid / 32, lane = tid % 32;
  const int chunks = (p.T + L - 1) / L;

  load_state<P, N>(shifted(a.dhT, int64_t{bh} * P * N), s.dh);
  float carry = 0.f;  // Σ over later tokens of C·dC - B·dB (warp 0)

  for (int c = chunks - 1; c >= 0; --c) {
    const int t0 = c * L;
    load_chunk<P, N>(p, x, a.dt, Bm, Cm, bi, hi, t0, s.V, s.B, s.C);
    load_state<P, N>(a.hs + (int64_t{bh} * chunks + c) * P * N, s.h);
    for (int idx = tid; idx < L * P; idx += kThreads) {
      const int t = idx / P, i = idx % P;
      s.dY[t * PP + i] = t0 + t < p.T ? a.dy[token_at(p, bi, t0 + t, hi) * P + i] : 0.f;
    }
    if (warp == 0) chunk_decays(p, a.g, a.sign, bi, hi, t0, lane, s.d);
    __syncthreads();
    {  // S = (C Bᵀ) ⊙ decays, W = (dY Vᵀ) ⊙ decays
      float as[2][2], aw[2][2];
      zero(as);
      zero(aw);
      tile<N>(as, ty, tx, [&](int t, int i) { return s.C[t * NP + i]; }, [&](int i, int j) { return s.B[j * NP + i]; });
      tile<P>(aw, ty, tx, [&](int t, int i) { return s.dY[t * PP + i]; }, [&](int i, int j) { return s.V[j * PP + i]; });
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int t = ty + 16 * r, j = tx + 16 * cc;
          const float w = s.d.pair(t, j);
          s.S[t * LP + j] = as[r][cc] * w;
          s.W[t * LP + j] = aw[r][cc] * w;
        }
    }
    __syncthreads();
    {  // dC = W B + dec ⊙ (dY h)
      float a1[2][TN], a2[2][TN];
      zero(a1);
      zero(a2);
      tile<L>(a1, ty, tx, [&](int t, int j) { return s.W[t * LP + j]; }, [&](int j, int n) { return s.B[j * NP + n]; });
      tile<P>(a2, ty, tx, [&](int t, int i) { return s.dY[t * PP + i]; }, [&](int i, int n) { return s.h[i * NP + n]; });
      store_key_grad<N>(p, bi, hi, t0, ty, tx, a1, a2, s.d.dec, s.C, a.dC, s.cdc);
    }
    {  // dB = Wᵀ C + end ⊙ (V dh)
      float a1[2][TN], a2[2][TN];
      zero(a1);
      zero(a2);
      tile<L>(a1, ty, tx, [&](int j, int t) { return s.W[t * LP + j]; }, [&](int t, int n) { return s.C[t * NP + n]; });
      tile<P>(a2, ty, tx, [&](int j, int i) { return s.V[j * PP + i]; }, [&](int i, int n) { return s.dh[i * NP + n]; });
      store_key_grad<N>(p, bi, hi, t0, ty, tx, a1, a2, s.d.end, s.B, a.dB, s.bdb);
    }
    {  // dV = Sᵀ dY + end ⊙ (B dhᵀ);  dx = dt dV + D dy, and dt's share through V: x·dV
      float a1[2][TP], a2[2][TP];
      zero(a1);
      zero(a2);
      tile<L>(a1, ty, tx, [&](int j, int t) { return s.S[t * LP + j]; }, [&](int t, int i) { return s.dY[t * PP + i]; });
      tile<N>(a2, ty, tx, [&](int j, int n) { return s.B[j * NP + n]; }, [&](int n, int i) { return s.dh[i * NP + n]; });
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int j = ty + 16 * r;
        const bool ok = t0 + j < p.T;
        const int64_t row = token_at(p, bi, ok ? t0 + j : 0, hi), xr = x_at<P>(p, bi, ok ? t0 + j : 0, hi);
        const float dt = a.dt[row];
        float dot = 0.f;
#pragma unroll
        for (int cc = 0; cc < TP; ++cc) {
          const int i = tx + 16 * cc;
          const float d = a1[r][cc] + s.d.end[j] * a2[r][cc], xv = to_float(x[xr + i]), dy = s.dY[j * PP + i];
          dot += d * xv;
          dskip += dy * xv;  // zero past T
          if (ok) a.dx[row * P + i] = dt * d + skip * dy;
        }
        dot = row_sum(dot);
        if (tx == 0 && ok) a.ddt[row] = dot;
      }
    }
    __syncthreads();
    // dh <- total dh + Σ_t dec_t dY_tᵀ C_t  (the gradient at the chunk's start)
    decay_and_add<P, N>(s.dh, *s.d.total, ty, tx, [&](int i, int t) { return s.d.dec[t] * s.dY[t * PP + i]; },
                        [&](int t, int n) { return s.C[t * NP + n]; });
    if (warp == 0) {  // d g_l = Σ_{t>=l} (C_t·dC_t - B_t·dB_t), <h_T, dh_T> at the last token
      float r = s.cdc[lane] - s.bdb[lane];
      if (c == chunks - 1 && a.final_dot && lane == p.T - 1 - t0) r += a.final_dot[bh];
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const float y = __shfl_down_sync(kAllLanes, r, o);
        if (lane + o < 32) r += y;
      }
      r += carry;
      carry = __shfl_sync(kAllLanes, r, 0);
      if (t0 + lane < p.T) a.dg[token_at(p, bi, t0 + lane, hi)] = r;
    }
    __syncthreads();
  }
  store_state<P, N>(s.dh, shifted(a.dh0, int64_t{bh} * P * N));
  if (a.dD) {  // Σ dy·x over the block: warp sums, then warp 0 over the warps
    dskip = warp_sum(dskip);
    if (lane == 0) s.cdc[warp] = dskip;
    __syncthreads();
    if (warp == 0) {
      const float w = warp_sum(lane < kThreads / 32 ? s.cdc[lane] : 0.f);
      if (lane == 0) a.dD[bh] = w;
    }
  }
}

std::string check(SsdProblem& p) {
  if (p.B < 0 || p.T < 0 || p.H < 0 || p.G <= 0 || p.H % p.G) return "SSD kernel: bad sizes";
  if (p.x_row == 0) p.x_row = int64_t{p.H} * p.P;
  if (p.bc_row == 0) p.bc_row = int64_t{p.G} * p.N;
  if (!ssd_dim_supported(p.P) || !ssd_dim_supported(p.N))
    return "SSD kernel: head dim " + std::to_string(p.P) + " or state size " + std::to_string(p.N) +
           " is not 16, 32, 64 or 128";
  return "";
}

template <int D, typename Fn>
std::string with_n(int n, Fn fn) {
  switch (n) {
    case 16: return fn(std::integral_constant<int, D>{}, std::integral_constant<int, 16>{});
    case 32: return fn(std::integral_constant<int, D>{}, std::integral_constant<int, 32>{});
    case 64: return fn(std::integral_constant<int, D>{}, std::integral_constant<int, 64>{});
    default: return fn(std::integral_constant<int, D>{}, std::integral_constant<int, 128>{});
  }
}
// fn(integral_constant P, integral_constant N) for the problem's sizes.
template <typename Fn>
std::string by_dims(int P, int N, Fn fn) {
  switch (P) {
    case 16: return with_n<16>(N, fn);
    case 32: return with_n<32>(N, fn);
    case 64: return with_n<64>(N, fn);
    default: return with_n<128>(N, fn);
  }
}

}  // namespace

size_t ssd_backward_shared_bytes(int P, int N) {
  size_t floats = 0;
  by_dims(P, N, [&](auto pp, auto nn) {
    floats = BackwardShared::floats<decltype(pp)::value, decltype(nn)::value>();
    return std::string();
  });
  return floats * sizeof(float);
}

std::string ssd_forward(SsdProblem p, const SsdForwardArgs& a, void* stream) {
  if (auto e = check(p); !e.empty()) return e;
  if (p.B == 0 || p.H == 0 || p.T == 0) return "";
  return by_dims(p.P, p.N, [&](auto pp, auto nn) {
    constexpr int P = decltype(pp)::value, N = decltype(nn)::value;
    const size_t floats = ForwardShared::floats<P, N>();
    return p.bf16 ? launch_tiles("SSD", ssd_forward_kernel<P, N, __nv_bfloat16>, p.B * p.H, floats, stream, p, a)
                  : launch_tiles("SSD", ssd_forward_kernel<P, N, float>, p.B * p.H, floats, stream, p, a);
  });
}

std::string ssd_backward(SsdProblem p, const SsdBackwardArgs& a, void* stream) {
  if (auto e = check(p); !e.empty()) return e;
  if (p.B == 0 || p.H == 0 || p.T == 0) return "";
  return by_dims(p.P, p.N, [&](auto pp, auto nn) {
    constexpr int P = decltype(pp)::value, N = decltype(nn)::value;
    const size_t floats = BackwardShared::floats<P, N>();
    return p.bf16 ? launch_tiles("SSD", ssd_backward_kernel<P, N, __nv_bfloat16>, p.B * p.H, floats, stream, p, a)
                  : launch_tiles("SSD", ssd_backward_kernel<P, N, float>, p.B * p.H, floats, stream, p, a);
  });
}

}  // namespace memlab::kernels
