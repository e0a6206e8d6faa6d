#pragma once
// Tile products on tensor cores from shared (or global) memory, 16×16 output tiles of m16n8k8 TF32 products: the
// delta-rule, mLSTM and Mesa chunk kernels' matrix products.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "ops/mma_layout.cuh"

namespace memlab::kernels {

// c (M×N, leading dim ldc) = alpha·op(a) op(b) (+ c when accumulate), op(x) = xᵀ when the flag says so, for
// row-major a (M×K, or K×M when TA) and b (K×N, or N×K when TB); M, N multiples of 16, K of 8. Output tiles go
// round-robin to warps [0, nwarps); the caller's warp is `warp`. EXACT: 3xTF32 (a = a_hi + a_lo, likewise b,
// the a_lo·b_lo term dropped), which keeps fp32 accuracy.
// How operands become tf32, without the conversion pipe (cvt.rna, which bound these kernels' issue):
// - Truncate: they go in as they are and the tensor cores drop their low 13 bits (twice rounding's error, still far
//   under bf16's, but biased toward zero);
// - Nearest: single-pass operands are first rounded to nearest by an integer add and a mask (two ALU instructions):
//   a recurrence that feeds its products back (the delta rule near β = 2) drifts under truncation's bias.
// EXACT's hi parts are split off by a mask, which keeps fp32 accuracy either way. The k loop unrolls (K a constant
// at the call).
enum class Tf32 { Truncate, Nearest };

__device__ __forceinline__ float tf32_nearest(float x) {
  return __uint_as_float((__float_as_uint(x) + 0x1000u) & 0xffffe000u);
}

// d += a b on one m16n8k8 TF32 tensor-core product, fp32 accumulators; a, b as fp32 bit patterns (the tensor cores read
// their top 19 bits). Fragments (PTX ISA): lane 4 g + q holds a's rows g, g + 8 at columns q, q + 4, b's column g at
// rows q, q + 4, d's rows g, g + 8 at columns 2q, 2q + 1.
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <bool EXACT, bool TA, bool TB, Tf32 ROUND>
__device__ inline void mm(float* c, int ldc, const float* a, int lda, const float* b, int ldb, int M, int N, int K,
                          bool accumulate, float alpha, int warp, int nwarps) {
  // m16n8k8 fragments read with plain loads (wmma's loads compile to generic ones, which the shared space then
  // serves on the long scoreboard): lane 4 g + q holds A's rows g, g + 8 at k = q, q + 4, B's column g at k = q,
  // q + 4, the accumulator's rows g, g + 8 at columns 2q, 2q + 1 of each 8-column half.
  const int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  // The products sum over a k-slice in any order, so Aᵀ B (both read down columns: lane (g, q) at row k of a pitch
  // of 4 x odd floats) takes its fragments' k slots q, q + 4 from rows 2q, 2q + 1: banks 8q + g, not 4q + g (2-way).
  constexpr bool kPairs = TA && !TB;
  const int kq = kPairs ? 2 * q : q, kq4 = kPairs ? 2 * q + 1 : q + 4;
  auto A = [&](int m, int k) { return TA ? a[k * lda + m] : a[m * lda + k]; };
  auto B = [&](int k, int n) { return TB ? b[n * ldb + k] : b[k * ldb + n]; };
  const int tiles_n = N / 16, tiles = (M / 16) * tiles_n;
#pragma unroll 1
  for (int tile = warp; tile < tiles; tile += nwarps) {
    const int m0 = tile / tiles_n * 16, n0 = tile % tiles_n * 16;
    float acc[2][4];
    each_entry<2>(m0 + g, m0 + g + 8, q,
                  [&](int h, int e, int row, int col) { acc[h][e] = accumulate ? c[row * ldc + n0 + col] : 0.f; });
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 8) {
      float av[4] = {alpha * A(m0 + g, k0 + kq), alpha * A(m0 + g + 8, k0 + kq), alpha * A(m0 + g, k0 + kq4),
                     alpha * A(m0 + g + 8, k0 + kq4)};
      float bv[2][2] = {{B(k0 + kq, n0 + g), B(k0 + kq4, n0 + g)}, {B(k0 + kq, n0 + 8 + g), B(k0 + kq4, n0 + 8 + g)}};
      if constexpr (EXACT) {
        uint32_t ah[4], al[4], bh[2][2], bl[2][2];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          ah[i] = __float_as_uint(av[i]) & 0xffffe000u;
          al[i] = __float_as_uint(av[i] - __uint_as_float(ah[i]));
        }
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            bh[h][i] = __float_as_uint(bv[h][i]) & 0xffffe000u;
            bl[h][i] = __float_as_uint(bv[h][i] - __uint_as_float(bh[h][i]));
          }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          mma_tf32(acc[h], al, bh[h][0], bh[h][1]);
          mma_tf32(acc[h], ah, bl[h][0], bl[h][1]);
          mma_tf32(acc[h], ah, bh[h][0], bh[h][1]);
        }
      } else {
        if constexpr (ROUND == Tf32::Nearest) {
#pragma unroll
          for (int i = 0; i < 4; ++i) av[i] = tf32_nearest(av[i]);
#pragma unroll
          for (int h = 0; h < 2; ++h) bv[h][0] = tf32_nearest(bv[h][0]), bv[h][1] = tf32_nearest(bv[h][1]);
        }
        const uint32_t fa[4] = {__float_as_uint(av[0]), __float_as_uint(av[1]), __float_as_uint(av[2]),
                                __float_as_uint(av[3])};
#pragma unroll
        for (int h = 0; h < 2; ++h) mma_tf32(acc[h], fa, __float_as_uint(bv[h][0]), __float_as_uint(bv[h][1]));
      }
    }
    each_entry<2>(m0 + g, m0 + g + 8, q, [&](int h, int e, int row, int col) { c[row * ldc + n0 + col] = acc[h][e]; });
  }
}

}  // namespace memlab::kernels
