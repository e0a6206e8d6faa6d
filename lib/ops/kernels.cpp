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

}  // namespace memlab
