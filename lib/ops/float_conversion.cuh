#pragma once
// fp32 <-> the element types memlab's kernels read and write (fp32, bf16): kernels templated on the element
// type compute in fp32 and convert at their loads and stores.
#include <cuda_bf16.h>

namespace memlab::kernels {

__host__ __device__ inline float to_float(float x) { return x; }
__host__ __device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
__host__ __device__ inline T from_float(float x);
template <>
__host__ __device__ inline float from_float<float>(float x) { return x; }
template <>
__host__ __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }

// V elements of type T moved as one load or store (16 bytes: 8 bf16 or 4 fp32), where the address is that aligned.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T x[V];
};

}  // namespace memlab::kernels
