#pragma once
// HQLT's dynamic vector mixing on CUDA, torch-free: the launch interface of sigmoid_blend.cu.
//
// o = σ(m) ⊙ a + (1 − σ(m)) ⊙ b over n elements, computed and written in fp32; a, b and m may each be fp32 or
// bf16 (the FW-memory's output, the window's, the mixing projection). The backward takes dO (fp32) and writes
// da = σ(m) dO, db = (1 − σ(m)) dO and dm = dO (a − b) σ(m)(1 − σ(m)), each in its input's dtype: one pass
// each way where the tensor-op form runs about eight elementwise kernels forward and ten backward.
#include <cstdint>
#include <string>

namespace memlab::kernels {

struct SigmoidBlendProblem {
  int64_t n = 0;
  bool a_bf16 = false, b_bf16 = false, m_bf16 = false;
};

struct SigmoidBlendForwardArgs {
  const void *a = nullptr, *b = nullptr, *m = nullptr;
  float* o = nullptr;
};

struct SigmoidBlendBackwardArgs {
  const void *a = nullptr, *b = nullptr, *m = nullptr;
  const float* d_o = nullptr;
  void *da = nullptr, *db = nullptr, *dm = nullptr;
};

// Return an empty string on success, else the error. stream is a cudaStream_t.
std::string sigmoid_blend_forward(const SigmoidBlendProblem& p, const SigmoidBlendForwardArgs& a, void* stream);
std::string sigmoid_blend_backward(const SigmoidBlendProblem& p, const SigmoidBlendBackwardArgs& a, void* stream);

// The same per-element code run on the CPU (fp32 only), for the CPU tests.
std::string sigmoid_blend_forward_host(const SigmoidBlendProblem& p, const SigmoidBlendForwardArgs& a);
std::string sigmoid_blend_backward_host(const SigmoidBlendProblem& p, const SigmoidBlendBackwardArgs& a);

}  // namespace memlab::kernels
