#pragma once
// What every op's dispatch needs around a fused kernel: whether autograd records the call, the current CUDA
// stream, and a kernel's error string turned into an exception.
#include <torch/torch.h>

#include <stdexcept>
#include <string>

#include "ops/kernels.h"

#ifdef MEMLAB_CUDA_KERNELS
#include <c10/cuda/CUDAStream.h>
#endif

namespace memlab {

// Whether autograd records a call on these (undefined ones ignored).
inline bool recorded(std::initializer_list<torch::Tensor> ts) {
  if (!torch::GradMode::is_enabled()) return false;
  for (const auto& t : ts)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

// Why no op's kernel can run on x (model.kernels=torch, a build without nvcc, a CPU tensor), or "" if one may.
inline std::string kernels_unavailable(const torch::Tensor& x, Kernels kernels) {
  if (kernels == Kernels::Torch) return "model.kernels is torch";
  if (!kernels_built()) return "memlab was built without nvcc, so it has no CUDA kernels";
  if (!x.is_cuda()) return "the run is on the CPU";
  return "";
}

// A launcher's result: empty on success, else the CUDA error.
inline void check_launch(const std::string& err) {
  if (!err.empty()) throw std::runtime_error(err);
}

#ifdef MEMLAB_CUDA_KERNELS
inline void* stream_of(const torch::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.get_device()).stream(); }
#endif

}  // namespace memlab
