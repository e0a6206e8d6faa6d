#pragma once
// SwiGLU's elementwise core on CUDA, torch-free: the launch interface of silu_mul.cu.
//
// gu [rows, 2I] holds the gate (columns [0, I)) and the up projection (columns [I, 2I)) side by side, as one
// fused projection gives them; h [rows, I] = SiLU(g) * u, computed in fp32. The backward writes
// dgu = [dh * u * SiLU'(g), dh * SiLU(g)] into one [rows, 2I] buffer, so the projection's backward is one
// matmul. Each thread takes a vector of 16 bytes (8 bf16 or 4 fp32 elements) where I allows.
#include <cstdint>
#include <string>

namespace memlab::kernels {

struct SiluMulProblem {
  int64_t rows = 0, inner = 0;  // I
  bool bf16 = false;            // gu, h, dh, dgu in bf16, else fp32
};

struct SiluMulForwardArgs {
  const void* gu = nullptr;
  void* h = nullptr;
};

struct SiluMulBackwardArgs {
  const void *gu = nullptr, *dh = nullptr;
  void* dgu = nullptr;
};

// Return an empty string on success, else the error. stream is a cudaStream_t.
std::string silu_mul_forward(const SiluMulProblem& p, const SiluMulForwardArgs& a, void* stream);
std::string silu_mul_backward(const SiluMulProblem& p, const SiluMulBackwardArgs& a, void* stream);

// The same per-thread code run on the CPU (fp32 only), for the CPU tests.
std::string silu_mul_forward_host(const SiluMulProblem& p, const SiluMulForwardArgs& a);
std::string silu_mul_backward_host(const SiluMulProblem& p, const SiluMulBackwardArgs& a);

}  // namespace memlab::kernels
