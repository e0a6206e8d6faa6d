// Fused RMS / L2 / Layer norms with optional weight, skip term and SiLU gate: see row_norm.h.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "ops/norm/row_norm.h"

namespace memlab::kernels {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
// Enough warps that each walks few rows: a warp's rows run one after another, each waiting on its loads
// (1024 backward blocks left 128 rows per warp at 1M rows of 32 and ran at a third of the memory bandwidth).
constexpr int kMaxForwardBlocks = 8192, kMaxBackwardBlocks = 8192;
// The skip kernel with one weight row per head writes two partial weight gradients per block, as many floats as half
// its elements at one row group per warp: fewer blocks, each warp taking several row groups, keep them small.
constexpr int kMaxHeadWeightBackwardBlocks = 2048;

__device__ inline float load(const void* p, size_t i, bool bf16) {
  return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
}
__device__ inline void store(void* p, size_t i, float v, bool bf16) {
  if (bf16)
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16(v);
  else
    static_cast<float*>(p)[i] = v;
}
__device__ inline float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float sigmoid(float z) { return 1.f / (1.f + __expf(-z)); }

// Rows a warp works on at once (all their loads issued before the first reduction): short rows leave a warp's
// single row too little to load to keep memory busy. Measured on an H200 (parity step at T256): rows of 32
// gain in both directions (backward 0.93 -> 0.72 ms, forward 0.60 -> 0.43), rows of 128 in the backward
// (1.00 -> 0.86) but not in the forward (0.28 -> 0.35), which keeps one.
template <int NPL, bool BACKWARD>
__host__ __device__ constexpr int rows_at_once() {
  return NPL == 1 ? 4 : (BACKWARD && NPL <= 4) ? 2 : 1;
}

// Centres each of a warp's R rows on its mean (elements past D stay 0) and puts the centred Σ x² in ss.
template <int R, int NPL>
__device__ inline void centre_rows(float (&xv)[R][NPL], float (&ss)[R], int lane, int D) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < NPL; ++i) sum += xv[r][i];
    const float mu = warp_sum(sum) / D;
    ss[r] = 0.f;
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      if (lane + 32 * i < D) xv[r][i] -= mu;
      ss[r] += xv[r][i] * xv[r][i];
    }
  }
}

// Lane `lane` holds elements lane + 32 i, i < NPL, of each of its R rows.
template <int NPL>
__global__ void __launch_bounds__(kThreads) row_norm_forward_kernel(RowNormProblem p, RowNormForwardArgs a) {
  constexpr int R = rows_at_once<NPL, false>();
  const int lane = threadIdx.x & 31;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps * R;
  const float c = p.mean ? 1.f / p.D : 1.f;
  for (int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32) * R; row0 < p.rows;
       row0 += stride) {
    float xv[R][NPL], ss[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const bool row_in = row0 + r < p.rows;
      const size_t base = static_cast<size_t>(row0 + r) * p.D;
      ss[r] = 0.f;
#pragma unroll
      for (int i = 0; i < NPL; ++i) {
        const int j = lane + 32 * i;
        xv[r][i] = row_in && j < p.D ? load(a.x, base + j, p.x_bf16) : 0.f;
        ss[r] += xv[r][i] * xv[r][i];
      }
    }
    if (p.centre) centre_rows<R, NPL>(xv, ss, lane, p.D);
#pragma unroll
    for (int r = 0; r < R; ++r) ss[r] = rsqrtf(c * warp_sum(ss[r]) + p.eps);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (row0 + r >= p.rows) break;
      const size_t base = static_cast<size_t>(row0 + r) * p.D;
      const float* w = p.has_weight ? a.w + ((row0 + r) % p.weight_rows) * p.D : nullptr;
#pragma unroll
      for (int i = 0; i < NPL; ++i) {
        const int j = lane + 32 * i;
        if (j >= p.D) continue;
        float y = xv[r][i] * ss[r];
        if (p.has_weight) y *= w[j];
        if (p.has_gate) {
          const float g = load(a.gate, base + j, p.gate_bf16);
          y *= g * sigmoid(g);
        }
        store(a.y, base + j, y, p.y_bf16);
      }
    }
  }
}

template <int NPL>
__global__ void __launch_bounds__(kThreads) row_norm_backward_kernel(RowNormProblem p, RowNormBackwardArgs a) {
  constexpr int R = rows_at_once<NPL, true>();
  __shared__ float dw_block[kWarps][kRowNormMaxDim];
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps * R;
  const float c = p.mean ? 1.f / p.D : 1.f;
  const int WD = p.weight_rows * p.D;
  // dw in registers (one weight row), else in the warp's own row of dw_block (several)
  const bool dw_shared = p.has_weight && p.weight_rows > 1;
  float dw[NPL];
#pragma unroll
  for (int i = 0; i < NPL; ++i) dw[i] = 0.f;
  if (dw_shared)
    for (int j = lane; j < WD; j += 32) dw_block[warp][j] = 0.f;
  __syncwarp();
  for (int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * R; row0 < p.rows; row0 += stride) {
    // sv: SiLU(gate) or 1; gv: the gate; u = dy w SiLU(gate)
    float xv[R][NPL], dyv[R][NPL], gv[R][NPL], ss[R], dot[R], usum[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const bool row_in = row0 + r < p.rows;
      const size_t base = static_cast<size_t>(row0 + r) * p.D;
#pragma unroll
      for (int i = 0; i < NPL; ++i) {
        const int j = lane + 32 * i;
        const bool in = row_in && j < p.D;
        xv[r][i] = in ? load(a.x, base + j, p.x_bf16) : 0.f;
        dyv[r][i] = in ? load(a.dy, base + j, p.dy_bf16) : 0.f;
        gv[r][i] = p.has_gate && in ? load(a.gate, base + j, p.gate_bf16) : 0.f;
      }
    }
    if (p.centre) centre_rows<R, NPL>(xv, ss, lane, p.D);  // xv: the centred x from here on
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (!p.centre) ss[r] = 0.f;
      dot[r] = 0.f;
      usum[r] = 0.f;
      const float* w = p.has_weight ? a.w + ((row0 + r) % p.weight_rows) * p.D : nullptr;
#pragma unroll
      for (int i = 0; i < NPL; ++i) {
        const int j = lane + 32 * i;
        const float sv = p.has_gate ? gv[r][i] * sigmoid(gv[r][i]) : 1.f;
        const float u = dyv[r][i] * sv * (p.has_weight && j < p.D ? w[j] : 1.f);
        if (!p.centre) ss[r] += xv[r][i] * xv[r][i];
        dot[r] += u * xv[r][i];
        usum[r] += u;
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      ss[r] = rsqrtf(c * warp_sum(ss[r]) + p.eps);  // now r = 1 / rms
      dot[r] = warp_sum(dot[r]);
      if (p.centre) usum[r] = warp_sum(usum[r]) / p.D;  // the centring's share: dx -= mean of rr u
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (row0 + r >= p.rows) break;
      const size_t base = static_cast<size_t>(row0 + r) * p.D;
      const int wrow = static_cast<int>((row0 + r) % p.weight_rows) * p.D;
      const float rr = ss[r], k = c * rr * rr * rr * dot[r], mu = p.centre ? rr * usum[r] : 0.f;
#pragma unroll
      for (int i = 0; i < NPL; ++i) {
        const int j = lane + 32 * i;
        if (j >= p.D) continue;
        const float w = p.has_weight ? a.w[wrow + j] : 1.f;
        const float g = gv[r][i], s = p.has_gate ? sigmoid(g) : 1.f, sv = p.has_gate ? g * s : 1.f;
        store(a.dx, base + j, rr * dyv[r][i] * sv * w - k * xv[r][i] - mu, p.x_bf16);
        const float n = xv[r][i] * rr;
        if (p.has_gate) store(a.dgate, base + j, dyv[r][i] * n * w * s * (1.f + g * (1.f - s)), p.gate_bf16);
        if (dw_shared)
          dw_block[warp][wrow + j] += dyv[r][i] * n * sv;
        else if (p.has_weight)
          dw[i] += dyv[r][i] * n * sv;
      }
    }
  }
  if (!p.has_weight) return;  // uniform over the block: no thread waits at the barrier below
  if (!dw_shared) {
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      const int j = lane + 32 * i;
      if (j < p.D) dw_block[warp][j] = dw[i];
    }
  }
  __syncthreads();
  for (int j = threadIdx.x; j < WD; j += kThreads) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) s += dw_block[w][j];
    a.dw_partial[static_cast<size_t>(blockIdx.x) * WD + j] = s;
  }
}

// The same norms with the skip term (p.has_skip), as separate kernels: folding the term into the kernels above as
// a compile-time branch left their code for norms without it 30-45% slower on an H200 (the DeltaNet parity step's
// RMS norm backward, 0.17 -> 0.25 ms), for reasons the PTX does not show. Even sharing the backward's row statistics
// as an inlined helper changes their register allocation (80 -> 95 at 128 per row), so the bodies stay apart.
template <int NPL>
__global__ void __launch_bounds__(kThreads) row_norm_skip_forward_kernel(RowNormProblem p, RowNormForwardArgs a) {
  constexpr int R = rows_at_once<NPL, false>();
  const int lane = threadIdx.x & 31;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps * R;
  const float c = p.mean ? 1.f / p.D : 1.f;
  for (int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / 32) * R; row0 < p.rows;
       row0 += stride) {
    // every load issued before the first reduction: x, the gate and the skip input (sv: SiLU(gate) or 1, tv: s r)
    float xv[R][NPL], sv[R][NPL], tv[R][NPL], ss[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const bool row_in = row0 + r < p.rows;
      const size_t base = static_cast<size_t>(row0 + r) * p.D;
      const int64_t wrow = ((row0 + r) % p.weight_rows) * p.D;
      ss[r] = 0.f;
#pragma unroll
      for (int i = 0; i < NPL; ++i) {
        const int j = lane + 32 * i;
        const bool in = row_in && j < p.D;
        xv[r][i] = in ? load(a.x, base + j, p.x_bf16) : 0.f;
        const float g = p.has_gate && in ? load(a.gate, base + j, p.gate_bf16) : 0.f;
        sv[r][i] = p.has_gate ? g * sigmoid(g) : 1.f;
        tv[r][i] = in ? a.s[wrow + j] * load(a.r, base + j, p.r_bf16) : 0.f;
        ss[r] += xv[r][i] * xv[r][i];
      }
    }
    if (p.centre) centre_rows<R, NPL>(xv, ss, lane, p.D);
#pragma unroll
    for (int r = 0; r < R; ++r) ss[r] = rsqrtf(c * warp_sum(ss[r]) + p.eps);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (row0 + r >= p.rows) break;
      const size_t base = static_cast<size_t>(row0 + r) * p.D;
      const int64_t wrow = ((row0 + r) % p.weight_rows) * p.D;
#pragma unroll
      for (int i = 0; i < NPL; ++i) {
        const int j = lane + 32 * i;
        if (j >= p.D) continue;
        float y = xv[r][i] * ss[r];
        if (p.has_weight) y *= a.w[wrow + j];
        store(a.y, base + j, (y + tv[r][i]) * sv[r][i], p.y_bf16);
      }
    }
  }
}

// SKIP false: the same walk for norms without the skip term whose weight has more than kRowNormMaxDim elements (packed
// runs' per-member norms), which the kernel above cannot hold in shared memory.
template <int NPL, bool SKIP>
__global__ void __launch_bounds__(kThreads) row_norm_skip_backward_kernel(RowNormProblem p, RowNormBackwardArgs a) {
  constexpr int R = rows_at_once<NPL, true>();
  __shared__ float dw_block[kWarps][kRowNormMaxDim];
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kWarps * R;
  const float c = p.mean ? 1.f / p.D : 1.f;
  const int WD = p.weight_rows * p.D;
  // dw and ds in registers, one per slot r of the warp's R rows: every row a slot takes has the same weight row, as
  // the grid (row_norm_backward_blocks) makes the warps' stride a multiple of the weight's rows or gives each warp
  // one row group at most. So the weights may have any size.
  float dw[R][NPL], ds[R][NPL];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int i = 0; i < NPL; ++i) dw[r][i] = ds[r][i] = 0.f;
  for (int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * R; row0 < p.rows; row0 += stride) {
    // sv: SiLU(gate) or 1; gv: the gate; rv: the skip input; u = dy w SiLU(gate)
    float xv[R][NPL], dyv[R][NPL], gv[R][NPL], rv[R][NPL], ss[R], dot[R], usum[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const bool row_in = row0 + r < p.rows;
      const size_t base = static_cast<size_t>(row0 + r) * p.D;
#pragma unroll
      for (int i = 0; i < NPL; ++i) {
        const int j = lane + 32 * i;
        const bool in = row_in && j < p.D;
        xv[r][i] = in ? load(a.x, base + j, p.x_bf16) : 0.f;
        dyv[r][i] = in ? load(a.dy, base + j, p.dy_bf16) : 0.f;
        gv[r][i] = p.has_gate && in ? load(a.gate, base + j, p.gate_bf16) : 0.f;
        rv[r][i] = SKIP && in ? load(a.r, base + j, p.r_bf16) : 0.f;
      }
    }
    if (p.centre) centre_rows<R, NPL>(xv, ss, lane, p.D);  // xv: the centred x from here on
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (!p.centre) ss[r] = 0.f;
      dot[r] = 0.f;
      usum[r] = 0.f;
      const float* w = p.has_weight ? a.w + ((row0 + r) % p.weight_rows) * p.D : nullptr;
#pragma unroll
      for (int i = 0; i < NPL; ++i) {
        const int j = lane + 32 * i;
        const float sv = p.has_gate ? gv[r][i] * sigmoid(gv[r][i]) : 1.f;
        const float u = dyv[r][i] * sv * (p.has_weight && j < p.D ? w[j] : 1.f);
        if (!p.centre) ss[r] += xv[r][i] * xv[r][i];
        dot[r] += u * xv[r][i];
        usum[r] += u;
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      ss[r] = rsqrtf(c * warp_sum(ss[r]) + p.eps);  // now r = 1 / rms
      dot[r] = warp_sum(dot[r]);
      if (p.centre) usum[r] = warp_sum(usum[r]) / p.D;  // the centring's share: dx -= mean of rr u
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (row0 + r >= p.rows) break;
      const size_t base = static_cast<size_t>(row0 + r) * p.D;
      const int wrow = static_cast<int>((row0 + r) % p.weight_rows) * p.D;
      const float rr = ss[r], k = c * rr * rr * rr * dot[r], mu = p.centre ? rr * usum[r] : 0.f;
#pragma unroll
      for (int i = 0; i < NPL; ++i) {
        const int j = lane + 32 * i;
        if (j >= p.D) continue;
        const float w = p.has_weight ? a.w[wrow + j] : 1.f;
        const float g = gv[r][i], s = p.has_gate ? sigmoid(g) : 1.f, sv = p.has_gate ? g * s : 1.f;
        store(a.dx, base + j, rr * dyv[r][i] * sv * w - k * xv[r][i] - mu, p.x_bf16);
        const float n = xv[r][i] * rr, res = rv[r][i], sk = SKIP ? a.s[wrow + j] : 0.f;
        const float pre = n * w + sk * res;
        if (p.has_gate) store(a.dgate, base + j, dyv[r][i] * pre * s * (1.f + g * (1.f - s)), p.gate_bf16);
        if (SKIP) store(a.dr, base + j, dyv[r][i] * sv * sk, p.r_bf16);
        dw[r][i] += dyv[r][i] * n * sv;
        if (SKIP) ds[r][i] += dyv[r][i] * res * sv;
      }
    }
  }
  // The block's sums of [dw | ds] (2 WD entries; WD without the skip term), kRowNormMaxDim at a time through shared
  // memory.
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * R;
  const int sums = SKIP ? 2 * WD : WD;
  for (int p0 = 0; p0 < sums; p0 += kRowNormMaxDim) {
    for (int j = lane; j < kRowNormMaxDim; j += 32) dw_block[warp][j] = 0.f;
    __syncwarp();
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int wrow = static_cast<int>((first + r) % p.weight_rows) * p.D;
#pragma unroll
      for (int i = 0; i < NPL; ++i) {
        const int j = lane + 32 * i, e = wrow + j - p0;
        if (j >= p.D) continue;
        if (e >= 0 && e < kRowNormMaxDim) dw_block[warp][e] += dw[r][i];
        if (SKIP && e + WD >= 0 && e + WD < kRowNormMaxDim) dw_block[warp][e + WD] += ds[r][i];
      }
    }
    __syncthreads();
    const int n = sums - p0 < kRowNormMaxDim ? sums - p0 : kRowNormMaxDim;
    for (int j = threadIdx.x; j < n; j += kThreads) {
      float sum = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) sum += dw_block[w][j];
      const int e = p0 + j;
      if (e >= WD)
        a.ds_partial[static_cast<size_t>(blockIdx.x) * WD + e - WD] = sum;
      else if (p.has_weight)
        a.dw_partial[static_cast<size_t>(blockIdx.x) * WD + e] = sum;
    }
    __syncthreads();
  }
}

// A weight the plain backward kernel cannot sum in shared memory.
bool wide_weight(const RowNormProblem& p) {
  return p.has_weight && int64_t{p.weight_rows} * p.D > kRowNormMaxDim;
}

std::string check(const RowNormProblem& p) {
  if (p.D < 1 || p.D > kRowNormMaxDim) return "row norm kernel: the row length must be 1 to 1024";
  if (p.weight_rows < 1) return "row norm kernel: the weight must have at least one row";
  if (p.rows < 0) return "row norm kernel: negative row count";
  return "";
}

// Blocks for `rows` rows taken `per_warp` at a time by kWarps warps each, at most max_blocks.
int blocks_for(int64_t rows, int per_warp, int max_blocks) {
  const int64_t per_block = int64_t{kWarps} * per_warp, b = (rows + per_block - 1) / per_block;
  return static_cast<int>(b < max_blocks ? (b > 0 ? b : 1) : max_blocks);
}

// Calls f.template operator()<NPL>() with the smallest power of two NPL with 32 NPL >= D.
template <typename F>
void with_lanes(int D, F&& f) {
  if (D <= 32) f.template operator()<1>();
  else if (D <= 64) f.template operator()<2>();
  else if (D <= 128) f.template operator()<4>();
  else if (D <= 256) f.template operator()<8>();
  else if (D <= 512) f.template operator()<16>();
  else f.template operator()<32>();
}

struct ForwardLaunch {
  const RowNormProblem& p;
  const RowNormForwardArgs& a;
  cudaStream_t s;
  template <int NPL>
  void operator()() const {
    const int blocks = blocks_for(p.rows, rows_at_once<NPL, false>(), kMaxForwardBlocks);
    if (p.has_skip)
      row_norm_skip_forward_kernel<NPL><<<blocks, kThreads, 0, s>>>(p, a);
    else
      row_norm_forward_kernel<NPL><<<blocks, kThreads, 0, s>>>(p, a);
  }
};

struct BackwardLaunch {
  const RowNormProblem& p;
  const RowNormBackwardArgs& a;
  cudaStream_t s;
  template <int NPL>
  void operator()() const {
    if (p.has_skip)
      row_norm_skip_backward_kernel<NPL, true><<<row_norm_backward_blocks(p), kThreads, 0, s>>>(p, a);
    else if (wide_weight(p))
      row_norm_skip_backward_kernel<NPL, false><<<row_norm_backward_blocks(p), kThreads, 0, s>>>(p, a);
    else
      row_norm_backward_kernel<NPL><<<row_norm_backward_blocks(p), kThreads, 0, s>>>(p, a);
  }
};

struct BackwardRowsPerWarp {
  int n = 1;
  template <int NPL>
  void operator()() {
    n = rows_at_once<NPL, true>();
  }
};

std::string last_error() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? std::string() : std::string("row norm kernel: ") + cudaGetErrorString(e);
}

}  // namespace

int row_norm_backward_blocks(const RowNormProblem& p) {
  BackwardRowsPerWarp r;
  with_lanes(p.D, r);
  if (!p.has_skip && !wide_weight(p)) return blocks_for(p.rows, r.n, kMaxBackwardBlocks);
  // The skip kernel keeps each warp's weight gradients in slots of fixed weight rows: where a warp walks several row
  // groups, the warps' stride (blocks kWarps rows-at-once) must be a multiple of the weight's rows.
  int blocks = blocks_for(p.rows, r.n, p.weight_rows > 1 ? kMaxHeadWeightBackwardBlocks : kMaxBackwardBlocks);
  if (int64_t{blocks} * kWarps * r.n < p.rows) blocks = std::max(p.weight_rows, blocks - blocks % p.weight_rows);
  return blocks;
}

std::string row_norm_forward(const RowNormProblem& p, const RowNormForwardArgs& a, void* stream) {
  if (auto e = check(p); !e.empty()) return e;
  if (p.rows == 0) return "";
  with_lanes(p.D, ForwardLaunch{p, a, static_cast<cudaStream_t>(stream)});
  return last_error();
}

std::string row_norm_backward(const RowNormProblem& p, const RowNormBackwardArgs& a, void* stream) {
  if (auto e = check(p); !e.empty()) return e;
  if (p.rows == 0) return "";
  with_lanes(p.D, BackwardLaunch{p, a, static_cast<cudaStream_t>(stream)});
  return last_error();
}

}  // namespace memlab::kernels
