// The chunkwise mLSTM, forward and backward, each one launch with a block per (batch row, head): see chunk.h.
// A chunk's matrix products run on tensor cores (ops/tf32_mm.cuh): TF32 for bf16 q, k, v, 3xTF32 for fp32 ones.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "ops/cp_async.cuh"
#include "ops/mlstm/chunk.h"
#include "ops/tf32_mm.cuh"
#include "ops/tile.cuh"

namespace memlab::kernels {
namespace {

constexpr int L = kMLstmChunk;
constexpr int kPad = 4;  // rows 16-byte aligned; a pitch of 4 x odd floats: see delta_rule/chunk.cu's kPad
constexpr int LP = L + kPad;
constexpr int kThreads = kTileThreads;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kAll = kAllLanes;

__device__ inline float log_sigmoid(float x) { return fminf(x, 0.f) - log1pf(expf(-fabsf(x))); }
__device__ inline float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }

// A chunk's gates, one warp with lane = token. x_j = ĩ_j - b_j; m_t = b_t + max(m_prev, max_{j<=t} x_j). The
// pair weight exp(b_t - b_j + ĩ_j - m_t) is exp(a_t + x_j) with a_t = b_t - m_t (both sides <= 0 together).
struct Gates {
  float a, x, stab, w, e;   // this lane's a_t, x_t, m_t, w_t = exp(m_prev + b_t - m_t), e_t = exp(b_L + x_t - m_L)
  float fw, m_new, x_max;   // exp(b_L + m_prev - m_L), m_L, max_j x_j (the same in every lane)
  int arg;                  // a lane where x_max is reached
  // This lane's per-token values into shared memory, for the whole block.
  __device__ void keep(int lane, float* sa, float* sx, float* sstab, float* sw, float* se) const {
    sa[lane] = a;
    sx[lane] = x;
    sstab[lane] = stab;
    sw[lane] = w;
    se[lane] = e;
  }
};

__device__ inline Gates scan_gates(int lane, float logf, float ig, float m_prev) {
  float b = logf;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float y = __shfl_up_sync(kAll, b, o);
    if (lane >= o) b += y;
  }
  Gates g;
  g.x = ig - b;  // -inf on padding
  float pmax = g.x;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float y = __shfl_up_sync(kAll, pmax, o);
    if (lane >= o) pmax = fmaxf(pmax, y);
  }
  g.stab = b + fmaxf(m_prev, pmax);
  g.a = b - g.stab;
  const float bL = __shfl_sync(kAll, b, 31);
  g.m_new = __shfl_sync(kAll, g.stab, 31);
  g.x_max = __shfl_sync(kAll, pmax, 31);
  g.w = expf(m_prev + g.a);
  g.e = expf(bL + g.x - g.m_new);
  g.fw = expf(bL + m_prev - g.m_new);
  g.arg = __ffs(__ballot_sync(kAll, g.x == g.x_max)) - 1;
  return g;
}

__device__ inline int64_t token_at(const MLstmProblem& p, int bi, int t, int hi) {
  return (int64_t{bi} * p.T + t) * p.H + hi;
}

// Q, K (scaled by 1/sqrt(D)) and V of tokens t0.. into [L][D + kPad] tiles; zeros past T. Each thread's loads go
// out together before any is stored.
template <int D, typename E>
__device__ inline void load_qkv(const MLstmProblem& p, const E* q, const E* k, const E* v, int bi, int hi, int t0,
                                float* sQ, float* sK, float* sV) {
  constexpr int P = D + kPad, kPer = L * D / kThreads, kRound = kPer < 8 ? kPer : 8;
  const float scale = rsqrtf(static_cast<float>(D));
#pragma unroll
  for (int r0 = 0; r0 < kPer; r0 += kRound) {
    E rq[kRound], rk[kRound], rv[kRound];
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      const int idx = (r0 + u) * kThreads + threadIdx.x, t = idx / D;
      const int64_t g = token_at(p, bi, t0 + t < p.T ? t0 + t : 0, hi) * D + idx % D;
      rq[u] = q[g];
      rk[u] = k[g];
      rv[u] = v[g];
    }
#pragma unroll
    for (int u = 0; u < kRound; ++u) {
      const int idx = (r0 + u) * kThreads + threadIdx.x, t = idx / D, at = t * P + idx % D;
      const bool ok = t0 + t < p.T;
      sQ[at] = ok ? to_float(rq[u]) : 0.f;
      sK[at] = ok ? to_float(rk[u]) * scale : 0.f;
      sV[at] = ok ? to_float(rv[u]) : 0.f;
    }
  }
}

// A state's C [D, D] (dense) and n [D] between global and shared memory (C's rows padded to D + kPad). load: null
// sources give zeros; null C or n destinations are skipped.
template <int D>
__device__ inline void load_state(const float* C, const float* n, float* sC, float* sn) {
  constexpr int P = D + kPad;
  if (sC)
    for (int idx = threadIdx.x; idx < D * D; idx += kThreads) sC[(idx / D) * P + idx % D] = C ? C[idx] : 0.f;
  for (int i = threadIdx.x; i < D; i += kThreads) sn[i] = n ? n[i] : 0.f;
}
template <int D>
__device__ inline void store_state(const float* sC, const float* sn, float* C, float* n) {
  constexpr int P = D + kPad;
  if (C)
    for (int idx = threadIdx.x; idx < D * D; idx += kThreads) C[idx] = sC[(idx / D) * P + idx % D];
  if (n)
    for (int i = threadIdx.x; i < D; i += kThreads) n[i] = sn[i];
}

// C [D, D] (dense, 16-byte aligned) into its padded shared tile with cp.async, 16 bytes a copy: the copy runs under
// the work before C's first use, which waits for it with cp_async_wait_all() and a barrier.
template <int D>
__device__ inline void copy_state_async(const float* C, float* sC) {
  constexpr int P = D + kPad;
  for (int e = threadIdx.x * 4; e < D * D; e += kThreads * 4) {
    cp_async16(sC + (e / D) * P + e % D, C + e);
  }
  cp_async_commit();
}

// Warp 0's gates of the chunk at t0 (lane = token): the raw forget-gate pre-activation into *fg_raw, and the scans.
// Tokens past T neither forget (log f = 0) nor write (ĩ = -inf).
__device__ inline Gates chunk_gates(const MLstmProblem& p, const float* fg, const float* ig, int bi, int hi, int t0,
                                    int lane, float m_prev, float* fg_raw) {
  const bool ok = t0 + lane < p.T;
  const int64_t g = token_at(p, bi, ok ? t0 + lane : 0, hi);
  *fg_raw = ok ? fg[g] : 0.f;
  return scan_gates(lane, ok ? log_sigmoid(*fg_raw) : 0.f, ok ? ig[g] : -INFINITY, m_prev);
}

// Shared-memory layout: L x (D + kPad) tiles, then L x LP tiles, then D x (D + kPad) states, then vectors. Every
// tile starts 32 bytes aligned (the state's 16-byte cp.async copies need 16).
struct ForwardShared {
  float *Q, *K, *V, *H, *S, *C, *n, *a, *x, *stab, *w, *e, *inv, *scalar;
  template <int D>
  __device__ static ForwardShared at(float* s) {
    constexpr int P = D + kPad;
    ForwardShared f;
    f.Q = s;
    f.K = f.Q + L * P;
    f.V = f.K + L * P;
    f.H = f.V + L * P;
    f.S = f.H + L * P;
    f.C = f.S + L * LP;
    f.n = f.C + D * P;
    f.a = f.n + D;
    f.x = f.a + L;
    f.stab = f.x + L;
    f.w = f.stab + L;
    f.e = f.w + L;
    f.inv = f.e + L;
    f.scalar = f.inv + L;  // fw, m_prev
    return f;
  }
  template <int D>
  static constexpr size_t floats() { return 4 * L * (D + kPad) + L * LP + D * (D + kPad) + D + 6 * L + 2; }
};

// One chunk's phases, each a barrier apart: the gates; S = Q Kᵀ and H = Q C; the pair weights on S, den and
// H = w ⊙ H; H += S V; h = H / Z, and C, n scaled by fw with V by e; C += Kᵀ V.
template <int D, typename E>
__global__ void __launch_bounds__(kThreads, D < 128 ? 3 : 1) mlstm_forward_kernel(MLstmProblem p, MLstmForwardArgs a) {
  constexpr int P = D + kPad;
  constexpr bool EXACT = std::is_same_v<E, float>;
  extern __shared__ __align__(128) float smem[];
  const ForwardShared s = ForwardShared::at<D>(smem);
  const int bh = blockIdx.x, bi = bh / p.H, hi = bh % p.H;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const E *q = static_cast<const E*>(a.q), *k = static_cast<const E*>(a.k), *v = static_cast<const E*>(a.v);
  const int N = (p.T + L - 1) / L;

  load_state<D>(shifted(a.C0, int64_t{bh} * D * D), shifted(a.n0, int64_t{bh} * D), s.C, s.n);
  if (tid == 0) s.scalar[1] = a.m0 ? a.m0[bh] : 0.f;
  __syncthreads();

  for (int c = 0; c < N; ++c) {
    const int t0 = c * L;
    if (a.Cs) {  // the chunk's starting state, for the backward
      const int64_t at = int64_t{bh} * N + c;
      store_state<D>(s.C, s.n, a.Cs + at * D * D, a.ns + at * D);
      if (tid == 0) a.ms[at] = s.scalar[1];
    }
    load_qkv<D>(p, q, k, v, bi, hi, t0, s.Q, s.K, s.V);
    if (warp == 0) {
      float fg_raw;
      const Gates gt = chunk_gates(p, a.fg, a.ig, bi, hi, t0, lane, s.scalar[1], &fg_raw);
      gt.keep(lane, s.a, s.x, s.stab, s.w, s.e);
      __syncwarp();
      if (lane == 0) {
        s.scalar[0] = gt.fw;
        s.scalar[1] = gt.m_new;  // read again only after the barriers below
      }
    }
    __syncthreads();
    mm<EXACT, false, true, Tf32::Truncate>(s.S, LP, s.Q, P, s.K, P, L, L, D, false, 1.f, warp, kWarps);
    mm<EXACT, false, false, Tf32::Truncate>(s.H, P, s.Q, P, s.C, P, L, D, D, false, 1.f, (warp + kWarps / 2) % kWarps,
                                   kWarps);
    __syncthreads();
    for (int t = warp; t < L; t += kWarps) {  // den = S 1 + w (Q n), and the row's 1 / (max(|den|, exp(-m)) + eps)
      const float st = lane <= t ? s.S[t * LP + lane] * expf(s.a[t] + s.x[lane]) : 0.f;
      s.S[t * LP + lane] = st;
      const float wt = s.w[t];
      float qn = 0.f;
      for (int i = lane; i < D; i += 32) {
        qn += s.Q[t * P + i] * s.n[i];
        s.H[t * P + i] *= wt;
      }
      const float den = warp_sum(st) + wt * warp_sum(qn);
      if (lane == 0) {
        s.inv[t] = 1.f / (fmaxf(fabsf(den), expf(-s.stab[t])) + p.eps);
        if (a.den && t0 + t < p.T) a.den[token_at(p, bi, t0 + t, hi)] = den;
      }
    }
    __syncthreads();
    mm<EXACT, false, false, Tf32::Truncate>(s.H, P, s.S, LP, s.V, P, L, D, L, true, 1.f, warp, kWarps);
    __syncthreads();
    for (int idx = tid; idx < L * D; idx += kThreads) {  // h out; V <- e ⊙ V
      const int t = idx / D, i = idx % D;
      if (t0 + t < p.T) a.h[token_at(p, bi, t0 + t, hi) * D + i] = s.H[t * P + i] * s.inv[t];
      s.V[t * P + i] *= s.e[t];
    }
    {  // C <- fw C, n <- fw n + Kᵀ e
      const float fw = s.scalar[0];
      for (int idx = tid; idx < D * D; idx += kThreads) s.C[(idx / D) * P + idx % D] *= fw;
      for (int i = tid; i < D; i += kThreads) {
        float sum = fw * s.n[i];
        for (int j = 0; j < L; ++j) sum += s.e[j] * s.K[j * P + i];
        s.n[i] = sum;
      }
    }
    __syncthreads();
    mm<EXACT, true, false, Tf32::Truncate>(s.C, P, s.K, P, s.V, P, D, D, L, true, 1.f, warp, kWarps);
    __syncthreads();
  }
  store_state<D>(s.C, s.n, shifted(a.CT, int64_t{bh} * D * D), shifted(a.nT, int64_t{bh} * D));
  if (a.mT && tid == 0) a.mT[bh] = s.scalar[1];
}

// The backward copies each chunk's starting state C into shared memory where it fits beside the rest (D <= 64);
// at D = 128 the tensor cores read it where the forward stored it.
template <int D>
__host__ __device__ constexpr bool c_shared() { return D <= 64; }

struct BackwardShared {
  float *Q, *K, *V, *dN, *Xq, *Xk, *Xv, *S, *G, *C, *dC, *n, *dn, *a, *x, *w, *e, *stab, *dden, *qdq, *kdk, *scalar;
  template <int D>
  __device__ static BackwardShared at(float* s) {
    constexpr int P = D + kPad;
    BackwardShared f;
    f.Q = s;
    f.K = f.Q + L * P;
    f.V = f.K + L * P;
    f.dN = f.V + L * P;
    f.Xq = f.dN + L * P;
    f.Xk = f.Xq + L * P;
    f.Xv = f.Xk + L * P;
    f.S = f.Xv + L * P;
    f.G = f.S + L * LP;
    f.C = c_shared<D>() ? f.G + L * LP : nullptr;
    f.dC = f.G + L * LP + (c_shared<D>() ? D * P : 0);
    f.n = f.dC + D * P;
    f.dn = f.n + D;
    f.a = f.dn + D;
    f.x = f.a + L;
    f.w = f.x + L;
    f.e = f.w + L;
    f.stab = f.e + L;
    f.dden = f.stab + L;
    f.qdq = f.dden + L;
    f.kdk = f.qdq + L;
    f.scalar = f.kdk + L;  // fw
    return f;
  }
  template <int D>
  static constexpr size_t floats() {
    return 7 * L * (D + kPad) + 2 * L * LP + (c_shared<D>() ? 2 : 1) * D * (D + kPad) + 2 * D + 8 * L + 1;
  }
};

// One chunk's phases, each a barrier apart: the gates; dN and dden; S = Q Kᵀ, G = dN Vᵀ and the state terms
// Xq = dN Cᵀ, Xk = V dCᵀ, Xv = K dC; the pair weights on S and G with the
// state terms' row scales; Xq += G K, Xk += Gᵀ Q, Xv += Sᵀ dN; dq, dk, dv out with dC, dn scaled by fw and dN by w;
// dC += Qᵀ dN with the gates' gradients.
template <int D, typename E>
__global__ void __launch_bounds__(kThreads, D < 128 ? 2 : 1)
    mlstm_backward_kernel(MLstmProblem p, MLstmBackwardArgs a) {
  constexpr int P = D + kPad;
  constexpr bool EXACT = std::is_same_v<E, float>;
  extern __shared__ __align__(128) float smem[];
  const BackwardShared s = BackwardShared::at<D>(smem);
  const int bh = blockIdx.x, bi = bh / p.H, hi = bh % p.H;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const E *q = static_cast<const E*>(a.q), *k = static_cast<const E*>(a.k), *v = static_cast<const E*>(a.v);
  const float scale = rsqrtf(static_cast<float>(D));
  const int N = (p.T + L - 1) / L;

  load_state<D>(shifted(a.dCT, int64_t{bh} * D * D), shifted(a.dnT, int64_t{bh} * D), s.dC, s.dn);
  float pend = a.pend ? a.pend[bh] : 0.f;  // m_T's gradient, not yet routed (warp 0 uses it)
  float carry = 0.f;                        // Σ over later tokens of q·dq - k·dk (warp 0)
  // Each chunk's C arrives in shared memory asynchronously, the next one issued as soon as this one is used.
  if constexpr (c_shared<D>()) copy_state_async<D>(a.Cs + (int64_t{bh} * N + N - 1) * D * D, s.C);

  for (int c = N - 1; c >= 0; --c) {
    const int t0 = c * L;
    const int64_t at = int64_t{bh} * N + c;
    // A warp's rows of dh, h and den, their loads issued first so that they arrive under the ones below.
    constexpr int RW = L / kWarps, NI = (D + 31) / 32;
    float den[RW], dh[RW][NI], h[RW][NI];
#pragma unroll
    for (int r = 0; r < RW; ++r) {
      const int t = warp + kWarps * r;
      const bool ok = t0 + t < p.T;
      const int64_t g = token_at(p, bi, ok ? t0 + t : 0, hi);
      den[r] = ok ? a.den[g] : 0.f;
#pragma unroll
      for (int u = 0; u < NI; ++u) {
        const int i = lane + 32 * u;
        dh[r][u] = ok && i < D ? a.dh[g * D + i] : 0.f;
        h[r][u] = ok && i < D ? a.h[g * D + i] : 0.f;
      }
    }
    load_qkv<D>(p, q, k, v, bi, hi, t0, s.Q, s.K, s.V);
    const float* C = a.Cs + at * D * D;
    load_state<D>(nullptr, a.ns + at * D, nullptr, s.n);
    Gates gt{};
    float fg_raw = 0.f;
    if (warp == 0) {
      gt = chunk_gates(p, a.fg, a.ig, bi, hi, t0, lane, a.ms[at], &fg_raw);
      gt.keep(lane, s.a, s.x, s.stab, s.w, s.e);
      if (lane == 0) s.scalar[0] = gt.fw;
    }
    __syncthreads();
    {  // dnum = dh / Z, dden = -(dh·h) / Z where |den| sets Z
#pragma unroll
      for (int r = 0; r < RW; ++r) {
        const int t = warp + kWarps * r;
        const float floor_ = expf(-s.stab[t]), inv = 1.f / (fmaxf(fabsf(den[r]), floor_) + p.eps);
        float dot = 0.f;
#pragma unroll
        for (int u = 0; u < NI; ++u) {
          const int i = lane + 32 * u;
          dot += dh[r][u] * h[r][u];
          if (i < D) s.dN[t * P + i] = dh[r][u] * inv;
        }
        dot = warp_sum(dot);
        if (lane == 0) s.dden[t] = fabsf(den[r]) > floor_ ? -dot * inv * (den[r] > 0.f ? 1.f : -1.f) : 0.f;
      }
    }
    if constexpr (c_shared<D>()) cp_async_wait_all();
    __syncthreads();
    if (warp < kWarps / 2)
      mm<EXACT, false, true, Tf32::Truncate>(s.S, LP, s.Q, P, s.K, P, L, L, D, false, 1.f, warp, kWarps / 2);
    else
      mm<EXACT, false, true, Tf32::Truncate>(s.G, LP, s.dN, P, s.V, P, L, L, D, false, 1.f, warp - kWarps / 2, kWarps / 2);
    mm<EXACT, false, true, Tf32::Truncate>(s.Xq, P, s.dN, P, c_shared<D>() ? s.C : C, c_shared<D>() ? P : D, L, D, D, false,
                                  1.f, warp, kWarps);
    mm<EXACT, false, true, Tf32::Truncate>(s.Xk, P, s.V, P, s.dC, P, L, D, D, false, 1.f, warp, kWarps);
    mm<EXACT, false, false, Tf32::Truncate>(s.Xv, P, s.K, P, s.dC, P, L, D, D, false, 1.f, warp, kWarps);
    __syncthreads();
    if constexpr (c_shared<D>())
      if (c > 0) copy_state_async<D>(C - D * D, s.C);
    for (int t = warp; t < L; t += kWarps) {  // S <- S ⊙ W, G <- (G + dden 1ᵀ) ⊙ W, W the causal pair weights
      const float wt = lane <= t ? expf(s.a[t] + s.x[lane]) : 0.f;
      s.S[t * LP + lane] *= wt;
      s.G[t * LP + lane] = (s.G[t * LP + lane] + s.dden[t]) * wt;
    }
    for (int idx = tid; idx < L * D; idx += kThreads) {  // Xq <- w (Xq + dden nᵀ), Xk <- e (Xk + 1 dnᵀ), Xv <- e Xv
      const int t = idx / D, i = idx % D, at_ = t * P + i;
      s.Xq[at_] = s.w[t] * (s.Xq[at_] + s.dden[t] * s.n[i]);
      s.Xk[at_] = s.e[t] * (s.Xk[at_] + s.dn[i]);
      s.Xv[at_] *= s.e[t];
    }
    __syncthreads();
    mm<EXACT, false, false, Tf32::Truncate>(s.Xq, P, s.G, LP, s.K, P, L, D, L, true, 1.f, warp, kWarps);
    mm<EXACT, true, false, Tf32::Truncate>(s.Xk, P, s.G, LP, s.Q, P, L, D, L, true, 1.f, warp, kWarps);
    mm<EXACT, true, false, Tf32::Truncate>(s.Xv, P, s.S, LP, s.dN, P, L, D, L, true, 1.f, warp, kWarps);
    __syncthreads();
    for (int t = warp; t < L; t += kWarps) {  // dq, dk (of the scaled k; k's is 1/sqrt(D) of it), dv; q·dq, k·dk
      const bool ok = t0 + t < p.T;
      const int64_t g = token_at(p, bi, ok ? t0 + t : 0, hi) * D;
      const float wt = s.w[t];
      float qd = 0.f, kd = 0.f;
      for (int i = lane; i < D; i += 32) {
        const float dq = s.Xq[t * P + i], dk = s.Xk[t * P + i];
        qd += dq * s.Q[t * P + i];
        kd += dk * s.K[t * P + i];
        if (ok) {
          store<E>(a.dq, g + i, dq);
          store<E>(a.dk, g + i, dk * scale);
          store<E>(a.dv, g + i, s.Xv[t * P + i]);
        }
        s.dN[t * P + i] *= wt;
      }
      qd = warp_sum(qd);
      kd = warp_sum(kd);
      if (lane == 0) {
        s.qdq[t] = qd;
        s.kdk[t] = kd;
      }
    }
    {  // dC <- fw dC, dn <- fw dn + (w ⊙ Q)ᵀ dden
      const float fw = s.scalar[0];
      for (int idx = tid; idx < D * D; idx += kThreads) s.dC[(idx / D) * P + idx % D] *= fw;
      for (int i = tid; i < D; i += kThreads) {
        float sum = fw * s.dn[i];
        for (int t = 0; t < L; ++t) sum += s.w[t] * s.Q[t * P + i] * s.dden[t];
        s.dn[i] = sum;
      }
    }
    __syncthreads();
    mm<EXACT, true, false, Tf32::Truncate>(s.dC, P, s.Q, P, s.dN, P, D, D, L, true, 1.f, warp, kWarps);  // dC += Qᵀ (w ⊙ dN)
    if (warp == 0) {  // the gates: dĩ_j = k_j·dk_j, d log f_l = Σ_{t>=l} (q_t·dq_t - k_t·dk_t), plus m_T's route
      float dig = s.kdk[lane], r = s.qdq[lane] - dig;
      if (c == N - 1 && a.dmT && lane == p.T - 1 - t0) r += a.dmT[bh];  // m_T = b_T + ...: every log f so far
      if (gt.x_max > a.ms[at]) {  // m_T was set inside this chunk, by ĩ_arg (through the log f after it)
        if (lane == gt.arg) {
          dig += pend;
          r -= pend;
        }
        pend = 0.f;
      }
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const float y = __shfl_down_sync(kAll, r, o);
        if (lane + o < 32) r += y;
      }
      r += carry;
      carry = __shfl_sync(kAll, r, 0);
      if (t0 + lane < p.T) {
        const int64_t g = token_at(p, bi, t0 + lane, hi);
        a.dig[g] = dig;
        a.dfg[g] = r * sigmoid(-fg_raw);
      }
    }
    __syncthreads();
  }
  store_state<D>(s.dC, s.dn, shifted(a.dC0, int64_t{bh} * D * D), shifted(a.dn0, int64_t{bh} * D));
  if (a.dm0 && tid == 0) a.dm0[bh] = pend;  // m_T was set by m_0: the caller adds C_0·dC_0 + n_0·dn_0
}

std::string check(const MLstmProblem& p) {
  if (p.B < 0 || p.T < 0 || p.H < 0) return "mLSTM kernel: negative size";
  if (!mlstm_head_dim_supported(p.D))
    return "mLSTM kernel: head dim " + std::to_string(p.D) + " is not 16, 32, 64 or 128";
  return "";
}

template <int D, typename E>
std::string forward_for(const MLstmProblem& p, const MLstmForwardArgs& a, void* stream) {
  return launch_tiles("mLSTM", mlstm_forward_kernel<D, E>, p.B * p.H, ForwardShared::floats<D>(), stream, p, a);
}
template <int D, typename E>
std::string backward_for(const MLstmProblem& p, const MLstmBackwardArgs& a, void* stream) {
  return launch_tiles("mLSTM", mlstm_backward_kernel<D, E>, p.B * p.H, BackwardShared::floats<D>(), stream, p, a);
}

// fn(std::integral_constant<int, D>{}) for the problem's head dim D.
template <typename E, typename Fn>
std::string by_dim(const MLstmProblem& p, Fn fn) {
  switch (p.D) {
    case 16: return fn(std::integral_constant<int, 16>{});
    case 32: return fn(std::integral_constant<int, 32>{});
    case 64: return fn(std::integral_constant<int, 64>{});
    default: return fn(std::integral_constant<int, 128>{});
  }
}

}  // namespace

size_t mlstm_backward_shared_bytes(int d) {
  switch (d) {
    case 16: return BackwardShared::floats<16>() * sizeof(float);
    case 32: return BackwardShared::floats<32>() * sizeof(float);
    case 64: return BackwardShared::floats<64>() * sizeof(float);
    default: return BackwardShared::floats<128>() * sizeof(float);
  }
}

std::string mlstm_forward(const MLstmProblem& p, const MLstmForwardArgs& a, void* stream) {
  if (auto e = check(p); !e.empty()) return e;
  if (p.B == 0 || p.H == 0 || p.T == 0) return "";
  if (p.bf16) {
    using E = __nv_bfloat16;
    return by_dim<E>(p, [&](auto d) { return forward_for<decltype(d)::value, E>(p, a, stream); });
  }
  return by_dim<float>(p, [&](auto d) { return forward_for<decltype(d)::value, float>(p, a, stream); });
}

std::string mlstm_backward(const MLstmProblem& p, const MLstmBackwardArgs& a, void* stream) {
  if (auto e = check(p); !e.empty()) return e;
  if (p.B == 0 || p.H == 0 || p.T == 0) return "";
  if (p.bf16) {
    using E = __nv_bfloat16;
    return by_dim<E>(p, [&](auto d) { return backward_for<decltype(d)::value, E>(p, a, stream); });
  }
  return by_dim<float>(p, [&](auto d) { return backward_for<decltype(d)::value, float>(p, a, stream); });
}

}  // namespace memlab::kernels
