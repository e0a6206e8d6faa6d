#pragma once
// A run's pieces, built from its config as `memlab rl visual-match` builds them (rl_trainer.cpp); memlab bench
// rl builds the same.
#include <torch/torch.h>

#include "envs/visual_match.h"
#include "models/agent.h"
#include "rl/sac.h"

namespace memlab {

class Config;

struct RlParts {
  VisualMatchConfig env;
  torch::Device device{torch::kCPU};
  bool bf16 = false;
  Agent agent{nullptr};
};

// Checks the config, the kernels and the memory the run needs, seeds torch with rl.seed and builds the agent.
RlParts make_rl_parts(const Config& cfg);
SacOptions sac_options(const Config& cfg, bool bf16);

}  // namespace memlab
