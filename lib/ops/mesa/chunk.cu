// The chunk-level parts of Mesa's op on tensor cores, one block per (batch, head, chunk): see chunk.h.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "ops/mesa/chunk.h"
#include "ops/mesa/rows.cuh"
#include "ops/tf32_mm.cuh"
#include "ops/tile.cuh"

namespace memlab::kernels {
namespace {

constexpr int kThreads = 256, kWarps = kThreads / 32;
// The adjoint kernel's block fills an SM's shared memory at C = d = 64 (one block per SM): more warps hide latency.
constexpr int kAdjointThreads = 512, kAdjointWarps = kAdjointThreads / 32;

// Tiles of a block: [CM, DP] token rows and [DP, DP] states with pitch DP + 4, [CM, CM] token pairs with pitch CM + 4
// (ldm a multiple of 4 floats and every 16-row tile start 32-byte aligned, as the wmma loads need; banks shift by
// row).
template <int CM, int DP>
struct Dims {
  static constexpr int P = DP + 4, PC = CM + 4;
  static constexpr int row_tile = CM * P, pair_tile = CM * PC, state_tile = DP * P;
};

// A state: dst[r][c] = src[r][c] for r < rows, c < width (a dense [rows, width] source; TRANSPOSED: src[c][r] of a
// dense [width, rows] one), 0 elsewhere in [R, W), by NT threads. Each thread's loads go out together before any is
// stored.
template <int R, int W, int NT, bool TRANSPOSED = false>
__device__ inline void load_state(float* dst, int pitch, const float* src, int rows, int width) {
  if constexpr (!TRANSPOSED) {
    load_span<R, W, NT>(dst, pitch, RowSpan{src, width, rows, false}, width);
  } else {  // consecutive threads read consecutive source entries
    constexpr int PER = (R * W + NT - 1) / NT;
    float v[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int idx = threadIdx.x + i * NT, r = idx % R, c = idx / R;
      v[i] = idx < R * W && r < rows && c < width ? src[static_cast<int64_t>(c) * rows + r] : 0.f;
    }
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int idx = threadIdx.x + i * NT;
      if (idx < R * W) dst[idx % R * pitch + idx / R] = v[i];
    }
  }
}

template <int R, int W>
__device__ inline void store_state(float* dst, const float* src, int pitch, int rows, int width) {
  for (int idx = threadIdx.x; idx < R * W; idx += blockDim.x) {
    const int r = idx / W, c = idx % W;
    if (r < rows && c < width) dst[static_cast<int64_t>(r) * width + c] = src[r * pitch + c];
  }
}

// The chunk's running log decay and β into shared memory: past C, b stays at b_{C-1} and β is 0 (no-op tokens).
template <int CM>
__device__ inline void load_gates(float* sb, float* sbeta, const float* logdecay, const float* beta, int64_t blk,
                                  int C) {
  for (int t = threadIdx.x; t < CM; t += blockDim.x) {
    sb[t] = logdecay[blk * C + (t < C ? t : C - 1)];
    sbeta[t] = beta && t < C ? beta[blk * C + t] : 0.f;
  }
}

__device__ inline const float* state_of(const MesaStates& s, int64_t blk, int N, int size) {
  return s.at + (blk / N * s.Ns + blk % N + s.offset) * static_cast<int64_t>(size);
}

__device__ inline RowSpan span(const MesaRows& r, const MesaChunkProblem& p, int64_t blk) {
  return span_of(r, blk, p.N, p.C, p.T, p.H);
}
__device__ inline RowSpanOut span(const MesaRowsOut& r, const MesaChunkProblem& p, int64_t blk) {
  return span_of(r, blk, p.N, p.C, p.T, p.H);
}

// ---- contributions to the scan: X = (L ⊙ s)ᵀ R ----
template <int CM, int DP, bool EXACT>
__global__ void __launch_bounds__(kThreads) mesa_contrib_kernel(MesaChunkProblem p, MesaContribArgs a) {
  using Dm = Dims<CM, DP>;
  extern __shared__ float smem[];
  float *sL = smem, *sR = sL + Dm::row_tile, *sX = sR + Dm::row_tile, *sb = sX + Dm::state_tile, *sbeta = sb + CM;
  const int64_t blk = blockIdx.x;
  const int C = p.C, warp = threadIdx.x / 32;
  load_gates<CM>(sb, sbeta, a.logdecay, a.beta, blk, C);
  load_span<CM, DP, kThreads>(sL, Dm::P, span(a.L, p, blk), a.L.d, a.scale);
  load_span<CM, DP, kThreads>(sR, Dm::P, span(a.R, p, blk), a.R.d);
  __syncthreads();
  const float last = sb[CM - 1];
  for (int idx = threadIdx.x; idx < CM * DP; idx += kThreads) {
    const int t = idx / DP;
    sL[t * Dm::P + idx % DP] *= a.to_end ? expf(last - sb[t]) * sbeta[t] : expf(sb[t]);
  }
  __syncthreads();
  mm<EXACT, true, false, Tf32::Truncate>(sX, Dm::P, sL, Dm::P, sR, Dm::P, DP, DP, CM, false, 1.f, warp, kWarps);
  __syncthreads();
  store_state<DP, DP>(a.X + blk * a.L.d * a.R.d, sX, Dm::P, a.L.d, a.R.d);
}

// ---- the scan over chunks, one thread per state entry ----
__global__ void mesa_scan_kernel(MesaChunkProblem p, MesaScanArgs a) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(a.BH) * a.dd) return;
  const int64_t bh = idx / a.dd, e = idx % a.dd, N = p.N, dd = a.dd;
  float s = a.S0 ? a.S0[idx] : 0.f;
  float* out = a.out + bh * (N + 1) * dd + e;
  const float* X = a.X + bh * N * dd + e;
  const float* dec = a.logdecay + bh * N * p.C + p.C - 1;
  if (!a.reverse) {
    out[0] = s;
    for (int64_t n = 0; n < N; ++n) {
      s = fmaf(expf(dec[n * p.C]), s, X[n * dd]);
      out[(n + 1) * dd] = s;
    }
  } else {
    out[N * dd] = s;
    for (int64_t n = N - 1; n >= 0; --n) {
      s = fmaf(expf(dec[n * p.C]), s, X[n * dd]);
      out[n * dd] = s;
    }
  }
}

// W[t][s] *= D_ts (with β) or E_ts (without) over the [CM, CM] pair tile.
template <int CM>
__device__ inline void mask_decay(float* W, int pitch, const float* sb, const float* sbeta) {
  for (int idx = threadIdx.x; idx < CM * CM; idx += blockDim.x) {
    const int t = idx / CM, s = idx % CM;
    W[t * pitch + s] *= s <= t ? expf(sb[t] - sb[s]) * (sbeta ? sbeta[s] : 1.f) : 0.f;
  }
}

// ---- reads: Y = (A ⊙ γ) S + ((A Bᵀ) ⊙ D) U ----
template <int CM, int DP, bool EXACT>
__global__ void __launch_bounds__(kThreads) mesa_read_kernel(MesaChunkProblem p, MesaReadArgs a) {
  using Dm = Dims<CM, DP>;
  extern __shared__ float smem[];
  float *sA = smem, *sB = sA + Dm::row_tile, *sU = sB + Dm::row_tile, *sY = sU + Dm::row_tile;
  float *sS = sY + Dm::row_tile, *sW = sS + Dm::state_tile, *sb = sW + Dm::pair_tile, *sbeta = sb + CM;
  const int64_t blk = blockIdx.x;
  const int C = p.C, warp = threadIdx.x / 32;
  load_gates<CM>(sb, sbeta, a.logdecay, a.beta, blk, C);
  const int da = a.A.d, du = a.U.d;
  load_span<CM, DP, kThreads>(sA, Dm::P, span(a.A, p, blk), da);
  load_span<CM, DP, kThreads>(sB, Dm::P, span(a.B, p, blk), da);
  load_span<CM, DP, kThreads>(sU, Dm::P, span(a.U, p, blk), du);
  const float* S = state_of(a.S, blk, p.N, da * du);
  if (a.S_transposed)
    load_state<DP, DP, kThreads, true>(sS, Dm::P, S, da, du);
  else
    load_state<DP, DP, kThreads>(sS, Dm::P, S, da, du);
  __syncthreads();
  mm<EXACT, false, true, Tf32::Truncate>(sW, Dm::PC, sA, Dm::P, sB, Dm::P, CM, CM, DP, false, 1.f, warp, kWarps);
  mm<EXACT, false, false, Tf32::Truncate>(sY, Dm::P, sA, Dm::P, sS, Dm::P, CM, DP, DP, false, 1.f, warp, kWarps);
  __syncthreads();
  mask_decay<CM>(sW, Dm::PC, sb, sbeta);
  for (int idx = threadIdx.x; idx < CM * DP; idx += kThreads) sY[(idx / DP) * Dm::P + idx % DP] *= expf(sb[idx / DP]);
  __syncthreads();
  mm<EXACT, false, false, Tf32::Truncate>(sY, Dm::P, sW, Dm::PC, sU, Dm::P, CM, DP, CM, true, 1.f, warp, kWarps);
  __syncthreads();
  store_span<CM, DP>(span(a.Y, p, blk), sY, Dm::P, du);
}

// ---- the adjoints' chunk-local part ----
template <int CM, int DP, bool EXACT>
__global__ void __launch_bounds__(kAdjointThreads) mesa_adjoint_kernel(MesaChunkProblem p, MesaAdjointArgs a) {
  using Dm = Dims<CM, DP>;
  extern __shared__ float smem[];
  float *sA = smem, *sBq = sA + Dm::row_tile, *sK = sBq + Dm::row_tile, *sU = sK + Dm::row_tile;
  float *sP = sU + Dm::row_tile, *sDu = sP + Dm::row_tile, *sY = sDu + Dm::row_tile;
  float *sS = sY + Dm::row_tile, *sR = sS + Dm::state_tile, *sM1 = sR + Dm::state_tile, *sM2 = sM1 + Dm::pair_tile;
  float *sb = sM2 + Dm::pair_tile, *sbeta = sb + CM;
  const int64_t blk = blockIdx.x;
  const int C = p.C, warp = threadIdx.x / 32, dk = a.K.d, du = a.U.d;
  load_gates<CM>(sb, sbeta, a.logdecay, a.beta, blk, C);
  load_span<CM, DP, kAdjointThreads>(sA, Dm::P, span(a.A, p, blk), du);
  load_span<CM, DP, kAdjointThreads>(sBq, Dm::P, span(a.Bq, p, blk), dk, a.bq_scale);
  load_span<CM, DP, kAdjointThreads>(sK, Dm::P, span(a.K, p, blk), dk);
  load_span<CM, DP, kAdjointThreads>(sU, Dm::P, span(a.U, p, blk), du);
  load_state<DP, DP, kAdjointThreads>(sS, Dm::P, state_of(a.S, blk, p.N, dk * du), dk, du);
  load_state<DP, DP, kAdjointThreads>(sR, Dm::P, state_of(a.R, blk, p.N, dk * du), dk, du);
  __syncthreads();
  constexpr int nw = kAdjointWarps;
  // M1 = A Uᵀ, M2 = Bq Kᵀ; the state terms P = U Rᵀ, Du = K R and Y = Bq S
  mm<EXACT, false, true, Tf32::Truncate>(sM1, Dm::PC, sA, Dm::P, sU, Dm::P, CM, CM, DP, false, 1.f, warp, nw);
  mm<EXACT, false, true, Tf32::Truncate>(sM2, Dm::PC, sBq, Dm::P, sK, Dm::P, CM, CM, DP, false, 1.f, warp, nw);
  mm<EXACT, false, true, Tf32::Truncate>(sP, Dm::P, sU, Dm::P, sR, Dm::P, CM, DP, DP, false, 1.f, warp, nw);
  mm<EXACT, false, false, Tf32::Truncate>(sDu, Dm::P, sK, Dm::P, sR, Dm::P, CM, DP, DP, false, 1.f, warp, nw);
  mm<EXACT, false, false, Tf32::Truncate>(sY, Dm::P, sBq, Dm::P, sS, Dm::P, CM, DP, DP, false, 1.f, warp, nw);
  __syncthreads();
  mask_decay<CM>(sM1, Dm::PC, sb, nullptr);
  mask_decay<CM>(sM2, Dm::PC, sb, sbeta);
  const float last = sb[CM - 1];
  for (int idx = threadIdx.x; idx < CM * DP; idx += kAdjointThreads) {
    const int t = idx / DP, at = t * Dm::P + idx % DP;
    const float to_end = expf(last - sb[t]);
    sP[at] *= to_end;
    sDu[at] *= to_end * sbeta[t];
    sY[at] *= expf(sb[t]);
  }
  __syncthreads();
  // P += (M1 ⊙ E)ᵀ Bq, Du += (M2 ⊙ D)ᵀ A, Y += (M2 ⊙ D) U
  mm<EXACT, true, false, Tf32::Truncate>(sP, Dm::P, sM1, Dm::PC, sBq, Dm::P, CM, DP, CM, true, 1.f, warp, nw);
  mm<EXACT, true, false, Tf32::Truncate>(sDu, Dm::P, sM2, Dm::PC, sA, Dm::P, CM, DP, CM, true, 1.f, warp, nw);
  mm<EXACT, false, false, Tf32::Truncate>(sY, Dm::P, sM2, Dm::PC, sU, Dm::P, CM, DP, CM, true, 1.f, warp, nw);
  __syncthreads();
  // per token: a warp per row, its lanes over the columns
  for (int t = warp; t < C; t += kAdjointWarps) {
    float kp = 0.f, ay = 0.f;
    for (int i = threadIdx.x % 32; i < DP; i += 32) {
      kp += sK[t * Dm::P + i] * sP[t * Dm::P + i];
      ay += sA[t * Dm::P + i] * sY[t * Dm::P + i];
    }
    kp = warp_sum(kp);
    ay = warp_sum(ay);
    if (threadIdx.x % 32 == 0) {
      const float dc = ay - sbeta[t] * kp;
      a.dbeta[blk * C + t] = a.accumulate ? a.dbeta[blk * C + t] + kp : kp;
      a.dc[blk * C + t] = a.accumulate ? a.dc[blk * C + t] + dc : dc;
    }
  }
  // dkey = β P (+ Du with du_into_dkey), du = Du, formed in P's tile once the rows' sums above have read it
  __syncthreads();
  for (int idx = threadIdx.x; idx < CM * DP; idx += kAdjointThreads) {
    const int at = idx / DP * Dm::P + idx % DP;
    sP[at] = a.du_into_dkey ? sbeta[idx / DP] * sP[at] + sDu[at] : sbeta[idx / DP] * sP[at];
  }
  __syncthreads();
  store_span<CM, DP>(span(a.dkey, p, blk), sP, Dm::P, dk);
  if (!a.du_into_dkey) store_span<CM, DP>(span(a.du, p, blk), sDu, Dm::P, du);
}

template <int CM, int DP>
constexpr size_t contrib_floats() {
  return 2 * Dims<CM, DP>::row_tile + Dims<CM, DP>::state_tile + 2 * CM;
}
template <int CM, int DP>
constexpr size_t read_floats() {
  return 4 * Dims<CM, DP>::row_tile + Dims<CM, DP>::state_tile + Dims<CM, DP>::pair_tile + 2 * CM;
}
template <int CM, int DP>
constexpr size_t adjoint_floats() {  // 188 KB at C = d = 64: more than an A100 gives a block (163 KB)
  return 7 * Dims<CM, DP>::row_tile + 2 * Dims<CM, DP>::state_tile + 2 * Dims<CM, DP>::pair_tile + 2 * CM;
}

// The kernel template instance for (C, d, exact), launched with its shared memory.
template <template <int, int, bool> class Launch, int CM, int DP>
std::string by_exact(const MesaChunkProblem& p, void* stream, const void* args) {
  return p.exact ? Launch<CM, DP, true>::go(p, stream, args) : Launch<CM, DP, false>::go(p, stream, args);
}
template <template <int, int, bool> class Launch, int CM>
std::string by_dim(const MesaChunkProblem& p, int d, void* stream, const void* args) {
  if (d <= 16) return by_exact<Launch, CM, 16>(p, stream, args);
  if (d <= 32) return by_exact<Launch, CM, 32>(p, stream, args);
  return by_exact<Launch, CM, 64>(p, stream, args);
}
template <template <int, int, bool> class Launch>
std::string dispatch(const MesaChunkProblem& p, int d, void* stream, const void* args) {
  if (p.C <= 16) return by_dim<Launch, 16>(p, d, stream, args);
  if (p.C <= 32) return by_dim<Launch, 32>(p, d, stream, args);
  return by_dim<Launch, 64>(p, d, stream, args);
}

template <int CM, int DP, bool EXACT>
struct ContribLaunch {
  static std::string go(const MesaChunkProblem& p, void* stream, const void* args) {
    return launch_shared("Mesa contrib", mesa_contrib_kernel<CM, DP, EXACT>, p.chunks, kThreads,
                         contrib_floats<CM, DP>() * sizeof(float), stream, p,
                         *static_cast<const MesaContribArgs*>(args));
  }
};
template <int CM, int DP, bool EXACT>
struct ReadLaunch {
  static std::string go(const MesaChunkProblem& p, void* stream, const void* args) {
    return launch_shared("Mesa read", mesa_read_kernel<CM, DP, EXACT>, p.chunks, kThreads,
                         read_floats<CM, DP>() * sizeof(float), stream, p, *static_cast<const MesaReadArgs*>(args));
  }
};
template <int CM, int DP, bool EXACT>
struct AdjointLaunch {
  static std::string go(const MesaChunkProblem& p, void* stream, const void* args) {
    return launch_shared("Mesa adjoint", mesa_adjoint_kernel<CM, DP, EXACT>, p.chunks, kAdjointThreads,
                         adjoint_floats<CM, DP>() * sizeof(float), stream, p,
                         *static_cast<const MesaAdjointArgs*>(args));
  }
};

std::string check(const MesaChunkProblem& p, int d) {
  if (!mesa_chunk_supported(d, p.C) || p.chunks < 0 || p.N < 1)
    return "Mesa chunk kernel: head dim " + std::to_string(d) + " or chunk " + std::to_string(p.C) +
           " out of range (1-64)";
  return "";
}

template <int CM>
size_t shared_bytes_by_dim(int d) {
  if (d <= 16) return adjoint_floats<CM, 16>() * sizeof(float);
  if (d <= 32) return adjoint_floats<CM, 32>() * sizeof(float);
  return adjoint_floats<CM, 64>() * sizeof(float);
}

}  // namespace

size_t mesa_chunk_shared_bytes(int d, int C) {
  if (C <= 16) return shared_bytes_by_dim<16>(d);
  return C <= 32 ? shared_bytes_by_dim<32>(d) : shared_bytes_by_dim<64>(d);
}

std::string mesa_chunk_contrib(const MesaChunkProblem& p, const MesaContribArgs& a, void* stream) {
  const int d = a.L.d > a.R.d ? a.L.d : a.R.d;
  if (auto e = check(p, d); !e.empty() || p.chunks == 0) return e;
  return dispatch<ContribLaunch>(p, d, stream, &a);
}

std::string mesa_chunk_scan(const MesaChunkProblem& p, const MesaScanArgs& a, void* stream) {
  const int64_t n = static_cast<int64_t>(a.BH) * a.dd;
  if (n == 0) return "";
  constexpr int threads = 256;
  const int blocks = static_cast<int>((n + threads - 1) / threads);
  mesa_scan_kernel<<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>(p, a);
  return launch_error("Mesa scan");
}

std::string mesa_chunk_read(const MesaChunkProblem& p, const MesaReadArgs& a, void* stream) {
  const int d = a.A.d > a.U.d ? a.A.d : a.U.d;
  if (auto e = check(p, d); !e.empty() || p.chunks == 0) return e;
  return dispatch<ReadLaunch>(p, d, stream, &a);
}

std::string mesa_chunk_adjoint(const MesaChunkProblem& p, const MesaAdjointArgs& a, void* stream) {
  const int d = a.K.d > a.U.d ? a.K.d : a.U.d;
  if (auto e = check(p, d); !e.empty() || p.chunks == 0) return e;
  return dispatch<AdjointLaunch>(p, d, stream, &a);
}

}  // namespace memlab::kernels
