// SwiGLU's SiLU(g) * u and its backward: see silu_mul.h. The per-thread work is a __host__ __device__
// function so that the CPU tests run the very code the GPU runs.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/float_conversion.cuh"
#include "ops/swiglu/silu_mul.h"

namespace memlab::kernels {
namespace {

constexpr int kThreads = 256;

__host__ __device__ inline float sigmoid(float z) { return 1.f / (1.f + expf(-z)); }

// Vector e covers elements [e*V, e*V + V) of h, all in one row since V divides I.
template <typename T, int V>
__host__ __device__ void forward_vector(const SiluMulProblem& p, const T* gu, T* h, int64_t e) {
  const int64_t row = e * V / p.inner, col = e * V % p.inner;
  const auto g = *reinterpret_cast<const Pack<T, V>*>(gu + row * 2 * p.inner + col);
  const auto u = *reinterpret_cast<const Pack<T, V>*>(gu + row * 2 * p.inner + p.inner + col);
  Pack<T, V> out;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const float z = to_float(g.x[i]);
    out.x[i] = from_float<T>(z * sigmoid(z) * to_float(u.x[i]));
  }
  *reinterpret_cast<Pack<T, V>*>(h + e * V) = out;
}

template <typename T, int V>
__host__ __device__ void backward_vector(const SiluMulProblem& p, const T* gu, const T* dh, T* dgu, int64_t e) {
  const int64_t row = e * V / p.inner, col = e * V % p.inner;
  const int64_t at_g = row * 2 * p.inner + col, at_u = at_g + p.inner;
  const auto g = *reinterpret_cast<const Pack<T, V>*>(gu + at_g);
  const auto u = *reinterpret_cast<const Pack<T, V>*>(gu + at_u);
  const auto d = *reinterpret_cast<const Pack<T, V>*>(dh + e * V);
  Pack<T, V> dg, du;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    const float z = to_float(g.x[i]), s = sigmoid(z), dy = to_float(d.x[i]);
    du.x[i] = from_float<T>(dy * z * s);
    dg.x[i] = from_float<T>(dy * to_float(u.x[i]) * s * (1.f + z * (1.f - s)));
  }
  *reinterpret_cast<Pack<T, V>*>(dgu + at_g) = dg;
  *reinterpret_cast<Pack<T, V>*>(dgu + at_u) = du;
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads) silu_mul_forward_kernel(SiluMulProblem p, SiluMulForwardArgs a) {
  const int64_t n = p.rows * p.inner / V;
  for (int64_t e = blockIdx.x * int64_t{kThreads} + threadIdx.x; e < n; e += int64_t{gridDim.x} * kThreads)
    forward_vector<T, V>(p, static_cast<const T*>(a.gu), static_cast<T*>(a.h), e);
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads) silu_mul_backward_kernel(SiluMulProblem p, SiluMulBackwardArgs a) {
  const int64_t n = p.rows * p.inner / V;
  for (int64_t e = blockIdx.x * int64_t{kThreads} + threadIdx.x; e < n; e += int64_t{gridDim.x} * kThreads)
    backward_vector<T, V>(p, static_cast<const T*>(a.gu), static_cast<const T*>(a.dh), static_cast<T*>(a.dgu), e);
}

std::string check(const SiluMulProblem& p) {
  if (p.rows < 0 || p.inner < 0) return "silu-mul kernel: negative size";
  return "";
}

// 16-byte vectors where the inner width and every pointer allow them.
template <typename T>
bool vectorised(const SiluMulProblem& p, std::initializer_list<const void*> ptrs) {
  bool ok = p.inner % (16 / sizeof(T)) == 0;
  for (const void* ptr : ptrs) ok = ok && reinterpret_cast<std::uintptr_t>(ptr) % 16 == 0;
  return ok;
}

unsigned grid_for(int64_t vectors) {
  const int64_t blocks = (vectors + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < (int64_t{1} << 19) ? blocks : (int64_t{1} << 19));
}

std::string launched() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? std::string() : std::string("silu-mul kernel: ") + cudaGetErrorString(e);
}

template <typename T>
void forward_on_gpu(const SiluMulProblem& p, const SiluMulForwardArgs& a, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  if (vectorised<T>(p, {a.gu, a.h}))
    silu_mul_forward_kernel<T, V><<<grid_for(p.rows * p.inner / V), kThreads, 0, s>>>(p, a);
  else
    silu_mul_forward_kernel<T, 1><<<grid_for(p.rows * p.inner), kThreads, 0, s>>>(p, a);
}

template <typename T>
void backward_on_gpu(const SiluMulProblem& p, const SiluMulBackwardArgs& a, cudaStream_t s) {
  constexpr int V = 16 / sizeof(T);
  if (vectorised<T>(p, {a.gu, a.dh, a.dgu}))
    silu_mul_backward_kernel<T, V><<<grid_for(p.rows * p.inner / V), kThreads, 0, s>>>(p, a);
  else
    silu_mul_backward_kernel<T, 1><<<grid_for(p.rows * p.inner), kThreads, 0, s>>>(p, a);
}

}  // namespace

std::string silu_mul_forward(const SiluMulProblem& p, const SiluMulForwardArgs& a, void* stream) {
  if (auto e = check(p); !e.empty()) return e;
  if (p.rows == 0 || p.inner == 0) return "";
  const auto s = static_cast<cudaStream_t>(stream);
  p.bf16 ? forward_on_gpu<__nv_bfloat16>(p, a, s) : forward_on_gpu<float>(p, a, s);
  return launched();
}

std::string silu_mul_backward(const SiluMulProblem& p, const SiluMulBackwardArgs& a, void* stream) {
  if (auto e = check(p); !e.empty()) return e;
  if (p.rows == 0 || p.inner == 0) return "";
  const auto s = static_cast<cudaStream_t>(stream);
  p.bf16 ? backward_on_gpu<__nv_bfloat16>(p, a, s) : backward_on_gpu<float>(p, a, s);
  return launched();
}

std::string silu_mul_forward_host(const SiluMulProblem& p, const SiluMulForwardArgs& a) {
  if (auto e = check(p); !e.empty()) return e;
  if (p.bf16) return "silu-mul on the host: fp32 only";
  for (int64_t e = 0; e < p.rows * p.inner; ++e)
    forward_vector<float, 1>(p, static_cast<const float*>(a.gu), static_cast<float*>(a.h), e);
  return "";
}

std::string silu_mul_backward_host(const SiluMulProblem& p, const SiluMulBackwardArgs& a) {
  if (auto e = check(p); !e.empty()) return e;
  if (p.bf16) return "silu-mul on the host: fp32 only";
  for (int64_t e = 0; e < p.rows * p.inner; ++e)
    backward_vector<float, 1>(p, static_cast<const float*>(a.gu), static_cast<const float*>(a.dh),
                              static_cast<float*>(a.dgu), e);
  return "";
}

}  // namespace memlab::kernels
