#include "core/device.h"

#include <c10/cuda/CUDAFunctions.h>
#include <fmt/format.h>

#include "core/config.h"
#include "core/errors.h"

#ifdef __has_include
#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#define MEMLAB_HAVE_CUDA_RT 1
#endif
#endif

namespace memlab {

torch::Device pick_device(const std::string& want) {
  if (want == "cpu") return torch::kCPU;
  const bool have = torch::cuda::is_available();
  if (want == "cuda" && !have)
    throw UserError("device 'cuda' requested but no CUDA GPU is visible (use --device cpu or auto)");
  return have ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
}

std::string device_description(const torch::Device& d) {
  if (d.is_cpu()) {
    const int n = torch::get_num_threads();
    return fmt::format("cpu ({} thread{})", n, n == 1 ? "" : "s");
  }
#ifdef MEMLAB_HAVE_CUDA_RT
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, d.index() < 0 ? 0 : d.index()) == cudaSuccess)
    return fmt::format("cuda:{} ({})", d.index() < 0 ? 0 : d.index(), prop.name);
#endif
  return d.str();
}

bool bf16_autocast(const Config& cfg, const std::string& key, const torch::Device& d) {
  const std::string prec = cfg.get_string(key);
  if (prec == "bf16" && !d.is_cuda()) cfg.fail(key, "bf16 autocast needs a CUDA device");
  return prec == "bf16" || (prec == "auto" && d.is_cuda());
}

int device_capability(const torch::Device& d) {
  if (!d.is_cuda()) return 0;
#ifdef MEMLAB_HAVE_CUDA_RT
  int major = 0, minor = 0;
  const int i = d.index() < 0 ? c10::cuda::current_device() : d.index();
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, i) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, i) == cudaSuccess)
    return 10 * major + minor;
#endif
  return 0;
}

double device_memory_bytes(const torch::Device& d) {
  if (!d.is_cuda()) return 0;
#ifdef MEMLAB_HAVE_CUDA_RT
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, d.index() < 0 ? 0 : d.index()) == cudaSuccess)
    return static_cast<double>(prop.totalGlobalMem);
#endif
  return 0;
}

}  // namespace memlab
