#pragma once
// Tile products on tensor cores from shared (or global) memory, as wmma TF32 tiles of 16×16×8: the delta-rule,
// mLSTM and Mesa chunk kernels' matrix products.
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>
#include <type_traits>

namespace memlab::kernels {

namespace wmma = nvcuda::wmma;

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
  using LA = std::conditional_t<TA, wmma::col_major, wmma::row_major>;
  using LB = std::conditional_t<TB, wmma::col_major, wmma::row_major>;
  using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, LA>;
  using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, LB>;
  using Acc = wmma::fragment<wmma::accumulator, 16, 16, 8, float>;
  // acc += the k-slice [k0, k0 + 8) of op(a) op(b) for the tile at (m0, n0).
  auto step = [&](Acc& acc, int m0, int n0, int k0) {
    FragA fa;
    FragB fb;
    wmma::load_matrix_sync(fa, TA ? a + k0 * lda + m0 : a + m0 * lda + k0, lda);
    wmma::load_matrix_sync(fb, TB ? b + n0 * ldb + k0 : b + k0 * ldb + n0, ldb);
    if constexpr (EXACT) {
      FragA fa_lo;
      FragB fb_lo;
#pragma unroll
      for (int i = 0; i < fa.num_elements; ++i) {
        const float x = fa.x[i] * alpha, hi = __uint_as_float(__float_as_uint(x) & 0xffffe000u);
        fa.x[i] = hi;
        fa_lo.x[i] = x - hi;
      }
#pragma unroll
      for (int i = 0; i < fb.num_elements; ++i) {
        const float x = fb.x[i], hi = __uint_as_float(__float_as_uint(x) & 0xffffe000u);
        fb.x[i] = hi;
        fb_lo.x[i] = x - hi;
      }
      wmma::mma_sync(acc, fa_lo, fb, acc);
      wmma::mma_sync(acc, fa, fb_lo, acc);
    } else if constexpr (ROUND == Tf32::Nearest) {
#pragma unroll
      for (int i = 0; i < fa.num_elements; ++i) fa.x[i] = tf32_nearest(fa.x[i] * alpha);
#pragma unroll
      for (int i = 0; i < fb.num_elements; ++i) fb.x[i] = tf32_nearest(fb.x[i]);
    } else {
#pragma unroll
      for (int i = 0; i < fa.num_elements; ++i) fa.x[i] *= alpha;
    }
    wmma::mma_sync(acc, fa, fb, acc);
  };
  const int tiles_n = N / 16, tiles = (M / 16) * tiles_n;
#pragma unroll 1
  for (int tile = warp; tile < tiles; tile += nwarps) {
    const int m0 = tile / tiles_n * 16, n0 = tile % tiles_n * 16;
    Acc acc;
    if (accumulate)
      wmma::load_matrix_sync(acc, c + m0 * ldc + n0, ldc, wmma::mem_row_major);
    else
      wmma::fill_fragment(acc, 0.f);
#pragma unroll
    for (int k0 = 0; k0 < K; k0 += 8) step(acc, m0, n0, k0);
    wmma::store_matrix_sync(c + m0 * ldc + n0, acc, ldc, wmma::mem_row_major);
  }
}

}  // namespace memlab::kernels
