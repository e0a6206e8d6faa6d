#include "train/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cmath>
#include <optional>

#include "core/config.h"
#include "ops/kernels.h"
#include "core/device.h"
#include "core/errors.h"
#include "core/io.h"
#include "core/length_generalisation.h"
#include "core/log.h"
#include "core/memory_budget.h"
#include "core/run_dir.h"
#include "core/run_files.h"
#include "core/tensorboard.h"
#include "models/sequence_model.h"
#include "tasks/task.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/optimizer.h"
#include "train/out_of_memory.h"
#include "train/train_step.h"

namespace memlab {
namespace {

const char* kTrainHeader = "step,loss,accuracy,lr,grad_norm,ms_per_step,elapsed_s";
const char* kEvalHeader =
    "task,model,seed,step,length_min,length_max,n,accuracy,normalized_accuracy,accuracy_all,normalized_all";
// What a run writes besides config.yaml, log.txt and its event files.
const std::vector<std::string> kOutputs = {"train.csv", "eval.csv", "summary.md", "checkpoint.pt"};

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

// Keys a resumed run may change: how long it trains, where, how it logs and how it is evaluated.
bool may_change_on_resume(const std::string& key) {
  return key == "train.steps" || key == "train.device" || key == "train.log_every" ||
         key == "train.checkpoint_every" || key == "train.cuda_graph" || key == "train.tensorboard" ||
         key == "model.kernels" || key == "label" || key.rfind("eval.", 0) == 0;
}

// Lower bounds of what a run holds in memory at once (core/memory_budget.h).
std::vector<MemoryNeed> memory_needs(const Config& cfg, const Task& task, const std::vector<LengthRange>& ranges,
                                     int64_t vocab, bool cuda) {
  const double D = static_cast<double>(cfg.get_int("model.hidden")), L = static_cast<double>(cfg.get_int("model.layers"));
  const double V = static_cast<double>(vocab);
  const double params = min_block_params(cfg) + 2 * V * D;
  const double B = static_cast<double>(cfg.get_int("train.batch_size"));
  const double T = static_cast<double>(task.max_input_length(task.train_range));
  int64_t eval_max = 0;
  double eval_tokens = 0;  // tokens of one range's examples, held at once (lengths drawn uniformly)
  for (const auto& r : ranges) {
    eval_max = std::max(eval_max, task.max_input_length(r));
    eval_tokens = std::max(eval_tokens, static_cast<double>(cfg.get_int("eval.n")) *
                                            0.5 * static_cast<double>(task.max_input_length({r.min, r.min}) +
                                                                      task.max_input_length(r)));
  }
  const double EB = std::min(static_cast<double>(cfg.get_int("eval.batch_size")), static_cast<double>(cfg.get_int("eval.n")));
  const std::string model = fmt::format("model.hidden {}, model.layers {}", D, L);
  return {
      {fmt::format("the model's weights ({})", model), "model.hidden or model.layers", 4 * params, false},
      {fmt::format("the model's weights, gradients and AdamW moments ({})", model), "model.hidden or model.layers",
       16 * params, cuda},
      {fmt::format("the training batches (train.batch_size {} x length {})", B, T), "train.batch_size or task.train_len",
       16 * B * T, false},
      {fmt::format("the training step's activations (train.batch_size {} x length {} x width {} x {} blocks)", B, T, D,
                   L),
       "train.batch_size, task.train_len or model.hidden", B * T * (8 * D * L + 4 * V), cuda},
      {fmt::format("the evaluation examples (eval.n {} up to length {})", cfg.get_int("eval.n"), eval_max),
       "eval.n or the evaluation lengths (task.eval_len, eval.ranges)", 16 * eval_tokens, false},
      {fmt::format("an evaluation batch (eval.batch_size {} x length {})", EB, eval_max),
       "eval.batch_size or the evaluation lengths", EB * static_cast<double>(eval_max) * (8 * D + 4 * V), cuda},
  };
}

std::string length_table(const std::vector<EvalRow>& rows, const LengthRange& protocol, double threshold,
                         bool running_answer) {
  std::string s = running_answer ? "| lengths | n | accuracy | normalised | every position |\n|---|---:|---:|---:|---:|\n"
                                 : "| lengths | n | accuracy | normalised |\n|---|---:|---:|---:|\n";
  std::vector<LengthAccuracy> bins;
  for (const auto& r : rows) {
    const bool main = r.length_min == protocol.min && r.length_max == protocol.max;
    s += fmt::format("| {}{}-{}{} | {} | {:.4f} | {:.4f} |", main ? "**" : "", r.length_min, r.length_max,
                     main ? "**" : "", r.n, r.accuracy, r.normalized);
    s += running_answer ? fmt::format(" {:.4f} |\n", r.accuracy_all) : "\n";
    bins.push_back({r.length_min, r.length_max, r.accuracy});
  }
  const int64_t longest = longest_length_at(bins, threshold);
  s += fmt::format("\nLongest length with accuracy >= {:g} in every bin up to it: {}\n", threshold,
                   longest > 0 ? std::to_string(longest) : "none (the shortest bin is below it)");
  if (running_answer)
    s += "\naccuracy: the answer at the last position; every position: the running answer wherever it is defined.\n";
  return s;
}

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
  p.bf16 = bf16_autocast(cfg, "train.precision", p.device);
  check_kernels(cfg, p.device.is_cuda());
  p.spec.ranges = eval_ranges(cfg, *p.task);
  p.spec.n = cfg.get_int("eval.n");
  p.spec.batch_size = cfg.get_int("eval.batch_size");
  p.spec.split = parse_split(cfg.get_string("eval.split"));
  p.spec.bf16 = p.bf16;
  const auto vocab = static_cast<int64_t>(p.task->vocab().size());
  check_memory_needs(memory_needs(cfg, *p.task, p.spec.ranges, vocab, p.device.is_cuda()),
                     device_memory_bytes(p.device));
  torch::manual_seed(static_cast<uint64_t>(cfg.get_int("train.seed")));
  p.model = SequenceModel(cfg, vocab);
  return p;
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
  void evaluate_at(int64_t step, bool final);
  std::string checkpoint_words() const;

  const Config& cfg_;
  TrainRequest req_;
  Prepared prep_;
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<EventWriter> events_;
  std::vector<TrainRecord> train_rows_;
  std::vector<EvalRow> eval_rows_;
  std::vector<EvalRow> final_rows_;
  double ms_per_step_ = 0;
  int64_t steps_done_ = 0, checkpoint_step_ = -1;
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
    s += fmt::format("{},{},{},{},{},{},{},{:.6f},{:.6f},{:.6f},{:.6f}\n", task, model, seed, r.step, r.length_min,
                     r.length_max, r.n, r.accuracy, r.normalized, r.accuracy_all, r.normalized_all);
  write_file_atomic(join_path(req_.out_dir, "eval.csv"), s);
}

void Run::write_summary(double total_s) {
  const Task& task = *prep_.task;
  std::string s = fmt::format("# {} · {} · seed {}\n\n", cfg_.get_string("task.name"), cfg_.get_string("model.name"),
                              cfg_.get_int("train.seed"));
  s += fmt::format(
      "- steps: {} (batch {}, lr {}), parameters: {}\n- device: {}, precision: {}\n"
      "- time: {} in all, {:.2f} ms per training step\n- split: {}, {} examples per length range; "
      "normalised = (accuracy - chance) / (1 - chance), chance = {}\n\n",
      steps_done_, cfg_.get_int("train.batch_size"), cfg_.get_float("train.lr"), prep_.model->num_params(),
      device_description(prep_.device), prep_.bf16 ? "bf16 autocast" : "fp32", format_duration(total_s), ms_per_step_,
      cfg_.get_string("eval.split"), cfg_.get_int("eval.n"), task.chance());
  s += length_table(final_rows_, task.eval_range, cfg_.get_float("eval.threshold"), task.running_answer());
  write_file_atomic(join_path(req_.out_dir, "summary.md"), s);
}

void Run::checkpoint(int64_t step) {
  save_checkpoint(join_path(req_.out_dir, "checkpoint.pt"), prep_.model, *opt_, step, cfg_);
  checkpoint_step_ = step;
}

std::string Run::checkpoint_words() const {
  return checkpoint_step_ < 0 ? fmt::format("no checkpoint was written to {}", req_.out_dir)
                              : fmt::format("the last checkpoint (step {}) is in {}", checkpoint_step_, req_.out_dir);
}

void Run::evaluate_at(int64_t step, bool final) {
  const std::string where = final ? fmt::format("the trained model is saved in {}/checkpoint.pt", req_.out_dir)
                                  : checkpoint_words();
  auto rows = with_memory_advice(
      fmt::format("the evaluation at step {}", step),
      fmt::format("lower eval.batch_size, eval.n or the evaluation lengths ({}; memlab eval evaluates it again)", where),
      [&] { return evaluate(prep_.model, *prep_.task, prep_.spec, prep_.device, step); });
  std::string line = fmt::format("eval step {}:", step);
  for (const auto& r : rows) {
    line += fmt::format(" {}-{} {:.3f}", r.length_min, r.length_max, r.normalized);
    eval_rows_.push_back(r);
    const std::string range = fmt::format("{}-{}", r.length_min, r.length_max);
    events_->scalar("eval/accuracy/" + range, step, r.accuracy);
    events_->scalar("eval/normalized_accuracy/" + range, step, r.normalized);
    if (prep_.task->running_answer()) events_->scalar("eval/accuracy_all/" + range, step, r.accuracy_all);
  }
  logf("{} (normalised accuracy)", line);
  write_eval_csv();
  final_rows_ = rows;
}

int Run::go() {
  prep_ = prepare(cfg_);
  Task& task = *prep_.task;
  SequenceModel& model = prep_.model;
  const int64_t steps = cfg_.get_int("train.steps"), B = cfg_.get_int("train.batch_size");
  const int64_t warmup = cfg_.get_int("train.warmup");
  const int64_t decay = cfg_.get_int("train.decay_steps") > 0 ? cfg_.get_int("train.decay_steps") : steps;
  const double peak = cfg_.get_float("train.lr"), min_ratio = cfg_.get_float("train.min_lr_ratio");
  const int64_t log_every = cfg_.get_int("train.log_every"), eval_every = cfg_.get_int("eval.every");
  const int64_t ckpt_every = cfg_.get_int("train.checkpoint_every");

  // A checkpoint is checked (whole, same config, not past train.steps) before the directory is touched.
  const std::string ckpt_path = join_path(req_.out_dir, "checkpoint.pt");
  std::optional<CheckpointReader> ckpt;
  if (req_.resume && path_exists(ckpt_path)) {
    ckpt.emplace(ckpt_path, prep_.device);
    check_resumed_config(cfg_, ckpt->config(), may_change_on_resume, req_.out_dir);
    if (ckpt->step() > steps)
      throw UserError(fmt::format("cannot resume '{}' to train.steps = {}: it is at step {} already (give --steps {} or "
                                  "more)",
                                  req_.out_dir, steps, ckpt->step(), ckpt->step()));
  }
  open_run_dir(req_.out_dir, req_.resume, cfg_.dump(), kOutputs);
  model->to(prep_.device);
  model->train();
  opt_ = make_adamw(cfg_, model);

  int64_t start = 0;
  if (ckpt) {
    ckpt->restore(model, opt_.get());
    start = checkpoint_step_ = ckpt->step();
    for (const auto& r : read_train_csv(req_.out_dir))
      if (r.step <= start) train_rows_.push_back(r);
    for (const auto& r : read_eval_csv(req_.out_dir))
      if (r.step <= start)
        eval_rows_.push_back({r.step, r.length_min, r.length_max, r.n, r.accuracy, r.normalized, r.accuracy_all,
                              r.normalized_all});
    logf("resuming {} from step {}", req_.out_dir, start);
  }
  ckpt.reset();
  events_ = std::make_unique<EventWriter>(cfg_.get_bool("train.tensorboard") ? req_.out_dir : "", start);
  logf("memlab train: task {} · model {} · {} parameters · device {} · {}", task.name(), cfg_.get_string("model.name"),
       model->num_params(), device_description(prep_.device), prep_.bf16 ? "bf16" : "fp32");
  logf("run directory {}; {} steps of batch {}; train lengths {}-{}, evaluation lengths {}-{}", req_.out_dir, steps, B,
       task.train_range.min, task.train_range.max, task.eval_range.min, task.eval_range.max);

  StopSignals stop;
  TrainStep step(model, *opt_, prep_.device, train_step_options(cfg_, task, prep_.bf16), start);
  int64_t in_window = 0;
  const double elapsed_prev = train_rows_.empty() ? 0 : train_rows_.back().elapsed_s;
  double train_ms_total = 0;
  int64_t train_steps_timed = 0;
  const auto t_start = std::chrono::steady_clock::now();
  auto t_window = t_start;
  std::string mode_logged;
  steps_done_ = start;
  // A run stopped between a checkpoint and that step's evaluation (kill, SIGINT) evaluates it on resuming.
  if (start > 0 && start < steps && eval_every > 0 && start % eval_every == 0 &&
      (eval_rows_.empty() || eval_rows_.back().step != start))
    evaluate_at(start, false);

  for (int64_t s = start; s < steps; ++s) {
    const double lr = lr_at(s, peak, warmup, decay, min_ratio);
    with_memory_advice(fmt::format("training step {}", s + 1),
                       fmt::format("lower train.batch_size, task.train_len or the model's size ({})", checkpoint_words()),
                       [&] { step.run(task.batch(Split::Train, static_cast<uint64_t>(s) * B, B, task.train_range), lr); });
    ++in_window;
    steps_done_ = s + 1;
    const bool last = s + 1 == steps;
    const bool do_log = (s + 1) % log_every == 0 || last || stop.requested();
    if (do_log) {
      const int64_t bad_step = step.first_bad.item<int64_t>();  // synchronises
      if (step.mode() != mode_logged) {
        logf("training step: {}", step.mode());
        mode_logged = step.mode();
      }
      const auto now = std::chrono::steady_clock::now();
      const double window_ms = std::chrono::duration<double, std::milli>(now - t_window).count();
      const double ms = window_ms / static_cast<double>(in_window);
      train_ms_total += window_ms;
      train_steps_timed += in_window;
      if (bad_step >= 0)
        throw NumericError(fmt::format("loss or gradient became NaN/Inf at step {} (updates from then on were "
                                       "skipped); {} — lower train.lr or raise train.warmup and start again",
                                       bad_step, checkpoint_words()));
      TrainRecord row;
      row.step = s + 1;
      row.loss = step.loss_sum.item<double>() / static_cast<double>(in_window);
      const auto scored = step.scored.item<int64_t>();
      row.accuracy = scored ? static_cast<double>(step.correct.item<int64_t>()) / static_cast<double>(scored) : 0.0;
      row.lr = lr;
      row.grad_norm = step.gnorm_sum.item<double>() / static_cast<double>(in_window);
      row.ms_per_step = ms;
      row.elapsed_s = elapsed_prev + std::chrono::duration<double>(now - t_start).count();
      train_rows_.push_back(row);
      write_train_csv();
      const std::initializer_list<std::pair<const char*, double>> scalars = {{"train/loss", row.loss},
                                                                             {"train/accuracy", row.accuracy},
                                                                             {"train/lr", row.lr},
                                                                             {"train/grad_norm", row.grad_norm},
                                                                             {"train/ms_per_step", row.ms_per_step}};
      for (const auto& [name, value] : scalars) events_->scalar(name, row.step, value);
      const double eta = ms * static_cast<double>(steps - s - 1) / 1000.0;
      logf("step {:>6}/{} | loss {:.4f} | acc {:.3f} | lr {:.2e} | |g| {:.3f} | {:.2f} ms/step | eta {}", s + 1, steps,
           row.loss, row.accuracy, lr, row.grad_norm, ms, format_duration(eta));
      step.reset_window();
      in_window = 0;
    }
    // The last step's checkpoint comes before its evaluation, which may run out of memory.
    if ((ckpt_every > 0 && (s + 1) % ckpt_every == 0) || last || stop.requested()) checkpoint(s + 1);
    const bool do_eval = eval_every > 0 && (s + 1) % eval_every == 0 && !last;
    if (do_eval) evaluate_at(s + 1, false);
    if (do_log || do_eval) t_window = std::chrono::steady_clock::now();
    if (stop.requested()) {
      log_close();
      std::fprintf(stderr, "interrupted at step %lld; checkpoint saved. Continue with: memlab train --resume %s\n",
                   static_cast<long long>(s + 1), req_.out_dir.c_str());
      return 130;
    }
  }
  stop.release();  // the final evaluation may be stopped like any program: the checkpoint is written
  if (eval_rows_.empty() || eval_rows_.back().step != steps_done_) {
    evaluate_at(steps_done_, true);
  } else {
    final_rows_.clear();
    for (const auto& r : eval_rows_)
      if (r.step == steps_done_) final_rows_.push_back(r);
  }
  ms_per_step_ = train_steps_timed ? train_ms_total / static_cast<double>(train_steps_timed)
                                   : (train_rows_.empty() ? 0.0 : train_rows_.back().ms_per_step);
  const double total_s = elapsed_prev + std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  write_summary(total_s);
  logf("done: {} steps ({} in this call) in {}; results in {}", steps_done_, steps_done_ - start,
       format_duration(total_s), req_.out_dir);
  log_close();
  std::printf("\n%s · %s · seed %lld — %s normalised accuracy by length (bold: the evaluation range)\n\n%s",
              task.name().c_str(), cfg_.get_string("model.name").c_str(),
              static_cast<long long>(cfg_.get_int("train.seed")), cfg_.get_string("eval.split").c_str(),
              length_table(final_rows_, task.eval_range, cfg_.get_float("eval.threshold"), task.running_answer()).c_str());
  std::fflush(stdout);
  return 0;
}

const char* kEvaluationHeader =
    "task,model,seed,step,split,length_min,length_max,n,accuracy,normalized_accuracy,accuracy_all,normalized_all";

}  // namespace

int evaluate_saved_run(const Config& cfg, const std::string& run_dir) {
  Prepared prep = prepare(cfg);
  const std::string ckpt_path = join_path(run_dir, "checkpoint.pt");
  if (!path_exists(ckpt_path)) throw UserError(fmt::format("cannot evaluate '{}': it holds no checkpoint.pt", run_dir));
  CheckpointReader ckpt(ckpt_path, prep.device);
  check_resumed_config(cfg, ckpt.config(), may_change_on_resume, run_dir);
  ckpt.restore(prep.model, nullptr);
  prep.model->to(prep.device);
  const Task& task = *prep.task;
  const std::string split = cfg.get_string("eval.split");
  std::fprintf(stderr, "memlab eval: %s at step %lld on %s, %s split, %lld examples per range\n", run_dir.c_str(),
               static_cast<long long>(ckpt.step()), device_description(prep.device).c_str(), split.c_str(),
               static_cast<long long>(prep.spec.n));
  const auto rows = with_memory_advice(
      "the evaluation", "lower --batch-size, --n or the lengths",
      [&] { return evaluate(prep.model, task, prep.spec, prep.device, ckpt.step()); });

  // evaluation.csv: earlier rows, but those this call measured again
  const std::string csv_path = join_path(run_dir, "evaluation.csv");
  std::vector<std::vector<std::string>> kept;
  for (const auto& c : read_csv(csv_path)) {
    if (c.size() != 12) throw UserError(fmt::format("{}: expected 12 columns, found {}", csv_path, c.size()));
    bool again = false;
    for (const auto& r : rows)
      again = again || (c[3] == std::to_string(r.step) && c[4] == split && c[5] == std::to_string(r.length_min) &&
                        c[6] == std::to_string(r.length_max) && c[7] == std::to_string(r.n));
    if (!again) kept.push_back(c);
  }
  std::string out = std::string(kEvaluationHeader) + "\n";
  for (const auto& c : kept) out += fmt::format("{}\n", fmt::join(c, ","));
  for (const auto& r : rows)
    out += fmt::format("{},{},{},{},{},{},{},{},{:.6f},{:.6f},{:.6f},{:.6f}\n", cfg.get_string("task.name"),
                       cfg.get_string("model.name"), cfg.get_int("train.seed"), r.step, split, r.length_min,
                       r.length_max, r.n, r.accuracy, r.normalized, r.accuracy_all, r.normalized_all);
  const std::string table = length_table(rows, task.eval_range, cfg.get_float("eval.threshold"), task.running_answer());
  const std::string title = fmt::format("{} · {} · seed {} — step {}, {} split, {} examples per range", task.name(),
                                        cfg.get_string("model.name"), cfg.get_int("train.seed"), ckpt.step(), split,
                                        prep.spec.n);
  write_file_atomic(csv_path, out);
  write_file_atomic(join_path(run_dir, "evaluation.md"), fmt::format("# {}\n\n{}", title, table));
  std::printf("\n%s\n\n%s", title.c_str(), table.c_str());
  std::fflush(stdout);
  return 0;
}

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
  s.add_bool("train.tensorboard", true, "write TensorBoard event files (events.out.tfevents.*) in the run directory");
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
  Run run(cfg, req);
  return run.go();
}

}  // namespace memlab
