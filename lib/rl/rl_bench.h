#pragma once
// memlab bench rl: where the time of a `memlab rl visual-match` run goes, part by part, built from its config
// as the run builds it: the environment alone, rollouts (the agent's step() and the environment, with their
// GPU time and kernel launches per env step), replay sampling with its host-to-device copies, the SAC update
// (as the run steps it, its kernels by kind, and an eager update's phases by CUDA events), and whole rounds of
// the training loop (collection, then the updates it earns) in env steps per second. With --runs K, K runs of
// the config (K seeds) also go round the loop together, each on a thread and CUDA stream of its own, against one
// run alone in the same process.
#include <string>
#include <vector>

namespace memlab {

struct RlBenchArgs {
  std::string config;  // the run's YAML (may be empty: the paper's agent for model.name from --set)
  std::vector<std::string> sets;
  std::string device;  // "" = the config's rl.device
  int reps = 20;    // timed updates and replay samples
  int rounds = 2;   // whole training-loop rounds timed
  int top = 12;     // kernels listed in the update's profile
  bool by_op = false;  // also an eager update's kernels by the op that launched them
  int runs = 1;     // > 1: also that many runs (seeds rl.seed, +1, ...) trained side by side, a thread each
};

int bench_rl(const RlBenchArgs& a);

}  // namespace memlab
