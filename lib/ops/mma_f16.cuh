#pragma once
// Warp-level m16n8k16 products on fp16 or bf16 operands with fp32 accumulators (mma.sync), and their operand loads
// from shared memory (ldmatrix): the Mesa kernels' fp16 path (ops/mesa/) and the window kernel's bf16 tensor-core
// form (ops/local_attention/). Fragment layouts (PTX ISA, m16n8k16): lane 4 g + q holds A's rows g and g + 8 at
// columns 2q, 2q + 1 of each k-half, B's column g at rows 2q, 2q + 1 of each k-half, and the accumulator's rows g,
// g + 8 at columns 2q, 2q + 1.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "ops/mma_layout.cuh"

namespace memlab::kernels {

__device__ __forceinline__ uint32_t half2_bits(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// d += a b
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d += a b on bf16 operands.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// d = a b (no accumulator to read).
__device__ __forceinline__ void mma_f16_first(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%10,%10,%10};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.f));
}

// Four 8 x 8 fp16 matrices from shared memory: lanes 8 i to 8 i + 7 give matrix i's row addresses (16-byte aligned);
// r[i] is matrix i's row lane / 4, columns 2 (lane % 4) and the next (TRANS: its column lane / 4, rows 2 (lane % 4)
// and the next).
template <bool TRANS>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  const auto at = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  if constexpr (TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(at));
}

// acc[n] += A B over k in [0, K) for a warp's 16 output rows from m0 and NT 8-column tiles from n0, A and B fp16 in
// shared memory (pitches in elements, multiples of 8):
//   A_T false: a[m][k] (A as stored), true: a[k][m] (A transposed);
//   B_T false: b[n][k] (B's columns stored as rows: the product's right factor is bᵀ), true: b[k][n].
// K a multiple of 16, NT of 2.
// E: __half (mma_f16) or __nv_bfloat16 (mma_bf16); ldmatrix moves either as 16-bit words.
template <int K, int NT, bool A_T, bool B_T, typename E = __half>
__device__ __forceinline__ void warp_mm_f16(float (&acc)[NT][4], const E* a, int lda, int m0, const E* b,
                                            int ldb, int n0, int lane) {
  static_assert(std::is_same_v<E, __half> || std::is_same_v<E, __nv_bfloat16>, "fp16 or bf16 operands");
  const int i = lane / 8, j = lane % 8;
#pragma unroll
  for (int k0 = 0; k0 < K; k0 += 16) {
    uint32_t fa[4];
    if constexpr (A_T)
      ldmatrix_x4<true>(fa, a + (k0 + j + 8 * (i / 2)) * lda + m0 + 8 * (i % 2));
    else
      ldmatrix_x4<false>(fa, a + (m0 + lane % 16) * lda + k0 + 8 * (lane / 16));
#pragma unroll
    for (int n = 0; n < NT; n += 2) {
      uint32_t fb[4];  // b0, b1 of tile n, then of tile n + 1
      if constexpr (B_T)
        ldmatrix_x4<true>(fb, b + (k0 + j + 8 * (i % 2)) * ldb + n0 + 8 * n + 8 * (i / 2));
      else
        ldmatrix_x4<false>(fb, b + (n0 + 8 * n + j + 8 * (i / 2)) * ldb + k0 + 8 * (i % 2));
      if constexpr (std::is_same_v<E, __half>) {
        mma_f16(acc[n], fa, fb[0], fb[1]);
        mma_f16(acc[n + 1], fa, fb[2], fb[3]);
      } else {
        mma_bf16(acc[n], fa, fb[0], fb[1]);
        mma_bf16(acc[n + 1], fa, fb[2], fb[3]);
      }
    }
  }
}

}  // namespace memlab::kernels
