// Mesa's chunked CG solve on tensor cores, one block per (batch, head, chunk): see cg.h.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/mesa/cg.h"
#include "ops/tile.cuh"

namespace memlab::kernels {
namespace {

// The chunk runs as sub-chunks of 16 tokens, one warp each (the 16 rows of an m16n8k8 product). Token t of
// sub-chunk r, which starts at t0 = 16 r, sees H_t = exp(b_t - b_{t0-1}) M_r + Σ_{t0<=s<=t} D_ts k_s k_sᵀ, with
// M_r = H_{t0-1} (M_0 = S, b_{-1} = 0) formed once before the CG. So a warp's CG needs nothing of the other warps:
// its mat-vec is U = (dec ⊙ P) M_r + ((P K_rᵀ) ⊙ D_r) K_r + λ ⊙ P for its [16, dk] block P, C dk² + 2 C 16 dk
// multiply-adds per CG step for the chunk.
//
// The vectors x, r, p, u stay in registers in the accumulator layout of m16n8k8 (lane = 4 g + q holds rows g and
// g + 8, columns 2q and 2q + 1 of each 8-column tile). Read as an A operand, that is the same tile with its k
// index permuted (k = q holds column 2q, k = q + 4 column 2q + 1), so the B operands are read from shared memory
// in the same permuted order and a product's output feeds the next product without any shuffle.
constexpr int SC = 16;

// x = hi + lo with hi x's top 10 mantissa bits (exact, by masking) and lo the rest, which the tensor cores read
// as tf32 by dropping its low bits: hi·hi + hi·lo + lo·hi keeps about 2^-20 of x, near fp32 (the statistics never
// drop to tf32). Two full-rate instructions where cvt.rna.tf32 runs on the slower conversion pipe.
__device__ __forceinline__ void split(float x, uint32_t& hi, uint32_t& lo) {
  hi = __float_as_uint(x) & 0xffffe000u;
  lo = __float_as_uint(x - __uint_as_float(hi));
}

__device__ __forceinline__ void mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// An A operand from accumulator-layout values v (one 8-column tile), split once for all the products it feeds
// (EXACT); without EXACT the values go in as they are and the tensor cores read them as tf32 (bf16 inputs).
template <bool EXACT>
struct AFrag {
  uint32_t hi[4], lo[4];
  __device__ __forceinline__ AFrag(const float (&v)[4], float s0 = 1.f, float s1 = 1.f) {
    // rows g, g + 8 at k = q: v[0], v[2]; at k = q + 4: v[1], v[3]
    const float w[4] = {s0 * v[0], s1 * v[2], s0 * v[1], s1 * v[3]};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if constexpr (EXACT)
        split(w[i], hi[i], lo[i]);
      else
        hi[i] = __float_as_uint(w[i]);
    }
  }
};

// d += a b, b = (b0, b1) the B operand's two values (k = q and k = q + 4, column g): to fp32 accuracy with EXACT
// (three products of split operands), else one tf32 product.
template <bool EXACT>
__device__ __forceinline__ void mma3(float (&d)[4], const AFrag<EXACT>& a, float2 b) {
  if constexpr (EXACT) {
    uint32_t bh0, bl0, bh1, bl1;
    split(b.x, bh0, bl0);
    split(b.y, bh1, bl1);
    mma(d, a.lo, bh0, bh1);
    mma(d, a.hi, bl0, bl1);
    mma(d, a.hi, bh0, bh1);
  } else {
    mma(d, a.hi, __float_as_uint(b.x), __float_as_uint(b.y));
  }
}

// Shared memory of a block: K [CM][KP] (token rows), Kt [DK][CP] (Kᵀ), Mt [CM / 16][DK][KP] (M_rᵀ), the parts
// row of D of each sub-chunk's last token Dl [CM / 16][CM]; the chunk's running log decay b, β and the sub-chunk
// decays dec [CM], λ [DK]. The pitches make each quarter of a warp's 8-byte reads hit distinct banks. At DK = CM = 64
// that is 110 KB, so two blocks share an SM.
template <int DK, int CM>
struct Shared {
  static constexpr int KP = DK + 8, CP = CM + 8;
  float *K, *Kt, *Mt, *Dl, *b, *beta, *dec, *lam;
  __device__ static Shared at(float* s) {
    Shared f;
    f.K = s;
    f.Kt = f.K + CM * KP;
    f.Mt = f.Kt + DK * CP;
    f.Dl = f.Mt + (CM / SC) * DK * KP;
    f.b = f.Dl + (CM / SC) * CM;
    f.beta = f.b + CM;
    f.dec = f.beta + CM;
    f.lam = f.dec + CM;
    return f;
  }
  static constexpr size_t floats() {
    return CM * KP + DK * CP + (CM / SC) * DK * KP + (CM / SC) * CM + 3 * CM + DK;
  }
};

// D_ts = exp(b_t - b_s) β_s for s <= t, else 0 (zero past C, where β is).
template <int DK, int CM>
__device__ __forceinline__ float decay(const Shared<DK, CM>& s, int t, int j) {
  return j <= t ? expf(s.b[t] - s.b[j]) * s.beta[j] : 0.f;
}

// What a warp keeps of its sub-chunk for the mat-vec: D_r in accumulator layout, the rows' decays, λ by column.
template <int NT>
struct WarpConsts {
  float D[2][4];
  float dec0, dec1;
  float lam[NT][2];
};

// u = (H_t + Λ) p for the warp's 16 tokens (sub-chunk r).
template <int DK, int CM, bool EXACT>
__device__ __forceinline__ void matvec(const Shared<DK, CM>& s, int r, const WarpConsts<DK / 8>& w,
                                       const float (&p)[DK / 8][4], float (&u)[DK / 8][4], int g, int q) {
  constexpr int NT = DK / 8, KP = Shared<DK, CM>::KP, CP = Shared<DK, CM>::CP;
  const float* Kr = s.K + (SC * r + g) * KP + 2 * q;
  const float* Kt = s.Kt + g * CP + SC * r + 2 * q;
  const float* Mt = s.Mt + (r * DK + g) * KP + 2 * q;
  float W[2][4] = {};  // (P K_rᵀ) ⊙ D_r, [16, 16]
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) u[n][e] = 0.f;
  // one k step of P K_rᵀ (a chain on two accumulators) beside the same k step of (dec ⊙ P) M_r (eight independent
  // ones), so that the tensor cores' latency is hidden within the warp
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const AFrag<EXACT> a(p[j]);
#pragma unroll
    for (int n = 0; n < 2; ++n) mma3(W[n], a, *reinterpret_cast<const float2*>(Kr + 8 * n * KP + 8 * j));
    const AFrag<EXACT> ad(p[j], w.dec0, w.dec1);
#pragma unroll
    for (int n = 0; n < NT; ++n) mma3(u[n], ad, *reinterpret_cast<const float2*>(Mt + 8 * n * KP + 8 * j));
  }
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) W[n][e] *= w.D[n][e];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const AFrag<EXACT> a(W[j]);
#pragma unroll
    for (int n = 0; n < NT; ++n) mma3(u[n], a, *reinterpret_cast<const float2*>(Kt + 8 * n * CP + 8 * j));
  }
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    u[n][0] += w.lam[n][0] * p[n][0];
    u[n][1] += w.lam[n][1] * p[n][1];
    u[n][2] += w.lam[n][0] * p[n][2];
    u[n][3] += w.lam[n][1] * p[n][3];
  }
}

// Σ over each of the lane's two rows (g, g + 8) of a ⊙ b: the row's four lanes (q) share it.
template <int NT>
__device__ __forceinline__ void row_dots(const float (&a)[NT][4], const float (&b)[NT][4], float& d0, float& d1) {
  d0 = 0.f, d1 = 0.f;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    d0 += a[n][0] * b[n][0] + a[n][1] * b[n][1];
    d1 += a[n][2] * b[n][2] + a[n][3] * b[n][3];
  }
#pragma unroll
  for (int o = 1; o < 4; o <<= 1) {
    d0 += __shfl_xor_sync(kAllLanes, d0, o);
    d1 += __shfl_xor_sync(kAllLanes, d1, o);
  }
}

// Warp r's Mt_r = M_rᵀ (see the kernel), m16n8k8 tiles of M_r = A B with A[i][s] = k_s[i] D_ls, B[s][c] = k_s[c].
template <int DK, int CM, bool EXACT>
__device__ __forceinline__ void state_at_subchunk(const Shared<DK, CM>& s, const float* S, int r, int dk, int g,
                                                  int q) {
  constexpr int KP = Shared<DK, CM>::KP;
  const float el = r > 0 ? expf(s.b[SC * r - 1]) : 1.f;
  const float* Dl = s.Dl + (r > 0 ? r - 1 : 0) * CM;
#pragma unroll 1
  for (int tile = 0; tile < (DK / 16) * (DK / 8); ++tile) {
    const int i0 = 16 * (tile / (DK / 8)) + g, c0 = 8 * (tile % (DK / 8)) + 2 * q;
    float acc[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = i0 + (e < 2 ? 0 : 8), c = c0 + (e & 1);
      acc[e] = i < dk && c < dk ? el * S[i * dk + c] : 0.f;
    }
#pragma unroll 1
    for (int ks = 0; ks < 2 * r; ++ks) {
      const int s0 = 8 * ks + q, s1 = s0 + 4;
      const float d0 = Dl[s0], d1 = Dl[s1];
      const float av[4] = {s.K[s0 * KP + i0] * d0, s.K[s0 * KP + i0 + 8] * d0, s.K[s1 * KP + i0] * d1,
                           s.K[s1 * KP + i0 + 8] * d1};
      const float b0 = s.K[s0 * KP + c0 - 2 * q + g], b1 = s.K[s1 * KP + c0 - 2 * q + g];
      uint32_t ah[4], al[4];
      if constexpr (EXACT) {
#pragma unroll
        for (int e = 0; e < 4; ++e) split(av[e], ah[e], al[e]);
        uint32_t bh0, bl0, bh1, bl1;
        split(b0, bh0, bl0);
        split(b1, bh1, bl1);
        mma(acc, al, bh0, bh1);
        mma(acc, ah, bl0, bl1);
        mma(acc, ah, bh0, bh1);
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) ah[e] = __float_as_uint(av[e]);
        mma(acc, ah, __float_as_uint(b0), __float_as_uint(b1));
      }
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) s.Mt[(r * DK + c0 + (e & 1)) * KP + i0 + (e < 2 ? 0 : 8)] = acc[e];
  }
}

// Registers are capped below DK 64 so that 12 (DK 32) or 16 (DK 16) warps share an SM without spilling.
template <int DK, int CM, bool EXACT>
__global__ void __launch_bounds__(CM * 2, (DK == 16 ? 512 : DK == 32 ? 384 : 128) / (CM * 2))
    mesa_cg_kernel(MesaCgProblem p, MesaCgArgs a) {
  constexpr int NT = DK / 8, KP = Shared<DK, CM>::KP, CP = Shared<DK, CM>::CP, threads = CM * 2;
  extern __shared__ float smem[];
  const Shared<DK, CM> s = Shared<DK, CM>::at(smem);
  const int tid = threadIdx.x, r = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
  const int64_t blk = blockIdx.x;
  const int head = static_cast<int>((blk / p.N) % p.H), C = p.C, dk = p.dk;
  const float* K = a.K + blk * C * dk;
  const float* S = a.S + (blk / p.N * a.Ns + blk % p.N) * dk * dk;
  // Padding (tokens past C, dims past dk) is zero but for λ = 1 there: those rows and columns solve 1 x = 0.
  for (int idx = tid; idx < CM * DK; idx += threads) {
    const int t = idx / DK, i = idx % DK;
    const float k = t < C && i < dk ? K[t * dk + i] : 0.f;
    s.K[t * KP + i] = k;
    s.Kt[i * CP + t] = k;
  }
  // past C the decay stays: b = b_{C-1}, so those tokens neither decay nor see anything
  for (int t = tid; t < CM; t += threads) s.b[t] = a.logdecay[blk * C + (t < C ? t : C - 1)];
  for (int i = tid; i < DK; i += threads) s.lam[i] = i < dk ? a.lam[head * dk + i] : 1.f;
  for (int t = tid; t < CM; t += threads) s.beta[t] = t < C ? a.beta[blk * C + t] : 0.f;
  __syncthreads();
  for (int idx = tid; idx < (CM / SC) * CM; idx += threads) {  // Dl[r][j] = D_lj, l = 16 r + 15
    const int l = SC * (idx / CM) + SC - 1, j = idx % CM;
    s.Dl[idx] = j <= l ? expf(s.b[l] - s.b[j]) * s.beta[j] : 0.f;
  }
  __syncthreads();
  for (int t = tid; t < CM; t += threads) {
    const int t0 = (t / SC) * SC;
    s.dec[t] = expf(s.b[t] - (t0 > 0 ? s.b[t0 - 1] : 0.f));
  }
  // Mt_r = M_rᵀ, M_r = H_{16 r - 1} = exp(b_l) S + Σ_{s<=l} D_ls k_s k_sᵀ (l = 16 r - 1): warp r forms its own as
  // [DK, DK] tiles on the tensor cores, over the 16 r tokens before its sub-chunk.
  state_at_subchunk<DK, CM, EXACT>(s, S, r, dk, g, q);
  WarpConsts<NT> w;
  const int row0 = SC * r + g, row1 = row0 + 8;  // the lane's two tokens
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) w.D[n][e] = decay(s, e < 2 ? row0 : row1, SC * r + 8 * n + 2 * q + (e & 1));
  float x[NT][4], b[NT][4], r_[NT][4], pd[NT][4], u[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int t = e < 2 ? row0 : row1, i = 8 * n + 2 * q + (e & 1);
      b[n][e] = t < C && i < dk ? a.rhs[(blk * C + t) * dk + i] : 0.f;
    }
  float scale0 = 1.f, scale1 = 1.f;
  if (p.normalize) {  // a linear system: solve for b / |b| and scale back, so eps is relative to |b|²
    row_dots(b, b, scale0, scale1);
    scale0 = sqrtf(scale0), scale1 = sqrtf(scale1);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      b[n][0] /= scale0 + 1e-30f;
      b[n][1] /= scale0 + 1e-30f;
      b[n][2] /= scale1 + 1e-30f;
      b[n][3] /= scale1 + 1e-30f;
    }
  }
  __syncthreads();  // K, Mt, dec
  w.dec0 = s.dec[row0], w.dec1 = s.dec[row1];
#pragma unroll
  for (int n = 0; n < NT; ++n) w.lam[n][0] = s.lam[8 * n + 2 * q], w.lam[n][1] = s.lam[8 * n + 2 * q + 1];

  if (p.init == 0) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[n][e] = 0.f, r_[n][e] = b[n][e];
  } else {
    if (p.init == 1) {
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) x[n][e] = b[n][e];
    } else {  // Jacobi: diag(H_t) + λ = dec_t diag(M_r) + Σ_{t0<=s<=t} D_ts k_s² + λ
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int t = e < 2 ? row0 : row1, i = 8 * n + 2 * q + (e & 1);
          float d = (e < 2 ? w.dec0 : w.dec1) * s.Mt[(r * DK + i) * KP + i] + s.lam[i];
          for (int j = 0; j < SC; ++j) {
            const float k = s.K[(SC * r + j) * KP + i];
            d = fmaf(decay(s, t, SC * r + j) * k, k, d);
          }
          x[n][e] = b[n][e] / d;
        }
    }
    matvec<DK, CM, EXACT>(s, r, w, x, u, g, q);
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) r_[n][e] = b[n][e] - u[n][e];
  }
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) pd[n][e] = r_[n][e];  // the search direction
  float delta0, delta1;
  row_dots(r_, r_, delta0, delta1);
  for (int step = 0; step < p.steps; ++step) {
    matvec<DK, CM, EXACT>(s, r, w, pd, u, g, q);
    float pu0, pu1, dn0, dn1;
    row_dots(pd, u, pu0, pu1);
    const float alpha0 = delta0 / (pu0 + p.eps), alpha1 = delta1 / (pu1 + p.eps);
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float al = e < 2 ? alpha0 : alpha1;
        x[n][e] += al * pd[n][e];
        r_[n][e] -= al * u[n][e];
      }
    row_dots(r_, r_, dn0, dn1);
    const float beta0 = dn0 / (delta0 + p.eps), beta1 = dn1 / (delta1 + p.eps);
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) pd[n][e] = r_[n][e] + (e < 2 ? beta0 : beta1) * pd[n][e];
    delta0 = dn0, delta1 = dn1;
  }
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int t = e < 2 ? row0 : row1, i = 8 * n + 2 * q + (e & 1);
      const float sc = p.normalize ? (e < 2 ? scale0 : scale1) : 1.f;
      if (t < C && i < dk) a.x[(blk * C + t) * dk + i] = x[n][e] * sc;
    }
}

template <int DK, int CM, bool EXACT>
std::string launch(const MesaCgProblem& p, const MesaCgArgs& a, void* stream) {
  return launch_shared("Mesa CG", mesa_cg_kernel<DK, CM, EXACT>, p.chunks, CM * 2,
                       Shared<DK, CM>::floats() * sizeof(float), stream, p, a);
}

template <int CM, bool EXACT>
std::string by_dk(const MesaCgProblem& p, const MesaCgArgs& a, void* stream) {
  if (p.dk <= 16) return launch<16, CM, EXACT>(p, a, stream);
  if (p.dk <= 32) return launch<32, CM, EXACT>(p, a, stream);
  return launch<64, CM, EXACT>(p, a, stream);
}

template <bool EXACT>
std::string by_chunk(const MesaCgProblem& p, const MesaCgArgs& a, void* stream) {
  if (p.C <= 16) return by_dk<16, EXACT>(p, a, stream);
  return p.C <= 32 ? by_dk<32, EXACT>(p, a, stream) : by_dk<64, EXACT>(p, a, stream);
}

}  // namespace

std::string mesa_cg_solve(const MesaCgProblem& p, const MesaCgArgs& a, void* stream) {
  if (!mesa_chunk_supported(p.dk, p.C) || p.chunks < 0 || p.H < 1 || p.N < 1 || p.steps < 0)
    return "Mesa CG kernel: head dim " + std::to_string(p.dk) + " or chunk " + std::to_string(p.C) +
           " out of range (1-64)";
  if (a.Ns < p.N) return "Mesa CG kernel: " + std::to_string(a.Ns) + " states per (batch, head) for " +
                         std::to_string(p.N) + " chunks";
  if (p.chunks == 0) return "";
  return p.exact ? by_chunk<true>(p, a, stream) : by_chunk<false>(p, a, stream);
}

}  // namespace memlab::kernels
