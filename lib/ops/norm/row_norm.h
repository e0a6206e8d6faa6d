#pragma once
// Fused norms over the last dimension, on CUDA, torch-free: the launch interface of row_norm.cu.
//
// y = (x * rsqrt(c * Σ x² + eps) [* w] [+ s * r]) [* SiLU(gate)] per row of D elements, c = 1/D (RMS norm) or 1
// (L2 norm),
// computed in fp32; with `centre` x is first centred on its row mean (LayerNorm without bias). The weight may
// hold one row per group of rows: row r takes weight row r mod weight_rows (a multi-head norm's per-head weights). One warp per row, each lane holding its D/32 elements in registers, so x is read once.
// The backward recomputes the row statistics and writes dx, dgate, and one partial sum of dw per block
// ([blocks, D], for the caller to sum).
#include <cstdint>
#include <string>

namespace memlab::kernels {

struct RowNormProblem {
  int64_t rows = 0;
  int D = 0;
  float eps = 0.f;
  bool mean = true;     // RMS norm (mean of squares); false: L2 norm (sum)
  bool centre = false;  // subtract the row mean first (with mean: LayerNorm)
  int weight_rows = 1;  // rows of the weight (any number: past kRowNormMaxDim elements the backward walks as the skip one)
  bool has_weight = false, has_gate = false;
  bool has_skip = false;
  // Dtypes: bf16 where true, else fp32. The weights and their gradients are always fp32; dr is in r's dtype.
  bool x_bf16 = false, y_bf16 = false, gate_bf16 = false, dy_bf16 = false, r_bf16 = false;
};

struct RowNormForwardArgs {
  const void* x = nullptr;
  const float* w = nullptr;  // [weight_rows, D] when has_weight
  const void* gate = nullptr;
  const float* s = nullptr;  // [weight_rows, D] when has_skip
  const void* r = nullptr;   // x's shape when has_skip
  void* y = nullptr;
};

struct RowNormBackwardArgs {
  const void *x = nullptr, *gate = nullptr, *dy = nullptr;
  const float* w = nullptr;
  const float* s = nullptr;
  const void* r = nullptr;
  void* dx = nullptr;            // x's dtype
  void* dgate = nullptr;         // gate's dtype, when has_gate
  void* dr = nullptr;            // r's dtype, when has_skip
  float* dw_partial = nullptr;   // [row_norm_backward_blocks(p), weight_rows * D], when has_weight
  float* ds_partial = nullptr;   // the same for s, when has_skip
};

constexpr int kRowNormMaxDim = 1024;

int row_norm_backward_blocks(const RowNormProblem& p);  // rows of dw_partial and ds_partial

// Return an empty string on success, else the error. stream is a cudaStream_t.
std::string row_norm_forward(const RowNormProblem& p, const RowNormForwardArgs& a, void* stream);
std::string row_norm_backward(const RowNormProblem& p, const RowNormBackwardArgs& a, void* stream);

}  // namespace memlab::kernels
