#pragma once
// The chunkwise SSD of Mamba-2 (ops/ssd/ssd.h) on CUDA, torch-free: the launch interface of chunk.cu.
//
// One block per (batch row, head) walks chunks of 32 tokens in order and keeps the state h [P, N] in shared
// memory. With g_t = log|alpha_t|, s_t = sign(alpha_t) (+1 without neg_eigval), G_t = Σ_{chunk start < l <= t} g_l
// and S_t = Π s_l likewise, a product of transitions over (j, t] is S_t S_j exp(G_t - G_j) (<= 1 in size, so
// nothing needs a stabiliser). Per chunk, with V_t = dt_t x_t:
//   y_t = Σ_{j<=t} (C_t·B_j) S_t S_j exp(G_t - G_j) V_j + S_t exp(G_t) h C_t
//   h  <- S_L exp(G_L) h + Σ_j S_L S_j exp(G_L - G_j) V_j B_jᵀ
// as products of shared-memory tiles (ops/tile.cuh).
//
// The backward walks the chunks in reverse from the saved chunk-start states with dh in shared memory. The
// transitions' gradient needs no state terms: d g_l = Σ_{t>=l} (C_t·dC_t - B_t·dB_t) over the whole sequence,
// plus <h_T, dh_T> (which the caller passes), because every y_t and h_T is a sum of terms each scaled by
// exp(G_t - G_j) for a pair (j, t] (the initial state's with j = 0).
#include <cstddef>
#include <cstdint>
#include <string>

namespace memlab::kernels {

constexpr int kSsdChunk = 32;  // tokens per chunk: one warp scans a chunk's transitions

// Head dims P and state sizes N the kernels are built for.
inline bool ssd_dim_supported(int d) { return d == 16 || d == 32 || d == 64 || d == 128; }
// Shared memory the backward needs per block (the forward needs less).
size_t ssd_backward_shared_bytes(int P, int N);

struct SsdProblem {
  int B = 0, T = 0, H = 0, G = 1, P = 0, N = 0;  // G groups of B, C; head h reads group h / (H / G)
  bool bf16 = false;                            // x, Bm, Cm in bf16, else fp32
  int64_t x_row = 0, bc_row = 0;  // elements from one token to the next in x and in Bm, Cm (0: H P and G N)
  int chunks() const { return (T + kSsdChunk - 1) / kSsdChunk; }
};

// Layouts: x [B, T, H, P] and Bm, Cm [B, T, G, N], dense but for the token stride (they may be column slices of
// one projection); the rest dense fp32: y, dy, dx [B, T, H, P]; dt, g (log|alpha|), sign [B, T, H]; states
// [B, H, P, N]; the states at each chunk's start hs [B, H, chunks, P, N]; dB, dC [B, T, H, N].
struct SsdForwardArgs {
  const void *x = nullptr, *Bm = nullptr, *Cm = nullptr;
  const float *dt = nullptr, *g = nullptr, *sign = nullptr;  // sign null: all +1
  const float* D = nullptr;   // [H]: y += D x (the layer's skip); null: none
  const float* h0 = nullptr;  // null: the zero state
  float* y = nullptr;
  float* hs = nullptr;  // for the backward; null: not kept
  float* hT = nullptr;  // final state
};

struct SsdBackwardArgs {
  const void *x = nullptr, *Bm = nullptr, *Cm = nullptr;
  const float *dt = nullptr, *g = nullptr, *sign = nullptr, *D = nullptr, *hs = nullptr;
  const float* dy = nullptr;
  const float* dhT = nullptr;       // null: 0
  const float* final_dot = nullptr;  // [B, H] <h_T, dh_T>; null: 0
  float *dx = nullptr, *ddt = nullptr, *dg = nullptr;  // ddt: through V = dt x only (g's path is the caller's)
  float *dB = nullptr, *dC = nullptr;                  // per head [B, T, H, N]: the caller sums each group
  float* dh0 = nullptr;                                // null: not wanted
  float* dD = nullptr;  // [B, H]: Σ_t dy_t·x_t per batch row (the caller sums the rows); with D only
};

// Return an empty string on success, else the error. stream is a cudaStream_t.
std::string ssd_forward(SsdProblem p, const SsdForwardArgs& a, void* stream);
std::string ssd_backward(SsdProblem p, const SsdBackwardArgs& a, void* stream);

}  // namespace memlab::kernels
