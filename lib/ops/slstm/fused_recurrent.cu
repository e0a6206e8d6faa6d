// The sLSTM recurrence, forward and backward, each one launch over all time steps: see fused_recurrent.h.
// A thread's work between two barriers is a __host__ __device__ function, so that the CPU tests run the very
// arithmetic the GPU runs.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/slstm/fused_recurrent.h"

namespace memlab::kernels {
namespace {

constexpr int kMaxThreads = 256;

struct Cell {
  float c = 0.f, n = 0.f, m = 0.f;
};

__host__ __device__ inline float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
__host__ __device__ inline float log_sigmoid(float x) { return fminf(x, 0.f) - log1pf(expf(-fabsf(x))); }

// Unit j's four gate pre-activations: pre (its row of the input part) + Σ_k h_prev[k] R[k, g dh + j].
// Consecutive threads take consecutive units, so R's reads are conflict-free and h_prev's a broadcast.
template <int DH>
__host__ __device__ inline void gate_inputs(const float* pre_row, const float* R, const float* h_prev, int dh, int j,
                                            float g[4]) {
  const int n = DH ? DH : dh, G = 4 * n;
  for (int q = 0; q < 4; ++q) g[q] = pre_row[q * n + j];
#ifdef __CUDA_ARCH__
#pragma unroll 16
#endif
  for (int k = 0; k < n; ++k) {
    const float x = h_prev[k];
    const float* r = R + k * G + j;
    g[0] += x * r[0];
    g[1] += x * r[n];
    g[2] += x * r[2 * n];
    g[3] += x * r[3 * n];
  }
}

// One step of one unit's cell (slstm.h's equations, the zero-state rule per unit); returns h_t.
__host__ __device__ inline float cell_forward(const float g[4], Cell& s) {
  const float a = log_sigmoid(g[1]) + s.m;
  const float m = s.n == 0.f ? g[0] : fmaxf(g[0], a);
  const float ip = expf(g[0] - m), fp = expf(a - m);
  s.c = fp * s.c + ip * tanhf(g[2]);
  s.n = fp * s.n + ip;
  s.m = m;
  return sigmoid(g[3]) * s.c / s.n;
}

// The same step backwards: dh is h_t's whole gradient; dc, dn carry c_t's and n_t's in and c_{t-1}'s and
// n_{t-1}'s out; d gets the gate pre-activations' gradients. m is a constant here (fused_recurrent.h).
__host__ __device__ inline void cell_backward(const float g[4], const Cell& s, const Cell& prev, float dh, float& dc,
                                              float& dn, float d[4]) {
  const float o = sigmoid(g[3]), z = tanhf(g[2]);
  const float ip = expf(g[0] - s.m), fp = expf(log_sigmoid(g[1]) + prev.m - s.m);
  const float r = s.c / s.n;
  dc += dh * o / s.n;
  dn -= dh * o * r / s.n;
  d[3] = dh * r * o * (1.f - o);
  d[2] = dc * ip * (1.f - z * z);
  d[0] = (dc * z + dn) * ip;
  d[1] = (dc * prev.c + dn * prev.n) * fp * sigmoid(-g[1]);
  dc *= fp;
  dn *= fp;
}

// The recurrent part of dh_{t-1}[k]: Σ_e R[k, e] dpre_t[e], from Rᵀ [4 dh, dh] (conflict-free over k).
template <int DH>
__host__ __device__ inline float recurrent_grad(const float* Rt, const float* dpre, int dh, int k) {
  const int n = DH ? DH : dh;
  float s = 0.f;
#ifdef __CUDA_ARCH__
#pragma unroll 16
#endif
  for (int e = 0; e < 4 * n; ++e) s += Rt[e * n + k] * dpre[e];
  return s;
}

__host__ __device__ inline int64_t state_at(const SLstmProblem& p, int b, int h, int j) {
  return (int64_t{b} * p.H + h) * p.dh + j;
}
__host__ __device__ inline int64_t row_at(const SLstmProblem& p, int b, int t, int h) {
  return (int64_t{b} * p.T + t) * p.H + h;
}

__host__ __device__ inline Cell initial_cell(const float* c0, const float* n0, const float* m0, int64_t at) {
  return c0 ? Cell{c0[at], n0[at], m0[at]} : Cell{};
}
__host__ __device__ inline Cell stored_cell(const float* cells, int64_t row, int dh, int j) {
  return {cells[row * 3 * dh + j], cells[row * 3 * dh + dh + j], cells[row * 3 * dh + 2 * dh + j]};
}

// Thread (b, unit j) of head h at step t, forward: reads pre and h_{t-1}, stores what the caller asked for (h,
// gates, cells) and returns h_t. R is R_h [dh, 4dh].
template <int DH>
__host__ __device__ inline float forward_step(const SLstmProblem& p, const SLstmForwardArgs& a, const float* R,
                                              const float* h_prev, int b, int t, int h, int j, Cell& s) {
  const int dh = DH ? DH : p.dh, G = 4 * dh;
  const int64_t row = row_at(p, b, t, h);
  float g[4];
  gate_inputs<DH>(a.pre + row * G, R, h_prev, dh, j, g);
  if (a.gates)
    for (int q = 0; q < 4; ++q) a.gates[row * G + q * dh + j] = g[q];
  const float hv = cell_forward(g, s);
  if (a.h) a.h[row * dh + j] = hv;
  if (a.cells) {
    a.cells[row * 3 * dh + j] = s.c;
    a.cells[row * 3 * dh + dh + j] = s.n;
    a.cells[row * 3 * dh + 2 * dh + j] = s.m;
  }
  return hv;
}

__host__ __device__ inline void store_final(const SLstmForwardArgs& a, int64_t at, float h, const Cell& s) {
  if (a.hT) a.hT[at] = h;
  if (a.cT) {
    a.cT[at] = s.c;
    a.nT[at] = s.n;
    a.mT[at] = s.m;
  }
}

// Thread (b, unit j) of head h at step t, backward: dhr is the recurrent part of h_t's gradient, dc and dn the
// carries; writes dpre_t's four entries to a.dpre and d.
template <int DH>
__host__ __device__ inline void backward_step(const SLstmProblem& p, const SLstmBackwardArgs& a, const Cell& init,
                                              int b, int t, int h, int j, float dhr, float& dc, float& dn, float d[4]) {
  const int dh = DH ? DH : p.dh, G = 4 * dh;
  const int64_t row = row_at(p, b, t, h);
  float g[4];
  for (int q = 0; q < 4; ++q) g[q] = a.gates[row * G + q * dh + j];
  const Cell prev = t > 0 ? stored_cell(a.cells, row - p.H, dh, j) : init;
  cell_backward(g, stored_cell(a.cells, row, dh, j), prev, a.dh[row * dh + j] + dhr, dc, dn, d);
  for (int q = 0; q < 4; ++q) a.dpre[row * G + q * dh + j] = d[q];
}

__host__ __device__ inline void store_initial_grads(const SLstmBackwardArgs& a, int64_t at, float dhr, float dc,
                                                    float dn, const Cell& init) {
  if (a.dh0) a.dh0[at] = dhr;
  if (a.dc0) {
    a.dc0[at] = dc;
    a.dn0[at] = dn;
    a.dm0[at] = dc * init.c + dn * init.n;  // (c0, n0, m0) enter only as (c0 e^m0, n0 e^m0)
  }
}

// Block (head h, batch rows [y NB, y NB + NB)); thread (row, unit j). Shared: R_h [dh, 4dh], h_{t-1} twice.
template <int DH>
__global__ void __launch_bounds__(kMaxThreads) slstm_forward_kernel(SLstmProblem p, SLstmForwardArgs a, int rows) {
  extern __shared__ float smem[];
  const int dh = DH ? DH : p.dh, G = 4 * dh, h = blockIdx.x;
  float* sR = smem;
  float* sH = sR + dh * G;  // [2][rows][dh]
  const int bl = threadIdx.x / dh, j = threadIdx.x % dh, b = blockIdx.y * rows + bl;
  const bool valid = b < p.B;
  for (int e = threadIdx.x; e < dh * G; e += blockDim.x) sR[e] = a.R[int64_t{h} * dh * G + e];
  const int64_t at = valid ? state_at(p, b, h, j) : 0;
  Cell s = valid ? initial_cell(a.c0, a.n0, a.m0, at) : Cell{};
  float hv = valid && a.h0 ? a.h0[at] : 0.f;
  sH[bl * dh + j] = hv;
  __syncthreads();
  for (int t = 0; t < p.T; ++t) {
    if (valid) hv = forward_step<DH>(p, a, sR, sH + (t & 1) * rows * dh + bl * dh, b, t, h, j, s);
    sH[((t + 1) & 1) * rows * dh + bl * dh + j] = hv;
    __syncthreads();
  }
  if (valid) store_final(a, at, hv, s);
}

// Block and thread as the forward's. Shared: Rᵀ [4dh, dh], dpre_t twice [2][rows][4dh].
template <int DH>
__global__ void __launch_bounds__(kMaxThreads) slstm_backward_kernel(SLstmProblem p, SLstmBackwardArgs a, int rows) {
  extern __shared__ float smem[];
  const int dh = DH ? DH : p.dh, G = 4 * dh, h = blockIdx.x;
  float* sRt = smem;
  float* sD = sRt + dh * G;
  const int bl = threadIdx.x / dh, j = threadIdx.x % dh, b = blockIdx.y * rows + bl;
  const bool valid = b < p.B;
  for (int e = threadIdx.x; e < dh * G; e += blockDim.x) sRt[(e % G) * dh + e / G] = a.R[int64_t{h} * dh * G + e];
  const int64_t at = valid ? state_at(p, b, h, j) : 0;
  float dc = valid && a.dcT ? a.dcT[at] : 0.f, dn = valid && a.dnT ? a.dnT[at] : 0.f;
  float dhr = valid && a.dhT ? a.dhT[at] : 0.f;  // the recurrent part of h_t's gradient
  const Cell init = valid ? initial_cell(a.c0, a.n0, a.m0, at) : Cell{};
  __syncthreads();
  for (int t = p.T - 1; t >= 0; --t) {
    float* d_row = sD + (t & 1) * rows * G + bl * G;
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    if (valid) backward_step<DH>(p, a, init, b, t, h, j, dhr, dc, dn, d);
    for (int q = 0; q < 4; ++q) d_row[q * dh + j] = d[q];
    __syncthreads();
    dhr = recurrent_grad<DH>(sRt, d_row, dh, j);
  }
  if (valid) store_initial_grads(a, at, dhr, dc, dn, init);
}

std::string check(const SLstmProblem& p) {
  if (p.B < 0 || p.T < 0 || p.H < 0) return "sLSTM kernel: negative size";
  if (p.dh < 1 || p.dh > kSLstmMaxHeadDim)
    return "sLSTM kernel: head dim " + std::to_string(p.dh) + " outside 1.." + std::to_string(kSLstmMaxHeadDim);
  return "";
}

std::string launched() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? std::string() : std::string("sLSTM kernel: ") + cudaGetErrorString(e);
}

// The current device's SM count, asked once per device (every launch needs it).
int multiprocessors() {
  constexpr int kDevices = 64;
  static int count[kDevices] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 132;
  if (dev >= kDevices) dev = kDevices - 1;
  if (count[dev] == 0 && cudaDeviceGetAttribute(&count[dev], cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    count[dev] = 132;
  return count[dev];
}

// Batch rows per block: as many as 256 threads hold, halved while that leaves fewer than two blocks per SM
// (the walk over time is latency-bound, so more, smaller blocks run it sooner).
int rows_per_block(const SLstmProblem& p) {
  int rows = kMaxThreads / p.dh;
  rows = rows < p.B ? rows : (p.B > 0 ? p.B : 1);
  const int64_t want = 2 * int64_t{multiprocessors()};
  while (rows > 1 && int64_t{p.H} * ((p.B + rows - 1) / rows) < want) rows /= 2;
  return rows;
}

template <typename Kernel, typename Args>
std::string launch(Kernel kernel, const SLstmProblem& p, const Args& a, size_t shared_floats, void* stream) {
  const int rows = rows_per_block(p);
  const size_t bytes = (size_t{4} * p.dh * p.dh + shared_floats * rows) * sizeof(float);
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)) != cudaSuccess)
    return launched();
  const dim3 grid(p.H, (p.B + rows - 1) / rows);
  kernel<<<grid, rows * p.dh, bytes, static_cast<cudaStream_t>(stream)>>>(p, a, rows);
  return launched();
}

}  // namespace

std::string slstm_forward(const SLstmProblem& p, const SLstmForwardArgs& a, void* stream) {
  if (auto e = check(p); !e.empty()) return e;
  if (p.B == 0 || p.H == 0) return "";
  const size_t per_row = 2 * size_t(p.dh);  // h_{t-1}, double-buffered
  switch (p.dh) {
    case 16: return launch(slstm_forward_kernel<16>, p, a, per_row, stream);
    case 32: return launch(slstm_forward_kernel<32>, p, a, per_row, stream);
    case 64: return launch(slstm_forward_kernel<64>, p, a, per_row, stream);
    default: return launch(slstm_forward_kernel<0>, p, a, per_row, stream);
  }
}

std::string slstm_backward(const SLstmProblem& p, const SLstmBackwardArgs& a, void* stream) {
  if (auto e = check(p); !e.empty()) return e;
  if (p.B == 0 || p.H == 0) return "";
  const size_t per_row = 8 * size_t(p.dh);  // dpre_t, double-buffered
  switch (p.dh) {
    case 16: return launch(slstm_backward_kernel<16>, p, a, per_row, stream);
    case 32: return launch(slstm_backward_kernel<32>, p, a, per_row, stream);
    case 64: return launch(slstm_backward_kernel<64>, p, a, per_row, stream);
    default: return launch(slstm_backward_kernel<0>, p, a, per_row, stream);
  }
}

std::string slstm_forward_host(const SLstmProblem& p, const SLstmForwardArgs& a) {
  if (auto e = check(p); !e.empty()) return e;
  const int dh = p.dh, G = 4 * dh;
  std::vector<float> h_prev(dh), h_next(dh);
  std::vector<Cell> s(dh);
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h) {
      const float* R = a.R + int64_t{h} * dh * G;
      for (int j = 0; j < dh; ++j) {
        s[j] = initial_cell(a.c0, a.n0, a.m0, state_at(p, b, h, j));
        h_prev[j] = a.h0 ? a.h0[state_at(p, b, h, j)] : 0.f;
      }
      for (int t = 0; t < p.T; ++t) {
        for (int j = 0; j < dh; ++j)  // the threads between two barriers
          h_next[j] = forward_step<0>(p, a, R, h_prev.data(), b, t, h, j, s[j]);
        h_prev.swap(h_next);
      }
      for (int j = 0; j < dh; ++j) store_final(a, state_at(p, b, h, j), h_prev[j], s[j]);
    }
  return "";
}

std::string slstm_backward_host(const SLstmProblem& p, const SLstmBackwardArgs& a) {
  if (auto e = check(p); !e.empty()) return e;
  const int dh = p.dh, G = 4 * dh;
  std::vector<float> Rt(size_t(G) * dh), d(G), dc(dh), dn(dh), dhr(dh);
  for (int b = 0; b < p.B; ++b)
    for (int h = 0; h < p.H; ++h) {
      for (int e = 0; e < dh * G; ++e) Rt[(e % G) * dh + e / G] = a.R[int64_t{h} * dh * G + e];
      for (int j = 0; j < dh; ++j) {
        const int64_t at = state_at(p, b, h, j);
        dc[j] = a.dcT ? a.dcT[at] : 0.f;
        dn[j] = a.dnT ? a.dnT[at] : 0.f;
        dhr[j] = a.dhT ? a.dhT[at] : 0.f;
      }
      for (int t = p.T - 1; t >= 0; --t) {
        for (int j = 0; j < dh; ++j) {
          const Cell init = initial_cell(a.c0, a.n0, a.m0, state_at(p, b, h, j));
          float dj[4];
          backward_step<0>(p, a, init, b, t, h, j, dhr[j], dc[j], dn[j], dj);
          for (int q = 0; q < 4; ++q) d[q * dh + j] = dj[q];
        }
        for (int j = 0; j < dh; ++j) dhr[j] = recurrent_grad<0>(Rt.data(), d.data(), dh, j);
      }
      for (int j = 0; j < dh; ++j) {
        const int64_t at = state_at(p, b, h, j);
        store_initial_grads(a, at, dhr[j], dc[j], dn[j], initial_cell(a.c0, a.n0, a.m0, at));
      }
    }
  return "";
}

}  // namespace memlab::kernels
