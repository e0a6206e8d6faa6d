// Fused causal depthwise convolution (+ SiLU): see causal_conv.h. The per-thread work is a __host__ __device__
// function so that the CPU tests can run the very code the GPU runs.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/float_conversion.cuh"
#include "ops/short_conv/causal_conv.h"

namespace memlab::kernels {
namespace {

constexpr int kThreads = 128;

__host__ __device__ inline float sigmoid(float z) { return 1.f / (1.f + expf(-z)); }
__host__ __device__ inline int tiles_of(int T) { return (T + kConvTile - 1) / kConvTile; }
__host__ __device__ inline int64_t x_row_of(const CausalConvProblem& p) { return p.x_row ? p.x_row : p.C; }
__host__ __device__ inline bool in_sequence(int t, int T) { return t >= 0 && t < T; }
// t clamped into [0, T): a load that is always in bounds, its value discarded where t is outside.
__host__ __device__ inline int64_t clamp_step(int t, int T) { return t < 0 ? 0 : t >= T ? T - 1 : t; }

// Forward of channel c over time steps [tile * kConvTile, +kConvTile) of sequence b. Tried and slower on an H200
// (B1024 T256 C128 bf16, 0.087 ms): the tile's loads issued before the arithmetic (0.099-0.115: the registers
// they hold cut the threads an SM runs), 16-byte vectors of 8 channels per thread (0.099).
template <typename T, int K>
__host__ __device__ void forward_thread(const CausalConvProblem& p, const T* __restrict__ x,
                                        const float* __restrict__ w, T* __restrict__ y, int b, int tile, int c) {
  const int t0 = tile * kConvTile, t_end = min(p.T, t0 + kConvTile);
  const int64_t base = static_cast<int64_t>(b) * p.T * p.C + c, C = p.C;
  const int64_t xr = x_row_of(p), xbase = static_cast<int64_t>(b) * p.T * xr + c;
  float wr[K], win[K];  // win[j] = x[t - (K-1) + j]
#pragma unroll
  for (int j = 0; j < K; ++j) wr[j] = w[c * K + j];
#pragma unroll
  for (int j = 0; j < K - 1; ++j) {
    const int t = t0 - (K - 1) + j;
    win[j] = t >= 0 ? to_float(x[xbase + t * xr]) : 0.f;
  }
  for (int t = t0; t < t_end; ++t) {
    win[K - 1] = to_float(x[xbase + t * xr]);
    float z = 0.f;
#pragma unroll
    for (int j = 0; j < K; ++j) z = fmaf(wr[j], win[j], z);
    y[base + t * C] = from_float<T>(p.silu ? z * sigmoid(z) : z);
#pragma unroll
    for (int j = 0; j < K - 1; ++j) win[j] = win[j + 1];
  }
}

// Backward of the same work: dx for its steps from dz over [t, t + K) (the halo ahead is recomputed), and its
// sum of dw over its steps added to dw. All of the tile's loads go out before the arithmetic (indices clamped into
// the sequence, values zeroed after): 0.180 -> 0.130 ms with the batch slices below (H200, B1024 T256 C128 bf16).
template <typename T, int K>
__host__ __device__ void backward_thread(const CausalConvProblem& p, const T* __restrict__ x,
                                         const T* __restrict__ dy, const float* __restrict__ w, T* __restrict__ dx,
                                         float (&dw)[K], int b, int tile, int c) {
  constexpr int L = kConvTile + K - 1;  // dz at t0 .. t0 + L - 1; xv[i] = x[t0 - (K-1) + i], i < L + K - 1
  const int t0 = tile * kConvTile, n = min(kConvTile, p.T - t0);
  const int64_t base = static_cast<int64_t>(b) * p.T * p.C + c, C = p.C;
  const int64_t xr = x_row_of(p), xbase = static_cast<int64_t>(b) * p.T * xr + c;
  T raw_x[L + K - 1], raw_dy[L];
#pragma unroll
  for (int i = 0; i < L + K - 1; ++i) raw_x[i] = x[xbase + clamp_step(t0 - (K - 1) + i, p.T) * xr];
#pragma unroll
  for (int i = 0; i < L; ++i) raw_dy[i] = dy[base + clamp_step(t0 + i, p.T) * C];
  float wr[K], xv[L + K - 1], dz[L];
#pragma unroll
  for (int j = 0; j < K; ++j) wr[j] = w[c * K + j];
#pragma unroll
  for (int i = 0; i < L + K - 1; ++i) xv[i] = in_sequence(t0 - (K - 1) + i, p.T) ? to_float(raw_x[i]) : 0.f;
#pragma unroll
  for (int i = 0; i < L; ++i) {
    float d = in_sequence(t0 + i, p.T) ? to_float(raw_dy[i]) : 0.f;
    if (p.silu) {
      float z = 0.f;
#pragma unroll
      for (int j = 0; j < K; ++j) z = fmaf(wr[j], xv[i + j], z);
      const float s = sigmoid(z);
      d *= s * (1.f + z * (1.f - s));
    }
    dz[i] = d;
    if (i < n) {
#pragma unroll
      for (int j = 0; j < K; ++j) dw[j] = fmaf(d, xv[i + j], dw[j]);
    }
  }
#pragma unroll
  for (int i = 0; i < kConvTile; ++i) {  // dx[s] = Σ_j w[j] dz[s + K-1 - j]
    float g = 0.f;
#pragma unroll
    for (int j = 0; j < K; ++j) g = fmaf(wr[j], dz[i + K - 1 - j], g);
    if (i < n) dx[base + (t0 + i) * C] = from_float<T>(g);
  }
}

// Slices of the batch for the backward, each thread walking its tile over one slice's sequences and summing its
// dw: the partial sums the caller reduces are ~kTargetThreads * K floats rather than B * T * K / kConvTile (at
// B1024 T256 C128 as many bytes as x itself), while enough threads stay to fill the GPU.
constexpr int64_t kTargetThreads = int64_t{1} << 19;
__host__ __device__ inline int batch_slices(const CausalConvProblem& p) {
  if (p.slices > 0) return min(p.slices, max(p.B, 1));
  const int64_t threads_per_slice = int64_t{(p.C + kThreads - 1) / kThreads} * kThreads * tiles_of(p.T);
  const int64_t want = (kTargetThreads + threads_per_slice - 1) / threads_per_slice;
  return static_cast<int>(max(int64_t{1}, min(min(want, int64_t{p.B}), int64_t{65535})));
}

// dw partial sums of one backward thread over the sequences b = slice, slice + slices, ...
template <typename T, int K>
__host__ __device__ void backward_slice(const CausalConvProblem& p, const CausalConvBackwardArgs& a, int slice,
                                        int slices, int tile, int c) {
  float dw[K];
#pragma unroll
  for (int j = 0; j < K; ++j) dw[j] = 0.f;
  for (int b = slice; b < p.B; b += slices)
    backward_thread<T, K>(p, static_cast<const T*>(a.x), static_cast<const T*>(a.dy), a.w, static_cast<T*>(a.dx), dw,
                          b, tile, c);
  const size_t row = static_cast<size_t>(slice) * tiles_of(p.T) + tile;
#pragma unroll
  for (int j = 0; j < K; ++j) a.dw_partial[(row * p.C + c) * K + j] = dw[j];
}

template <typename T, int K>
__global__ void __launch_bounds__(kThreads) causal_conv_forward_kernel(CausalConvProblem p, CausalConvForwardArgs a) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= p.C) return;
  for (int b = blockIdx.z; b < p.B; b += gridDim.z)
    forward_thread<T, K>(p, static_cast<const T*>(a.x), a.w, static_cast<T*>(a.y), b, blockIdx.y, c);
}

// Six blocks an SM at least: the tile's inputs in registers cost threads beyond that (H200, B1024 T256 C128).
template <typename T, int K>
__global__ void __launch_bounds__(kThreads, 6) causal_conv_backward_kernel(CausalConvProblem p, CausalConvBackwardArgs a) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c < p.C) backward_slice<T, K>(p, a, blockIdx.z, gridDim.z, blockIdx.y, c);
}

struct Forward {
  static int slices(const CausalConvProblem& p) { return p.B < 65535 ? p.B : 65535; }
  template <typename T, int K>
  static void gpu(const CausalConvProblem& p, const CausalConvForwardArgs& a, dim3 grid, int threads, cudaStream_t s) {
    causal_conv_forward_kernel<T, K><<<grid, threads, 0, s>>>(p, a);
  }
  template <int K>
  static void host(const CausalConvProblem& p, const CausalConvForwardArgs& a) {
    for (int b = 0; b < p.B; ++b)
      for (int tile = 0; tile < causal_conv_tiles(p.T); ++tile)
        for (int c = 0; c < p.C; ++c)
          forward_thread<float, K>(p, static_cast<const float*>(a.x), a.w, static_cast<float*>(a.y), b, tile, c);
  }
};

struct Backward {
  template <typename T, int K>
  static void gpu(const CausalConvProblem& p, const CausalConvBackwardArgs& a, dim3 grid, int threads, cudaStream_t s) {
    causal_conv_backward_kernel<T, K><<<grid, threads, 0, s>>>(p, a);
  }
  template <int K>
  static void host(const CausalConvProblem& p, const CausalConvBackwardArgs& a) {
    const int slices = batch_slices(p);
    for (int slice = 0; slice < slices; ++slice)
      for (int tile = 0; tile < causal_conv_tiles(p.T); ++tile)
        for (int c = 0; c < p.C; ++c) backward_slice<float, K>(p, a, slice, slices, tile, c);
  }
  static int slices(const CausalConvProblem& p) { return batch_slices(p); }
};

// Calls f.template operator()<K>() for the runtime kernel size (2..kConvMaxKernel).
template <typename F>
void with_kernel_size(int K, F&& f) {
  switch (K) {
    case 2: f.template operator()<2>(); break;
    case 3: f.template operator()<3>(); break;
    case 4: f.template operator()<4>(); break;
    case 5: f.template operator()<5>(); break;
    case 6: f.template operator()<6>(); break;
    case 7: f.template operator()<7>(); break;
    case 8: f.template operator()<8>(); break;
    case 9: f.template operator()<9>(); break;
    case 10: f.template operator()<10>(); break;
    case 11: f.template operator()<11>(); break;
    case 12: f.template operator()<12>(); break;
    case 13: f.template operator()<13>(); break;
    case 14: f.template operator()<14>(); break;
    case 15: f.template operator()<15>(); break;
    case 16: f.template operator()<16>(); break;
    default: break;
  }
}

std::string check(const CausalConvProblem& p) {
  if (p.K < 2 || p.K > kConvMaxKernel) return "causal conv kernel: kernel size must be 2 to 16";
  if (p.B < 0 || p.T < 0 || p.C < 0) return "causal conv kernel: negative size";
  if (p.x_row != 0 && p.x_row < p.C) return "causal conv kernel: x's rows overlap (x_row < C)";
  return "";
}

template <typename Launch, typename Args>
struct GpuRun {
  const CausalConvProblem& p;
  const Args& a;
  dim3 grid;
  int threads;
  cudaStream_t s;
  template <int K>
  void operator()() const {
    if (p.bf16)
      Launch::template gpu<__nv_bfloat16, K>(p, a, grid, threads, s);
    else
      Launch::template gpu<float, K>(p, a, grid, threads, s);
  }
};

template <typename Launch, typename Args>
struct HostRun {
  const CausalConvProblem& p;
  const Args& a;
  template <int K>
  void operator()() const {
    Launch::template host<K>(p, a);
  }
};

template <typename Launch, typename Args>
std::string launch(const CausalConvProblem& p, const Args& a, void* stream) {
  if (auto e = check(p); !e.empty()) return e;
  if (p.B == 0 || p.T == 0 || p.C == 0) return "";
  const int threads = p.C >= kThreads ? kThreads : (p.C + 31) / 32 * 32;
  const dim3 grid((p.C + threads - 1) / threads, causal_conv_tiles(p.T), Launch::slices(p));
  with_kernel_size(p.K, GpuRun<Launch, Args>{p, a, grid, threads, static_cast<cudaStream_t>(stream)});
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? std::string() : std::string("causal conv kernel: ") + cudaGetErrorString(e);
}

template <typename Launch, typename Args>
std::string run_on_host(const CausalConvProblem& p, const Args& a) {
  if (auto e = check(p); !e.empty()) return e;
  if (p.bf16) return "causal conv on the host: fp32 only";
  with_kernel_size(p.K, HostRun<Launch, Args>{p, a});
  return "";
}

}  // namespace

int causal_conv_tiles(int T) { return tiles_of(T); }
int64_t causal_conv_partial_rows(const CausalConvProblem& p) {
  return int64_t{batch_slices(p)} * tiles_of(p.T);
}

std::string causal_conv_forward(const CausalConvProblem& p, const CausalConvForwardArgs& a, void* stream) {
  return launch<Forward>(p, a, stream);
}
std::string causal_conv_backward(const CausalConvProblem& p, const CausalConvBackwardArgs& a, void* stream) {
  return launch<Backward>(p, a, stream);
}
std::string causal_conv_forward_host(const CausalConvProblem& p, const CausalConvForwardArgs& a) {
  return run_on_host<Forward>(p, a);
}
std::string causal_conv_backward_host(const CausalConvProblem& p, const CausalConvBackwardArgs& a) {
  return run_on_host<Backward>(p, a);
}

}  // namespace memlab::kernels
