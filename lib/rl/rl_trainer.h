#pragma once
// `memlab rl visual-match`: discrete SAC with a sequence-model agent on Passive Visual Match.
// The loop (Ni et al. 2023, HQLT App. A.3): rl.warmup_episodes episodes of uniform random actions, then
// rounds of rl.envs policy episodes (dropout on, actions sampled), each followed by
// ceil(rl.updates_per_step x env steps collected) SAC updates on batches of rl.batch_episodes whole
// episodes; every rl.eval_every training episodes (and once before training) rl.eval_episodes greedy
// episodes with dropout off on their own seeds.
// Run directory: config.yaml, curve.csv, train.csv, summary.md, log.txt, checkpoint.pt (agent, target
// critics, optimiser, replay buffer and counters; written every rl.checkpoint_every episodes, at the end and
// on Ctrl-C), from which --resume continues.
#include <string>
#include <vector>

namespace memlab {

class Config;
class Schema;

// model.*, rl.* and env.* keys.
Schema& rl_schema();

// The paper's agent for a mixer (HQLT App. A.3): width 100, 2 heads, init std 0.02; Transformer 2 layers
// (full context), DeltaNet and HQLT 3 layers (no short conv, no output gate; HQLT window 64 with RoPE).
// YAML text applied before the user's config.
std::string rl_model_defaults(const std::string& model);

// A key given on the command line by its own flag (--model, --seed, ...): key, value, flag.
struct FlagValue {
  std::string key, value, flag;
};

// A run's effective config: the paper's agent for its model (rl_model_defaults), then the YAML file (may be
// empty; with saved_run, a run's own config.yaml, whose missing later keys take their before_key values), then the
// flags' values, then the --set assignments.
Config rl_config(const std::string& file, const std::vector<FlagValue>& flags, const std::vector<std::string>& sets,
                 bool saved_run = false);

// curve.csv's header: one row per evaluation.
extern const char* kCurveHeader;

struct RlRequest {
  std::string out_dir;
  bool resume = false;
};

void check_rl_config(const Config& cfg);  // builds the env and the agent: every error the start would meet
int run_rl(const Config& cfg, const RlRequest& req);  // returns the exit code

}  // namespace memlab
