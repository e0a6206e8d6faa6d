// The chunkwise mLSTM, forward and backward, each one launch with a block per (batch row, head): see chunk.h.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "ops/mlstm/chunk.h"
#include "ops/tile.cuh"

namespace memlab::kernels {
namespace {

constexpr int L = kMLstmChunk;
constexpr int LP = L + 1;        // padded row of an L x L tile (conflict-free column reads)
constexpr int kThreads = kTileThreads;
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

// Q, K (scaled by 1/sqrt(D)) and V of tokens t0.. into [L][D + 1] tiles; zeros past T.
template <int D, typename E>
__device__ inline void load_qkv(const MLstmProblem& p, const E* q, const E* k, const E* v, int bi, int hi, int t0,
                                float* sQ, float* sK, float* sV) {
  const float scale = rsqrtf(static_cast<float>(D));
  for (int idx = threadIdx.x; idx < L * D; idx += kThreads) {
    const int t = idx / D, i = idx % D;
    const bool ok = t0 + t < p.T;
    const int64_t g = token_at(p, bi, ok ? t0 + t : 0, hi) * D + i;
    sQ[t * (D + 1) + i] = ok ? to_float(q[g]) : 0.f;
    sK[t * (D + 1) + i] = ok ? to_float(k[g]) * scale : 0.f;
    sV[t * (D + 1) + i] = ok ? to_float(v[g]) : 0.f;
  }
}

// A state C [D, D] and n [D] between global memory (dense) and shared memory (C's rows padded to D + 1).
// load: null sources give zeros.
template <int D>
__device__ inline void load_state(const float* C, const float* n, float* sC, float* sn) {
  for (int idx = threadIdx.x; idx < D * D; idx += kThreads) sC[(idx / D) * (D + 1) + idx % D] = C ? C[idx] : 0.f;
  for (int i = threadIdx.x; i < D; i += kThreads) sn[i] = n ? n[i] : 0.f;
}
template <int D>
__device__ inline void store_state(const float* sC, const float* sn, float* C, float* n) {
  if (C)
    for (int idx = threadIdx.x; idx < D * D; idx += kThreads) C[idx] = sC[(idx / D) * (D + 1) + idx % D];
  if (n)
    for (int i = threadIdx.x; i < D; i += kThreads) n[i] = sn[i];
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

struct ForwardShared {
  float *Q, *K, *V, *S, *C, *n, *a, *x, *stab, *w, *e, *den, *scalar;
  template <int D>
  __device__ static ForwardShared at(float* s) {
    constexpr int P = D + 1;
    ForwardShared f;
    f.Q = s;
    f.K = f.Q + L * P;
    f.V = f.K + L * P;
    f.S = f.V + L * P;
    f.C = f.S + L * LP;
    f.n = f.C + D * P;
    f.a = f.n + D;
    f.x = f.a + L;
    f.stab = f.x + L;
    f.w = f.stab + L;
    f.e = f.w + L;
    f.den = f.e + L;
    f.scalar = f.den + L;  // fw, m_prev
    return f;
  }
  template <int D>
  static constexpr size_t floats() { return 3 * L * (D + 1) + L * LP + D * (D + 1) + D + 6 * L + 2; }
};

template <int D, typename E>
__global__ void __launch_bounds__(kThreads) mlstm_forward_kernel(MLstmProblem p, MLstmForwardArgs a) {
  constexpr int P = D + 1, TN = D / 16;
  extern __shared__ float smem[];
  const ForwardShared s = ForwardShared::at<D>(smem);
  const int bh = blockIdx.x, bi = bh / p.H, hi = bh % p.H;
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16, warp = tid / 32, lane = tid % 32;
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
    {  // S = (Q Kᵀ) ⊙ the causal pair weights
      float acc[2][2];
      zero(acc);
      tile<D>(acc, ty, tx, [&](int t, int i) { return s.Q[t * P + i]; }, [&](int i, int j) { return s.K[j * P + i]; });
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int t = ty + 16 * r, j = tx + 16 * cc;
          s.S[t * LP + j] = j <= t ? acc[r][cc] * expf(s.a[t] + s.x[j]) : 0.f;
        }
    }
    __syncthreads();
    for (int t = warp; t < L; t += kThreads / 32) {  // den = S 1 + w (Q n)
      float qn = 0.f;
      for (int i = lane; i < D; i += 32) qn += s.Q[t * P + i] * s.n[i];
      const float sum = warp_sum(s.S[t * LP + lane]);
      qn = warp_sum(qn);
      if (lane == 0) s.den[t] = sum + s.w[t] * qn;
    }
    __syncthreads();
    {  // num = S V + w (Q C);  h = num / (max(|den|, exp(-m)) + eps)
      float sv[2][TN], qc[2][TN];
      zero(sv);
      zero(qc);
      tile<L>(sv, ty, tx, [&](int t, int j) { return s.S[t * LP + j]; }, [&](int j, int cc) { return s.V[j * P + cc]; });
      tile<D>(qc, ty, tx, [&](int t, int i) { return s.Q[t * P + i]; }, [&](int i, int cc) { return s.C[i * P + cc]; });
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int t = ty + 16 * r;
        if (t0 + t >= p.T) continue;
        const float inv = 1.f / (fmaxf(fabsf(s.den[t]), expf(-s.stab[t])) + p.eps);
        const int64_t g = token_at(p, bi, t0 + t, hi) * D;
#pragma unroll
        for (int cc = 0; cc < TN; ++cc) a.h[g + tx + 16 * cc] = (sv[r][cc] + s.w[t] * qc[r][cc]) * inv;
      }
      if (a.den && tid < L && t0 + tid < p.T) a.den[token_at(p, bi, t0 + tid, hi)] = s.den[tid];
    }
    __syncthreads();
    {  // C <- fw C + (e ⊙ K)ᵀ V,  n <- fw n + (e ⊙ K)ᵀ 1
      constexpr int TC = D / 16;
      const float fw = s.scalar[0];
      float acc[TC][TC];
#pragma unroll
      for (int r = 0; r < TC; ++r)
#pragma unroll
        for (int cc = 0; cc < TC; ++cc) acc[r][cc] = fw * s.C[(ty + 16 * r) * P + tx + 16 * cc];
      tile<L>(acc, ty, tx, [&](int i, int j) { return s.e[j] * s.K[j * P + i]; },
              [&](int j, int cc) { return s.V[j * P + cc]; });
#pragma unroll
      for (int r = 0; r < TC; ++r)
#pragma unroll
        for (int cc = 0; cc < TC; ++cc) s.C[(ty + 16 * r) * P + tx + 16 * cc] = acc[r][cc];
      for (int i = tid; i < D; i += kThreads) {
        float sum = fw * s.n[i];
        for (int j = 0; j < L; ++j) sum += s.e[j] * s.K[j * P + i];
        s.n[i] = sum;
      }
    }
    __syncthreads();
  }
  store_state<D>(s.C, s.n, shifted(a.CT, int64_t{bh} * D * D), shifted(a.nT, int64_t{bh} * D));
  if (a.mT && tid == 0) a.mT[bh] = s.scalar[1];
}

struct BackwardShared {
  float *Q, *K, *V, *dN, *S, *G, *C, *dC, *n, *dn, *a, *x, *w, *e, *stab, *dden, *qdq, *kdk, *scalar;
  template <int D>
  __device__ static BackwardShared at(float* s) {
    constexpr int P = D + 1;
    BackwardShared f;
    f.Q = s;
    f.K = f.Q + L * P;
    f.V = f.K + L * P;
    f.dN = f.V + L * P;
    f.S = f.dN + L * P;
    f.G = f.S + L * LP;
    f.C = f.G + L * LP;
    f.dC = f.C + D * P;
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
  static constexpr size_t floats() { return 4 * L * (D + 1) + 2 * L * LP + 2 * D * (D + 1) + 2 * D + 8 * L + 1; }
};

template <int D, typename E>
__global__ void __launch_bounds__(kThreads) mlstm_backward_kernel(MLstmProblem p, MLstmBackwardArgs a) {
  constexpr int P = D + 1, TN = D / 16, TC = D / 16;
  extern __shared__ float smem[];
  const BackwardShared s = BackwardShared::at<D>(smem);
  const int bh = blockIdx.x, bi = bh / p.H, hi = bh % p.H;
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16, warp = tid / 32, lane = tid % 32;
  const E *q = static_cast<const E*>(a.q), *k = static_cast<const E*>(a.k), *v = static_cast<const E*>(a.v);
  const float scale = rsqrtf(static_cast<float>(D));
  const int N = (p.T + L - 1) / L;

  load_state<D>(shifted(a.dCT, int64_t{bh} * D * D), shifted(a.dnT, int64_t{bh} * D), s.dC, s.dn);
  float pend = a.pend ? a.pend[bh] : 0.f;  // m_T's gradient, not yet routed (warp 0 uses it)
  float carry = 0.f;                        // Σ over later tokens of q·dq - k·dk (warp 0)

  for (int c = N - 1; c >= 0; --c) {
    const int t0 = c * L;
    const int64_t at = int64_t{bh} * N + c;
    load_qkv<D>(p, q, k, v, bi, hi, t0, s.Q, s.K, s.V);
    load_state<D>(a.Cs + at * D * D, a.ns + at * D, s.C, s.n);
    Gates gt{};
    float fg_raw = 0.f;
    if (warp == 0) {
      gt = chunk_gates(p, a.fg, a.ig, bi, hi, t0, lane, a.ms[at], &fg_raw);
      gt.keep(lane, s.a, s.x, s.stab, s.w, s.e);
      if (lane == 0) s.scalar[0] = gt.fw;
    }
    __syncthreads();
    for (int t = warp; t < L; t += kThreads / 32) {  // dnum = dh / Z, dden = -(dh·h) / Z where |den| sets Z
      const bool ok = t0 + t < p.T;
      const int64_t g = token_at(p, bi, ok ? t0 + t : 0, hi);
      const float den = ok ? a.den[g] : 0.f, floor_ = expf(-s.stab[t]);
      const float inv = 1.f / (fmaxf(fabsf(den), floor_) + p.eps);
      float dot = 0.f;
      for (int i = lane; i < D; i += 32) {
        const float d = ok ? a.dh[g * D + i] : 0.f;
        dot += d * (ok ? a.h[g * D + i] : 0.f);
        s.dN[t * P + i] = d * inv;
      }
      dot = warp_sum(dot);
      if (lane == 0) s.dden[t] = fabsf(den) > floor_ ? -dot * inv * (den > 0.f ? 1.f : -1.f) : 0.f;
    }
    __syncthreads();
    {  // S = (Q Kᵀ) ⊙ W and G = (dN Vᵀ + dden 1ᵀ) ⊙ W, W the causal pair weights
      float as[2][2], ag[2][2];
      zero(as);
      zero(ag);
      tile<D>(as, ty, tx, [&](int t, int i) { return s.Q[t * P + i]; }, [&](int i, int j) { return s.K[j * P + i]; });
      tile<D>(ag, ty, tx, [&](int t, int i) { return s.dN[t * P + i]; }, [&](int i, int j) { return s.V[j * P + i]; });
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
          const int t = ty + 16 * r, j = tx + 16 * cc;
          const float wt = j <= t ? expf(s.a[t] + s.x[j]) : 0.f;
          s.S[t * LP + j] = as[r][cc] * wt;
          s.G[t * LP + j] = (ag[r][cc] + s.dden[t]) * wt;
        }
    }
    __syncthreads();
    {  // dq = G K + w (dN Cᵀ + dden nᵀ)
      float a1[2][TN], a2[2][TN];
      zero(a1);
      zero(a2);
      tile<L>(a1, ty, tx, [&](int t, int j) { return s.G[t * LP + j]; }, [&](int j, int i) { return s.K[j * P + i]; });
      tile<D>(a2, ty, tx, [&](int t, int cc) { return s.dN[t * P + cc]; },
              [&](int cc, int i) { return s.C[i * P + cc]; });
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int t = ty + 16 * r;
        const bool ok = t0 + t < p.T;
        const int64_t g = token_at(p, bi, ok ? t0 + t : 0, hi) * D;
        float dot = 0.f;
#pragma unroll
        for (int cc = 0; cc < TN; ++cc) {
          const int i = tx + 16 * cc;
          const float d = a1[r][cc] + s.w[t] * (a2[r][cc] + s.dden[t] * s.n[i]);
          dot += d * s.Q[t * P + i];
          if (ok) store<E>(a.dq, g + i, d);
        }
        dot = row_sum(dot);
        if (tx == 0) s.qdq[t] = dot;
      }
    }
    {  // dk = Gᵀ Q + e (V dCᵀ + dn)   (the gradient of the scaled k; k's is 1/sqrt(D) of it)
      float a1[2][TN], a2[2][TN];
      zero(a1);
      zero(a2);
      tile<L>(a1, ty, tx, [&](int j, int t) { return s.G[t * LP + j]; }, [&](int t, int i) { return s.Q[t * P + i]; });
      tile<D>(a2, ty, tx, [&](int j, int cc) { return s.V[j * P + cc]; },
              [&](int cc, int i) { return s.dC[i * P + cc]; });
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int j = ty + 16 * r;
        const bool ok = t0 + j < p.T;
        const int64_t g = token_at(p, bi, ok ? t0 + j : 0, hi) * D;
        float dot = 0.f;
#pragma unroll
        for (int cc = 0; cc < TN; ++cc) {
          const int i = tx + 16 * cc;
          const float d = a1[r][cc] + s.e[j] * (a2[r][cc] + s.dn[i]);
          dot += d * s.K[j * P + i];
          if (ok) store<E>(a.dk, g + i, d * scale);
        }
        dot = row_sum(dot);
        if (tx == 0) s.kdk[j] = dot;
      }
    }
    {  // dv = Sᵀ dN + e (K dC)
      float a1[2][TN], a2[2][TN];
      zero(a1);
      zero(a2);
      tile<L>(a1, ty, tx, [&](int j, int t) { return s.S[t * LP + j]; }, [&](int t, int cc) { return s.dN[t * P + cc]; });
      tile<D>(a2, ty, tx, [&](int j, int i) { return s.K[j * P + i]; }, [&](int i, int cc) { return s.dC[i * P + cc]; });
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int j = ty + 16 * r;
        if (t0 + j >= p.T) continue;
        const int64_t g = token_at(p, bi, t0 + j, hi) * D;
#pragma unroll
        for (int cc = 0; cc < TN; ++cc) store<E>(a.dv, g + tx + 16 * cc, a1[r][cc] + s.e[j] * a2[r][cc]);
      }
    }
    __syncthreads();
    {  // dC <- fw dC + (w ⊙ Q)ᵀ dN,  dn <- fw dn + (w ⊙ Q)ᵀ dden
      const float fw = s.scalar[0];
      float acc[TC][TC];
#pragma unroll
      for (int r = 0; r < TC; ++r)
#pragma unroll
        for (int cc = 0; cc < TC; ++cc) acc[r][cc] = fw * s.dC[(ty + 16 * r) * P + tx + 16 * cc];
      tile<L>(acc, ty, tx, [&](int i, int t) { return s.w[t] * s.Q[t * P + i]; },
              [&](int t, int cc) { return s.dN[t * P + cc]; });
#pragma unroll
      for (int r = 0; r < TC; ++r)
#pragma unroll
        for (int cc = 0; cc < TC; ++cc) s.dC[(ty + 16 * r) * P + tx + 16 * cc] = acc[r][cc];
      for (int i = tid; i < D; i += kThreads) {
        float sum = fw * s.dn[i];
        for (int t = 0; t < L; ++t) sum += s.w[t] * s.Q[t * P + i] * s.dden[t];
        s.dn[i] = sum;
      }
    }
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
