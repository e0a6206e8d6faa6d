#include "rl/rl_trainer.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>

#include "core/config.h"
#include "ops/kernels.h"
#include "core/device.h"
#include "core/errors.h"
#include "core/io.h"
#include "core/log.h"
#include "core/memory_budget.h"
#include "core/rng.h"
#include "core/run_dir.h"
#include "core/run_files.h"
#include "core/tensorboard.h"
#include "envs/visual_match.h"
#include "mixers/mixer.h"
#include "models/agent.h"
#include "rl/replay_buffer.h"
#include "rl/rl_parts.h"
#include "rl/rollout.h"
#include "rl/sac.h"
#include "models/sequence_model.h"
#include "train/checkpoint.h"

namespace memlab {

const char* kCurveHeader =
    "episodes,env_steps,updates,return,success,length,train_return,train_success,elapsed_s,env_steps_per_s";

namespace {

const char* kTrainHeader = "episodes,env_steps,updates,critic_loss,actor_loss,entropy,q_mean,grad_norm,"
                           "skipped_updates,ms_per_update,rollout_ms_per_step";

// Seed streams of one run.
constexpr uint64_t kTrainSeeds = 0x524c01, kEvalSeeds = 0x524c02, kReplayDraws = 0x524c03, kTorchDraws = 0x524c04,
                   kRandomActions = 0x524c05;

void register_rl_keys(Schema& s) {
  s.add_string("label", "", "name of this run in memlab rl plot; empty = model.name");
  s.add_int("rl.train_episodes", 2565, "policy episodes collected after the warm-up (the paper: 2565)", 0);
  s.add_int("rl.warmup_episodes", 10, "episodes of uniform random actions before training", 1);
  s.add_int("rl.envs", 1, "episodes collected in parallel per round (the reference: 1)", 1, 4096);
  s.add_int("rl.batch_episodes", 64, "whole episodes per SAC update", 1);
  s.add_float("rl.updates_per_step", 0.25, "gradient updates per environment step collected", 0.0, 1000.0);
  s.add_float("rl.gamma", 0.99, "discount", 0.0, 1.0);
  s.add_float("rl.alpha", 0.1, "fixed entropy temperature", 0.0, 100.0);
  s.add_float("rl.reward_scale", 1.0, "the learner sees rewards times this (returns are reported unscaled)", 1e-6,
              1e6);
  s.add_float("rl.tau", 0.005, "soft update rate of the target critics", 0.0, 1.0);
  s.add_float("rl.lr", 3e-4, "Adam learning rate of every parameter", 0.0, 1.0);
  s.add_float("rl.clip", 0.0, "gradient clipping by global norm; 0 = off (the reference)", 0.0);
  s.add_bool("rl.freeze_critic", true, "actor loss on a detached state with the critics' values as constants");
  s.add_bool("rl.rollout_dropout", true, "keep dropout on while collecting training episodes (the reference)");
  s.add_int("rl.buffer_transitions", 1000000, "replay capacity in transitions (kept in episode slots)", 1);
  s.add_int("rl.eval_every", 10, "training episodes between evaluations", 1);
  s.add_int("rl.eval_episodes", 20, "greedy episodes per evaluation (played in parallel)", 1, 4096);
  s.add_int("rl.checkpoint_every", 100, "training episodes between checkpoints (also at the end)", 1);
  s.add_int("rl.seed", 1, "seed of initialisation, episodes and sampling", 0);
  s.add_string("rl.device", "auto", "cpu, cuda, or auto (CUDA when present)", {"auto", "cpu", "cuda"});
  s.add_string("rl.precision", "auto", "auto = bf16 autocast of the sequence model on CUDA, fp32 on CPU",
               {"auto", "fp32", "bf16"});
  s.add_bool("rl.cuda_graph", true, "on CUDA, capture the SAC update once as a CUDA graph and replay it");
  s.add_bool("rl.rollout_graph", true,
             "on CUDA, act through the mixers' fixed-shape step, captured once as a CUDA graph (one launch per env step)");
  s.add_bool("rl.tf32", true,
             "on CUDA, the SAC update's actor and critic heads (fp32, outside bf16 autocast) multiply on TF32 tensor "
             "cores; false = full fp32 (PyTorch's default, the reference's)")
      .before_key("rl.tf32", "false");  // runs saved before the key trained their heads in full fp32
  s.add_bool("rl.tensorboard", true, "write TensorBoard event files (events.out.tfevents.*) in the run directory");
  register_agent_keys(s);
}

void register_env_keys(Schema& s) {
  s.add_int("env.distractor_len", 750, "distractor phase length L (episode: 15 + L + up to 15 steps)", 0, 1e7);
  s.add_int("env.explore_len", 15, "steps of the colour phase", 1, 1e6);
  s.add_int("env.reward_len", 15, "most steps of the reward phase", 1, 1e6);
  s.add_int("env.n_apples", 10, "apples in the distractor room (of 22 slots)", 0, 22);
  s.add_float("env.apple_reward", 1.0, "reward of an apple", -1e6, 1e6);
  s.add_int("env.respawn_every", 20, "an eaten apple is back after this many steps", 0, 1e7);
  s.add_float("env.final_reward", 100.0, "reward of the matching colour", -1e6, 1e6);
  s.add_string("env.reward_phase", "paper",
               "paper: touching a colour ends the episode; reference: the phase always runs its 15 steps",
               {"paper", "reference"});
  s.add_string("env.colours", "episode", "door colours shuffled per episode, or fixed once (env.colour_seed)",
               {"episode", "fixed"});
  s.add_int("env.colour_seed", 0, "seed of the fixed door colours", 0);
}

VisualMatchConfig env_config(const Config& cfg) {
  VisualMatchConfig v;
  v.distractor_len = static_cast<int>(cfg.get_int("env.distractor_len"));
  v.explore_len = static_cast<int>(cfg.get_int("env.explore_len"));
  v.reward_len = static_cast<int>(cfg.get_int("env.reward_len"));
  v.n_apples = static_cast<int>(cfg.get_int("env.n_apples"));
  v.apple_reward = static_cast<float>(cfg.get_float("env.apple_reward"));
  v.respawn_every = static_cast<int>(cfg.get_int("env.respawn_every"));
  v.final_reward = static_cast<float>(cfg.get_float("env.final_reward"));
  v.reward_phase = parse_reward_phase(cfg.get_string("env.reward_phase"));
  v.colours = parse_colour_shuffle(cfg.get_string("env.colours"));
  v.colour_seed = static_cast<uint64_t>(cfg.get_int("env.colour_seed"));
  v.validate();
  return v;
}

}  // namespace

RlParts make_rl_parts(const Config& cfg) {
  RlParts p;
  p.env = env_config(cfg);
  p.device = pick_device(cfg.get_string("rl.device"));
  p.bf16 = bf16_autocast(cfg, "rl.precision", p.device);
  check_kernels(cfg, p.device.is_cuda());
  if (cfg.get_string("model.head") != "lm") cfg.fail("model.head", "the RL agent has its own heads; leave it at lm");
  // Lower bounds (core/memory_budget.h): the agent's blocks, the replay buffer (observations and a few
  // numbers per transition) and one update's activations over whole episodes.
  const double params = min_block_params(cfg), D = static_cast<double>(cfg.get_int("model.hidden"));
  const double transitions = static_cast<double>(cfg.get_int("rl.buffer_transitions"));
  const double batch_tokens =
      static_cast<double>(cfg.get_int("rl.batch_episodes")) * static_cast<double>(p.env.max_episode_len());
  const bool cuda = p.device.is_cuda();
  check_memory_needs(
      {{"the agent's weights, gradients and Adam moments", "model.hidden or model.layers", 16 * params, cuda},
       {fmt::format("the replay buffer (rl.buffer_transitions {})", transitions), "rl.buffer_transitions",
        transitions * static_cast<double>(kObsSize + 12), cuda},
       {fmt::format("a SAC update's activations (rl.batch_episodes {} x episodes of {} steps)",
                    cfg.get_int("rl.batch_episodes"), p.env.max_episode_len()),
        "rl.batch_episodes, env.distractor_len or model.hidden",
        batch_tokens * 8 * D * static_cast<double>(cfg.get_int("model.layers")), cuda}},
      device_memory_bytes(p.device));
  torch::manual_seed(static_cast<uint64_t>(cfg.get_int("rl.seed")));
  p.agent = Agent(cfg);
  return p;
}

SacOptions sac_options(const Config& cfg, bool bf16) {
  SacOptions so;
  so.gamma = cfg.get_float("rl.gamma");
  so.alpha = cfg.get_float("rl.alpha");
  so.tau = cfg.get_float("rl.tau");
  so.lr = cfg.get_float("rl.lr");
  so.clip = cfg.get_float("rl.clip");
  so.freeze_critic = cfg.get_bool("rl.freeze_critic");
  so.bf16 = bf16;
  so.cuda_graph = cfg.get_bool("rl.cuda_graph");
  so.tf32 = cfg.get_bool("rl.tf32");
  return so;
}

namespace {

struct CurveRow {
  int64_t episodes, env_steps, updates;
  double ret, success, length, train_return, train_success, elapsed_s, steps_per_s;
};
struct StatsRow {
  int64_t episodes, env_steps, updates;
  double critic, actor, entropy, q, gnorm;
  int64_t skipped;
  double ms_per_update, rollout_ms_per_step;
};

class RlRun {
 public:
  RlRun(const Config& cfg, const RlRequest& req) : cfg_(cfg), req_(req) {}
  int go();

 private:
  void evaluate();
  void collect(ActMode mode, int64_t n);
  void train_updates(int64_t n);
  void write_files();
  void write_summary();
  void save();
  void load();
  double loop_seconds() const;

  const Config& cfg_;
  RlRequest req_;
  RlParts prep_;
  std::unique_ptr<Sac> sac_;
  std::unique_ptr<EpisodeReplay> replay_;
  std::unique_ptr<VisualMatch> train_env_, eval_env_;
  std::unique_ptr<PolicySteps> acting_;  // the graphed acting steps (CUDA, rl.rollout_graph); null: dynamic steps
  uint64_t seed_ = 0;
  // counters (saved in checkpoints)
  int64_t warm_done_ = 0, episodes_ = 0, env_steps_ = 0, updates_ = 0, eval_rounds_ = 0, rounds_ = 0;
  double loop_s_ = 0, eval_s_ = 0;  // time spent collecting and training, and evaluating
  // since the last evaluation
  std::vector<double> recent_returns_;
  std::vector<bool> recent_success_;
  double update_s_ = 0, rollout_s_ = 0;
  int64_t window_updates_ = 0, window_steps_ = 0;
  std::vector<CurveRow> curve_;
  std::vector<StatsRow> stats_;
  std::unique_ptr<EventWriter> events_;
  std::unique_ptr<torch::serialize::InputArchive> ckpt_;  // the checkpoint being resumed, until load()
};

// What a run writes besides config.yaml, log.txt and its event files.
const std::vector<std::string> kOutputs = {"curve.csv", "train.csv", "summary.md", "checkpoint.pt",
                                           "curve_return.png", "curve_return.svg", "curve_success.png",
                                           "curve_success.svg"};

// Keys a resumed run may change: how long it trains, where, how it logs, evaluates and checkpoints.
bool may_change_on_resume(const std::string& key) {
  return key == "rl.train_episodes" || key == "rl.device" || key == "rl.eval_every" || key == "rl.eval_episodes" ||
         key == "rl.checkpoint_every" || key == "rl.cuda_graph" || key == "rl.rollout_graph" ||
         key == "rl.tf32" || key == "rl.tensorboard" || key == "model.kernels" ||
         key == "label";
}

std::vector<uint64_t> seeds_for(uint64_t seed, uint64_t stream, int64_t first, int64_t n) {
  std::vector<uint64_t> s;
  for (int64_t i = 0; i < n; ++i) s.push_back(derive_seed(seed, stream, static_cast<uint64_t>(first + i)));
  return s;
}

void RlRun::collect(ActMode mode, int64_t n) {
  // Each round's sampling (actions, dropout) is seeded by its index, so a resumed run replays it exactly.
  torch::manual_seed(derive_seed(seed_, kTorchDraws, static_cast<uint64_t>(rounds_)));
  Rng rng = make_rng(seed_, kRandomActions, static_cast<uint64_t>(rounds_));
  const int64_t first = warm_done_ + episodes_;
  if (train_env_->size() != n) train_env_ = std::make_unique<VisualMatch>(n, prep_.env);
  RolloutOptions ro;
  ro.mode = mode;
  ro.dropout = cfg_.get_bool("rl.rollout_dropout");
  ro.bf16 = prep_.bf16;
  ro.fixed = acting_.get();
  const auto t0 = std::chrono::steady_clock::now();
  Agent agent = sac_->agent;
  Episodes eps = play_episodes(*train_env_, seeds_for(seed_, kTrainSeeds, first, n), &agent, prep_.device, ro, rng);
  rollout_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double reward_scale = cfg_.get_float("rl.reward_scale");
  for (size_t i = 0; i < eps.obs.size(); ++i) {
    replay_->add(eps.obs[i], eps.actions[i], eps.rewards[i] * reward_scale, eps.seeds[i]);
    if (mode != ActMode::Random) {
      recent_returns_.push_back(eps.returns[i]);
      recent_success_.push_back(eps.success[i]);
    }
  }
  env_steps_ += eps.steps;
  window_steps_ += eps.steps;
  ++rounds_;
  train_updates(static_cast<int64_t>(std::ceil(cfg_.get_float("rl.updates_per_step") * double(eps.steps))));
}

void RlRun::train_updates(int64_t n) {
  if (n <= 0) return;
  Rng rng = make_rng(seed_, kReplayDraws, static_cast<uint64_t>(rounds_));
  const int64_t B = cfg_.get_int("rl.batch_episodes");
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t k = 0; k < n; ++k) sac_->update(replay_->sample(B, rng));
  if (prep_.device.is_cuda()) torch::cuda::synchronize();
  update_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  updates_ += n;
  window_updates_ += n;
}

void RlRun::evaluate() {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t n = cfg_.get_int("rl.eval_episodes");
  torch::manual_seed(derive_seed(seed_, kTorchDraws ^ 0xe7a1, static_cast<uint64_t>(eval_rounds_)));
  Rng rng = make_rng(seed_, kRandomActions ^ 0xe7a1, static_cast<uint64_t>(eval_rounds_));
  RolloutOptions ro;
  ro.mode = ActMode::Greedy;
  ro.dropout = false;
  ro.bf16 = prep_.bf16;
  ro.record = false;
  ro.fixed = acting_.get();
  Agent agent = sac_->agent;
  Episodes eps =
      play_episodes(*eval_env_, seeds_for(seed_, kEvalSeeds, eval_rounds_ * n, n), &agent, prep_.device, ro, rng);
  ++eval_rounds_;
  eval_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  double len = 0;
  for (auto l : eps.lengths) len += double(l);
  double tr = 0, ts = 0;
  for (size_t i = 0; i < recent_returns_.size(); ++i) {
    tr += recent_returns_[i];
    ts += recent_success_[i];
  }
  const double nr = double(std::max<size_t>(1, recent_returns_.size()));
  const double loop = loop_seconds();
  CurveRow row{episodes_,
               env_steps_,
               updates_,
               eps.mean_return(),
               eps.success_rate(),
               len / double(n),
               recent_returns_.empty() ? std::nan("") : tr / nr,
               recent_returns_.empty() ? std::nan("") : ts / nr,
               loop + eval_s_,
               loop > 0 ? double(env_steps_) / loop : 0.0};
  curve_.push_back(row);
  const std::initializer_list<std::pair<const char*, double>> curve = {
      {"eval/return", row.ret},          {"eval/success", row.success},
      {"eval/episode_length", row.length}, {"train/return", row.train_return},
      {"train/success", row.train_success}, {"train/env_steps_per_s", row.steps_per_s}};
  for (const auto& [name, value] : curve)
    if (!std::isnan(value)) events_->scalar(name, env_steps_, value);

  // the learner's statistics since the last evaluation
  if (window_updates_ > 0) {
    const double w = double(window_updates_);
    StatsRow s{episodes_,
               env_steps_,
               updates_,
               sac_->critic_sum.item<double>() / w,
               sac_->actor_sum.item<double>() / w,
               sac_->entropy_sum.item<double>() / w,
               sac_->q_sum.item<double>() / w,
               sac_->gnorm_sum.item<double>() / w,
               sac_->bad_updates.item<int64_t>(),
               1000.0 * update_s_ / w,
               window_steps_ ? 1000.0 * rollout_s_ / double(window_steps_) : 0.0};
    stats_.push_back(s);
    const std::initializer_list<std::pair<const char*, double>> learner = {
        {"sac/critic_loss", s.critic}, {"sac/actor_loss", s.actor},   {"sac/entropy", s.entropy},
        {"sac/q_mean", s.q},           {"sac/grad_norm", s.gnorm},    {"sac/ms_per_update", s.ms_per_update}};
    for (const auto& [name, value] : learner) events_->scalar(name, env_steps_, value);
    const int64_t skipped = s.skipped;
    if (skipped * 2 > window_updates_) {
      save();
      throw NumericError(fmt::format(
          "{} of the last {} SAC updates had a NaN/Inf loss or gradient and were skipped; the last checkpoint is "
          "in {} — lower rl.lr or set rl.clip",
          skipped, window_updates_, req_.out_dir));
    }
    sac_->reset_stats();
  }
  const int64_t total = cfg_.get_int("rl.train_episodes");
  const double eta = episodes_ > 0 && loop > 0 ? (loop + eval_s_) / double(episodes_) * double(total - episodes_) : 0.0;
  logf("episode {:>5}/{} | env steps {} | eval return {:.2f} success {:.2f} | train return {:.2f} | critic {:.4g} "
       "actor {:.4g} entropy {:.3f} | {:.0f} env steps/s | eta {}",
       episodes_, total, env_steps_, row.ret, row.success, recent_returns_.empty() ? 0.0 : tr / nr,
       stats_.empty() ? 0.0 : stats_.back().critic, stats_.empty() ? 0.0 : stats_.back().actor,
       stats_.empty() ? 0.0 : stats_.back().entropy, row.steps_per_s, format_duration(eta));
  recent_returns_.clear();
  recent_success_.clear();
  update_s_ = rollout_s_ = 0;
  window_updates_ = window_steps_ = 0;
  write_files();
}

double RlRun::loop_seconds() const { return loop_s_; }

std::string csv_num(double x) { return std::isnan(x) ? "" : fmt::format("{:.6g}", x); }

void RlRun::write_files() {
  std::string c = std::string(kCurveHeader) + "\n";
  for (const auto& r : curve_)
    c += fmt::format("{},{},{},{},{},{},{},{},{:.3f},{:.1f}\n", r.episodes, r.env_steps, r.updates, csv_num(r.ret),
                     csv_num(r.success), csv_num(r.length), csv_num(r.train_return), csv_num(r.train_success),
                     r.elapsed_s, r.steps_per_s);
  write_file_atomic(join_path(req_.out_dir, "curve.csv"), c);
  std::string t = std::string(kTrainHeader) + "\n";
  for (const auto& r : stats_)
    t += fmt::format("{},{},{},{},{},{},{},{},{},{:.3f},{:.4f}\n", r.episodes, r.env_steps, r.updates,
                     csv_num(r.critic), csv_num(r.actor), csv_num(r.entropy), csv_num(r.q), csv_num(r.gnorm), r.skipped,
                     r.ms_per_update, r.rollout_ms_per_step);
  write_file_atomic(join_path(req_.out_dir, "train.csv"), t);
}

void RlRun::write_summary() {
  const auto& last = curve_.back();
  double best = 0;
  int64_t best_ep = 0;
  for (const auto& r : curve_)
    if (r.success > best) best = r.success, best_ep = r.episodes;
  // mean over the last (up to) 10 evaluations: one evaluation of 20 episodes is noisy
  double tail_s = 0, tail_r = 0;
  const size_t k = std::min<size_t>(10, curve_.size());
  for (size_t i = curve_.size() - k; i < curve_.size(); ++i) tail_s += curve_[i].success, tail_r += curve_[i].ret;
  std::string s = fmt::format("# Passive Visual Match (L = {}) · {} · seed {}\n\n", prep_.env.distractor_len,
                              cfg_.get_string("model.name"), seed_);
  const int64_t total = cfg_.get_int("rl.train_episodes");
  if (episodes_ < total)
    s += fmt::format("Stopped at training episode {} of {}; `memlab rl visual-match --resume {}` continues.\n\n",
                     episodes_, total, req_.out_dir);
  s += fmt::format(
      "- {} training episodes after {} warm-up episodes; {} environment steps; {} SAC updates of {} episodes\n"
      "- agent: {} parameters; device {}; precision {}; update step: {}; acting step: {}\n"
      "- time: {} in all; training loop (collection + updates) {:.1f} environment steps/s; evaluation {}\n\n",
      episodes_, warm_done_, env_steps_, updates_, cfg_.get_int("rl.batch_episodes"), sac_->agent->num_params(),
      device_description(prep_.device), prep_.bf16 ? "bf16 autocast" : "fp32", sac_->mode(),
      acting_ ? acting_->mode() : "dynamic, eager", format_duration(loop_s_ + eval_s_), loop_s_ > 0 ? double(env_steps_) / loop_s_ : 0.0, format_duration(eval_s_));
  s += fmt::format("| evaluation ({} greedy episodes each) | return | success |\n|---|---:|---:|\n",
                   cfg_.get_int("rl.eval_episodes"));
  s += fmt::format("| last (episode {}) | {:.2f} | {:.3f} |\n", last.episodes, last.ret, last.success);
  s += fmt::format("| mean of the last {} | {:.2f} | {:.3f} |\n", k, tail_r / double(k), tail_s / double(k));
  s += fmt::format("| best success (episode {}) | | {:.3f} |\n", best_ep, best);
  s += "\nChance success of a policy that walks to a random colour: 1/3.\n";
  write_file_atomic(join_path(req_.out_dir, "summary.md"), s);
}

void RlRun::save() {
  torch::serialize::OutputArchive ar;
  sac_->agent->save(ar);
  torch::serialize::OutputArchive tar;
  sac_->target->save(tar);
  ar.write("target", tar);
  sac_->opt->save(ar);
  replay_->save(ar);
  ar.write("rl.counters",
           torch::tensor({warm_done_, episodes_, env_steps_, updates_, eval_rounds_, rounds_}, torch::kLong));
  ar.write("rl.seconds", torch::tensor({loop_s_, eval_s_}, torch::kDouble));
  // The window since the last evaluation, so a run stopped between evaluations resumes the same
  ar.write("rl.window", torch::tensor({static_cast<double>(window_updates_), static_cast<double>(window_steps_),
                                       update_s_, rollout_s_}, torch::kDouble));
  ar.write("rl.recent_returns", torch::tensor(recent_returns_, torch::kDouble));
  std::vector<double> success(recent_success_.begin(), recent_success_.end());
  ar.write("rl.recent_success", torch::tensor(success, torch::kDouble));
  ar.write("rl.learner_sums", torch::stack({sac_->critic_sum.to(torch::kDouble).cpu(), sac_->actor_sum.to(torch::kDouble).cpu(),
                                            sac_->entropy_sum.to(torch::kDouble).cpu(), sac_->q_sum.to(torch::kDouble).cpu(),
                                            sac_->gnorm_sum.to(torch::kDouble).cpu(),
                                            sac_->bad_updates.to(torch::kDouble).cpu()}));
  write_config(ar, cfg_);
  save_archive_atomic(ar, join_path(req_.out_dir, "checkpoint.pt"));
}

void RlRun::load() {
  const std::string path = join_path(req_.out_dir, "checkpoint.pt");
  torch::serialize::InputArchive& ar = *ckpt_;
  try {
    sac_->agent->load(ar);
    torch::serialize::InputArchive tar;
    ar.read("target", tar);
    sac_->target->load(tar);
    sac_->opt->load(ar);
    replay_->load(ar, replay_in(prep_.env, cfg_.get_float("rl.reward_scale")));
    torch::Tensor c, t;
    ar.read("rl.counters", c);
    ar.read("rl.seconds", t);
    c = c.cpu();
    t = t.cpu();
    warm_done_ = c[0].item<int64_t>();
    episodes_ = c[1].item<int64_t>();
    env_steps_ = c[2].item<int64_t>();
    updates_ = c[3].item<int64_t>();
    eval_rounds_ = c[4].item<int64_t>();
    rounds_ = c[5].item<int64_t>();
    loop_s_ = t[0].item<double>();
    eval_s_ = t[1].item<double>();
    torch::Tensor w, returns, success, sums;
    if (ar.try_read("rl.window", w)) {  // absent in checkpoints of memlab before 2026-11-23
      w = w.cpu();
      window_updates_ = static_cast<int64_t>(w[0].item<double>());
      window_steps_ = static_cast<int64_t>(w[1].item<double>());
      update_s_ = w[2].item<double>();
      rollout_s_ = w[3].item<double>();
      ar.read("rl.recent_returns", returns);
      ar.read("rl.recent_success", success);
      ar.read("rl.learner_sums", sums);
      returns = returns.cpu().contiguous();
      success = success.cpu().contiguous();
      recent_returns_.assign(returns.data_ptr<double>(), returns.data_ptr<double>() + returns.numel());
      for (int64_t i = 0; i < success.numel(); ++i) recent_success_.push_back(success[i].item<double>() > 0.5);
      sums = sums.cpu();
      torch::Tensor* dst[] = {&sac_->critic_sum, &sac_->actor_sum, &sac_->entropy_sum,
                              &sac_->q_sum,      &sac_->gnorm_sum, &sac_->bad_updates};
      for (int k = 0; k < 6; ++k) dst[k]->fill_(sums[k].item<double>());
    }
  } catch (const c10::Error& e) {
    throw UserError(fmt::format("checkpoint '{}' does not fit the agent of this config (a model.* key differs from the "
                                "run that wrote it): {}",
                                path, torch_message(e)));
  }
  for (const auto& r : read_csv(join_path(req_.out_dir, "curve.csv"))) {
    if (r.size() != 10 || std::stoll(r[0]) > episodes_) continue;
    auto num = [](const std::string& x) { return x.empty() ? std::nan("") : std::stod(x); };
    curve_.push_back({std::stoll(r[0]), std::stoll(r[1]), std::stoll(r[2]), num(r[3]), num(r[4]), num(r[5]), num(r[6]),
                      num(r[7]), num(r[8]), num(r[9])});
  }
  for (const auto& r : read_csv(join_path(req_.out_dir, "train.csv"))) {
    if (r.size() != 11 || std::stoll(r[0]) > episodes_) continue;
    auto num = [](const std::string& x) { return x.empty() ? std::nan("") : std::stod(x); };
    stats_.push_back({std::stoll(r[0]), std::stoll(r[1]), std::stoll(r[2]), num(r[3]), num(r[4]), num(r[5]), num(r[6]),
                      num(r[7]), std::stoll(r[8]), num(r[9]), num(r[10])});
  }
}

int RlRun::go() {
  StopSignals stop;  // from the start: a SIGTERM during setup stops the run as one during training
  prep_ = make_rl_parts(cfg_);
  seed_ = static_cast<uint64_t>(cfg_.get_int("rl.seed"));
  const int64_t total = cfg_.get_int("rl.train_episodes"), warm = cfg_.get_int("rl.warmup_episodes");
  // A checkpoint is checked (whole, same config, not past rl.train_episodes) before the directory is touched.
  const std::string ckpt = join_path(req_.out_dir, "checkpoint.pt");
  if (req_.resume && path_exists(ckpt)) {
    ckpt_ = std::make_unique<torch::serialize::InputArchive>();
    load_archive(*ckpt_, ckpt, prep_.device);
    check_resumed_config(cfg_, read_config(*ckpt_), may_change_on_resume, req_.out_dir);
    torch::Tensor c;
    if (ckpt_->try_read("rl.counters", c) && c.cpu()[1].item<int64_t>() > total)
      throw UserError(fmt::format("cannot resume '{}' to rl.train_episodes = {}: it is at training episode {} already",
                                  req_.out_dir, total, c.cpu()[1].item<int64_t>()));
  }
  open_run_dir(req_.out_dir, req_.resume, cfg_.dump(), kOutputs);

  sac_ = std::make_unique<Sac>(prep_.agent, prep_.device, sac_options(cfg_, prep_.bf16));
  const int64_t max_len = prep_.env.max_episode_len();
  replay_ = std::make_unique<EpisodeReplay>(cfg_.get_int("rl.buffer_transitions"), max_len, kObsSize, prep_.device);
  train_env_ = std::make_unique<VisualMatch>(cfg_.get_int("rl.envs"), prep_.env);
  eval_env_ = std::make_unique<VisualMatch>(cfg_.get_int("rl.eval_episodes"), prep_.env);
  if (prep_.device.is_cuda() && cfg_.get_bool("rl.rollout_graph"))
    acting_ = std::make_unique<PolicySteps>(prep_.agent, prep_.bf16, prep_.device, /*graph=*/true);
  if (ckpt_) {
    load();
    ckpt_.reset();
    logf("resuming {} at training episode {} ({} environment steps)", req_.out_dir, episodes_, env_steps_);
  }
  events_ = std::make_unique<EventWriter>(cfg_.get_bool("rl.tensorboard") ? req_.out_dir : "", env_steps_);
  const int64_t envs = cfg_.get_int("rl.envs"), eval_every = cfg_.get_int("rl.eval_every");
  const int64_t ckpt_every = cfg_.get_int("rl.checkpoint_every");
  logf("memlab rl visual-match: model {} · {} parameters · device {} · {}", cfg_.get_string("model.name"),
       sac_->agent->num_params(), device_description(prep_.device), prep_.bf16 ? "bf16" : "fp32");
  logf("distractor L = {} (episodes of at most {} steps); {} warm-up + {} training episodes, {} per round; batches "
       "of {} episodes; replay {} episodes; run directory {}",
       prep_.env.distractor_len, max_len, warm, total, envs, cfg_.get_int("rl.batch_episodes"), replay_->slots(),
       req_.out_dir);

  auto timed = [&](auto&& f) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    loop_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  if (warm_done_ < warm && !stop.requested()) {
    timed([&] { collect(ActMode::Random, warm - warm_done_); });
    warm_done_ = warm;
    logf("warm-up: {} random episodes, {} environment steps, {} updates", warm, env_steps_, updates_);
  }
  if (curve_.empty() && !stop.requested()) evaluate();
  std::string mode_logged;
  int64_t next_ckpt = (episodes_ / ckpt_every + 1) * ckpt_every;
  while (episodes_ < total && !stop.requested()) {
    const int64_t n = std::min(envs, total - episodes_);
    // episodes_ is counted in collect's seeds; advance it after
    timed([&] { collect(ActMode::Sample, n); });
    episodes_ += n;
    if (sac_->mode() != mode_logged) {
      logf("SAC update: {}", sac_->mode());
      mode_logged = sac_->mode();
    }
    if (episodes_ / eval_every != (episodes_ - n) / eval_every || episodes_ == total) evaluate();
    if (episodes_ >= next_ckpt || episodes_ == total) {
      save();
      next_ckpt = (episodes_ / ckpt_every + 1) * ckpt_every;
    }
  }
  if (stop.requested()) {
    // No evaluation here: one would shift the evaluation episodes' seeds of the resumed run.
    save();
    if (!curve_.empty()) write_summary();
    log_close();
    std::fprintf(stderr, "interrupted at training episode %lld; checkpoint saved. Continue with: memlab rl visual-match "
                 "--resume %s\n", static_cast<long long>(episodes_), req_.out_dir.c_str());
    return 130;
  }
  stop.release();
  write_summary();
  logf("done: {} training episodes, {} environment steps in {}; results in {}", episodes_, env_steps_,
       format_duration(loop_s_ + eval_s_), req_.out_dir);
  log_close();
  return 0;
}

}  // namespace

Schema& rl_schema() {
  static Schema s = [] {
    Schema x;
    register_model_keys(x);
    register_rl_keys(x);
    register_env_keys(x);
    return x;
  }();
  return s;
}

std::string rl_model_defaults(const std::string& model) {
  std::string y =
      "model:\n  hidden: 100\n  heads: 2\n  init_std: 0.02\n  mlp: true\n  mlp_inner: 0\n  mlp_ratio: 4\n";
  if (model == "transformer") return y + "  layers: 2\n  attention: {window: 0, pos: rope}\n";
  y += "  layers: 3\n";
  if (model == "deltanet") return y + "  deltanet: {neg_eigval: false, short_conv: false, out_gate: false}\n";
  if (model == "hqlt")
    return y +
           "  hqlt: {variant: synchronous, window: 64, chunk: 64, pos: rope, mixing: vector, neg_eigval: true, "
           "short_conv: false, out_gate: false}\n";
  return y;
}

void check_rl_config(const Config& cfg) { make_rl_parts(cfg); }

Config rl_config(const std::string& file, const std::vector<FlagValue>& flags, const std::vector<std::string>& sets,
                 bool saved_run) {
  // The model decides the paper defaults, so find it first: a flag, else the file's, else the default.
  Config probe(rl_schema());
  if (!file.empty()) probe.merge_file(file);
  for (const auto& f : flags)
    if (!f.value.empty()) probe.set_value(f.key, f.value, f.flag);
  for (const auto& s : sets) probe.set(s);
  Config cfg(rl_schema());
  cfg.merge_text(rl_model_defaults(probe.get_string("model.name")), "the paper's agent for this model");
  if (!file.empty() && saved_run)
    cfg.merge_saved_run(file);
  else if (!file.empty())
    cfg.merge_file(file);
  for (const auto& f : flags)
    if (!f.value.empty()) cfg.set_value(f.key, f.value, f.flag);
  for (const auto& s : sets) cfg.set(s);
  return cfg;
}

int run_rl(const Config& cfg, const RlRequest& req) {
  RlRun run(cfg, req);
  return run.go();
}

}  // namespace memlab
