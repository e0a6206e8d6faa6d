// HQLT's vector mixing and its backward: see sigmoid_blend.h. The per-element work is a __host__ __device__
// function so that the CPU tests run the very code the GPU runs.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "ops/float_conversion.cuh"
#include "ops/vector_mix/sigmoid_blend.h"

namespace memlab::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kVector = 4;  // elements a thread moves per load: 16 bytes of fp32, 8 of bf16

// σ(z) and 1 − σ(z), each without cancellation: 1 − σ(z) for large z is σ(−z), not 1 minus a number near 1.
__host__ __device__ inline void sigmoid_pair(float z, float& g, float& h) {
  const float e = expf(-fabsf(z)), r = 1.f / (1.f + e);
  g = z >= 0.f ? r : e * r;
  h = z >= 0.f ? e * r : r;
}

template <typename T, int V>
__host__ __device__ inline Pack<T, V> load(const void* p, int64_t e) {
  return reinterpret_cast<const Pack<T, V>*>(p)[e];
}

// Vector e covers elements [e*V, e*V + V).
template <typename TA, typename TB, typename TM, int V>
__host__ __device__ void forward_vector(const SigmoidBlendForwardArgs& x, int64_t e) {
  const auto a = load<TA, V>(x.a, e);
  const auto b = load<TB, V>(x.b, e);
  const auto m = load<TM, V>(x.m, e);
  Pack<float, V> o;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    float g, h;
    sigmoid_pair(to_float(m.x[i]), g, h);
    o.x[i] = g * to_float(a.x[i]) + h * to_float(b.x[i]);
  }
  reinterpret_cast<Pack<float, V>*>(x.o)[e] = o;
}

template <typename TA, typename TB, typename TM, int V>
__host__ __device__ void backward_vector(const SigmoidBlendBackwardArgs& x, int64_t e) {
  const auto a = load<TA, V>(x.a, e);
  const auto b = load<TB, V>(x.b, e);
  const auto m = load<TM, V>(x.m, e);
  const auto d = load<float, V>(x.d_o, e);
  Pack<TA, V> da;
  Pack<TB, V> db;
  Pack<TM, V> dm;
#pragma unroll
  for (int i = 0; i < V; ++i) {
    float g, h;
    sigmoid_pair(to_float(m.x[i]), g, h);
    const float dy = d.x[i];
    da.x[i] = from_float<TA>(g * dy);
    db.x[i] = from_float<TB>(h * dy);
    dm.x[i] = from_float<TM>(dy * (to_float(a.x[i]) - to_float(b.x[i])) * g * h);
  }
  reinterpret_cast<Pack<TA, V>*>(x.da)[e] = da;
  reinterpret_cast<Pack<TB, V>*>(x.db)[e] = db;
  reinterpret_cast<Pack<TM, V>*>(x.dm)[e] = dm;
}

template <typename TA, typename TB, typename TM, int V>
__global__ void __launch_bounds__(kThreads) forward_kernel(int64_t vectors, SigmoidBlendForwardArgs x) {
  for (int64_t e = blockIdx.x * int64_t{kThreads} + threadIdx.x; e < vectors; e += int64_t{gridDim.x} * kThreads)
    forward_vector<TA, TB, TM, V>(x, e);
}

template <typename TA, typename TB, typename TM, int V>
__global__ void __launch_bounds__(kThreads) backward_kernel(int64_t vectors, SigmoidBlendBackwardArgs x) {
  for (int64_t e = blockIdx.x * int64_t{kThreads} + threadIdx.x; e < vectors; e += int64_t{gridDim.x} * kThreads)
    backward_vector<TA, TB, TM, V>(x, e);
}

unsigned grid_for(int64_t vectors) {
  const int64_t blocks = (vectors + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < (int64_t{1} << 19) ? blocks : (int64_t{1} << 19));
}

// Whole vectors where n and every pointer allow them: each pointer aligned to its vector's bytes.
bool vectorised(int64_t n, std::initializer_list<std::pair<const void*, bool>> ptrs) {
  bool ok = n % kVector == 0;
  for (auto [ptr, bf16] : ptrs)
    ok = ok && reinterpret_cast<std::uintptr_t>(ptr) % (kVector * (bf16 ? 2 : 4)) == 0;
  return ok;
}

template <typename TA, typename TB, typename TM>
void launch(const SigmoidBlendProblem& p, const SigmoidBlendForwardArgs& x, cudaStream_t s) {
  if (vectorised(p.n, {{x.a, p.a_bf16}, {x.b, p.b_bf16}, {x.m, p.m_bf16}, {x.o, false}}))
    forward_kernel<TA, TB, TM, kVector><<<grid_for(p.n / kVector), kThreads, 0, s>>>(p.n / kVector, x);
  else
    forward_kernel<TA, TB, TM, 1><<<grid_for(p.n), kThreads, 0, s>>>(p.n, x);
}

template <typename TA, typename TB, typename TM>
void launch(const SigmoidBlendProblem& p, const SigmoidBlendBackwardArgs& x, cudaStream_t s) {
  if (vectorised(p.n, {{x.a, p.a_bf16}, {x.b, p.b_bf16}, {x.m, p.m_bf16}, {x.d_o, false}, {x.da, p.a_bf16},
                       {x.db, p.b_bf16}, {x.dm, p.m_bf16}}))
    backward_kernel<TA, TB, TM, kVector><<<grid_for(p.n / kVector), kThreads, 0, s>>>(p.n / kVector, x);
  else
    backward_kernel<TA, TB, TM, 1><<<grid_for(p.n), kThreads, 0, s>>>(p.n, x);
}

// The eight dtype combinations of a, b, m.
template <typename Args>
void dispatch(const SigmoidBlendProblem& p, const Args& x, cudaStream_t s) {
  using F = float;
  using H = __nv_bfloat16;
  const int code = (p.a_bf16 ? 4 : 0) | (p.b_bf16 ? 2 : 0) | (p.m_bf16 ? 1 : 0);
  switch (code) {
    case 0: launch<F, F, F>(p, x, s); break;
    case 1: launch<F, F, H>(p, x, s); break;
    case 2: launch<F, H, F>(p, x, s); break;
    case 3: launch<F, H, H>(p, x, s); break;
    case 4: launch<H, F, F>(p, x, s); break;
    case 5: launch<H, F, H>(p, x, s); break;
    case 6: launch<H, H, F>(p, x, s); break;
    default: launch<H, H, H>(p, x, s); break;
  }
}

std::string check(const SigmoidBlendProblem& p) { return p.n < 0 ? "sigmoid-blend kernel: negative size" : ""; }

std::string launched() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? std::string() : std::string("sigmoid-blend kernel: ") + cudaGetErrorString(e);
}

std::string host_check(const SigmoidBlendProblem& p) {
  if (auto e = check(p); !e.empty()) return e;
  return p.a_bf16 || p.b_bf16 || p.m_bf16 ? "sigmoid-blend on the host: fp32 only" : "";
}

}  // namespace

std::string sigmoid_blend_forward(const SigmoidBlendProblem& p, const SigmoidBlendForwardArgs& a, void* stream) {
  if (auto e = check(p); !e.empty()) return e;
  if (p.n == 0) return "";
  dispatch(p, a, static_cast<cudaStream_t>(stream));
  return launched();
}

std::string sigmoid_blend_backward(const SigmoidBlendProblem& p, const SigmoidBlendBackwardArgs& a, void* stream) {
  if (auto e = check(p); !e.empty()) return e;
  if (p.n == 0) return "";
  dispatch(p, a, static_cast<cudaStream_t>(stream));
  return launched();
}

std::string sigmoid_blend_forward_host(const SigmoidBlendProblem& p, const SigmoidBlendForwardArgs& a) {
  if (auto e = host_check(p); !e.empty()) return e;
  for (int64_t e = 0; e < p.n; ++e) forward_vector<float, float, float, 1>(a, e);
  return "";
}

std::string sigmoid_blend_backward_host(const SigmoidBlendProblem& p, const SigmoidBlendBackwardArgs& a) {
  if (auto e = host_check(p); !e.empty()) return e;
  for (int64_t e = 0; e < p.n; ++e) backward_vector<float, float, float, 1>(a, e);
  return "";
}

}  // namespace memlab::kernels
