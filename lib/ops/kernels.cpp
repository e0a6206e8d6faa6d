#include "ops/kernels.h"

#include "core/config.h"

namespace memlab {

void register_kernels_key(Schema& s) {
  s.add_string("model.kernels", "auto",
               "auto: fused CUDA kernels on a GPU where one exists, else tensor ops; cuda: kernels or an error; "
               "torch: tensor ops only (the reference)",
               {"auto", "cuda", "torch"});
}

Kernels kernels_option(const Config& cfg) {
  const std::string k = cfg.get_string("model.kernels");
  return k == "cuda" ? Kernels::Cuda : k == "torch" ? Kernels::Torch : Kernels::Auto;
}

const char* kernels_name(Kernels k) {
  switch (k) {
    case Kernels::Cuda: return "cuda";
    case Kernels::Torch: return "torch";
    case Kernels::Auto: break;
  }
  return "auto";
}

bool kernels_built() {
#ifdef MEMLAB_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

void check_kernels(const Config& cfg, bool cuda_device) {
  if (kernels_option(cfg) != Kernels::Cuda) return;
  if (!kernels_built()) cfg.fail("model.kernels", "cuda needs a memlab built with nvcc (this one has no kernels)");
  if (!cuda_device) cfg.fail("model.kernels", "cuda needs a CUDA device (the run is on the CPU); use auto or torch");
}

}  // namespace memlab
