#pragma once
// Which form an op runs in: `model.kernels: auto|cuda|torch`. auto = the fused CUDA kernel on a GPU where one
// exists for the call, else the tensor-op form; cuda = the kernel or an error saying why not; torch = the
// tensor-op form always (the reference the kernels are tested against).
#include <string>

namespace memlab {

class Config;
class Schema;

enum class Kernels { Auto, Cuda, Torch };

void register_kernels_key(Schema& s);
Kernels kernels_option(const Config& cfg);
const char* kernels_name(Kernels k);
// Whether this binary was built with nvcc, i.e. has any fused kernel.
bool kernels_built();
// model.kernels=cuda on a run that cannot have kernels (CPU device, or a build without nvcc) fails here,
// naming the key, before anything is written.
void check_kernels(const Config& cfg, bool cuda_device);

}  // namespace memlab
