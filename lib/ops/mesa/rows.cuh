#pragma once
// Device side of MesaRows and MesaRowsOut (chunk.h): one chunk's token rows of the Mesa op's tensors, for its chunk
// kernels and its CG kernel.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "ops/mesa/chunk.h"

namespace memlab::kernels {

// Chunk blk's rows of a tensor: row t < rows at base + t stride elements. Read-only while a kernel runs (no kernel
// writes a tensor it reads through one), so its loads take the non-coherent path.
struct RowSpan {
  const void* base;
  int stride;  // elements; offsets within a chunk's rows fit 32 bits
  int rows;
  bool bf16;
  __device__ float at(int t, int i) const {
    const int k = t * stride + i;
    return bf16 ? __bfloat162float(__ldg(static_cast<const __nv_bfloat16*>(base) + k))
                : __ldg(static_cast<const float*>(base) + k);
  }
  // four consecutive entries, i a multiple of 4 (aligned(): vector loads). The _as forms take the dtype as given, so
  // that a loop of loads branches on it once (with_dtype), not around each load, and its loads go out together.
  // raw4_as is the load alone (bf16: the 8 bytes in .x, .y), widen4 its floats: a caller may put other loads between.
  template <bool BF16>
  __device__ float4 raw4_as(int t, int i) const {
    const int k = t * stride + i;
    if constexpr (!BF16) {
      return __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(base) + k));
    } else {
      const uint2 u = __ldg(reinterpret_cast<const uint2*>(static_cast<const __nv_bfloat16*>(base) + k));
      return make_float4(__uint_as_float(u.x), __uint_as_float(u.y), 0.f, 0.f);
    }
  }
  template <bool BF16>
  __device__ static float4 widen4(float4 raw) {
    if constexpr (!BF16) {
      return raw;
    } else {
      const uint32_t x = __float_as_uint(raw.x), y = __float_as_uint(raw.y);
      const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x));
      const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&y));
      return make_float4(lo.x, lo.y, hi.x, hi.y);
    }
  }
  template <bool BF16>
  __device__ float4 at4_as(int t, int i) const {
    return widen4<BF16>(raw4_as<BF16>(t, i));
  }
  __device__ bool aligned() const {
    return stride % 4 == 0 && (reinterpret_cast<uintptr_t>(base) & (bf16 ? 7 : 15)) == 0;
  }
  // entries i and i + 1, i even (paired(): one load)
  template <bool BF16>
  __device__ float2 at2_as(int t, int i) const {
    const int k = t * stride + i;
    if constexpr (BF16)
      return __bfloat1622float2(
          __ldg(reinterpret_cast<const __nv_bfloat162*>(static_cast<const __nv_bfloat16*>(base) + k)));
    else
      return __ldg(reinterpret_cast<const float2*>(static_cast<const float*>(base) + k));
  }
  __device__ bool paired() const {
    return stride % 2 == 0 && (reinterpret_cast<uintptr_t>(base) & (bf16 ? 3 : 7)) == 0;
  }
};

// f(std::true_type) for bf16 rows, else f(std::false_type): see RowSpan::at4_as.
template <class F>
__device__ inline void with_dtype(const RowSpan& s, F&& f) {
  if (s.bf16)
    f(std::true_type{});
  else
    f(std::false_type{});
}

struct RowSpanOut {
  void* base;
  int stride;
  int rows;
  bool bf16, accumulate;
  __device__ void put(int t, int i, float v) const {
    const int k = t * stride + i;
    if (bf16) {
      auto* p = static_cast<__nv_bfloat16*>(base) + k;
      *p = __float2bfloat16(accumulate ? __bfloat162float(*p) + v : v);
    } else {
      auto* p = static_cast<float*>(base) + k;
      *p = accumulate ? *p + v : v;
    }
  }
  // entries i and i + 1 (both false: i alone), as one store where the address allows it (PairOut's)
  __device__ void put2(int t, int i, float v0, float v1, bool both) const;
  // four consecutive entries, i a multiple of 4 (aligned(): vector stores)
  __device__ void put4(int t, int i, float4 v) const {
    const int k = t * stride + i;
    if (bf16) {
      auto* p = reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(base) + k);
      if (accumulate) {
        const uint2 o = *p;
        const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&o.x));
        const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&o.y));
        v = make_float4(v.x + lo.x, v.y + lo.y, v.z + hi.x, v.w + hi.y);
      }
      const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
      *p = make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
    } else {
      auto* p = reinterpret_cast<float4*>(static_cast<float*>(base) + k);
      if (accumulate) {
        const float4 o = *p;
        v = make_float4(v.x + o.x, v.y + o.y, v.z + o.z, v.w + o.w);
      }
      *p = v;
    }
  }
  __device__ bool aligned() const {
    return stride % 4 == 0 && (reinterpret_cast<uintptr_t>(base) & (bf16 ? 7 : 15)) == 0;
  }
};

// A RowSpanOut whose pairs of entries (i even) each go as one store, its dtype fixed: store loops without branches on
// the layout at every entry (with_pairs picks it).
template <bool BF16>
struct PairOut : RowSpanOut {
  __device__ void put2(int t, int i, float v0, float v1, bool) const {
    const int k = t * stride + i;
    if constexpr (BF16) {
      auto* p = reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(base) + k);
      if (accumulate) {
        const float2 x = __bfloat1622float2(*p);
        v0 += x.x, v1 += x.y;
      }
      *p = __floats2bfloat162_rn(v0, v1);
    } else {
      auto* p = reinterpret_cast<float2*>(static_cast<float*>(base) + k);
      if (accumulate) {
        const float2 x = *p;
        v0 += x.x, v1 += x.y;
      }
      *p = make_float2(v0, v1);
    }
  }
};

__device__ inline void RowSpanOut::put2(int t, int i, float v0, float v1, bool both) const {
  const uintptr_t at = reinterpret_cast<uintptr_t>(base) + static_cast<uintptr_t>(t * stride + i) * (bf16 ? 2 : 4);
  if (both && (at & (bf16 ? 3 : 7)) == 0) {
    if (bf16)
      PairOut<true>{*this}.put2(t, i, v0, v1, true);
    else
      PairOut<false>{*this}.put2(t, i, v0, v1, true);
    return;
  }
  put(t, i, v0);
  if (both) put(t, i + 1, v1);
}

// f(out) with out a PairOut where every pair of o's first `width` entries can go as one store (width and stride even,
// base aligned), else o itself (whose put2 checks each address).
template <class F>
__device__ inline void with_pairs(const RowSpanOut& o, int width, F&& f) {
  const bool paired = width % 2 == 0 && o.stride % 2 == 0 &&
                      (reinterpret_cast<uintptr_t>(o.base) & (o.bf16 ? 3 : 7)) == 0;
  if (paired && o.bf16)
    f(PairOut<true>{o});
  else if (paired)
    f(PairOut<false>{o});
  else
    f(o);
}

// Where chunk blk lies, worked out once per block (32-bit divisions: chunks < 2^31): its (batch, head) bh, its index n
// among the bh's N chunks, its head h, its first token's row in a native [B, T, H, d] tensor (in rows of d), and how
// many of its C tokens lie before T.
struct ChunkAt {
  int64_t blk, native_row;
  int bh, n, h, rows, C, H;
};
__device__ inline ChunkAt chunk_at(int64_t blk, int N, int C, int T, int H) {
  const int i = static_cast<int>(blk), bh = i / N, n = i - bh * N, b = bh / H, h = bh - b * H, t0 = n * C;
  const int left = T - t0;
  return {blk, (static_cast<int64_t>(b) * T + t0) * H + h, bh, n, h, left < C ? left : C, C, H};
}

__device__ inline RowSpan span_of(const MesaRows& r, const ChunkAt& at) {
  if (!r.native) return {static_cast<const float*>(r.at) + at.blk * at.C * r.d, r.d, at.C, false};
  const int64_t off = at.native_row * r.d;
  const void* base = r.bf16 ? static_cast<const void*>(static_cast<const __nv_bfloat16*>(r.at) + off)
                            : static_cast<const void*>(static_cast<const float*>(r.at) + off);
  return {base, at.H * r.d, at.rows, r.bf16};
}

__device__ inline RowSpanOut span_of(const MesaRowsOut& r, const ChunkAt& at) {
  if (!r.native) return {static_cast<float*>(r.at) + at.blk * at.C * r.d, r.d, at.C, false, r.accumulate};
  const int64_t off = at.native_row * r.d;
  void* base = r.bf16 ? static_cast<void*>(static_cast<__nv_bfloat16*>(r.at) + off)
                      : static_cast<void*>(static_cast<float*>(r.at) + off);
  return {base, at.H * r.d, at.rows, r.bf16, r.accumulate};
}

// dst[t][i] = scale src(t, i) for t < src.rows, i < width, 0 elsewhere in [R, W), by NT threads; each thread's loads
// go out together before any is stored, four entries at once where the rows allow it.
template <int R, int W, int NT>
__device__ inline void load_span(float* dst, int pitch, const RowSpan& src, int width, float scale = 1.f) {
  if (width % 4 == 0 && src.aligned()) {
    with_dtype(src, [&](auto bf16) {
      constexpr int V = R * W / 4, PER = (V + NT - 1) / NT;
      float4 v[PER];
#pragma unroll
      for (int i = 0; i < PER; ++i) {
        const int idx = threadIdx.x + i * NT, t = idx / (W / 4), c = idx % (W / 4) * 4;
        const bool ok = idx < V && t < src.rows && c < width;
        const float4 x = src.template at4_as<decltype(bf16)::value>(ok ? t : 0, ok ? c : 0);
        v[i] = ok ? x : make_float4(0.f, 0.f, 0.f, 0.f);
      }
#pragma unroll
      for (int i = 0; i < PER; ++i) {
        const int idx = threadIdx.x + i * NT;
        if (idx < V)
          *reinterpret_cast<float4*>(dst + idx / (W / 4) * pitch + idx % (W / 4) * 4) =
              make_float4(scale * v[i].x, scale * v[i].y, scale * v[i].z, scale * v[i].w);
      }
    });
    return;
  }
  constexpr int PER = (R * W + NT - 1) / NT;
  float v[PER];
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int idx = threadIdx.x + i * NT, t = idx / W, c = idx % W;
    v[i] = idx < R * W && t < src.rows && c < width ? src.at(t, c) : 0.f;
  }
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int idx = threadIdx.x + i * NT;
    if (idx < R * W) dst[idx / W * pitch + idx % W] = scale * v[i];
  }
}

// dst(t, i) = src[t][i] (or += with accumulate) for t < dst.rows, i < width; four entries at once where the rows
// allow it (pitch a multiple of 4).
template <int R, int W>
__device__ inline void store_span(const RowSpanOut& dst, const float* src, int pitch, int width) {
  if (width % 4 == 0 && dst.aligned()) {
    for (int idx = threadIdx.x; idx < R * W / 4; idx += blockDim.x) {
      const int t = idx / (W / 4), i = idx % (W / 4) * 4;
      if (t < dst.rows && i < width) dst.put4(t, i, *reinterpret_cast<const float4*>(src + t * pitch + i));
    }
    return;
  }
  for (int idx = threadIdx.x; idx < R * W; idx += blockDim.x) {
    const int t = idx / W, i = idx % W;
    if (t < dst.rows && i < width) dst.put(t, i, src[t * pitch + i]);
  }
}

}  // namespace memlab::kernels
