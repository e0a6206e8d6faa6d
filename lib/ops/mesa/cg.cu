// Mesa's chunked CG solve, one block per (batch, head, chunk): see cg.h.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/mesa/cg.h"
#include "ops/tile.cuh"

namespace memlab::kernels {
namespace {

// The chunk runs as sub-chunks of 16 tokens (the 16 rows of a thread's tile row group): token t of sub-chunk r,
// which starts at t0 = 16 r, sees H_t = exp(b_t - b_{t0-1}) M_r + Σ_{t0<=s<=t} D_ts k_s k_sᵀ, with M_r = H_{t0-1}
// (M_0 = S, b_{-1} = 0) formed once before the CG. A CG step then costs C dk² + 2 C 16 dk multiply-adds instead of
// C dk² + 2 C² dk over the whole chunk.
constexpr int SC = 16;

// Shared memory of a block: K, P [CM][DK + 1]; M [CM / 16][DK][DK + 1]; D [CM][CM + 1]; W [CM][SC + 1];
// b, the sub-chunk decays e^(b_t - b_{t0-1}) [CM]; λ [DK].
template <int DK, int CM>
struct Shared {
  static constexpr int KP = DK + 1, CP = CM + 1, WP = SC + 1;
  float *K, *P, *M, *D, *W, *b, *dec, *lam;
  __device__ static Shared at(float* s) {
    Shared f;
    f.K = s;
    f.P = f.K + CM * KP;
    f.M = f.P + CM * KP;
    f.D = f.M + (CM / SC) * DK * KP;
    f.W = f.D + CM * CP;
    f.b = f.W + CM * WP;
    f.dec = f.b + CM;
    f.lam = f.dec + CM;
    return f;
  }
  static constexpr size_t floats() { return 2 * CM * KP + (CM / SC) * DK * KP + CM * CP + CM * WP + 2 * CM + DK; }
};

// u = (H_t + Λ) p for thread (ty, tx)'s elements (rows ty + 16 r: sub-chunk r), P in shared memory and `p` its own
// elements of P. Ends with every thread past its reads of P and W (a barrier).
template <int DK, int CM, int TM, int TN>
__device__ inline void matvec(const Shared<DK, CM>& s, const float (&p)[TM][TN], float (&u)[TM][TN], int ty, int tx) {
  constexpr int KP = DK + 1, CP = CM + 1, WP = SC + 1;
  float w[TM];  // W[t][s] = (p_t·k_s) D_ts within the sub-chunk: thread (ty, tx) has t = 16 r + ty, s = 16 r + tx
#pragma unroll
  for (int r = 0; r < TM; ++r) w[r] = 0.f;
#pragma unroll 8
  for (int i = 0; i < DK; ++i)
#pragma unroll
    for (int r = 0; r < TM; ++r) w[r] = fmaf(s.P[(SC * r + ty) * KP + i], s.K[(SC * r + tx) * KP + i], w[r]);
#pragma unroll
  for (int r = 0; r < TM; ++r) s.W[(SC * r + ty) * WP + tx] = w[r] * s.D[(SC * r + ty) * CP + SC * r + tx];
  float u1[TM][TN];  // p_t M_r
  zero(u1);
#pragma unroll 4
  for (int i = 0; i < DK; ++i)
#pragma unroll
    for (int r = 0; r < TM; ++r) {
      const float pv = s.P[(SC * r + ty) * KP + i];
      const float* Mr = s.M + (r * DK + i) * KP;
#pragma unroll
      for (int c = 0; c < TN; ++c) u1[r][c] = fmaf(pv, Mr[tx + 16 * c], u1[r][c]);
    }
  __syncthreads();  // W complete
  zero(u);
#pragma unroll 4
  for (int j = 0; j < SC; ++j)
#pragma unroll
    for (int r = 0; r < TM; ++r) {
      const float wv = s.W[(SC * r + ty) * WP + j];
      const float* Kj = s.K + (SC * r + j) * KP;
#pragma unroll
      for (int c = 0; c < TN; ++c) u[r][c] = fmaf(wv, Kj[tx + 16 * c], u[r][c]);
    }
#pragma unroll
  for (int r = 0; r < TM; ++r)
#pragma unroll
    for (int c = 0; c < TN; ++c) {
      const int t = SC * r + ty, i = tx + 16 * c;
      u[r][c] += s.dec[t] * u1[r][c] + s.lam[i] * p[r][c];
    }
  __syncthreads();  // P and W may be overwritten
}

// Each of the thread's rows: Σ over the row of a ⊙ b (the row's 16 threads share it).
template <int TM, int TN>
__device__ inline void row_dots(const float (&a)[TM][TN], const float (&b)[TM][TN], float (&out)[TM]) {
#pragma unroll
  for (int r = 0; r < TM; ++r) {
    float d = 0.f;
#pragma unroll
    for (int c = 0; c < TN; ++c) d += a[r][c] * b[r][c];
    out[r] = row_sum(d);
  }
}

template <int DK, int CM, int TM, int TN>
__device__ inline void put(float* P, const float (&v)[TM][TN], int ty, int tx) {
#pragma unroll
  for (int r = 0; r < TM; ++r)
#pragma unroll
    for (int c = 0; c < TN; ++c) P[(ty + 16 * r) * (DK + 1) + tx + 16 * c] = v[r][c];
}

template <int DK, int CM>
__global__ void __launch_bounds__(kTileThreads) mesa_cg_kernel(MesaCgProblem p, MesaCgArgs a) {
  constexpr int TM = CM / 16, TN = DK / 16, KP = DK + 1, CP = CM + 1;
  extern __shared__ float smem[];
  const Shared<DK, CM> s = Shared<DK, CM>::at(smem);
  const int tid = threadIdx.x, ty = tid / 16, tx = tid % 16;
  const int64_t blk = blockIdx.x;
  const int hi = static_cast<int>((blk / p.N) % p.H);
  const float* K = a.K + blk * p.C * p.dk;
  const float* S = a.S + blk * p.dk * p.dk;
  const float* D = a.D + blk * p.C * p.C;
  // Padding (tokens past C, dims past dk) is zero but for λ = 1 there: those rows and columns solve 1 x = 0.
  for (int idx = tid; idx < CM * DK; idx += kTileThreads) {
    const int t = idx / DK, i = idx % DK;
    s.K[t * KP + i] = t < p.C && i < p.dk ? K[t * p.dk + i] : 0.f;
  }
  for (int idx = tid; idx < DK * DK; idx += kTileThreads) {
    const int i = idx / DK, j = idx % DK;
    s.M[i * KP + j] = i < p.dk && j < p.dk ? S[i * p.dk + j] : 0.f;
  }
  for (int idx = tid; idx < CM * CM; idx += kTileThreads) {
    const int t = idx / CM, j = idx % CM;
    s.D[t * CP + j] = t < p.C && j < p.C ? D[t * p.C + j] : 0.f;
  }
  // past C the decay stays: b = b_{C-1}, so those tokens neither decay nor see anything
  for (int t = tid; t < CM; t += kTileThreads) s.b[t] = a.logdecay[blk * p.C + (t < p.C ? t : p.C - 1)];
  for (int i = tid; i < DK; i += kTileThreads) s.lam[i] = i < p.dk ? a.lam[hi * p.dk + i] : 1.f;
  __syncthreads();
  for (int t = tid; t < CM; t += kTileThreads) {
    const int t0 = (t / SC) * SC;
    s.dec[t] = expf(s.b[t] - (t0 > 0 ? s.b[t0 - 1] : 0.f));
  }
  // M_r = H_{t0-1} = e^(b_{t0-1}) S + Σ_{s<t0} D_{t0-1,s} k_s k_sᵀ for the sub-chunks r >= 1
  for (int idx = tid; idx < (TM - 1) * DK * DK; idx += kTileThreads) {
    const int r = 1 + idx / (DK * DK), i = (idx / DK) % DK, j = idx % DK, last = SC * r - 1;
    float m = expf(s.b[last]) * s.M[i * KP + j];
    for (int t = 0; t <= last; ++t) m = fmaf(s.D[last * CP + t] * s.K[t * KP + i], s.K[t * KP + j], m);
    s.M[(r * DK + i) * KP + j] = m;
  }

  float b[TM][TN], x[TM][TN], r_[TM][TN], q[TM][TN], u[TM][TN], scale[TM], delta[TM];
#pragma unroll
  for (int r = 0; r < TM; ++r)
#pragma unroll
    for (int c = 0; c < TN; ++c) {
      const int t = ty + 16 * r, i = tx + 16 * c;
      b[r][c] = t < p.C && i < p.dk ? a.rhs[(blk * p.C + t) * p.dk + i] : 0.f;
    }
  if (p.normalize) {  // a linear system: solve for b / |b| and scale back, so eps is relative to |b|²
    row_dots(b, b, scale);
#pragma unroll
    for (int r = 0; r < TM; ++r) {
      scale[r] = sqrtf(scale[r]);
#pragma unroll
      for (int c = 0; c < TN; ++c) b[r][c] /= scale[r] + 1e-30f;
    }
  }
  __syncthreads();  // M
  if (p.init == 0) {
#pragma unroll
    for (int r = 0; r < TM; ++r)
#pragma unroll
      for (int c = 0; c < TN; ++c) {
        x[r][c] = 0.f;
        r_[r][c] = b[r][c];
      }
  } else {
    if (p.init == 1) {
#pragma unroll
      for (int r = 0; r < TM; ++r)
#pragma unroll
        for (int c = 0; c < TN; ++c) x[r][c] = b[r][c];
    } else {  // Jacobi: diag(H_t) + λ = dec_t diag(M_r) + Σ_{t0<=s<=t} D_ts k_s² + λ
#pragma unroll
      for (int r = 0; r < TM; ++r)
#pragma unroll
        for (int c = 0; c < TN; ++c) {
          const int t = ty + 16 * r, i = tx + 16 * c;
          float d = s.dec[t] * s.M[(r * DK + i) * KP + i] + s.lam[i];
          for (int j = 0; j < SC; ++j) {
            const float k = s.K[(SC * r + j) * KP + i];
            d = fmaf(s.D[t * CP + SC * r + j] * k, k, d);
          }
          x[r][c] = b[r][c] / d;
        }
    }
    put<DK, CM>(s.P, x, ty, tx);
    __syncthreads();
    matvec<DK, CM>(s, x, u, ty, tx);
#pragma unroll
    for (int r = 0; r < TM; ++r)
#pragma unroll
      for (int c = 0; c < TN; ++c) r_[r][c] = b[r][c] - u[r][c];
  }
#pragma unroll
  for (int r = 0; r < TM; ++r)
#pragma unroll
    for (int c = 0; c < TN; ++c) q[r][c] = r_[r][c];  // the search direction p
  row_dots(r_, r_, delta);
  for (int step = 0; step < p.steps; ++step) {
    put<DK, CM>(s.P, q, ty, tx);
    __syncthreads();
    matvec<DK, CM>(s, q, u, ty, tx);
    float pu[TM], dn[TM];
    row_dots(q, u, pu);
#pragma unroll
    for (int r = 0; r < TM; ++r) {
      const float alpha = delta[r] / (pu[r] + p.eps);
#pragma unroll
      for (int c = 0; c < TN; ++c) {
        x[r][c] += alpha * q[r][c];
        r_[r][c] -= alpha * u[r][c];
      }
    }
    row_dots(r_, r_, dn);
#pragma unroll
    for (int r = 0; r < TM; ++r) {
      const float beta = dn[r] / (delta[r] + p.eps);
#pragma unroll
      for (int c = 0; c < TN; ++c) q[r][c] = r_[r][c] + beta * q[r][c];
      delta[r] = dn[r];
    }
  }
#pragma unroll
  for (int r = 0; r < TM; ++r)
#pragma unroll
    for (int c = 0; c < TN; ++c) {
      const int t = ty + 16 * r, i = tx + 16 * c;
      if (t < p.C && i < p.dk) a.x[(blk * p.C + t) * p.dk + i] = p.normalize ? x[r][c] * scale[r] : x[r][c];
    }
}

template <int DK, int CM>
std::string launch(const MesaCgProblem& p, const MesaCgArgs& a, void* stream) {
  return launch_tiles("Mesa CG", mesa_cg_kernel<DK, CM>, p.chunks, Shared<DK, CM>::floats(), stream, p, a);
}

template <int CM>
std::string by_dk(const MesaCgProblem& p, const MesaCgArgs& a, void* stream) {
  if (p.dk <= 16) return launch<16, CM>(p, a, stream);
  if (p.dk <= 32) return launch<32, CM>(p, a, stream);
  return launch<64, CM>(p, a, stream);
}

}  // namespace

std::string mesa_cg_solve(const MesaCgProblem& p, const MesaCgArgs& a, void* stream) {
  if (!mesa_cg_supported(p.dk, p.C) || p.chunks < 0 || p.H < 1 || p.N < 1 || p.steps < 0)
    return "Mesa CG kernel: head dim " + std::to_string(p.dk) + " or chunk " + std::to_string(p.C) +
           " out of range (1-64)";
  if (p.chunks == 0) return "";
  return p.C <= 32 ? by_dk<32>(p, a, stream) : by_dk<64>(p, a, stream);
}

}  // namespace memlab::kernels
