#include "train/trainer.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <fstream>
#include <sstream>

#include "core/config.h"
#include "core/device.h"
#include "core/errors.h"
#include "core/io.h"
#include "core/length_generalisation.h"
#include "core/run_files.h"
#include "core/log.h"
#include "models/sequence_model.h"
#include "tasks/task.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/optimizer.h"
#include "train/train_step.h"

namespace memlab {
namespace {

std::atomic<bool> g_interrupted{false};
void on_sigint(int) { g_interrupted = true; }

struct TrainRow {
  int64_t step;
  double loss, accuracy, lr, grad_norm, ms_per_step, elapsed_s;
};

const char* kTrainHeader = "step,loss,accuracy,lr,grad_norm,ms_per_step,elapsed_s";
const char* kEvalHeader = "task,model,seed,step,length_min,length_max,n,accuracy,normalized_accuracy";


std::vector<LengthRange> eval_ranges(const Config& cfg, const Task& task) {
  std::vector<LengthRange> out;
  for (auto [a, b] : cfg.get_ranges("eval.ranges")) {
    if (a < 3) cfg.fail("eval.ranges", "lengths must be >= 3");
    out.push_back({a, b});
  }
  if (!out.empty()) return out;
  // Default: the training range, the evaluation range, and the evaluation range cut into three bins.
  out.push_back(task.train_range);
  out.push_back(task.eval_range);
  const auto [lo, hi] = task.eval_range;
  if (hi - lo >= 8) {
    const int64_t a = lo + (hi - lo) / 8, b = lo + (hi - lo) * 3 / 8;
    out.push_back({lo, a});
    out.push_back({a + 1, b});
    out.push_back({b + 1, hi});
  }
  return out;
}

std::string length_table(const std::vector<EvalRow>& rows, const LengthRange& protocol, double threshold) {
  std::string s = "| lengths | n | accuracy | normalised |\n|---|---:|---:|---:|\n";
  std::vector<LengthAccuracy> bins;
  for (const auto& r : rows) {
    const bool main = r.length_min == protocol.min && r.length_max == protocol.max;
    s += fmt::format("| {}{}-{}{} | {} | {:.4f} | {:.4f} |\n", main ? "**" : "", r.length_min, r.length_max,
                     main ? "**" : "", r.n, r.accuracy, r.normalized);
    bins.push_back({r.length_min, r.length_max, r.accuracy});
  }
  const int64_t longest = longest_length_at(bins, threshold);
  s += fmt::format("\nLongest length with accuracy >= {:g} in every bin up to it: {}\n", threshold,
                   longest > 0 ? std::to_string(longest) : "none (the shortest bin is below it)");
  return s;
}

class Run {
 public:
  Run(const Config& cfg, const TrainRequest& req) : cfg_(cfg), req_(req) {}
  int go();

 private:
  void write_train_csv();
  void write_eval_csv();
  void write_summary(double total_s);
  void checkpoint(int64_t step);

  const Config& cfg_;
  TrainRequest req_;
  std::unique_ptr<Task> task_;
  SequenceModel model_{nullptr};
  std::unique_ptr<AdamW> opt_;
  torch::Device device_{torch::kCPU};
  bool bf16_ = false;
  std::vector<TrainRow> train_rows_;
  std::vector<EvalRow> eval_rows_;
  std::vector<EvalRow> final_rows_;
  double ms_per_step_ = 0;
  int64_t steps_done_ = 0;
};

void Run::write_train_csv() {
  std::string s = std::string(kTrainHeader) + "\n";
  for (const auto& r : train_rows_)
    s += fmt::format("{},{:.6g},{:.6g},{:.6g},{:.6g},{:.4g},{:.3f}\n", r.step, r.loss, r.accuracy, r.lr, r.grad_norm,
                     r.ms_per_step, r.elapsed_s);
  write_file_atomic(join_path(req_.out_dir, "train.csv"), s);
}

void Run::write_eval_csv() {
  std::string s = std::string(kEvalHeader) + "\n";
  const auto task = cfg_.get_string("task.name"), model = cfg_.get_string("model.name");
  const auto seed = cfg_.get_int("train.seed");
  for (const auto& r : eval_rows_)
    s += fmt::format("{},{},{},{},{},{},{},{:.6f},{:.6f}\n", task, model, seed, r.step, r.length_min, r.length_max,
                     r.n, r.accuracy, r.normalized);
  write_file_atomic(join_path(req_.out_dir, "eval.csv"), s);
}

void Run::write_summary(double total_s) {
  std::string s = fmt::format("# {} · {} · seed {}\n\n", cfg_.get_string("task.name"), cfg_.get_string("model.name"),
                              cfg_.get_int("train.seed"));
  s += fmt::format(
      "- steps: {} (batch {}, lr {}), parameters: {}\n- device: {}, precision: {}\n"
      "- time: {} in all, {:.2f} ms per training step\n- split: {}, {} examples per length range; "
      "normalised = (accuracy - chance) / (1 - chance), chance = {}\n\n",
      steps_done_, cfg_.get_int("train.batch_size"), cfg_.get_float("train.lr"), model_->num_params(),
      device_description(device_), bf16_ ? "bf16 autocast" : "fp32", format_duration(total_s), ms_per_step_,
      cfg_.get_string("eval.split"), cfg_.get_int("eval.n"), task_->chance());
  s += length_table(final_rows_, task_->eval_range, cfg_.get_float("eval.threshold"));
  write_file_atomic(join_path(req_.out_dir, "summary.md"), s);
}

void Run::checkpoint(int64_t step) { save_checkpoint(join_path(req_.out_dir, "checkpoint.pt"), model_, *opt_, step); }

// What a run is built from; building it finds every error the config can hold, before anything is written.
struct Prepared {
  std::unique_ptr<Task> task;
  torch::Device device{torch::kCPU};
  bool bf16 = false;
  SequenceModel model{nullptr};
  EvalSpec spec;
};

Prepared prepare(const Config& cfg) {
  Prepared p;
  p.task = make_task(cfg);
  p.device = pick_device(cfg.get_string("train.device"));
  const std::string prec = cfg.get_string("train.precision");
  if (prec == "bf16" && !p.device.is_cuda()) cfg.fail("train.precision", "bf16 autocast needs a CUDA device");
  p.bf16 = prec == "bf16" || (prec == "auto" && p.device.is_cuda());
  torch::manual_seed(static_cast<uint64_t>(cfg.get_int("train.seed")));
  p.model = SequenceModel(cfg, static_cast<int64_t>(p.task->vocab().size()));
  p.spec.ranges = eval_ranges(cfg, *p.task);
  p.spec.n = cfg.get_int("eval.n");
  p.spec.batch_size = cfg.get_int("eval.batch_size");
  p.spec.split = parse_split(cfg.get_string("eval.split"));
  p.spec.bf16 = p.bf16;
  return p;
}

int Run::go() {
  Prepared prep = prepare(cfg_);
  task_ = std::move(prep.task);
  device_ = prep.device;
  bf16_ = prep.bf16;
  model_ = prep.model;
  const EvalSpec spec = prep.spec;
  const int64_t steps = cfg_.get_int("train.steps"), B = cfg_.get_int("train.batch_size");
  const int64_t warmup = cfg_.get_int("train.warmup");
  const int64_t decay = cfg_.get_int("train.decay_steps") > 0 ? cfg_.get_int("train.decay_steps") : steps;
  const double peak = cfg_.get_float("train.lr"), min_ratio = cfg_.get_float("train.min_lr_ratio");
  const double clip = cfg_.get_float("train.clip");
  const int64_t log_every = cfg_.get_int("train.log_every"), eval_every = cfg_.get_int("eval.every");
  const int64_t ckpt_every = cfg_.get_int("train.checkpoint_every");

  const std::string ckpt_path = join_path(req_.out_dir, "checkpoint.pt");
  if (req_.resume) {
    if (!path_exists(ckpt_path))
      throw UserError(fmt::format("cannot resume '{}': it holds no checkpoint.pt", req_.out_dir));
  } else if (dir_non_empty(req_.out_dir)) {
    throw UserError(fmt::format("output directory '{}' is not empty (resume it with --resume {}, or pick another --out)",
                                req_.out_dir, req_.out_dir));
  }
  ensure_writable_dir(req_.out_dir);
  write_file_atomic(join_path(req_.out_dir, "config.yaml"), cfg_.dump());
  log_open(join_path(req_.out_dir, "log.txt"));

  model_->to(device_);
  model_->train();
  AdamWOptions ao;
  ao.beta1 = cfg_.get_float("train.beta1");
  ao.beta2 = cfg_.get_float("train.beta2");
  ao.eps = cfg_.get_float("train.eps");
  ao.weight_decay = cfg_.get_float("train.weight_decay");
  std::vector<torch::Tensor> params;
  std::vector<bool> decays;
  for (const auto& p : model_->named_parameters()) {
    params.push_back(p.value());
    decays.push_back(!exempt_from_weight_decay(p.key()));
  }
  opt_ = std::make_unique<AdamW>(params, ao, decays);

  int64_t start = 0;
  if (req_.resume) {
    start = load_checkpoint(ckpt_path, model_, *opt_);
    for (const auto& c : read_csv(join_path(req_.out_dir, "train.csv")))
      if (c.size() == 7 && std::stoll(c[0]) <= start)
        train_rows_.push_back({std::stoll(c[0]), std::stod(c[1]), std::stod(c[2]), std::stod(c[3]), std::stod(c[4]),
                               std::stod(c[5]), std::stod(c[6])});
    for (const auto& c : read_csv(join_path(req_.out_dir, "eval.csv")))
      if (c.size() == 9 && std::stoll(c[3]) <= start)
        eval_rows_.push_back({std::stoll(c[3]), std::stoll(c[4]), std::stoll(c[5]), std::stoll(c[6]), std::stod(c[7]),
                              std::stod(c[8])});
    logf("resuming {} from step {}", req_.out_dir, start);
  }
  logf("memlab train: task {} · model {} · {} parameters · device {} · {}", task_->name(),
       cfg_.get_string("model.name"), model_->num_params(), device_description(device_), bf16_ ? "bf16" : "fp32");
  logf("run directory {}; {} steps of batch {}; train lengths {}-{}, evaluation lengths {}-{}", req_.out_dir, steps, B,
       task_->train_range.min, task_->train_range.max, task_->eval_range.min, task_->eval_range.max);

  auto prev_handler = std::signal(SIGINT, on_sigint);
  std::signal(SIGTERM, on_sigint);
  TrainStepOptions so;
  so.clip = clip;
  so.bf16 = bf16_;
  so.cuda_graph = cfg_.get_bool("train.cuda_graph");
  so.graph_length = task_->max_input_length(task_->train_range);
  so.vocab = static_cast<int64_t>(task_->vocab().size());
  TrainStep step(model_, *opt_, device_, so, start);
  int64_t in_window = 0;
  double window_ms = 0, elapsed_prev = train_rows_.empty() ? 0 : train_rows_.back().elapsed_s;
  double train_ms_total = 0;
  int64_t train_steps_timed = 0;
  const auto t_start = std::chrono::steady_clock::now();
  auto t_window = t_start;
  std::string mode_logged;

  for (int64_t s = start; s < steps; ++s) {
    const double lr = lr_at(s, peak, warmup, decay, min_ratio);
    step.run(task_->batch(Split::Train, static_cast<uint64_t>(s) * B, B, task_->train_range), lr);
    ++in_window;
    steps_done_ = s + 1;
    const bool last = s + 1 == steps;
    const bool do_log = (s + 1) % log_every == 0 || last || g_interrupted;
    const bool do_eval = (eval_every > 0 && (s + 1) % eval_every == 0) || last;
    if (do_log) {
      const int64_t bad_step = step.first_bad.item<int64_t>();  // synchronises
      if (step.mode() != mode_logged) {
        logf("training step: {}", step.mode());
        mode_logged = step.mode();
      }
      const auto now = std::chrono::steady_clock::now();
      window_ms = std::chrono::duration<double, std::milli>(now - t_window).count();
      const double ms = window_ms / static_cast<double>(in_window);
      train_ms_total += window_ms;
      train_steps_timed += in_window;
      if (bad_step >= 0) {
        log_close();
        throw NumericError(fmt::format(
            "loss or gradient became NaN/Inf at step {} (updates from then on were skipped); the last checkpoint "
            "is in {} — lower train.lr or raise train.warmup and start again",
            bad_step, req_.out_dir));
      }
      const double elapsed = elapsed_prev + std::chrono::duration<double>(now - t_start).count();
      TrainRow row{s + 1,
                   step.loss_sum.item<double>() / in_window,
                   step.scored.item<int64_t>()
                       ? double(step.correct.item<int64_t>()) / double(step.scored.item<int64_t>())
                       : 0.0,
                   lr,
                   step.gnorm_sum.item<double>() / in_window,
                   ms,
                   elapsed};
      train_rows_.push_back(row);
      write_train_csv();
      const double eta = ms * static_cast<double>(steps - s - 1) / 1000.0;
      logf("step {:>6}/{} | loss {:.4f} | acc {:.3f} | lr {:.2e} | |g| {:.3f} | {:.2f} ms/step | eta {}", s + 1, steps,
           row.loss, row.accuracy, lr, row.grad_norm, ms, format_duration(eta));
      step.reset_window();
      in_window = 0;
    }
    if (do_eval) {
      auto rows = evaluate(model_, *task_, spec, device_, s + 1);
      std::string line = fmt::format("eval step {}:", s + 1);
      for (const auto& r : rows) {
        line += fmt::format(" {}-{} {:.3f}", r.length_min, r.length_max, r.normalized);
        eval_rows_.push_back(r);
      }
      logf("{} (normalised accuracy)", line);
      write_eval_csv();
      final_rows_ = rows;
    }
    if (do_log || do_eval) t_window = std::chrono::steady_clock::now();
    if ((ckpt_every > 0 && (s + 1) % ckpt_every == 0) || last) checkpoint(s + 1);
    if (g_interrupted) {
      checkpoint(s + 1);
      log_close();
      std::signal(SIGINT, prev_handler);
      std::fprintf(stderr, "interrupted at step %lld; checkpoint saved. Continue with: memlab train --resume %s\n",
                   static_cast<long long>(s + 1), req_.out_dir.c_str());
      return 130;
    }
  }
  std::signal(SIGINT, prev_handler);
  if (final_rows_.empty()) final_rows_ = evaluate(model_, *task_, spec, device_, steps_done_);
  ms_per_step_ = train_steps_timed ? train_ms_total / static_cast<double>(train_steps_timed) : 0.0;
  const double total_s = elapsed_prev + std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  write_summary(total_s);
  logf("done: {} steps in {}; results in {}", steps_done_, format_duration(total_s), req_.out_dir);
  log_close();
  std::printf("\n%s · %s · seed %lld — %s normalised accuracy by length (bold: the evaluation range)\n\n%s",
              task_->name().c_str(), cfg_.get_string("model.name").c_str(),
              static_cast<long long>(cfg_.get_int("train.seed")), cfg_.get_string("eval.split").c_str(),
              length_table(final_rows_, task_->eval_range, cfg_.get_float("eval.threshold")).c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace

void register_train_keys(Schema& s) {
  s.add_string("label", "", "name of this run's row in memlab report; empty = model.name and the model keys that set it apart");
  s.add_int("train.steps", 500, "optimiser steps", 1);
  s.add_int("train.batch_size", 256, "examples per step", 1);
  s.add_float("train.lr", 1e-2, "peak learning rate", 0.0, 10.0);
  s.add_float("train.weight_decay", 0.0, "AdamW decoupled weight decay", 0.0, 10.0);
  s.add_int("train.warmup", 50, "linear warmup steps", 0);
  s.add_int("train.decay_steps", 0, "step at which the cosine reaches its floor; 0 = train.steps", 0);
  s.add_float("train.min_lr_ratio", 1e-3, "cosine floor as a fraction of the peak", 0.0, 1.0);
  s.add_float("train.clip", 1.0, "gradient clipping by global norm; 0 = off", 0.0);
  s.add_float("train.beta1", 0.9, "AdamW beta1", 0.0, 1.0);
  s.add_float("train.beta2", 0.999, "AdamW beta2", 0.0, 1.0);
  s.add_float("train.eps", 1e-8, "AdamW epsilon", 0.0, 1.0);
  s.add_int("train.seed", 1, "seed of initialisation and data", 0);
  s.add_string("train.device", "auto", "cpu, cuda, or auto (CUDA when present)", {"auto", "cpu", "cuda"});
  s.add_bool("train.cuda_graph", true, "on CUDA, capture the training step once as a CUDA graph and replay it");
  s.add_string("train.precision", "auto", "auto = bf16 autocast on CUDA, fp32 on CPU", {"auto", "fp32", "bf16"});
  s.add_int("train.log_every", 50, "steps between progress lines and train.csv rows", 1);
  s.add_int("train.checkpoint_every", 1000, "steps between checkpoints; 0 = only at the end", 0);
  s.add_int("eval.every", 100, "steps between evaluations; 0 = only at the end", 0);
  s.add_int("eval.n", 512, "examples per length range", 1);
  s.add_int("eval.batch_size", 256, "evaluation batch size", 1);
  s.add_string("eval.split", "val", "split evaluated", {"val", "test"});
  s.add_range_list("eval.ranges", {}, "length ranges [[min, max], ...]; empty = train range, eval range and 3 bins",
                   3);
  s.add_float("eval.threshold", 0.9,
              "summary.md names the longest length up to which accuracy stays at or above this", 0.0, 1.0);
}

Schema& full_schema() {
  static Schema s = [] {
    Schema x;
    register_task_keys(x);
    register_model_keys(x);
    register_train_keys(x);
    return x;
  }();
  return s;
}

void check_training_config(const Config& cfg) { prepare(cfg); }

int run_training(const Config& cfg, const TrainRequest& req) {
  g_interrupted = false;
  Run run(cfg, req);
  return run.go();
}

}  // namespace memlab
