// memlab bench: throughput measurements, one sub-subcommand per benchmark: env (the RL environment), mixer
// (a mixer layer and its op, fused kernel beside tensor ops), step (a config's training step with its GPU
// profile; lib/ops/bench.h) and rl (an RL run's loop, part by part; lib/rl/rl_bench.h).
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "commands.h"
#include "core/rng.h"
#include "envs/visual_match.h"
#include "ops/bench.h"
#include "rl/rl_bench.h"

namespace memlab {

namespace {
using Clock = std::chrono::steady_clock;

struct EnvBenchArgs {
  int64_t n_envs = 256;
  double seconds = 3.0;
  uint64_t seed = 0;
  int distractor = 750;
};

// Random actions, resetting every env that finishes with a fresh episode seed; counts env steps.
int bench_env(const EnvBenchArgs& a) {
  VisualMatchConfig cfg;
  cfg.distractor_len = a.distractor;
  VisualMatch env(a.n_envs, cfg);
  env.reset(a.seed);
  uint64_t next_episode = static_cast<uint64_t>(a.n_envs);
  Rng rng = make_rng(a.seed, kVisualMatchStream + 3, 0);
  std::vector<int64_t> actions(static_cast<size_t>(a.n_envs));
  int64_t steps = 0, episodes = 0;
  const auto t0 = Clock::now();
  double elapsed = 0.0;
  while (elapsed < a.seconds) {
    for (int rep = 0; rep < 64; ++rep) {
      uint64_t bits = 0;
      for (size_t i = 0; i < actions.size(); ++i) {
        if (i % 32 == 0) bits = rng();  // 2 random bits an action
        actions[i] = static_cast<int64_t>(bits & 3u);
        bits >>= 2;
      }
      env.step(actions);
      steps += a.n_envs;
      for (int64_t i = 0; i < a.n_envs; ++i)
        if (env.done()[i]) {
          env.reset_one(i, episode_seed(a.seed, next_episode++));
          ++episodes;
        }
    }
    elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  }
  std::printf("visual-match: %lld envs, L=%d, random actions: %lld env steps (%lld episodes) in %.2f s = %.3g env steps/s\n",
              static_cast<long long>(a.n_envs), a.distractor, static_cast<long long>(steps),
              static_cast<long long>(episodes), elapsed, double(steps) / elapsed);
  return 0;
}
}  // namespace

std::function<int()> add_bench_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("bench", "throughput benchmarks");
  cmd->require_subcommand(1);
  auto env_args = std::make_shared<EnvBenchArgs>();
  auto* env = cmd->add_subcommand("env", "Passive Visual Match env steps per second (one thread)");
  env->add_option("--n-envs", env_args->n_envs, "environments stepped together (default 256)")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  env->add_option("--seconds", env_args->seconds, "how long to run (default 3)")->check(CLI::Range(0.01, 3600.0));
  env->add_option("--seed", env_args->seed, "base episode seed")->check(CLI::NonNegativeNumber);
  env->add_option("--distractor", env_args->distractor, "distractor phase length L (default 750)")
      ->check(CLI::Range(0, 10000000));
  auto mixer_args = std::make_shared<MixerBenchArgs>();
  auto* mixer = cmd->add_subcommand(
      "mixer", "a mixer layer, its op and its one-token step: fused kernel and tensor-op form side by side");
  mixer->add_option("--model", mixer_args->model, "mixer (model.name; default deltanet)");
  mixer->add_option("--batch", mixer_args->batch, "batch (default 256)")->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  mixer->add_option("--len", mixer_args->len, "sequence length (default 128)")->check(CLI::Range(int64_t(1), int64_t(1) << 20));
  mixer->add_option("--heads", mixer_args->heads, "heads (default 4)")->check(CLI::Range(int64_t(1), int64_t(1024)));
  mixer->add_option("--dim", mixer_args->dim, "head dim (default 32); hidden = heads x dim")
      ->check(CLI::Range(int64_t(1), int64_t(4096)));
  mixer->add_option("--config", mixer_args->config, "YAML config for the model.* keys")->check(CLI::ExistingFile);
  mixer->add_option("--set", mixer_args->sets, "override a config key (repeatable)");
  mixer->add_option("--precision", mixer_args->precision, "bf16 (autocast, as CUDA training) or fp32")
      ->check(CLI::IsMember({"bf16", "fp32"}));
  mixer->add_option("--device", mixer_args->device, "auto, cpu or cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  mixer->add_option("--reps", mixer_args->reps, "timed repetitions (default 50)")->check(CLI::Range(1, 100000));
  mixer->add_option("--top", mixer_args->top,
                    "also profile the fused op's forward+backward on the GPU, listing this many kernels")
      ->check(CLI::Range(1, 1000));
  auto step_args = std::make_shared<StepBenchArgs>();
  auto* step = cmd->add_subcommand(
      "step", "one training step of a config, fused kernels and tensor ops side by side, with a GPU profile table");
  step->add_option("--config", step_args->config, "the run's YAML config")->required()->check(CLI::ExistingFile);
  step->add_option("--set", step_args->sets, "override a config key (repeatable)");
  step->add_option("--device", step_args->device, "auto, cpu or cuda (default: the config's train.device)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  step->add_option("--reps", step_args->reps, "timed steps (default 30)")->check(CLI::Range(1, 100000));
  step->add_option("--top", step_args->top, "kernels listed in the profile (default 15)")->check(CLI::Range(1, 1000));
  step->add_option("--members", step_args->members,
                   "also time K runs of the config packed into one step, for each K given, beside one run (e.g. --members 4,12,48)")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096));
  step->add_option("--length-buckets", step_args->length_buckets,
                   "also time the step with each batch split by length into N buckets (train.length_buckets), for "
                   "each N given, beside the whole batch; at each --members K too (e.g. --length-buckets 2,3)")
      ->delimiter(',')
      ->check(CLI::Range(1, 16));
  step->add_flag("--by-op", step_args->by_op,
                 "also profile the step run eagerly, with its GPU time by the op that launched each kernel");
  auto rl_args = std::make_shared<RlBenchArgs>();
  auto* rl = cmd->add_subcommand(
      "rl", "where a memlab rl visual-match run's time goes: environment, rollouts, replay, SAC update, whole loop");
  rl->add_option("--config", rl_args->config, "the run's YAML config (as memlab rl visual-match --config)")
      ->check(CLI::ExistingFile);
  rl->add_option("--set", rl_args->sets, "override a config key (repeatable)");
  rl->add_option("--device", rl_args->device, "auto, cpu or cuda (default: the config's rl.device)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  rl->add_option("--reps", rl_args->reps, "timed updates and replay samples (default 20)")->check(CLI::Range(1, 100000));
  rl->add_option("--rounds", rl_args->rounds, "training-loop rounds timed (default 2)")->check(CLI::Range(1, 10000));
  rl->add_option("--top", rl_args->top, "kernels listed in the update's profile (default 12)")->check(CLI::Range(1, 1000));
  rl->add_flag("--by-op", rl_args->by_op, "also profile an eager update by the op that launched each kernel");
  rl->add_option("--runs", rl_args->runs,
                 "also time this many runs (seeds, at most 16) side by side, a thread and CUDA stream each (default 1: off)")
      ->check(CLI::Range(1, 16));
  return [cmd, env, env_args, mixer, mixer_args, step, step_args, rl, rl_args]() -> int {
    if (!cmd->parsed()) return -1;
    if (env->parsed()) return bench_env(*env_args);
    if (mixer->parsed()) return bench_mixer(*mixer_args);
    if (step->parsed()) return bench_step(*step_args);
    if (rl->parsed()) return bench_rl(*rl_args);
    return -1;
  };
}

}  // namespace memlab
