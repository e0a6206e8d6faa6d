// Mesa's chunked CG solve on tensor cores, one block per (batch, head, chunk): see cg.h.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/mesa/cg.h"
#include "ops/mesa/rows.cuh"
#include "ops/mma_f16.cuh"
#include "ops/tf32_mm.cuh"
#include "ops/tile.cuh"

namespace memlab::kernels {
namespace {

// ---- fp32 accuracy (fp32 inputs): 3xTF32 on m16n8k8 ----
//
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

// The solution, scaled back, into x (dense chunked, every row of the chunk) and x_rows where asked (the chunk's rows
// before T): the lane's rows row0, row1 and columns 2q, 2q + 1 of each 8-column tile, a pair a store.
template <int NT>
__device__ __forceinline__ void store_x(const MesaCgProblem& p, const MesaCgArgs& a, const ChunkAt& at,
                                        const float (&x)[NT][4], float scale0, float scale1, int row0, int row1,
                                        int q) {
  const int C = p.C, dk = p.dk;
  float* const xc = a.x + at.blk * C * dk;  // the chunk's rows
  const float sc[2] = {p.normalize ? scale0 : 1.f, p.normalize ? scale1 : 1.f};
  if (dk % 2 == 0) {
    each_pair<NT>(row0, row1, q, [&](int n, int h, int t, int i) {
      if (t < C && i < dk)
        *reinterpret_cast<float2*>(xc + t * dk + i) = make_float2(x[n][2 * h] * sc[h], x[n][2 * h + 1] * sc[h]);
    });
  } else {
    each_entry<NT>(row0, row1, q, [&](int n, int e, int t, int i) {
      if (t < C && i < dk) xc[t * dk + i] = x[n][e] * sc[e / 2];
    });
  }
  if (!a.x_rows.at) return;
  with_pairs(span_of(a.x_rows, at), dk, [&](const auto& out) {
    each_pair<NT>(row0, row1, q, [&](int n, int h, int t, int i) {
      if (t < out.rows && i < dk) out.put2(t, i, x[n][2 * h] * sc[h], x[n][2 * h + 1] * sc[h], i + 1 < dk);
    });
  });
}

// x = hi + lo with hi x's top 10 mantissa bits (exact, by masking) and lo the rest, which the tensor cores read
// as tf32 by dropping its low bits: hi·hi + hi·lo + lo·hi keeps about 2^-20 of x, near fp32 (the statistics never
// drop to tf32). Two full-rate instructions where cvt.rna.tf32 runs on the slower conversion pipe.
__device__ __forceinline__ void split(float x, uint32_t& hi, uint32_t& lo) {
  hi = __float_as_uint(x) & 0xffffe000u;
  lo = __float_as_uint(x - __uint_as_float(hi));
}

// An A operand from accumulator-layout values v (one 8-column tile), split once for all the products it feeds.
struct AFrag {
  uint32_t hi[4], lo[4];
  __device__ __forceinline__ AFrag(const float (&v)[4], float s0 = 1.f, float s1 = 1.f) {
    // rows g, g + 8 at k = q: v[0], v[2]; at k = q + 4: v[1], v[3]
    const float w[4] = {s0 * v[0], s1 * v[2], s0 * v[1], s1 * v[3]};
#pragma unroll
    for (int i = 0; i < 4; ++i) split(w[i], hi[i], lo[i]);
  }
};

// d += a b to fp32 accuracy (three products of split operands), b = (b0, b1) the B operand's two values (k = q and
// k = q + 4, column g).
__device__ __forceinline__ void mma3(float (&d)[4], const AFrag& a, float2 b) {
  uint32_t bh0, bl0, bh1, bl1;
  split(b.x, bh0, bl0);
  split(b.y, bh1, bl1);
  mma_tf32(d, a.lo, bh0, bh1);
  mma_tf32(d, a.hi, bl0, bl1);
  mma_tf32(d, a.hi, bh0, bh1);
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
template <int DK, int CM>
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
    const AFrag a(p[j]);
#pragma unroll
    for (int n = 0; n < 2; ++n) mma3(W[n], a, *reinterpret_cast<const float2*>(Kr + 8 * n * KP + 8 * j));
    const AFrag ad(p[j], w.dec0, w.dec1);
#pragma unroll
    for (int n = 0; n < NT; ++n) mma3(u[n], ad, *reinterpret_cast<const float2*>(Mt + 8 * n * KP + 8 * j));
  }
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) W[n][e] *= w.D[n][e];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const AFrag a(W[j]);
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

// The lane's entries of the right-hand side (rows row0, row1; columns 2q, 2q + 1 of each 8-column tile). With
// normalize each row is divided by its norm, which goes to scale0, scale1 (else 1): a linear system, solved for
// b / |b| and scaled back, so that eps is relative to |b|².
template <int NT>
__device__ __forceinline__ void load_rhs(const RowSpan& rhs, bool normalize, int dk, int row0, int row1, int q,
                                         float (&b)[NT][4], float& scale0, float& scale1) {
  if (rhs.paired() && dk % 2 == 0) {  // one branch on the dtype, then every load at once (a valid address each)
    with_dtype(rhs, [&](auto bf16) {
      each_pair<NT>(row0, row1, q, [&](int n, int h, int t, int i) {
        const bool ok = t < rhs.rows && i < dk;
        const float2 v = rhs.template at2_as<decltype(bf16)::value>(ok ? t : 0, ok ? i : 0);
        b[n][2 * h] = ok ? v.x : 0.f, b[n][2 * h + 1] = ok ? v.y : 0.f;
      });
    });
  } else {
    each_entry<NT>(row0, row1, q,
                   [&](int n, int e, int t, int i) { b[n][e] = t < rhs.rows && i < dk ? rhs.at(t, i) : 0.f; });
  }
  scale0 = 1.f, scale1 = 1.f;
  if (!normalize) return;
  row_dots(b, b, scale0, scale1);
  scale0 = sqrtf(scale0), scale1 = sqrtf(scale1);
  const float inv0 = 1.f / (scale0 + 1e-30f), inv1 = 1.f / (scale1 + 1e-30f);
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    b[n][0] *= inv0;
    b[n][1] *= inv0;
    b[n][2] *= inv1;
    b[n][3] *= inv1;
  }
}

// Warp r's Mt_r = M_rᵀ (see the kernel), m16n8k8 tiles of M_r = A B with A[i][s] = k_s[i] D_ls, B[s][c] = k_s[c].
template <int DK, int CM>
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
#pragma unroll
      for (int e = 0; e < 4; ++e) split(av[e], ah[e], al[e]);
      uint32_t bh0, bl0, bh1, bl1;
      split(b0, bh0, bl0);
      split(b1, bh1, bl1);
      mma_tf32(acc, al, bh0, bh1);
      mma_tf32(acc, ah, bl0, bl1);
      mma_tf32(acc, ah, bh0, bh1);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) s.Mt[(r * DK + c0 + (e & 1)) * KP + i0 + (e < 2 ? 0 : 8)] = acc[e];
  }
}

// The CG iterations both kernels share, from x_0 and r_0 = b - (H + Λ) x_0 (the lane's two rows). Ops gives the
// mat-vec (apply: (H + Λ) p = c u row by row, given |r|² δ), the rows' dots and the division.
template <int NT, class Ops>
__device__ __forceinline__ void cg_iterate(const Ops& op, int steps, float eps, float (&x)[NT][4], float (&r_)[NT][4],
                                           float (&pd)[NT][4], float (&u)[NT][4]) {
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) pd[n][e] = r_[n][e];  // the search direction
  float delta0, delta1;
  op.dots(r_, r_, delta0, delta1);
  for (int step = 0; step < steps; ++step) {
    float c0, c1, pu0, pu1, dn0, dn1;
    op.apply(pd, delta0, delta1, u, c0, c1);
    op.dots(pd, u, pu0, pu1);
    const float alpha0 = op.div(delta0, c0 * pu0 + eps), alpha1 = op.div(delta1, c1 * pu1 + eps);
    const float ac0 = alpha0 * c0, ac1 = alpha1 * c1;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      x[n][0] += alpha0 * pd[n][0];
      x[n][1] += alpha0 * pd[n][1];
      x[n][2] += alpha1 * pd[n][2];
      x[n][3] += alpha1 * pd[n][3];
      r_[n][0] -= ac0 * u[n][0];
      r_[n][1] -= ac0 * u[n][1];
      r_[n][2] -= ac1 * u[n][2];
      r_[n][3] -= ac1 * u[n][3];
    }
    op.dots(r_, r_, dn0, dn1);
    const float beta0 = op.div(dn0, delta0 + eps), beta1 = op.div(dn1, delta1 + eps);
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) pd[n][e] = r_[n][e] + (e < 2 ? beta0 : beta1) * pd[n][e];
    delta0 = dn0, delta1 = dn1;
  }
}

constexpr float kTiny = 1e-30f;  // keeps 1/|v| finite for zero rows (padding, converged solves)

// cg_iterate's operations for the 3xTF32 kernel: the mat-vec as it is (c = 1).
template <int DK, int CM>
struct ExactCgOps {
  static constexpr int NT = DK / 8;
  const Shared<DK, CM>& s;
  const WarpConsts<NT>& w;
  int r, g, q;
  __device__ void apply(const float (&v)[NT][4], float, float, float (&out)[NT][4], float& c0, float& c1) const {
    matvec<DK, CM>(s, r, w, v, out, g, q);
    c0 = 1.f, c1 = 1.f;
  }
  __device__ void dots(const float (&a)[NT][4], const float (&b)[NT][4], float& d0, float& d1) const {
    row_dots(a, b, d0, d1);
  }
  __device__ float div(float a, float b) const { return a / b; }
};

// Registers are capped below DK 64 so that 12 (DK 32) or 16 (DK 16) warps share an SM without spilling.
template <int DK, int CM>
__global__ void __launch_bounds__(CM * 2, (DK == 16 ? 512 : DK == 32 ? 384 : 128) / (CM * 2))
    mesa_cg_kernel(MesaCgProblem p, MesaCgArgs a) {
  constexpr int NT = DK / 8, KP = Shared<DK, CM>::KP, CP = Shared<DK, CM>::CP, threads = CM * 2;
  extern __shared__ float smem[];
  const Shared<DK, CM> s = Shared<DK, CM>::at(smem);
  const int tid = threadIdx.x, r = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
  const int64_t blk = blockIdx.x;
  const ChunkAt at = chunk_at(blk, p.N, p.C, p.T, p.H);
  const int head = at.h, C = p.C, dk = p.dk;
  const RowSpan K = span_of(a.K, at), rhs = span_of(a.rhs, at);
  const float* S = a.S + (static_cast<int64_t>(at.bh) * a.Ns + at.n) * dk * dk;
  // Padding (tokens past C or T, dims past dk) is zero but for λ = 1 there: those rows and columns solve 1 x = 0.
  for (int idx = tid; idx < CM * DK; idx += threads) {
    const int t = idx / DK, i = idx % DK;
    const float k = t < K.rows && i < dk ? K.at(t, i) : 0.f;
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
  state_at_subchunk<DK, CM>(s, S, r, dk, g, q);
  WarpConsts<NT> w;
  const int row0 = SC * r + g, row1 = row0 + 8;  // the lane's two tokens
#pragma unroll
  for (int n = 0; n < 2; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) w.D[n][e] = decay(s, e < 2 ? row0 : row1, SC * r + 8 * n + 2 * q + (e & 1));
  float x[NT][4], b[NT][4], r_[NT][4], pd[NT][4], u[NT][4];
  float scale0, scale1;
  load_rhs(rhs, p.normalize, dk, row0, row1, q, b, scale0, scale1);
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
    matvec<DK, CM>(s, r, w, x, u, g, q);
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) r_[n][e] = b[n][e] - u[n][e];
  }
  cg_iterate(ExactCgOps<DK, CM>{s, w, r, g, q}, p.steps, p.eps, x, r_, pd, u);
  store_x(p, a, at, x, scale0, scale1, row0, row1, q);
}

// ---- fp16 operands (the inputs were bf16) ----
//
// The same CG with every product on m16n8k16 fp16 tensor cores, fp32 accumulators. fp16's significand rounded to
// nearest is as fine as TF32's and runs at twice its rate from half the bytes; its range is kept by scaling, undone
// in fp32: the search direction by 1/|r| (in CG |r| <= |p|, within a few times it), the sub-chunk state by a power of
// two m above a bound on its entries (and the pair products' D by 1/m with it), so every operand is at most a few
// units. The accumulator layout of m16n8k16 is its A layout (lane 4 g + q holds rows g, g + 8 at columns 2q, 2q + 1
// of each 8-column tile, and A's k-block j is tiles 2j and 2j + 1), so a vector becomes an operand in place. The
// constant B operands stay on chip for all steps: K_r's (both ways) and λ's in registers, M_r / m in shared memory
// in the order the lanes read it (one 16-byte load a lane for two k-blocks).

// A warp's constant B fragments in shared memory: entry m of a lane (a uint2) lies beside entry m ^ 1, so that the lane
// reads two at once (a 16-byte load; a warp's load is 512 contiguous bytes).
struct LaneFrags {
  uint2* at;
  __device__ uint4 pair(int m, int lane) const { return reinterpret_cast<const uint4*>(at)[(m / 2) * 32 + lane]; }
  __device__ void put(int m, int lane, uint2 v) const { at[((m / 2) * 32 + lane) * 2 + (m & 1)] = v; }
};

// Σ over each of the lane's two rows of a ⊙ b as chains of FMAs (two a row, so each chain is half as long), the
// row's four lanes (q) sharing the sum.
template <int NT>
__device__ __forceinline__ void row_dots_fma(const float (&a)[NT][4], const float (&b)[NT][4], float& d0, float& d1) {
  float e0 = 0.f, e1 = 0.f, f0 = 0.f, f1 = 0.f;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    e0 = fmaf(a[n][0], b[n][0], e0);
    f0 = fmaf(a[n][1], b[n][1], f0);
    e1 = fmaf(a[n][2], b[n][2], e1);
    f1 = fmaf(a[n][3], b[n][3], f1);
  }
  d0 = e0 + f0, d1 = e1 + f1;
#pragma unroll
  for (int o = 1; o < 4; o <<= 1) {
    d0 += __shfl_xor_sync(kAllLanes, d0, o);
    d1 += __shfl_xor_sync(kAllLanes, d1, o);
  }
}

// Shared memory of a block: per warp its B fragments of M_r / m (DK² / 128 a lane: column tile nc, k-block j at entry
// nc JJ + j), of P K_rᵀ (2 JJ: token tile nt, k-block j at nt JJ + j) and of W K_r (DK / 8: column tile nc); K [CM][KP]
// fp32 (token rows; the pitch spreads a warp's column reads over the banks); each warp's diag(M_r) [CM / 16][DK];
// the rows of D of the tokens before each sub-chunk Dl [CM / 16][CM]; b, β, the sub-chunk decays dec and
// max_i k_ti² [CM]; λ [DK]; each warp's max |S| [CM / 16].
template <int DK, int CM>
struct HalfShared {
  static constexpr int KP = DK + 4, NW = CM / SC, JJ = DK / 16;
  static constexpr int kM = (DK / 8) * JJ, k1 = 2 * JJ, k2 = DK / 8, kWarp = 32 * (kM + k1 + k2);  // uint2 a warp
  uint2* frags;
  float *K, *diag, *Dl, *b, *beta, *dec, *kmax, *lam, *smax;
  __device__ static HalfShared at(float* base) {
    HalfShared f;
    f.frags = reinterpret_cast<uint2*>(base);
    f.K = base + 2 * NW * kWarp;
    f.diag = f.K + CM * KP;
    f.Dl = f.diag + NW * DK;
    f.b = f.Dl + NW * CM;
    f.beta = f.b + CM;
    f.dec = f.beta + CM;
    f.kmax = f.dec + CM;
    f.lam = f.kmax + CM;
    f.smax = f.lam + DK;
    return f;
  }
  static constexpr size_t bytes() {
    return sizeof(float) * (2 * NW * kWarp + CM * KP + NW * DK + NW * CM + 4 * CM + DK + NW);
  }
  __device__ LaneFrags M(int r) const { return {frags + r * kWarp}; }
  __device__ LaneFrags K1(int r) const { return {frags + r * kWarp + 32 * kM}; }
  __device__ LaneFrags K2(int r) const { return {frags + r * kWarp + 32 * (kM + k1)}; }
};

// What a warp keeps for its mat-vecs.
template <int DK>
struct HalfWarp {
  static constexpr int NT = DK / 8;
  LaneFrags Mf, k1, k2;  // B of (V' M_r'), of P K_rᵀ (K_r by token columns) and of W K_r
  uint32_t lam[NT];      // B of P diag(λ / m): each column tile's one nonzero register (b0 for even tiles)
  float Dm[2][4];        // D_r / m, [16, 16] in accumulator layout
  float dec0, dec1, m;
};

// acc = dec ⊙ (V' M_r') + ((V' K_rᵀ) ⊙ D_r / m) K_r + V' diag(λ / m) with V' = diag(s) V in fp16 and M_r' = M_r / m,
// so that (H_t + Λ) v = (m / s) acc, row by row.
template <int DK>
__device__ __forceinline__ void matvec_half(const HalfWarp<DK>& w, const float (&v)[DK / 8][4], float s0, float s1,
                                            float (&acc)[DK / 8][4], int lane) {
  constexpr int NT = DK / 8, JJ = DK / 16;
  uint32_t A[JJ][4];
#pragma unroll
  for (int j = 0; j < JJ; ++j) {
    A[j][0] = half2_bits(s0 * v[2 * j][0], s0 * v[2 * j][1]);
    A[j][1] = half2_bits(s1 * v[2 * j][2], s1 * v[2 * j][3]);
    A[j][2] = half2_bits(s0 * v[2 * j + 1][0], s0 * v[2 * j + 1][1]);
    A[j][3] = half2_bits(s1 * v[2 * j + 1][2], s1 * v[2 * j + 1][3]);
  }
  float W[2][4];
  // P K_rᵀ's k steps (a chain on two accumulators) beside the state product's (NT independent ones)
  if constexpr (JJ >= 2) {
#pragma unroll
    for (int j = 0; j < JJ; j += 2) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const uint4 b = w.k1.pair(nt * JJ + j, lane);
        if (j == 0)
          mma_f16_first(W[nt], A[j], b.x, b.y);
        else
          mma_f16(W[nt], A[j], b.x, b.y);
        mma_f16(W[nt], A[j + 1], b.z, b.w);
      }
#pragma unroll
      for (int nc = 0; nc < NT; ++nc) {
        const uint4 b = w.Mf.pair(nc * JJ + j, lane);
        if (j == 0)
          mma_f16_first(acc[nc], A[j], b.x, b.y);
        else
          mma_f16(acc[nc], A[j], b.x, b.y);
        mma_f16(acc[nc], A[j + 1], b.z, b.w);
      }
    }
  } else {
    const uint4 b = w.k1.pair(0, lane);
    mma_f16_first(W[0], A[0], b.x, b.y);
    mma_f16_first(W[1], A[0], b.z, b.w);
#pragma unroll
    for (int nc = 0; nc < NT; nc += 2) {
      const uint4 bm = w.Mf.pair(nc, lane);
      mma_f16_first(acc[nc], A[0], bm.x, bm.y);
      mma_f16_first(acc[nc + 1], A[0], bm.z, bm.w);
    }
  }
#pragma unroll
  for (int nc = 0; nc < NT; ++nc) {
    acc[nc][0] *= w.dec0;
    acc[nc][1] *= w.dec0;
    acc[nc][2] *= w.dec1;
    acc[nc][3] *= w.dec1;
  }
  const uint32_t Aw[4] = {half2_bits(W[0][0] * w.Dm[0][0], W[0][1] * w.Dm[0][1]),
                          half2_bits(W[0][2] * w.Dm[0][2], W[0][3] * w.Dm[0][3]),
                          half2_bits(W[1][0] * w.Dm[1][0], W[1][1] * w.Dm[1][1]),
                          half2_bits(W[1][2] * w.Dm[1][2], W[1][3] * w.Dm[1][3])};
#pragma unroll
  for (int nc = 0; nc < NT; nc += 2) {
    const uint4 b = w.k2.pair(nc, lane);
    mma_f16(acc[nc], Aw, b.x, b.y);
    mma_f16(acc[nc + 1], Aw, b.z, b.w);
    mma_f16(acc[nc], A[nc / 2], w.lam[nc], 0u);
    mma_f16(acc[nc + 1], A[nc / 2], 0u, w.lam[nc + 1]);
  }
}

// cg_iterate's operations for the fp16 kernel: p' = p / |r| (|p| >= |r| and stays within a few times it) into the
// mat-vec, so that (H + Λ) p = c u with c = m |r|.
template <int DK>
struct HalfCgOps {
  static constexpr int NT = DK / 8;
  const HalfWarp<DK>& w;
  int lane;
  __device__ void apply(const float (&v)[NT][4], float delta0, float delta1, float (&out)[NT][4], float& c0,
                        float& c1) const {
    const float d0 = fmaxf(delta0, kTiny), d1 = fmaxf(delta1, kTiny);
    const float sp0 = rsqrtf(d0), sp1 = rsqrtf(d1);
    matvec_half<DK>(w, v, sp0, sp1, out, lane);
    c0 = w.m * d0 * sp0, c1 = w.m * d1 * sp1;
  }
  __device__ void dots(const float (&a)[NT][4], const float (&b)[NT][4], float& d0, float& d1) const {
    row_dots_fma(a, b, d0, d1);
  }
  __device__ float div(float a, float b) const { return __fdividef(a, b); }
};

// The sub-chunk states M_r = H_{16 r - 1} = exp(b_l) S + Σ_{s<=l} D_ls k_s k_sᵀ (l = 16 r - 1), formed by all warps
// together: M_0 = S, M_{r+1} = dec_l' M_r + Σ_{s in sub-chunk r} D_l's k_s k_sᵀ (l' = 16 r + 15, dec_l' = exp(b_l' - b_l),
// s.dec's entry at l'). Each warp carries its share of the JJ x JJ grid of [16, 16] tiles (positions warp + NW k)
// through every sub-chunk, one k-block of 16 tokens a step, in the accumulators. The lane's entries of tile k: rows
// 16 im + g (+ 8), columns 16 jc + 8 h + 2q (+ 1) as v[k][h][0, 1] (+ 8: [2, 3]).
template <int DK, int CM>
struct StateTiles {
  static constexpr int JJ = DK / 16, NW = CM / SC, PER = (JJ * JJ + NW - 1) / NW;
  float v[PER][2][4];
  // S's entries (zero past dk): every load at once, from a valid address where the entry is padding
  __device__ void load(const float* S, int dk, int warp, int g, int q) {
    if (dk % 2 == 0) {
#pragma unroll
      for (int k = 0; k < PER; ++k)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 4; e += 2) {
            const int pos = warp + NW * k, i = 16 * (pos / JJ) + g + (e ? 8 : 0), c = 16 * (pos % JJ) + 8 * h + 2 * q;
            const bool ok = pos < JJ * JJ && i < dk && c < dk;
            const float2 x = __ldg(reinterpret_cast<const float2*>(S + (ok ? i * dk + c : 0)));
            v[k][h][e] = ok ? x.x : 0.f, v[k][h][e + 1] = ok ? x.y : 0.f;
          }
      return;
    }
#pragma unroll
    for (int k = 0; k < PER; ++k)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int pos = warp + NW * k, i = 16 * (pos / JJ) + g + (e < 2 ? 0 : 8);
          const int c = 16 * (pos % JJ) + 8 * h + 2 * q + (e & 1);
          v[k][h][e] = pos < JJ * JJ && i < dk && c < dk ? __ldg(S + i * dk + c) : 0.f;
        }
  }
  __device__ float amax() const {
    float mx = 0.f;
#pragma unroll
    for (int k = 0; k < PER; ++k)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) mx = fmaxf(mx, fabsf(v[k][h][e]));
    return mx;
  }
};

// Every M_r / m_r into warp r's B fragments (s.M(r)) and diag(M_r) (fp32) into s.diag's row r, from the tiles of S.
// M_r is symmetric (as every H_t, given a symmetric S), so the B fragment of column tile nc, k-block j (rows
// 16 j + 2q + {0, 1, 8, 9} of column 8 nc + g) is the lane's accumulators of row block nc / 2, column tiles 2j, 2j + 1.
template <int DK, int CM>
__device__ __forceinline__ void states_half(const HalfShared<DK, CM>& s, StateTiles<DK, CM>& st,
                                            const float (&inv_m)[CM / SC], int warp, int g, int q, int lane) {
  constexpr int KP = HalfShared<DK, CM>::KP, JJ = DK / 16, NW = CM / SC;
#pragma unroll
  for (int k = 0; k < StateTiles<DK, CM>::PER; ++k) {
    const int pos = warp + NW * k, im = pos / JJ, jc = pos % JJ, i0 = 16 * im + g;
    if (pos >= JJ * JJ) break;
    float(&acc)[2][4] = st.v[k];
#pragma unroll
    for (int r = 0; r < NW; ++r) {
      if (r > 0) {
        const float f = s.dec[SC * r - 1];
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[h][e] *= f;
        const int s0 = SC * (r - 1) + 2 * q;
        const float* Dl = s.Dl + (r - 1) * CM;
        const float d0 = Dl[s0], d1 = Dl[s0 + 1], d8 = Dl[s0 + 8], d9 = Dl[s0 + 9];
        const float* K0 = s.K + s0 * KP;
        const uint32_t A[4] = {half2_bits(K0[i0] * d0, K0[KP + i0] * d1),
                               half2_bits(K0[i0 + 8] * d0, K0[KP + i0 + 8] * d1),
                               half2_bits(K0[8 * KP + i0] * d8, K0[9 * KP + i0] * d9),
                               half2_bits(K0[8 * KP + i0 + 8] * d8, K0[9 * KP + i0 + 8] * d9)};
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int c = 16 * jc + 8 * h + g;
          mma_f16(acc[h], A, half2_bits(K0[c], K0[KP + c]), half2_bits(K0[8 * KP + c], K0[9 * KP + c]));
        }
      }
      if (im == jc)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = i0 + (e < 2 ? 0 : 8), c = 16 * jc + 8 * h + 2 * q + (e & 1);
            if (i == c) s.diag[r * DK + i] = acc[h][e];
          }
      const LaneFrags Mf = s.M(r);
#pragma unroll
      for (int h = 0; h < 2; ++h)
        Mf.put((2 * im + h) * JJ + jc, lane,
               make_uint2(half2_bits(inv_m[r] * acc[0][2 * h], inv_m[r] * acc[0][2 * h + 1]),
                          half2_bits(inv_m[r] * acc[1][2 * h], inv_m[r] * acc[1][2 * h + 1])));
    }
  }
}

// Registers: 168 at DK 64 (twelve warps an SM; 188 bytes spilled at CM 64, more at 32 and 16, where a warp holds 8 or
// 16 tiles of S, but 15-16 local loads a CG step at each), 128 at 32 (sixteen) and at 16. At DK 64, 225 registers
// without spills (eight warps) ran the CG 3% slower on an H200 (before the setup was spread over the warps).
template <int DK, int CM>
__global__ void __launch_bounds__(CM * 2, (DK == 16 ? 512 : DK == 32 ? 512 : 384) / (CM * 2))
    mesa_cg_half_kernel(MesaCgProblem p, MesaCgArgs a) {
  using Sh = HalfShared<DK, CM>;
  constexpr int NT = DK / 8, JJ = DK / 16, KP = Sh::KP, NW = Sh::NW, threads = CM * 2;
  extern __shared__ float smem[];
  const Sh s = Sh::at(smem);
  const int tid = threadIdx.x, r = tid / 32, lane = tid % 32, g = lane / 4, q = lane % 4;
  const int64_t blk = blockIdx.x;
  const ChunkAt at = chunk_at(blk, p.N, p.C, p.T, p.H);
  const int head = at.h, C = p.C, dk = p.dk;
  const RowSpan K = span_of(a.K, at), rhs = span_of(a.rhs, at);
  const float* S = a.S + (static_cast<int64_t>(at.bh) * a.Ns + at.n) * dk * dk;
  // Padding (tokens past C or T, dims past dk) is zero but for λ = 1 there: those rows and columns solve 1 x = 0.
  // Every thread's loads of S and K go out together (each exposed latency here is paid per block).
  const int row0 = SC * r + g, row1 = row0 + 8;  // the lane's two tokens
  StateTiles<DK, CM> st;
  st.load(S, dk, r, g, q);
  // its max before K's loads where a warp holds many tiles (fewer registers), else after (one latency exposed)
  constexpr bool many = StateTiles<DK, CM>::PER > 4;
  float smax_warp = many ? warp_max(st.amax()) : 0.f;
  load_span<CM, DK, threads>(s.K, KP, K, dk);
  // past C the decay stays: b = b_{C-1}, so those tokens neither decay nor see anything
  for (int t = tid; t < CM; t += threads) s.b[t] = a.logdecay[blk * C + (t < C ? t : C - 1)];
  for (int i = tid; i < DK; i += threads) s.lam[i] = i < dk ? a.lam[head * dk + i] : 1.f;
  for (int t = tid; t < CM; t += threads) s.beta[t] = t < C ? a.beta[blk * C + t] : 0.f;
  if (!many) smax_warp = warp_max(st.amax());
  if (lane == 0) s.smax[r] = smax_warp;
  __syncthreads();
  for (int idx = tid; idx < NW * CM; idx += threads) {  // Dl[r][j] = D_lj, l = 16 r + 15
    const int l = SC * (idx / CM) + SC - 1, j = idx % CM;
    s.Dl[idx] = j <= l ? expf(s.b[l] - s.b[j]) * s.beta[j] : 0.f;
  }
  {  // two threads a token (threads = 2 CM)
    const int t = tid / 2;
    float km = 0.f;
#pragma unroll 8
    for (int i = tid % 2; i < DK; i += 2) km = fmaxf(km, s.K[t * KP + i] * s.K[t * KP + i]);
    km = fmaxf(km, __shfl_xor_sync(kAllLanes, km, 1));
    if (tid % 2 == 0) {
      const int t0 = (t / SC) * SC;
      s.dec[t] = expf(s.b[t] - (t0 > 0 ? s.b[t0 - 1] : 0.f));
      s.kmax[t] = km;
    }
  }
  __syncthreads();
  // m_r: a power of two >= 1 above every |entry| of M_r (<= exp(b_l) max|S| + Σ_s D_ls max_i k_si²), every warp
  // forming all of them (it writes every sub-chunk's state)
  HalfWarp<DK> w;
  float inv_ms[NW];
  {
    float smax = 0.f;
    for (int i = 0; i < NW; ++i) smax = fmaxf(smax, s.smax[i]);
#pragma unroll
    for (int rr = 0; rr < NW; ++rr) {
      float bound = smax;
      if (rr > 0) {
        float part = 0.f;
        for (int j = lane; j < SC * rr; j += 32) part += s.Dl[(rr - 1) * CM + j] * s.kmax[j];
        bound = expf(s.b[SC * rr - 1]) * smax + warp_sum(part);
      }
      int e = 0;
      frexpf(fmaxf(bound, 1.f), &e);
      const float m = ldexpf(1.f, e);
      inv_ms[rr] = 1.f / m;
      if (rr == r) w.m = m;
    }
  }
  const float inv_m = 1.f / w.m;
  {
    const float* Kr = s.K + SC * r * KP;
    w.k1 = s.K1(r), w.k2 = s.K2(r), w.Mf = s.M(r);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int j = 0; j < JJ; ++j) {
        const float* row = Kr + (8 * nt + g) * KP + 16 * j + 2 * q;
        w.k1.put(nt * JJ + j, lane, make_uint2(half2_bits(row[0], row[1]), half2_bits(row[8], row[9])));
      }
#pragma unroll
    for (int nc = 0; nc < NT; ++nc) {
      const float* col = Kr + 2 * q * KP + 8 * nc + g;
      w.k2.put(nc, lane, make_uint2(half2_bits(col[0], col[KP]), half2_bits(col[8 * KP], col[9 * KP])));
      const int c = 8 * nc + g;
      const float l = s.lam[c] * inv_m;
      w.lam[nc] = half2_bits(g == 2 * q ? l : 0.f, g == 2 * q + 1 ? l : 0.f);
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = e < 2 ? row0 : row1, j = SC * r + 8 * nt + 2 * q + (e & 1);
        w.Dm[nt][e] = j <= t ? expf(s.b[t] - s.b[j]) * s.beta[j] * inv_m : 0.f;
      }
    w.dec0 = s.dec[row0], w.dec1 = s.dec[row1];
  }
  states_half<DK, CM>(s, st, inv_ms, r, g, q, lane);
  __syncthreads();  // every warp's M_r and diag(M_r)
  float x[NT][4], b[NT][4], r_[NT][4], pd[NT][4], u[NT][4];
  float scale0, scale1;
  load_rhs(rhs, p.normalize, dk, row0, row1, q, b, scale0, scale1);
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
    } else {  // Jacobi: diag(H_t) + λ = dec_t diag(M_r) + Σ_{t0<=s<=t} D_ts k_s² + λ, the sum as D_r (K_r ⊙ K_r)
      // both factors at most fp16's largest, so that no inf meets a zero (D's mask, padded dims' keys): a guess only
      auto h = [](float x) { return fminf(x, 65504.f); };
      const float m = w.m;
      const uint32_t Ad[4] = {half2_bits(h(m * w.Dm[0][0]), h(m * w.Dm[0][1])),
                              half2_bits(h(m * w.Dm[0][2]), h(m * w.Dm[0][3])),
                              half2_bits(h(m * w.Dm[1][0]), h(m * w.Dm[1][1])),
                              half2_bits(h(m * w.Dm[1][2]), h(m * w.Dm[1][3]))};
      auto sq = [&](float k) { return h(k * k); };
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const float* col = s.K + (SC * r + 2 * q) * KP + 8 * n + g;
        mma_f16_first(x[n], Ad, half2_bits(sq(col[0]), sq(col[KP])), half2_bits(sq(col[8 * KP]), sq(col[9 * KP])));
      }
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = 8 * n + 2 * q + (e & 1);
          const float d = x[n][e] + (e < 2 ? w.dec0 : w.dec1) * s.diag[r * DK + i] + s.lam[i];
          x[n][e] = __fdividef(b[n][e], d);
        }
    }
    float n0, n1;
    row_dots_fma(x, x, n0, n1);
    const float sx0 = rsqrtf(fmaxf(n0, kTiny)), sx1 = rsqrtf(fmaxf(n1, kTiny));
    matvec_half<DK>(w, x, sx0, sx1, u, lane);
    const float c0 = w.m / sx0, c1 = w.m / sx1;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      r_[n][0] = b[n][0] - c0 * u[n][0];
      r_[n][1] = b[n][1] - c0 * u[n][1];
      r_[n][2] = b[n][2] - c1 * u[n][2];
      r_[n][3] = b[n][3] - c1 * u[n][3];
    }
  }
  cg_iterate(HalfCgOps<DK>{w, lane}, p.steps, p.eps, x, r_, pd, u);
  store_x(p, a, at, x, scale0, scale1, row0, row1, q);
}

template <int DK, int CM>
std::string launch(const MesaCgProblem& p, const MesaCgArgs& a, void* stream) {
  if (p.exact)
    return launch_shared("Mesa CG", mesa_cg_kernel<DK, CM>, p.chunks, CM * 2, Shared<DK, CM>::floats() * sizeof(float),
                         stream, p, a);
  return launch_shared("Mesa CG (fp16)", mesa_cg_half_kernel<DK, CM>, p.chunks, CM * 2, HalfShared<DK, CM>::bytes(),
                       stream, p, a);
}

template <int CM>
std::string by_dk(const MesaCgProblem& p, const MesaCgArgs& a, void* stream) {
  if (p.dk <= 16) return launch<16, CM>(p, a, stream);
  if (p.dk <= 32) return launch<32, CM>(p, a, stream);
  return launch<64, CM>(p, a, stream);
}

}  // namespace

std::string mesa_cg_solve(const MesaCgProblem& p, const MesaCgArgs& a, void* stream) {
  if (!mesa_chunk_supported(p.dk, p.C) || p.chunks < 0 || p.H < 1 || p.N < 1 || p.steps < 0)
    return "Mesa CG kernel: head dim " + std::to_string(p.dk) + " or chunk " + std::to_string(p.C) +
           " out of range (1-64)";
  if (a.Ns < p.N) return "Mesa CG kernel: " + std::to_string(a.Ns) + " states per (batch, head) for " +
                         std::to_string(p.N) + " chunks";
  if (p.dk % 2 == 0 && ((reinterpret_cast<uintptr_t>(a.S) | reinterpret_cast<uintptr_t>(a.x)) & 7))
    return "Mesa CG kernel: S and x must be 8-byte aligned (they are read and written in pairs)";
  if (p.chunks == 0) return "";
  if (p.C <= 16) return by_dk<16>(p, a, stream);
  return p.C <= 32 ? by_dk<32>(p, a, stream) : by_dk<64>(p, a, stream);
}

}  // namespace memlab::kernels
