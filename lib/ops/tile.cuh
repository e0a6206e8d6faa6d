#pragma once
// Device helpers of the chunkwise kernels (mLSTM, SSD); SSD's tile product (mLSTM's run on tensor cores): 256 threads
// as a 16 x 16 grid (ty, tx) multiplying small shared-memory tiles, each thread a TM x TN block of fp32 outputs.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "ops/float_conversion.cuh"

namespace memlab::kernels {

constexpr int kTileThreads = 256;
constexpr unsigned kAllLanes = 0xffffffffu;

__device__ inline float warp_sum(float x) {
  for (int o = 16; o; o >>= 1) x += __shfl_xor_sync(kAllLanes, x, o);
  return x;
}
__device__ inline float warp_max(float x) {
  for (int o = 16; o; o >>= 1) x = fmaxf(x, __shfl_xor_sync(kAllLanes, x, o));
  return x;
}
// Over the 16 threads (tx) that share a tile row group (ty): half a warp.
__device__ inline float row_sum(float x) {
  for (int o = 8; o; o >>= 1) x += __shfl_xor_sync(kAllLanes, x, o);
  return x;
}

// acc[i][j] += Σ_k a(ty + 16 i, k) b(k, tx + 16 j): thread (ty, tx)'s outputs of a tile product from shared memory.
// Across a warp a() takes two rows (a broadcast each) and b() sixteen consecutive columns.
template <int K, int TM, int TN, class A, class B>
__device__ __forceinline__ void tile(float (&acc)[TM][TN], int ty, int tx, A a, B b) {
#pragma unroll 8
  for (int k = 0; k < K; ++k) {
    float av[TM], bv[TN];
#pragma unroll
    for (int i = 0; i < TM; ++i) av[i] = a(ty + 16 * i, k);
#pragma unroll
    for (int j = 0; j < TN; ++j) bv[j] = b(k, tx + 16 * j);
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
      for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
  }
}

template <int TM, int TN>
__device__ inline void zero(float (&acc)[TM][TN]) {
#pragma unroll
  for (int i = 0; i < TM; ++i)
#pragma unroll
    for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;
}

// p + at, where p may be null (an absent optional argument).
template <typename T>
__device__ inline T* shifted(T* p, int64_t at) {
  return p ? p + at : nullptr;
}

template <typename E>
__device__ inline void store(void* base, int64_t at, float x) {
  static_cast<E*>(base)[at] = from_float<E>(x);
}

// The last launch's error as "<what> kernel: <message>", or "" if there was none.
inline std::string launch_error(const char* what) {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? std::string() : std::string(what) + " kernel: " + cudaGetErrorString(e);
}

// kernel<<<blocks, threads, bytes of dynamic shared memory>>>(args...) on a cudaStream_t, the kernel's shared-memory
// limit raised to bytes first.
template <typename Kernel, typename... Args>
std::string launch_shared(const char* what, Kernel kernel, int blocks, int threads, size_t bytes, void* stream,
                          const Args&... args) {
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)) != cudaSuccess)
    return launch_error(what);
  kernel<<<blocks, threads, bytes, static_cast<cudaStream_t>(stream)>>>(args...);
  return launch_error(what);
}

// kernel<<<blocks, kTileThreads, floats * 4 bytes of dynamic shared memory>>>(args...) on a cudaStream_t.
template <typename Kernel, typename... Args>
std::string launch_tiles(const char* what, Kernel kernel, int blocks, size_t floats, void* stream,
                         const Args&... args) {
  return launch_shared(what, kernel, blocks, kTileThreads, floats * sizeof(float), stream, args...);
}

}  // namespace memlab::kernels
