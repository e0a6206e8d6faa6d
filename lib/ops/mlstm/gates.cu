// The mLSTM's gate pre-activations, forward and backward: see gates.h.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/mlstm/gates.h"
#include "ops/tile.cuh"

namespace memlab::kernels {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int kStagedRows = 64;      // backward: rows of dg staged in shared memory at once
constexpr int kRowsInFlight = 8;     // backward: each thread's loads of 8 rows issued together
constexpr int kTargetBlocks = 1056;  // backward: 8 blocks on each of 132 SMs

template <typename E>
__device__ inline const E* part_of(const void* q, const void* k, const void* v, int part) {
  return static_cast<const E*>(part == 0 ? q : part == 1 ? k : v);
}

// 16 bytes of E as floats (8 bf16 or 4 fp32); p 16-byte aligned.
template <typename E>
struct Vec {
  static constexpr int n = 16 / sizeof(E);
  __device__ static void load(const E* p, float (&out)[n]) {
    if constexpr (sizeof(E) == 2) {
      const uint4 u = *reinterpret_cast<const uint4*>(p);
      const auto* h = reinterpret_cast<const __nv_bfloat162*>(&u);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = __bfloat1622float2(h[i]);
        out[2 * i] = f.x;
        out[2 * i + 1] = f.y;
      }
    } else {
      const float4 f = *reinterpret_cast<const float4*>(p);
      out[0] = f.x;
      out[1] = f.y;
      out[2] = f.z;
      out[3] = f.w;
    }
  }
};

// Two adjacent elements of E as floats, and back.
template <typename E>
__device__ inline float2 load2(const E* p) {
  if constexpr (sizeof(E) == 2)
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
  else
    return *reinterpret_cast<const float2*>(p);
}
template <typename E>
__device__ inline void store2(E* p, float a, float b) {
  if constexpr (sizeof(E) == 2)
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
  else
    *reinterpret_cast<float2*>(p) = make_float2(a, b);
}

// A warp's 32 sums at once: lane l ends with the sum over lanes of v[l], in 31 shuffles (a warp_sum of each would
// take 160). Each round halves the values a lane keeps: it keeps the half its lane bit selects and sends the other.
template <int N>
__device__ inline void reduce_scatter_round(float (&v)[32], int lane) {
  const bool hi = lane & N;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const float send = hi ? v[j] : v[j + N], keep = hi ? v[j + N] : v[j];
    v[j] = keep + __shfl_xor_sync(kAllLanes, send, N);
  }
}
__device__ inline float reduce_scatter(float (&v)[32], int lane) {
  reduce_scatter_round<16>(v, lane);
  reduce_scatter_round<8>(v, lane);
  reduce_scatter_round<4>(v, lane);
  reduce_scatter_round<2>(v, lane);
  reduce_scatter_round<1>(v, lane);
  return v[0];
}

// OP: O = 2H padded to a power of two; a warp takes R = 32 / OP rows, so that its R x OP sums are one per lane.
template <typename E, int OP>
__global__ void __launch_bounds__(kThreads) mlstm_gates_forward_kernel(MLstmGatesProblem p, MLstmGatesForwardArgs a) {
  constexpr int R = 32 / OP, V = Vec<E>::n;
  const int lane = threadIdx.x & 31, O = 2 * p.H, C = 3 * p.I;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32) * R;
  if (row0 >= p.rows) return;
  float acc[R * OP];
#pragma unroll
  for (int j = 0; j < R * OP; ++j) acc[j] = 0.f;
  for (int part = 0; part < 3; ++part) {
    const E* x = part_of<E>(a.q, a.k, a.v, part);
    for (int c = lane * V; c < p.I; c += 32 * V) {
      float xv[R][V];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (row0 + r < p.rows) {
          Vec<E>::load(x + (row0 + r) * p.I + c, xv[r]);
        } else {
#pragma unroll
          for (int e = 0; e < V; ++e) xv[r][e] = 0.f;
        }
      }
      const float* w = a.W + part * p.I + c;
#pragma unroll
      for (int o = 0; o < OP; ++o) {
        if (o >= O) break;
        float wv[V];
        Vec<float>::load(w + o * C, *reinterpret_cast<float(*)[4]>(wv));
        if constexpr (V == 8) Vec<float>::load(w + o * C + 4, *reinterpret_cast<float(*)[4]>(wv + 4));
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int e = 0; e < V; ++e) acc[r * OP + o] = fmaf(xv[r][e], wv[e], acc[r * OP + o]);
      }
    }
  }
  const float g = reduce_scatter(acc, lane);  // lane = r OP + o
  const int r = lane / OP, o = lane % OP;
  if (o < O && row0 + r < p.rows) {
    if (o < p.H)
      a.ig[(row0 + r) * p.H + o] = g + a.b[o];
    else
      a.fg[(row0 + r) * p.H + o - p.H] = g + a.b[o];
  }
}

// A thread per pair of columns over a slice of rows; block x's first O threads also sum dg for the bias.
template <typename E, int OP>
__global__ void __launch_bounds__(kThreads) mlstm_gates_backward_kernel(MLstmGatesProblem p, MLstmGatesBackwardArgs a) {
  __shared__ float sg[kStagedRows][OP];
  const int O = 2 * p.H, C = 3 * p.I;
  const int col = 2 * (blockIdx.x * kThreads + threadIdx.x);  // the first of its two of the 3I columns
  const bool in = col < C, bias = blockIdx.x == 0 && threadIdx.x < O;  // bias: db[threadIdx.x]
  const int part = in ? col / p.I : 0, i = in ? col % p.I : 0;
  const E* x = part_of<E>(a.q, a.k, a.v, part);
  E* dx = static_cast<E*>(part == 0 ? a.dq : part == 1 ? a.dk : a.dv);
  float w0[OP], w1[OP], acc0[OP], acc1[OP], db = 0.f;
#pragma unroll
  for (int o = 0; o < OP; ++o) {
    const bool ok = in && o < O;
    w0[o] = ok ? a.W[o * C + col] : 0.f;
    w1[o] = ok ? a.W[o * C + col + 1] : 0.f;
    acc0[o] = acc1[o] = 0.f;
  }
  const int64_t per = (p.rows + gridDim.y - 1) / gridDim.y, begin = blockIdx.y * per;
  const int64_t end = begin + per < p.rows ? begin + per : p.rows;
  for (int64_t r0 = begin; r0 < end; r0 += kStagedRows) {
    const int n = static_cast<int>(end - r0 < kStagedRows ? end - r0 : kStagedRows);
    __syncthreads();  // the previous rows' reads are done
    for (int idx = threadIdx.x; idx < kStagedRows * OP; idx += kThreads) {
      const int rr = idx / OP, o = idx % OP;
      float g = 0.f;
      if (rr < n && o < O) g = o < p.H ? a.dig[(r0 + rr) * p.H + o] : a.dfg[(r0 + rr) * p.H + o - p.H];
      sg[rr][o] = g;
    }
    __syncthreads();
    if (bias)
      for (int rr = 0; rr < n; ++rr) db += sg[rr][threadIdx.x];
    if (!in) continue;
    for (int rb = 0; rb < n; rb += kRowsInFlight) {
      float2 xv[kRowsInFlight];
#pragma unroll
      for (int u = 0; u < kRowsInFlight; ++u)
        xv[u] = rb + u < n ? load2(x + (r0 + rb + u) * p.I + i) : make_float2(0.f, 0.f);
#pragma unroll
      for (int u = 0; u < kRowsInFlight; ++u) {
        if (rb + u >= n) break;
        float d0 = 0.f, d1 = 0.f;
#pragma unroll
        for (int o = 0; o < OP; ++o) {
          const float g = sg[rb + u][o];
          d0 = fmaf(g, w0[o], d0);
          d1 = fmaf(g, w1[o], d1);
          acc0[o] = fmaf(g, xv[u].x, acc0[o]);
          acc1[o] = fmaf(g, xv[u].y, acc1[o]);
        }
        store2(dx + (r0 + rb + u) * p.I + i, d0, d1);
      }
    }
  }
  float* out = a.dW_partial + static_cast<int64_t>(blockIdx.y) * O * (C + 1);  // [O, 3I + 1]: dW, then db
  if (bias) out[threadIdx.x * (C + 1) + C] = db;
#pragma unroll
  for (int o = 0; o < OP; ++o) {
    if (o >= O || !in) break;
    out[o * (C + 1) + col] = acc0[o];
    out[o * (C + 1) + col + 1] = acc1[o];
  }
}

std::string check(const MLstmGatesProblem& p) {
  if (p.rows < 0 || p.I < 0 || p.H < 0) return "mLSTM gates kernel: negative size";
  if (2 * p.H > kMLstmGatesMax)
    return "mLSTM gates kernel: more than " + std::to_string(kMLstmGatesMax / 2) + " heads";
  if (p.I % kMLstmGatesWidthMultiple) return "mLSTM gates kernel: the width is not a multiple of 8";
  return "";
}

int column_tiles(const MLstmGatesProblem& p) { return (3 * p.I + 2 * kThreads - 1) / (2 * kThreads); }

template <int OP>
std::string forward_for(const MLstmGatesProblem& p, const MLstmGatesForwardArgs& a, cudaStream_t s) {
  const int64_t per_block = int64_t{kWarps} * (32 / OP);
  const int blocks = static_cast<int>((p.rows + per_block - 1) / per_block);
  if (p.bf16)
    mlstm_gates_forward_kernel<__nv_bfloat16, OP><<<blocks, kThreads, 0, s>>>(p, a);
  else
    mlstm_gates_forward_kernel<float, OP><<<blocks, kThreads, 0, s>>>(p, a);
  return launch_error("mLSTM gates");
}

template <int OP>
std::string backward_for(const MLstmGatesProblem& p, const MLstmGatesBackwardArgs& a, cudaStream_t s) {
  const dim3 grid(column_tiles(p), mlstm_gates_slices(p));
  if (p.bf16)
    mlstm_gates_backward_kernel<__nv_bfloat16, OP><<<grid, kThreads, 0, s>>>(p, a);
  else
    mlstm_gates_backward_kernel<float, OP><<<grid, kThreads, 0, s>>>(p, a);
  return launch_error("mLSTM gates");
}

// O = 2H rounded up to a power of two (at least 2).
int padded_gates(const MLstmGatesProblem& p) {
  const int O = 2 * p.H;
  return O <= 2 ? 2 : O <= 4 ? 4 : O <= 8 ? 8 : O <= 16 ? 16 : 32;
}

}  // namespace

int mlstm_gates_slices(const MLstmGatesProblem& p) {
  const int64_t want = (kTargetBlocks + column_tiles(p) - 1) / column_tiles(p);
  const int64_t most = (p.rows + kStagedRows - 1) / kStagedRows;  // at least a staged tile of rows a slice
  const int64_t s = want < most ? want : most;
  return static_cast<int>(s > 0 ? s : 1);
}

std::string mlstm_gates_forward(const MLstmGatesProblem& p, const MLstmGatesForwardArgs& a, void* stream) {
  if (auto e = check(p); !e.empty()) return e;
  if (p.rows == 0 || p.H == 0) return "";
  auto s = static_cast<cudaStream_t>(stream);
  switch (padded_gates(p)) {
    case 2: return forward_for<2>(p, a, s);
    case 4: return forward_for<4>(p, a, s);
    case 8: return forward_for<8>(p, a, s);
    case 16: return forward_for<16>(p, a, s);
    default: return forward_for<32>(p, a, s);
  }
}

std::string mlstm_gates_backward(const MLstmGatesProblem& p, const MLstmGatesBackwardArgs& a, void* stream) {
  if (auto e = check(p); !e.empty()) return e;
  if (p.rows == 0 || p.H == 0 || p.I == 0) return "";
  auto s = static_cast<cudaStream_t>(stream);
  switch (padded_gates(p)) {
    case 2: return backward_for<2>(p, a, s);
    case 4: return backward_for<4>(p, a, s);
    case 8: return backward_for<8>(p, a, s);
    case 16: return backward_for<16>(p, a, s);
    default: return backward_for<32>(p, a, s);
  }
}

}  // namespace memlab::kernels
