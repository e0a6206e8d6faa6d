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
  int top = 0;  // > 0: profile the kernel form's op rows, listing this many kernels
};

int bench_mixer(const MixerBenchArgs& a);

// memlab bench step: one whole training step of a config (forward, loss, backward, clipping, AdamW, as
// `memlab train` runs it, CUDA graph included) in the kernel and tensor-op forms, with a profile table of
// where the GPU time of the step goes.
struct StepBenchArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string device = "auto";
  int reps = 30;
  int top = 15;  // kernels listed in the profile table
  bool by_op = false;  // also profile an eager step and attribute its kernels to the ops that launched them
  // Packed runs: the step of K runs of the config trained together (seeds train.seed + k), timed for each K
  // beside one run.
  std::vector<int64_t> members;
  // Length buckets: the step with train.length_buckets N, for each N given, beside N = 1 (at K = 1 and each K of
  // members).
  std::vector<int64_t> length_buckets;
};

int bench_step(const StepBenchArgs& a);

}  // namespace memlab
