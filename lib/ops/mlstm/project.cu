// The mLSTM layer's input side, forward and backward: the gates, and the whole projection. See project.h.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "ops/cp_async.cuh"
#include "ops/mlstm/project.h"
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

// x as E would hold it.
template <typename E>
__device__ inline float rounded(float x) {
  if constexpr (sizeof(E) == 2)
    return __bfloat162float(__float2bfloat16_rn(x));
  else
    return x;
}

// Four adjacent elements of E as floats, and back (8- or 16-byte aligned).
template <typename E>
__device__ inline void load4(const E* p, float (&out)[4]) {
  if constexpr (sizeof(E) == 2) {
    const uint2 u = *reinterpret_cast<const uint2*>(p);
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
    out[0] = a.x;
    out[1] = a.y;
    out[2] = b.x;
    out[3] = b.y;
  } else {
    const float4 f = *reinterpret_cast<const float4*>(p);
    out[0] = f.x;
    out[1] = f.y;
    out[2] = f.z;
    out[3] = f.w;
  }
}
template <typename E>
__device__ inline void store4(E* p, const float (&in)[4]) {
  if constexpr (sizeof(E) == 2) {
    uint2 u;
    *reinterpret_cast<__nv_bfloat162*>(&u.x) = __floats2bfloat162_rn(in[0], in[1]);
    *reinterpret_cast<__nv_bfloat162*>(&u.y) = __floats2bfloat162_rn(in[2], in[3]);
    *reinterpret_cast<uint2*>(p) = u;
  } else {
    *reinterpret_cast<float4*>(p) = make_float4(in[0], in[1], in[2], in[3]);
  }
}

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

// The warp's R x OP gate sums, one per lane after the reduce-scatter (lane = r OP + o), plus the bias, stored.
template <int OP>
__device__ inline void store_gates(float (&acc)[32], int lane, int64_t row0, int64_t rows, int H, const float* b,
                                   float* ig, float* fg) {
  const float g = reduce_scatter(acc, lane);
  const int r = lane / OP, o = lane % OP;
  if (o < 2 * H && row0 + r < rows) {
    if (o < H)
      ig[(row0 + r) * H + o] = g + b[o];
    else
      fg[(row0 + r) * H + o - H] = g + b[o];
  }
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
  store_gates<OP>(acc, lane, row0, p.rows, p.H, a.b, a.ig, a.fg);
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

// f(std::integral_constant<int, OP>{}) with OP = 2H rounded up to a power of two (at least 2); MAX_OP is the
// largest the kernel was built for.
template <int MAX_OP, typename F>
std::string with_padded_gates(const MLstmGatesProblem& p, F&& f) {
  const int O = 2 * p.H;
  if (O <= 2) return f(std::integral_constant<int, 2>{});
  if (O <= 4) return f(std::integral_constant<int, 4>{});
  if (O <= 8) return f(std::integral_constant<int, 8>{});
  if constexpr (MAX_OP > 16) {
    if (O > 16) return f(std::integral_constant<int, 32>{});
  }
  return f(std::integral_constant<int, 16>{});
}

// Row slices of a backward over `tiles` column tiles: about kTargetBlocks blocks, at least a staged tile of rows each.
int slices_for(int64_t rows, int tiles) {
  tiles = tiles > 0 ? tiles : 1;
  const int64_t want = (kTargetBlocks + tiles - 1) / tiles, most = (rows + kStagedRows - 1) / kStagedRows;
  const int64_t s = want < most ? want : most;
  return static_cast<int>(s > 0 ? s : 1);
}

// ---- The whole projection ----

constexpr int kBS = kMLstmProjectBlock;
constexpr int kProjectBackThreads = 192;  // 64 blocks of q, k and v: one tile at the xLSTM configs' I = 256

// Four adjacent elements of E as they lie in memory (8 or 16 bytes), and as floats.
template <typename E>
using Four = std::conditional_t<sizeof(E) == 2, uint2, uint4>;
template <typename E>
__device__ inline void unpack4(const Four<E>& u, float (&out)[4]) {
  if constexpr (sizeof(E) == 2) {
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
    out[0] = a.x;
    out[1] = a.y;
    out[2] = b.x;
    out[3] = b.y;
  } else {
    out[0] = __uint_as_float(u.x);
    out[1] = __uint_as_float(u.y);
    out[2] = __uint_as_float(u.z);
    out[3] = __uint_as_float(u.w);
  }
}
template <typename E>
__device__ inline void copy4_async(Four<E>* dst, const E* src) {
  if constexpr (sizeof(E) == 2)
    cp_async8(dst, src);
  else
    cp_async16(reinterpret_cast<float*>(dst), reinterpret_cast<const float*>(src));
}

// Forward. A warp takes R = 32 / OP rows at a time; lane l takes the blocks l, l + 32, ... of each of q, k, v: its
// 4 columns of c and x, the block's weights from shared memory (stored entry-major, so that a warp's reads are
// consecutive words), the gate weights' 4 columns from global memory (L1). Blocks stride over the row groups, so
// the weights are staged once per block.
template <typename E, int OP>
__global__ void __launch_bounds__(kThreads) mlstm_project_forward_kernel(MLstmProjectProblem p,
                                                                         MLstmProjectForwardArgs a) {
  constexpr int R = 32 / OP, kW = kBS * kBS;
  extern __shared__ float sW[];  // [3][16][I / 4]: part, entry (i, j), block
  const int lane = threadIdx.x & 31, nb = p.I / kBS, O = 2 * p.H, C = 3 * p.I;
  for (int idx = threadIdx.x; idx < 3 * kW * nb; idx += kThreads) {  // read in W's order, written transposed
    const int part = idx / (kW * nb), b = idx / kW % nb, e = idx % kW;
    const float* W = part == 0 ? a.Wq : part == 1 ? a.Wk : a.Wv;
    sW[(part * kW + e) * nb + b] = W[b * kW + e];
  }
  __syncthreads();
  const E* c = static_cast<const E*>(a.c);
  const E* x = static_cast<const E*>(a.x);
  const int64_t groups = (p.rows + R - 1) / R;
  for (int64_t grp = int64_t{blockIdx.x} * kWarps + threadIdx.x / 32; grp < groups; grp += int64_t{gridDim.x} * kWarps) {
    const int64_t row0 = grp * R;
    float acc[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) acc[j] = 0.f;
    for (int b = lane; b < nb; b += 32) {
      const int col = b * kBS;
      float cv[R][kBS], xv[R][kBS];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const bool ok = row0 + r < p.rows;
        if (ok) {
          load4(c + (row0 + r) * p.I + col, cv[r]);
          load4(x + (row0 + r) * p.I + col, xv[r]);
        }
#pragma unroll
        for (int j = 0; j < kBS; ++j)
          if (!ok) cv[r][j] = xv[r][j] = 0.f;
      }
#pragma unroll
      for (int part = 0; part < 3; ++part) {
        float w[kW];
#pragma unroll
        for (int e = 0; e < kW; ++e) w[e] = sW[(part * kW + e) * nb + b];
        E* out = static_cast<E*>(part == 0 ? a.q : part == 1 ? a.k : a.v);
        float y[R][kBS];
#pragma unroll
        for (int r = 0; r < R; ++r) {
#pragma unroll
          for (int i = 0; i < kBS; ++i) {
            float s = 0.f;
#pragma unroll
            for (int j = 0; j < kBS; ++j) s = fmaf(w[i * kBS + j], part == 2 ? xv[r][j] : cv[r][j], s);
            y[r][i] = rounded<E>(s);
          }
          if (row0 + r < p.rows) store4(out + (row0 + r) * p.I + col, y[r]);
        }
#pragma unroll
        for (int o = 0; o < OP; ++o) {
          if (o >= O) break;
          const float4 wv = *reinterpret_cast<const float4*>(a.Wg + o * C + part * p.I + col);
#pragma unroll
          for (int r = 0; r < R; ++r) {
            float s = acc[r * OP + o];
            s = fmaf(y[r][0], wv.x, s);
            s = fmaf(y[r][1], wv.y, s);
            s = fmaf(y[r][2], wv.z, s);
            acc[r * OP + o] = fmaf(y[r][3], wv.w, s);
          }
        }
      }
    }
    store_gates<OP>(acc, lane, row0, p.rows, p.H, a.bg, a.ig, a.fg);
  }
}

// Backward. Thread u of the 3I/4 units: u < I/2 is block u/2 of q (u even) or of k (u odd), the rest block u - I/2
// of v. Each thread streams its own 4 columns of c (or x) and of dq (dk, dv) through shared memory by cp.async,
// kDepth rows ahead of the row it works on: its slots are its own, so no barrier guards them. (Summing d xᵀ and
// g xᵀ over the rows instead, and forming the weights' gradients at the end, saves a sixth of the FMAs but ran
// 8% slower on an H200.)
template <typename E, int OP>
__global__ void __launch_bounds__(kProjectBackThreads, OP <= 8 ? 2 : 1) mlstm_project_backward_kernel(
    MLstmProjectProblem p, MLstmProjectBackwardArgs a) {
  constexpr int kW = kBS * kBS, kDepth = sizeof(E) == 2 ? 8 : 4;
  __shared__ float sg[kStagedRows][OP];
  __shared__ Four<E> s_in[kDepth][kProjectBackThreads], s_d[kDepth][kProjectBackThreads];
  const int nb = p.I / kBS, units = 3 * nb, O = 2 * p.H, C = 3 * p.I;
  const int u = blockIdx.x * kProjectBackThreads + threadIdx.x;
  const bool in = u < units, bias = blockIdx.x == 0 && threadIdx.x < O;
  const int part = !in ? 0 : u < 2 * nb ? (u & 1) : 2;
  const int b = !in ? 0 : u < 2 * nb ? (u >> 1) : u - 2 * nb, col = kBS * b;
  const E* src = static_cast<const E*>(part == 2 ? a.x : a.c);
  const E* dsrc = static_cast<const E*>(part == 0 ? a.dq : part == 1 ? a.dk : a.dv);
  E* dst = static_cast<E*>(part == 2 ? a.dx : a.dc);
  const float* Wp = part == 0 ? a.Wq : part == 1 ? a.Wk : a.Wv;
  float W[kW], dW[kW], wg[OP][kBS], dWg[OP][kBS], db = 0.f;
#pragma unroll
  for (int e = 0; e < kW; ++e) {
    W[e] = in ? Wp[b * kW + e] : 0.f;
    dW[e] = 0.f;
  }
#pragma unroll
  for (int o = 0; o < OP; ++o)
#pragma unroll
    for (int i = 0; i < kBS; ++i) {
      wg[o][i] = in && o < O ? a.Wg[o * C + part * p.I + col + i] : 0.f;
      dWg[o][i] = 0.f;
    }
  const int64_t per = (p.rows + gridDim.y - 1) / gridDim.y, begin = blockIdx.y * per;
  const int64_t end = begin + per < p.rows ? begin + per : p.rows;
  int fill = 0, slot = 0;  // the slots the next copy and the next row use
  auto issue = [&](int64_t r) {  // row r's copies, one group (empty past the slice)
    if (in && r < end) {
      copy4_async<E>(&s_in[fill][threadIdx.x], src + r * p.I + col);
      if (dsrc) copy4_async<E>(&s_d[fill][threadIdx.x], dsrc + r * p.I + col);
    }
    cp_async_commit();
    fill = fill + 1 == kDepth ? 0 : fill + 1;
  };
#pragma unroll
  for (int f = 0; f < kDepth - 1; ++f) issue(begin + f);
  for (int64_t r0 = begin; r0 < end; r0 += kStagedRows) {
    const int n = static_cast<int>(end - r0 < kStagedRows ? end - r0 : kStagedRows);
    __syncthreads();  // the previous rows' reads of sg are done
    for (int idx = threadIdx.x; idx < kStagedRows * OP; idx += kProjectBackThreads) {
      const int rr = idx / OP, o = idx % OP;
      float g = 0.f;
      if (rr < n && o < O) g = o < p.H ? a.dig[(r0 + rr) * p.H + o] : a.dfg[(r0 + rr) * p.H + o - p.H];
      sg[rr][o] = g;
    }
    __syncthreads();
    if (bias)
      for (int rr = 0; rr < n; ++rr) db += sg[rr][threadIdx.x];
    for (int rr = 0; rr < n; ++rr) {  // n is the same in the whole block: every lane shuffles below
      cp_async_wait<kDepth - 2>();  // row r0 + rr has landed (the wait's memory clobber also keeps the last row's
      issue(r0 + rr + kDepth - 1);   // shared reads ahead of this copy into the slot they read)
      float xv[kBS], dv[kBS] = {0.f, 0.f, 0.f, 0.f};
      unpack4<E>(s_in[slot][threadIdx.x], xv);
      if (dsrc) unpack4<E>(s_d[slot][threadIdx.x], dv);
      slot = slot + 1 == kDepth ? 0 : slot + 1;
      const float* g = sg[rr];
      float y[kBS], dt[kBS], dxv[kBS];
#pragma unroll
      for (int i = 0; i < kBS; ++i) {
        float s = 0.f, d = dv[i];
#pragma unroll
        for (int j = 0; j < kBS; ++j) s = fmaf(W[i * kBS + j], xv[j], s);
        y[i] = rounded<E>(s);  // this part's q, k or v as the forward stored it
#pragma unroll
        for (int o = 0; o < OP; ++o) d = fmaf(g[o], wg[o][i], d);
        dt[i] = d;
      }
#pragma unroll
      for (int o = 0; o < OP; ++o)
#pragma unroll
        for (int i = 0; i < kBS; ++i) dWg[o][i] = fmaf(g[o], y[i], dWg[o][i]);
#pragma unroll
      for (int j = 0; j < kBS; ++j) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < kBS; ++i) {
          dW[i * kBS + j] = fmaf(dt[i], xv[j], dW[i * kBS + j]);
          s = fmaf(dt[i], W[i * kBS + j], s);
        }
        const float other = __shfl_xor_sync(kAllLanes, s, 1);  // the k (q) thread's share of dc
        dxv[j] = part < 2 ? s + other : s;
      }
      if (in && part != 1) store4(dst + (r0 + rr) * p.I + col, dxv);
    }
  }
  cp_async_wait_all();
  float* out = a.partial + static_cast<int64_t>(blockIdx.y) * (12 * p.I + O * (C + 1));
  if (bias) out[12 * p.I + O * C + threadIdx.x] = db;
  if (!in) return;
#pragma unroll
  for (int e = 0; e < kW; ++e) out[part * 4 * p.I + b * kW + e] = dW[e];
#pragma unroll
  for (int o = 0; o < OP; ++o) {
    if (o >= O) break;
#pragma unroll
    for (int i = 0; i < kBS; ++i) out[12 * p.I + o * C + part * p.I + col + i] = dWg[o][i];
  }
}

std::string check_project(const MLstmProjectProblem& p) {
  if (p.rows < 0 || p.I < 0 || p.H < 0) return "mLSTM projection kernel: negative size";
  if (2 * p.H > kMLstmProjectMaxGates)
    return "mLSTM projection kernel: more than " + std::to_string(kMLstmProjectMaxGates / 2) + " heads";
  if (p.I % kMLstmGatesWidthMultiple) return "mLSTM projection kernel: the width is not a multiple of 8";
  if (p.I > kMLstmProjectMaxWidth)
    return "mLSTM projection kernel: a width over " + std::to_string(kMLstmProjectMaxWidth);
  return "";
}

int project_column_tiles(const MLstmProjectProblem& p) {
  return (3 * p.I / kBS + kProjectBackThreads - 1) / kProjectBackThreads;
}

template <int OP>
std::string project_forward_for(const MLstmProjectProblem& p, const MLstmProjectForwardArgs& a, cudaStream_t s) {
  const int64_t groups = (p.rows + 32 / OP - 1) / (32 / OP), wanted = (groups + kWarps - 1) / kWarps;
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const int blocks = static_cast<int>(wanted < 4 * sms ? wanted : 4 * sms);  // about two waves
  const size_t bytes = sizeof(float) * 3 * kBS * p.I;  // the staged block weights
  if (p.bf16)
    mlstm_project_forward_kernel<__nv_bfloat16, OP><<<blocks, kThreads, bytes, s>>>(p, a);
  else
    mlstm_project_forward_kernel<float, OP><<<blocks, kThreads, bytes, s>>>(p, a);
  return launch_error("mLSTM projection");
}

template <int OP>
std::string project_backward_for(const MLstmProjectProblem& p, const MLstmProjectBackwardArgs& a, cudaStream_t s) {
  const dim3 grid(project_column_tiles(p), mlstm_project_slices(p));
  if (p.bf16)
    mlstm_project_backward_kernel<__nv_bfloat16, OP><<<grid, kProjectBackThreads, 0, s>>>(p, a);
  else
    mlstm_project_backward_kernel<float, OP><<<grid, kProjectBackThreads, 0, s>>>(p, a);
  return launch_error("mLSTM projection");
}

}  // namespace

int mlstm_gates_slices(const MLstmGatesProblem& p) { return slices_for(p.rows, column_tiles(p)); }

std::string mlstm_gates_forward(const MLstmGatesProblem& p, const MLstmGatesForwardArgs& a, void* stream) {
  if (auto e = check(p); !e.empty()) return e;
  if (p.rows == 0 || p.H == 0) return "";
  auto s = static_cast<cudaStream_t>(stream);
  return with_padded_gates<32>(p, [&](auto op) { return forward_for<decltype(op)::value>(p, a, s); });
}

std::string mlstm_gates_backward(const MLstmGatesProblem& p, const MLstmGatesBackwardArgs& a, void* stream) {
  if (auto e = check(p); !e.empty()) return e;
  if (p.rows == 0 || p.H == 0 || p.I == 0) return "";
  auto s = static_cast<cudaStream_t>(stream);
  return with_padded_gates<32>(p, [&](auto op) { return backward_for<decltype(op)::value>(p, a, s); });
}

int mlstm_project_slices(const MLstmProjectProblem& p) { return slices_for(p.rows, project_column_tiles(p)); }

int64_t mlstm_project_partial_width(const MLstmProjectProblem& p) {
  return 12 * int64_t{p.I} + 2 * int64_t{p.H} * (3 * int64_t{p.I} + 1);
}

std::string mlstm_project_forward(const MLstmProjectProblem& p, const MLstmProjectForwardArgs& a, void* stream) {
  if (auto e = check_project(p); !e.empty()) return e;
  if (p.rows == 0 || p.I == 0) return "";
  auto s = static_cast<cudaStream_t>(stream);
  return with_padded_gates<16>(p, [&](auto op) { return project_forward_for<decltype(op)::value>(p, a, s); });
}

std::string mlstm_project_backward(const MLstmProjectProblem& p, const MLstmProjectBackwardArgs& a, void* stream) {
  if (auto e = check_project(p); !e.empty()) return e;
  if (p.rows == 0 || p.I == 0) return "";
  auto s = static_cast<cudaStream_t>(stream);
  return with_padded_gates<16>(p, [&](auto op) { return project_backward_for<decltype(op)::value>(p, a, s); });
}

}  // namespace memlab::kernels
