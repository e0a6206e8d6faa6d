#pragma once
// What every op's dispatch needs around a fused kernel: whether autograd records the call, the current CUDA
// stream, and a kernel's error string turned into an exception.
#include <ATen/record_function.h>
#include <torch/torch.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "ops/kernels.h"

#ifdef MEMLAB_CUDA_KERNELS
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace memlab {

// Names an op's call in profiles (memlab bench step --by-op, Kineto traces), so that the kernels it launches
// outside any ATen op are charged to it rather than to nothing. Costs nothing while no profiler runs.
#define MEMLAB_PROFILED_OP(name) RECORD_FUNCTION(name, std::vector<c10::IValue>())

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

// Why a kernel that reads fp32 or bf16 cannot run on x: kernels_unavailable's reasons or x's dtype; "" if it may.
inline std::string float_kernels_unavailable(const torch::Tensor& x, Kernels kernels) {
  if (auto r = kernels_unavailable(x, kernels); !r.empty()) return r;
  if (x.scalar_type() != torch::kFloat && x.scalar_type() != torch::kBFloat16)
    return std::string(c10::toString(x.scalar_type())) + " inputs";
  return "";
}

// How an op's `*_kernel_applies(..., std::string* why)` says no: the reason into *why when asked, then false.
inline bool refuse(std::string* why, std::string reason) {
  if (why) *why = std::move(reason);
  return false;
}

// A launcher's result: empty on success, else the CUDA error.
inline void check_launch(const std::string& err) {
  if (!err.empty()) throw std::runtime_error(err);
}

// fp32 tensors handed to a torch-free launcher: undefined or empty ones become null (an absent optional input).
inline const float* ptr(const torch::Tensor& t) { return t.defined() && t.numel() ? t.data_ptr<float>() : nullptr; }
inline float* mut(torch::Tensor& t) { return t.defined() && t.numel() ? t.data_ptr<float>() : nullptr; }
inline torch::Tensor f32(const torch::Tensor& t) { return t.defined() ? t.to(torch::kFloat).contiguous() : t; }

#ifdef MEMLAB_CUDA_KERNELS
inline void* stream_of(const torch::Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.get_device()).stream(); }
// The most shared memory one block may have on t's GPU (kernels whose need grows with the head dim check it).
inline size_t max_shared_bytes_per_block(const torch::Tensor& t) {
  return at::cuda::getDeviceProperties(t.get_device())->sharedMemPerBlockOptin;
}
#endif

}  // namespace memlab
