#include "rl/rl_bench.h"

#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>

#include "core/config.h"
#include "core/device.h"
#include "core/errors.h"
#include "core/rng.h"
#include "envs/visual_match.h"
#include "ops/profile.h"
#include "rl/replay_buffer.h"
#include "rl/rl_parts.h"
#include "rl/rl_trainer.h"
#include "rl/rollout.h"

namespace memlab {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void sync(const torch::Device& dev) {
  if (dev.is_cuda()) torch::cuda::synchronize();
}

// Seed streams of the bench's episodes and draws (apart from a run's).
constexpr uint64_t kBenchEpisodes = 0xbe4c01, kBenchDraws = 0xbe4c02;

std::vector<uint64_t> episode_seeds(uint64_t seed, int64_t first, int64_t n) {
  std::vector<uint64_t> s;
  for (int64_t i = 0; i < n; ++i) s.push_back(derive_seed(seed, kBenchEpisodes, static_cast<uint64_t>(first + i)));
  return s;
}

// Median of fn's wall time in ms (the host's view, whatever it waits for), after 3 warm-up calls.
double median_wall_ms(const std::function<void()>& fn, const torch::Device& dev, int reps) {
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> v;
  for (int i = 0; i < reps; ++i) {
    sync(dev);
    const auto t0 = Clock::now();
    fn();
    sync(dev);
    v.push_back(1e3 * seconds_since(t0));
  }
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

// Mean GPU time (CUDA events; the clock on a CPU) of each phase that Sac::on_phase names, over `reps` eager
// updates after 3 warm-up updates, in the order the phases run.
std::vector<std::pair<std::string, double>> phase_ms(Sac& sac, const SacBatch& batch, const torch::Device& dev,
                                                     int reps) {
  std::vector<std::string> names;
  std::map<std::string, double> total;
  std::vector<std::pair<std::string, at::cuda::CUDAEvent>> events;
  std::vector<std::pair<std::string, Clock::time_point>> stamps;
  sac.on_phase = [&](const char* name) {
    if (dev.is_cuda()) {
      events.emplace_back(name, at::cuda::CUDAEvent(cudaEventDefault));
      events.back().second.record();
    } else {
      stamps.emplace_back(name, Clock::now());
    }
  };
  for (int i = 0; i < 3 + reps; ++i) {
    events.clear();
    stamps.clear();
    sac.update(batch);
    sync(dev);
    if (i < 3) continue;
    const size_t n = dev.is_cuda() ? events.size() : stamps.size();
    for (size_t p = 0; p + 1 < n; ++p) {
      const std::string& name = dev.is_cuda() ? events[p].first : stamps[p].first;
      if (i == 3) names.push_back(name);
      total[name] += dev.is_cuda() ? events[p].second.elapsed_time(events[p + 1].second)
                                   : 1e3 * std::chrono::duration<double>(stamps[p + 1].second - stamps[p].second).count();
    }
  }
  sac.on_phase = nullptr;
  std::vector<std::pair<std::string, double>> out;
  for (const auto& n : names) out.emplace_back(n, total[n] / reps);
  return out;
}

// One run of the loop for --runs: its agent (seeded rl.seed + k), learner, replay (filled by the warm-up's random
// episodes), environment and fixed-shape acting steps (graphed on CUDA with rl.rollout_graph). Its episode seeds
// and draws are the bench's own, not a run's.
struct LoopRun {
  RlParts parts;
  std::unique_ptr<Sac> sac;
  std::unique_ptr<EpisodeReplay> replay;
  std::unique_ptr<VisualMatch> env;
  std::unique_ptr<PolicySteps> steps;
  Rng rng;
  uint64_t seed = 0;
  int64_t first = 0, env_steps = 0;
};

std::unique_ptr<LoopRun> make_loop_run(const Config& base, int64_t k) {
  Config cfg = base;
  const auto seed = base.get_int("rl.seed") + k;
  cfg.set_value("rl.seed", std::to_string(seed), "memlab bench rl --runs");
  auto r = std::make_unique<LoopRun>();
  r->parts = make_rl_parts(cfg);
  r->seed = static_cast<uint64_t>(seed);
  r->rng = make_rng(r->seed, kBenchDraws, 1);
  r->sac = std::make_unique<Sac>(r->parts.agent, r->parts.device, sac_options(cfg, r->parts.bf16));
  const int64_t max_len = r->parts.env.max_episode_len();
  r->replay = std::make_unique<EpisodeReplay>(cfg.get_int("rl.buffer_transitions"), max_len, kObsSize,
                                              r->parts.device);
  const int64_t warm = cfg.get_int("rl.warmup_episodes");
  VisualMatch warm_env(warm, r->parts.env);
  RolloutOptions random;
  random.mode = ActMode::Random;
  Episodes w = play_episodes(warm_env, episode_seeds(r->seed, 0, warm), nullptr, r->parts.device, random, r->rng);
  for (size_t i = 0; i < w.obs.size(); ++i) r->replay->add(w.obs[i], w.actions[i], w.rewards[i], w.seeds[i]);
  r->first = warm;
  r->env = std::make_unique<VisualMatch>(cfg.get_int("rl.envs"), r->parts.env);
  r->steps = std::make_unique<PolicySteps>(r->parts.agent, r->parts.bf16, r->parts.device,
                                           cfg.get_bool("rl.rollout_graph"));
  return r;
}

// One round of the loop for run r: rl.envs episodes through the fixed-shape step, then the updates they earn.
void loop_round(LoopRun& r, const Config& cfg) {
  RolloutOptions ro;
  ro.mode = ActMode::Sample;
  ro.dropout = cfg.get_bool("rl.rollout_dropout");
  ro.bf16 = r.parts.bf16;
  ro.fixed = r.steps.get();
  Agent agent = r.sac->agent;
  Episodes e = play_episodes(*r.env, episode_seeds(r.seed, r.first, r.env->size()), &agent, r.parts.device, ro, r.rng);
  r.first += r.env->size();
  for (size_t i = 0; i < e.obs.size(); ++i) r.replay->add(e.obs[i], e.actions[i], e.rewards[i], e.seeds[i]);
  const auto n = static_cast<int64_t>(std::ceil(cfg.get_float("rl.updates_per_step") * static_cast<double>(e.steps)));
  const int64_t B = cfg.get_int("rl.batch_episodes");
  for (int64_t k = 0; k < n; ++k) r.sac->update(r.replay->sample(B, r.rng));
  r.env_steps += e.steps;
}

// Env steps per second of `runs` runs going round the loop together, a thread and a CUDA stream each, against
// run 0 alone: every run first plays one round alone (its graphs' warm-up and capture), then run 0 plays `rounds`
// rounds alone, then all runs `rounds` rounds at once. On CUDA every graph must be captured before the threads
// start: a capture must not meet other threads' random draws, nor an eager update's matmul-precision switch. The
// runs share the CUDA generator, so their random draws are not independent streams; the timing is what counts.
void concurrent_runs(const Config& cfg, int runs, int rounds) {
  std::vector<std::unique_ptr<LoopRun>> all;
  for (int k = 0; k < runs; ++k) all.push_back(make_loop_run(cfg, k));
  const torch::Device dev = all[0]->parts.device;
  for (auto& r : all) loop_round(*r, cfg);
  sync(dev);
  if (dev.is_cuda())
    for (auto& r : all) {
      const auto& st = r->steps->get(r->env->size(), r->parts.env.max_episode_len(), ActMode::Sample,
                                     cfg.get_bool("rl.rollout_dropout"));
      if (!r->sac->captured() || !st.captured())
        throw UserError("memlab bench rl --runs on CUDA needs the update and the acting step as CUDA graphs "
                        "(rl.cuda_graph and rl.rollout_graph true, and captured in the first round)");
    }
  auto timed = [&](const std::vector<LoopRun*>& group) {
    for (auto* r : group) r->env_steps = 0;
    sync(dev);
    const auto t0 = Clock::now();
    std::vector<std::thread> threads;
    std::vector<std::string> errors(group.size());
    for (size_t i = 0; i < group.size(); ++i)
      threads.emplace_back([&, i] {
        try {
          std::optional<c10::cuda::CUDAStreamGuard> guard;
          if (dev.is_cuda()) guard.emplace(c10::cuda::getStreamFromPool(false, dev.index()));
          for (int n = 0; n < rounds; ++n) loop_round(*group[i], cfg);
          if (dev.is_cuda()) c10::cuda::getCurrentCUDAStream().synchronize();
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    for (const auto& e : errors)
      if (!e.empty()) throw std::runtime_error("memlab bench rl --runs: a run failed: " + e);
    const double s = seconds_since(t0);
    int64_t steps = 0;
    for (auto* r : group) steps += r->env_steps;
    return static_cast<double>(steps) / s;
  };
  const double alone = timed({all[0].get()});
  std::vector<LoopRun*> group;
  for (auto& r : all) group.push_back(r.get());
  const double together = timed(group);
  std::printf("\n%d runs (seeds %lld..%lld) side by side, a thread and CUDA stream each, %d round%s of the loop:\n\n"
              "| runs | env steps/s, all runs | per run | vs one run alone |\n|---:|---:|---:|---:|\n",
              runs, static_cast<long long>(all.front()->seed), static_cast<long long>(all.back()->seed), rounds,
              rounds == 1 ? "" : "s");
  std::printf("| 1 | %.0f | %.0f | 1.00x |\n", alone, alone);
  std::printf("| %d | %.0f | %.0f | %.2fx |\n", runs, together, together / runs, together / alone);
}

}  // namespace

int bench_rl(const RlBenchArgs& a) {
  Config cfg = rl_config(a.config, {{"rl.device", a.device, "--device"}}, a.sets);
  RlParts parts = make_rl_parts(cfg);
  const torch::Device dev = parts.device;
  const uint64_t seed = static_cast<uint64_t>(cfg.get_int("rl.seed"));
  const int64_t envs = cfg.get_int("rl.envs"), B = cfg.get_int("rl.batch_episodes");
  const int64_t warm = cfg.get_int("rl.warmup_episodes");
  const double ups = cfg.get_float("rl.updates_per_step");
  const int64_t max_len = parts.env.max_episode_len();
  Sac sac(parts.agent, dev, sac_options(cfg, parts.bf16));
  EpisodeReplay replay(cfg.get_int("rl.buffer_transitions"), max_len, kObsSize, dev);
  std::printf("memlab bench rl: %s (agent %s, %lld parameters), L = %d (episodes of at most %lld steps), %s, %s\n"
              "rl.envs %lld, rl.batch_episodes %lld, rl.updates_per_step %g\n",
              a.config.empty() ? "(no config file)" : a.config.c_str(), cfg.get_string("model.name").c_str(),
              static_cast<long long>(sac.agent->num_params()), parts.env.distractor_len,
              static_cast<long long>(max_len), device_description(dev).c_str(),
              parts.bf16 ? "bf16 autocast" : "fp32", static_cast<long long>(envs), static_cast<long long>(B), ups);

  // 1. The warm-up's random episodes: the environment alone, recording what the replay keeps.
  Rng rng = make_rng(seed, kBenchDraws, 0);
  int64_t first = 0;
  RolloutOptions random;
  random.mode = ActMode::Random;
  VisualMatch warm_env(warm, parts.env);
  auto t0 = Clock::now();
  Episodes w = play_episodes(warm_env, episode_seeds(seed, first, warm), nullptr, dev, random, rng);
  const double env_ms = 1e3 * seconds_since(t0) / static_cast<double>(w.steps);
  first += warm;
  for (size_t i = 0; i < w.obs.size(); ++i) replay.add(w.obs[i], w.actions[i], w.rewards[i], w.seeds[i]);

  // 2. Rollouts: training episodes (actions sampled, dropout as the run has it), one round of rl.envs, through the
  // agent's dynamic step and through the fixed-shape step (graphed on CUDA with rl.rollout_graph), side by side.
  VisualMatch env(envs, parts.env);
  Agent agent = sac.agent;
  PolicySteps fixed_steps(agent, parts.bf16, dev, cfg.get_bool("rl.rollout_graph"));
  RolloutOptions dynamic_ro;
  dynamic_ro.mode = ActMode::Sample;
  dynamic_ro.dropout = cfg.get_bool("rl.rollout_dropout");
  dynamic_ro.bf16 = parts.bf16;
  RolloutOptions fixed_ro = dynamic_ro;
  fixed_ro.fixed = &fixed_steps;
  // What the run uses: the fixed step on CUDA with rl.rollout_graph (rl_trainer.cpp).
  const RolloutOptions& ro = dev.is_cuda() && cfg.get_bool("rl.rollout_graph") ? fixed_ro : dynamic_ro;
  auto round = [&](const RolloutOptions& o) {
    Episodes e = play_episodes(env, episode_seeds(seed, first, envs), &agent, dev, o, rng);
    first += envs;
    return e;
  };
  struct RolloutTime {
    double ms = 0, gpu_ms = -1, launches = -1;
  };
  std::vector<Episodes> played;
  auto time_rollout = [&](const RolloutOptions& o) {
    round(o);  // warm-up: cuBLAS handles, the allocator, the graph's capture
    RolloutTime r;
    const auto start = Clock::now();
    played.push_back(round(o));
    r.ms = 1e3 * seconds_since(start) / static_cast<double>(played.back().steps);
    if (dev.is_cuda()) {
      int64_t steps = 0;
      double total = 0;
      const auto prof = profile_kernels([&] { steps = round(o).steps; }, 1, &total);
      r.launches = 0;
      for (const auto& [name, kt] : prof) r.launches += kt.launches;
      r.gpu_ms = total / static_cast<double>(steps);
      r.launches /= static_cast<double>(steps);
    }
    return r;
  };
  const RolloutTime dynamic_rollout = time_rollout(dynamic_ro), fixed_rollout = time_rollout(fixed_ro);
  const double rollout_ms = (&ro == &fixed_ro ? fixed_rollout : dynamic_rollout).ms;
  for (const auto& e : played)
    for (size_t i = 0; i < e.obs.size(); ++i) replay.add(e.obs[i], e.actions[i], e.rewards[i], e.seeds[i]);

  // 3. Replay sampling (its index and length copies to the device included).
  const double sample_ms = median_wall_ms([&] { replay.sample(B, rng); }, dev, a.reps);

  // 4. The SAC update, as the run steps it (CUDA graph where the config has it), on one fixed batch.
  const SacBatch batch = replay.sample(B, rng);
  for (int i = 0; i < 5; ++i) sac.update(batch);  // warm-up, then the graph's capture
  const double update_ms = median_ms([&] { sac.update(batch); }, dev, a.reps);
  const double update_wall_ms = median_wall_ms([&] { sac.update(replay.sample(B, rng)); }, dev, a.reps);
  std::map<std::string, KernelTime> update_prof;
  double update_gpu_ms = 0;
  if (dev.is_cuda()) update_prof = profile_kernels([&] { sac.update(batch); }, kProfiledSteps, &update_gpu_ms);
  SacOptions eager_opts = sac_options(cfg, parts.bf16);
  eager_opts.cuda_graph = false;
  Sac eager(parts.agent, dev, eager_opts);
  const auto phases = phase_ms(eager, batch, dev, std::max(3, a.reps / 2));

  // 5. Whole rounds of the training loop: collect rl.envs episodes, then the updates they earn.
  double loop_s = 0, loop_rollout_s = 0, loop_update_s = 0;
  int64_t loop_steps = 0, loop_updates = 0;
  for (int r = 0; r < a.rounds; ++r) {
    sync(dev);
    const auto r0 = Clock::now();
    Episodes e = round(ro);
    for (size_t i = 0; i < e.obs.size(); ++i) replay.add(e.obs[i], e.actions[i], e.rewards[i], e.seeds[i]);
    const double collected = seconds_since(r0);
    const auto n = static_cast<int64_t>(std::ceil(ups * static_cast<double>(e.steps)));
    for (int64_t k = 0; k < n; ++k) sac.update(replay.sample(B, rng));
    sync(dev);
    const double all = seconds_since(r0);
    loop_s += all;
    loop_rollout_s += collected;
    loop_update_s += all - collected;
    loop_steps += e.steps;
    loop_updates += n;
  }

  const double per_step_updates = ups * update_wall_ms;
  std::printf("\n| part | ms | per env step (ms) | note |\n|---|---:|---:|---|\n");
  std::printf("| environment alone, random actions (%lld envs) | | %s | %.0f env steps/s |\n",
              static_cast<long long>(warm), ms(env_ms).c_str(), 1e3 / env_ms);
  auto rollout_row = [&](const char* form, const RolloutTime& r) {
    std::printf("| rollout through the %s, and the environment (%lld envs) | | %s | %s |\n", form,
                static_cast<long long>(envs), ms(r.ms).c_str(),
                r.gpu_ms < 0 ? "no GPU"
                             : fmt::format("GPU busy {} ms ({:.0f}%), {:.0f} kernel launches per env step",
                                           ms(r.gpu_ms), 100.0 * r.gpu_ms / r.ms, r.launches)
                                   .c_str());
  };
  rollout_row("agent's dynamic step()", dynamic_rollout);
  rollout_row(fixed_steps.get(envs, max_len, ActMode::Sample, dynamic_ro.dropout).captured()
                  ? "fixed-shape step (cuda graph)"
                  : "fixed-shape step (eager)",
              fixed_rollout);
  std::printf("| replay sample of %lld episodes, host view | %s | %s | x %g updates per env step |\n",
              static_cast<long long>(B), ms(sample_ms).c_str(), ms(ups * sample_ms).c_str(), ups);
  std::printf("| SAC update (%s), fixed batch, device time | %s | %s | |\n", sac.mode().c_str(), ms(update_ms).c_str(),
              ms(ups * update_ms).c_str());
  std::printf("| SAC update with its replay sample, host view | %s | %s | |\n", ms(update_wall_ms).c_str(),
              ms(per_step_updates).c_str());
  std::printf("| sum: rollout (%s) + sampled updates | | %s | %.0f env steps/s predicted |\n",
              &ro == &fixed_ro ? "fixed-shape step" : "dynamic step",
              ms(rollout_ms + per_step_updates).c_str(), 1e3 / (rollout_ms + per_step_updates));
  std::printf("| whole loop, %d round%s as the run steps them | | %s | **%.0f env steps/s**; rollout %.0f%%, updates "
              "%.0f%% (%lld updates) |\n",
              a.rounds, a.rounds == 1 ? "" : "s", ms(1e3 * loop_s / static_cast<double>(loop_steps)).c_str(),
              static_cast<double>(loop_steps) / loop_s, 100.0 * loop_rollout_s / loop_s,
              100.0 * loop_update_s / loop_s, static_cast<long long>(loop_updates));

  double phase_total = 0;
  for (const auto& [name, t] : phases) phase_total += t;
  std::printf("\nAn eager SAC update by phase (%s; the GPU's timeline between the phases' marks, launch gaps "
              "included): %s ms\n\n| phase | ms | share |\n|---|---:|---:|\n",
              dev.is_cuda() ? "CUDA events" : "host clock", ms(phase_total).c_str());
  for (const auto& [name, t] : phases)
    std::printf("| %s | %s | %.1f%% |\n", name.c_str(), ms(t).c_str(), 100.0 * t / phase_total);
  if (!update_prof.empty()) {
    double launches = 0;
    for (const auto& [name, kt] : update_prof) launches += kt.launches;
    std::printf("\nProfile of the update as the run steps it (%s), %d updates (Kineto/CUPTI): %s ms of GPU kernels "
                "per update in %.0f launches\n",
                sac.mode().c_str(), kProfiledSteps, ms(update_gpu_ms).c_str(), launches);
    print_family_table(update_prof, update_gpu_ms);
    print_kernel_table(update_prof, update_gpu_ms, a.top);
  }
  if (a.by_op && dev.is_cuda()) {
    std::printf("\nAn eager update, ");
    print_op_table(profile_ops([&] { eager.update(batch); }, kProfiledSteps), a.top);
  }
  if (a.runs > 1) concurrent_runs(cfg, a.runs, a.rounds);
  return 0;
}

}  // namespace memlab
