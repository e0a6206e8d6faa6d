#pragma once
// Where a lane's accumulator entries of the m16n8k8 and m16n8k16 tensor-core products lie in the output tile
// (PTX ISA): the one walk that the TF32 and the fp16 products' callers share.
#include <cuda_runtime.h>

namespace memlab::kernels {

// A lane's accumulator entries (m16n8k16 and m16n8k8 alike) of NT 8-column tiles, its rows row0 = r + g and
// row1 = row0 + 8: each_entry calls f(n, e, row, column) for entry [n][e] (row0 for e < 2, column 8 n + 2q + (e & 1));
// each_pair calls f(n, h, row, column) for entries [n][2h], [n][2h + 1] (row h ? row1 : row0, columns 8 n + 2q and
// the next).
template <int NT, class F>
__device__ __forceinline__ void each_entry(int row0, int row1, int q, F f) {
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) f(n, e, e < 2 ? row0 : row1, 8 * n + 2 * q + (e & 1));
}
template <int NT, class F>
__device__ __forceinline__ void each_pair(int row0, int row1, int q, F f) {
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h) f(n, h, h ? row1 : row0, 8 * n + 2 * q);
}

}  // namespace memlab::kernels
