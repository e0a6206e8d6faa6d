#pragma once
// memlab bench mixer: a mixer layer, its op alone and its one-token op step, each timed in the fused-kernel
// form and the tensor-op form in one run (median of CUDA-event timings after warm-up), with the ratio.
#include <string>
#include <vector>

namespace memlab {

struct MixerBenchArgs {
  std::string model = "deltanet";
  int64_t batch = 256, len = 128, heads = 4, dim = 32;  // dim: per head
  std::string config;                                   // optional YAML for model.* keys
  std::vector<std::string> sets;
  std::string precision = "bf16";  // bf16 (autocast, as training on CUDA) or fp32
  std::string device = "auto";
  int reps = 50;
};

int bench_mixer(const MixerBenchArgs& a);

}  // namespace memlab
