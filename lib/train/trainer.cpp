#include "train/trainer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
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
#include "train/length_buckets.h"
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
         key == "train.checkpoint_every" || key == "train.cuda_graph" || key == "train.target_rows" ||
         key == "train.length_buckets" || key == "train.tensorboard" || key == "model.kernels" || key == "label" ||
         key.rfind("eval.", 0) == 0;
}

// A lower bound of one training step's activations.
double step_activation_bytes(const Config& cfg, const Task& task, int64_t vocab) {
  const double D = static_cast<double>(cfg.get_int("model.hidden")), L = static_cast<double>(cfg.get_int("model.layers"));
  const double B = static_cast<double>(cfg.get_int("train.batch_size"));
  const double T = static_cast<double>(task.max_input_length(task.train_range));
  return B * T * (8 * D * L + 4 * static_cast<double>(vocab));
}

// A run keeps its evaluation's batches (eval_batches) where they take at most this much host memory, and makes
// them again at every evaluation where they take more.
constexpr double kKeptEvalBytes = 1 << 30;

// Lower bounds of what a run holds in memory at once (core/memory_budget.h).
std::vector<MemoryNeed> memory_needs(const Config& cfg, const Task& task, const std::vector<LengthRange>& ranges,
                                     int64_t vocab, bool cuda) {
  const double D = static_cast<double>(cfg.get_int("model.hidden")), L = static_cast<double>(cfg.get_int("model.layers"));
  const double V = static_cast<double>(vocab);
  const double params = min_block_params(cfg) + 2 * V * D;
  const double B = static_cast<double>(cfg.get_int("train.batch_size"));
  const double T = static_cast<double>(task.max_input_length(task.train_range));
  int64_t eval_max = 0;
  // Tokens of the evaluation's examples (lengths drawn uniformly): one range's as examples while they are batched,
  // and every range's as the int32 batches a run keeps (kKeptEvalBytes)
  double range_tokens = 0, all_tokens = 0;
  for (const auto& r : ranges) {
    eval_max = std::max(eval_max, task.max_input_length(r));
    const double tokens = static_cast<double>(cfg.get_int("eval.n")) * 0.5 *
                          static_cast<double>(task.max_input_length({r.min, r.min}) + task.max_input_length(r));
    range_tokens = std::max(range_tokens, tokens);
    all_tokens += tokens;
  }
  const double eval_bytes = std::max(16 * range_tokens, 8 * all_tokens <= kKeptEvalBytes ? 8 * all_tokens : 0.0);
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
       "train.batch_size, task.train_len or model.hidden", step_activation_bytes(cfg, task, vocab), cuda},
      {fmt::format("the evaluation examples (eval.n {} up to length {})", cfg.get_int("eval.n"), eval_max),
       "eval.n or the evaluation lengths (task.eval_len, eval.ranges)", eval_bytes, false},
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
  p.spec.mad_average = cfg.get_string("eval.average") == "mad";
  if (p.spec.mad_average && p.task->answer_sets())
    throw UserError(fmt::format("eval.average = mad scores one right answer a position, but {}'s answers are sets of "
                                "tokens (use eval.average = tokens)",
                                p.task->name()));
  train_step_options(cfg, *p.task, p.bf16);  // for its refusals (train.length_buckets with a non-causal head)
  const auto vocab = static_cast<int64_t>(p.task->vocab().size());
  check_memory_needs(memory_needs(cfg, *p.task, p.spec.ranges, vocab, p.device.is_cuda()),
                     device_memory_bytes(p.device));
  torch::manual_seed(static_cast<uint64_t>(cfg.get_int("train.seed")));
  p.model = SequenceModel(cfg, vocab);
  return p;
}

// Keys in which the members of a packed run may differ: none changes a tensor's shape or when a step logs,
// evaluates or checkpoints.
bool may_differ_in_pack(const std::string& key) {
  return key == "train.seed" || key == "train.lr" || key == "train.weight_decay" || key == "train.clip" ||
         key == "train.warmup" || key == "train.decay_steps" || key == "train.min_lr_ratio" || key == "label";
}

// One run: its files, its records and (packed) the model and optimiser it is saved from.
struct Member {
  const Config* cfg = nullptr;
  std::string dir;
  Prepared prep;  // prep.model: the run's model (one member), or the member's copy for its checkpoints (packed)
  std::unique_ptr<AdamW> opt;
  std::unique_ptr<EventWriter> events;
  std::vector<TrainRecord> train_rows;
  std::vector<EvalRow> eval_rows, final_rows;
  int64_t checkpoint_step = -1, start = 0;
  std::string failed;  // why the member stopped early ("" while it trains)
};

class Run {
 public:
  Run(std::vector<const Config*> cfgs, std::vector<std::string> dirs, bool resume);
  int go();

 private:
  void write_train_csv(Member& m);
  void write_eval_csv(Member& m);
  void write_summary(Member& m, double total_s);
  void checkpoint(int64_t step);
  void evaluate_at(int64_t step, bool final);
  std::string checkpoint_words(const Member& m) const;
  void log_to(size_t k, const std::string& line);  // member k's log (and stderr, tagged when packed)
  bool packed() const { return members_.size() > 1; }

  // go()'s phases, in order.
  void prepare_members();
  std::vector<std::optional<CheckpointReader>> read_checkpoints(int64_t steps);
  AdamW& build_training(std::vector<std::optional<CheckpointReader>>& ckpts);
  void restore_records(std::vector<std::optional<CheckpointReader>>& ckpts);
  void log_start(int64_t steps);
  int log_window(const TrainStep& step, const torch::Tensor& bad, int64_t steps_done, int64_t steps,
                 int64_t in_window, const std::vector<double>& lrs, double ms, double elapsed_s);
  int interrupted(int64_t steps_done);
  int finish(int64_t start, int64_t whole_steps, double elapsed_prev, std::chrono::steady_clock::time_point t_start);

  std::vector<Member> members_;
  bool resume_;
  SequenceModel model_{nullptr};  // what trains: the one run's model, or the packed one
  std::unique_ptr<AdamW> opt_;
  double ms_per_step_ = 0;
  int64_t steps_done_ = 0;
  std::optional<EvalBatches> eval_batches_;  // kept from the first evaluation where they fit kKeptEvalBytes
};

Run::Run(std::vector<const Config*> cfgs, std::vector<std::string> dirs, bool resume) : resume_(resume) {
  for (size_t k = 0; k < cfgs.size(); ++k) {
    members_.emplace_back();
    members_.back().cfg = cfgs[k];
    members_.back().dir = dirs[k];
  }
}

void Run::log_to(size_t k, const std::string& line) {
  if (!packed()) return log_line(line);
  log_line_to(k, fmt::format("[{}] {}", members_[k].dir, line));
}

void Run::write_train_csv(Member& m) {
  std::string s = std::string(kTrainHeader) + "\n";
  for (const auto& r : m.train_rows)
    s += fmt::format("{},{:.6g},{:.6g},{:.6g},{:.6g},{:.4g},{:.3f}\n", r.step, r.loss, r.accuracy, r.lr, r.grad_norm,
                     r.ms_per_step, r.elapsed_s);
  write_file_atomic(join_path(m.dir, "train.csv"), s);
}

void Run::write_eval_csv(Member& m) {
  std::string s = std::string(kEvalHeader) + "\n";
  const auto task = m.cfg->get_string("task.name"), model = m.cfg->get_string("model.name");
  const auto seed = m.cfg->get_int("train.seed");
  for (const auto& r : m.eval_rows)
    s += fmt::format("{},{},{},{},{},{},{},{:.6f},{:.6f},{:.6f},{:.6f}\n", task, model, seed, r.step, r.length_min,
                     r.length_max, r.n, r.accuracy, r.normalized, r.accuracy_all, r.normalized_all);
  write_file_atomic(join_path(m.dir, "eval.csv"), s);
}

void Run::write_summary(Member& m, double total_s) {
  const Config& cfg = *m.cfg;
  const Task& task = *m.prep.task;
  std::string s = fmt::format("# {} · {} · seed {}\n\n", cfg.get_string("task.name"), cfg.get_string("model.name"),
                              cfg.get_int("train.seed"));
  s += fmt::format(
      "- steps: {} (batch {}, lr {}), parameters: {}\n- device: {}, precision: {}\n"
      "- time: {} in all, {:.2f} ms per training step{}\n- split: {}, {} examples per length range; "
      "normalised = (accuracy - chance) / (1 - chance), chance = {}{}\n\n",
      steps_done_, cfg.get_int("train.batch_size"), cfg.get_float("train.lr"), m.prep.model->num_params(),
      device_description(m.prep.device), m.prep.bf16 ? "bf16 autocast" : "fp32", format_duration(total_s), ms_per_step_,
      packed() ? fmt::format(" (packed: {} runs trained together)", members_.size()) : "", cfg.get_string("eval.split"),
      cfg.get_int("eval.n"), task.chance(), m.prep.spec.mad_average ? "; accuracy as MAD averages it (eval.average)" : "");
  s += length_table(m.final_rows, task.eval_range, cfg.get_float("eval.threshold"), task.running_answer());
  write_file_atomic(join_path(m.dir, "summary.md"), s);
}

void Run::checkpoint(int64_t step) {
  // A pack's members are written first and renamed together, so that a kill leaves them at one step and the
  // launcher can resume them as a pack.
  struct Written {
    std::string tmp, path;
    Member* m;
  };
  std::vector<Written> written;
  try {
    for (size_t k = 0; k < members_.size(); ++k) {
      Member& m = members_[k];
      if (!m.failed.empty()) continue;
      if (packed()) {  // the member's slices into its own model and optimiser, saved as its solo run would be
        unpack_member(model_, static_cast<int64_t>(k), m.prep.model);
        opt_->copy_member_to(static_cast<int64_t>(k), *m.opt);
      }
      const std::string path = join_path(m.dir, "checkpoint.pt");
      written.push_back({write_temporary(path, checkpoint_bytes(m.prep.model, *m.opt, step, *m.cfg)), path, &m});
    }
  } catch (...) {
    for (const auto& w : written) std::remove(w.tmp.c_str());
    throw;
  }
  for (size_t i = 0; i < written.size(); ++i) {
    try {
      commit_temporary(written[i].tmp, written[i].path);
    } catch (...) {
      for (size_t j = i + 1; j < written.size(); ++j) std::remove(written[j].tmp.c_str());
      throw;
    }
    written[i].m->checkpoint_step = step;
  }
}

std::string Run::checkpoint_words(const Member& m) const {
  return m.checkpoint_step < 0 ? fmt::format("no checkpoint was written to {}", m.dir)
                               : fmt::format("the last checkpoint (step {}) is in {}", m.checkpoint_step, m.dir);
}

void Run::evaluate_at(int64_t step, bool final) {
  const Member& m0 = members_[0];
  const std::string where = final ? fmt::format("the trained model is saved in {}/checkpoint.pt", m0.dir)
                                  : checkpoint_words(m0);
  std::vector<const Task*> tasks;
  for (const auto& m : members_) tasks.push_back(m.prep.task.get());
  auto rows = with_memory_advice(
      fmt::format("the evaluation at step {}", step),
      fmt::format("lower eval.batch_size, eval.n or the evaluation lengths ({}; memlab eval evaluates it again)", where),
      [&] {
        const EvalSpec& spec = m0.prep.spec;
        if (eval_batches_) return evaluate_members(model_, tasks, *eval_batches_, spec, m0.prep.device, step);
        auto batches = eval_batches(tasks, spec);
        auto rows = evaluate_members(model_, tasks, batches, spec, m0.prep.device, step);
        if (static_cast<double>(batches.bytes()) <= kKeptEvalBytes) {
          if (m0.prep.device.is_cuda()) batches.pin();
          eval_batches_ = std::move(batches);
        }
        return rows;
      });
  for (size_t k = 0; k < members_.size(); ++k) {
    Member& m = members_[k];
    if (!m.failed.empty()) continue;
    std::string line = fmt::format("eval step {}:", step);
    for (const auto& r : rows[k]) {
      line += fmt::format(" {}-{} {:.3f}", r.length_min, r.length_max, r.normalized);
      m.eval_rows.push_back(r);
      const std::string range = fmt::format("{}-{}", r.length_min, r.length_max);
      m.events->scalar("eval/accuracy/" + range, step, r.accuracy);
      m.events->scalar("eval/normalized_accuracy/" + range, step, r.normalized);
      if (m.prep.task->running_answer()) m.events->scalar("eval/accuracy_all/" + range, step, r.accuracy_all);
    }
    log_to(k, fmt::format("{} (normalised accuracy)", line));
    write_eval_csv(m);
    m.final_rows = rows[k];
  }
}

// The members' configs agree but in the keys a pack may differ in; each is prepared (task, device, its own model),
// and K runs' memory is checked. A packed model is built here, before any directory is touched: a mixer that does
// not pack is refused.
void Run::prepare_members() {
  const Config& cfg0 = *members_[0].cfg;
  std::map<std::string, std::string> first;
  for (const auto& [key, value] : cfg0.flat()) first[key] = value;
  for (auto& m : members_) {
    for (const auto& [key, value] : m.cfg->flat())
      if (!may_differ_in_pack(key) && first[key] != value)
        throw UserError(fmt::format("runs packed together may differ only in their seed, learning rate, weight decay, "
                                    "clipping and schedule: {} is {} in {} but {} in {}",
                                    key, first[key], members_[0].dir, value, m.dir));
    m.prep = prepare(*m.cfg);
  }
  if (!packed()) return;
  const size_t K = members_.size();
  Task& task = *members_[0].prep.task;
  auto needs = memory_needs(cfg0, task, members_[0].prep.spec.ranges, static_cast<int64_t>(task.vocab().size()),
                            members_[0].prep.device.is_cuda());  // prepare() checked one run's
  for (auto& n : needs) {
    n.what += fmt::format(" x {} packed runs", K);
    n.keys += " or pack fewer runs (memlab sweep --pack K)";
    n.bytes *= static_cast<double>(K);
  }
  check_memory_needs(needs, device_memory_bytes(members_[0].prep.device));
  model_ = SequenceModel(cfg0, static_cast<int64_t>(task.vocab().size()), static_cast<int64_t>(K));
}

// The checkpoints to resume, checked (whole, same config, not past train.steps, one step for all) before a
// directory is touched; each member's start step.
std::vector<std::optional<CheckpointReader>> Run::read_checkpoints(int64_t steps) {
  const size_t K = members_.size();
  std::vector<std::optional<CheckpointReader>> ckpts(K);
  for (size_t k = 0; k < K; ++k) {
    Member& m = members_[k];
    const std::string ckpt_path = join_path(m.dir, "checkpoint.pt");
    if (!resume_ || !path_exists(ckpt_path)) continue;
    ckpts[k].emplace(ckpt_path, packed() ? torch::Device(torch::kCPU) : m.prep.device);
    check_resumed_config(*m.cfg, ckpts[k]->config(), may_change_on_resume, m.dir);
    if (ckpts[k]->step() > steps)
      throw UserError(fmt::format("cannot resume '{}' to train.steps = {}: it is at step {} already (give --steps {} or "
                                  "more)",
                                  m.dir, steps, ckpts[k]->step(), ckpts[k]->step()));
    m.start = ckpts[k]->step();
  }
  for (size_t k = 1; k < K; ++k)
    if (members_[k].start != members_[0].start)
      throw UserError(fmt::format("cannot resume these runs packed together: '{}' is at step {} but '{}' at step {} "
                                  "(resume them separately)",
                                  members_[0].dir, members_[0].start, members_[k].dir, members_[k].start));
  return ckpts;
}

// model_ on the device with its optimiser, both restored from the checkpoints. Packed: each member's own model and
// optimiser (on the CPU, restored from its checkpoint), then packed.
AdamW& Run::build_training(std::vector<std::optional<CheckpointReader>>& ckpts) {
  const Config& cfg0 = *members_[0].cfg;
  const auto device = members_[0].prep.device;
  if (!packed()) {
    Member& m = members_[0];
    model_ = m.prep.model;
    model_->to(device);
    m.opt = make_adamw(cfg0, model_);
    if (ckpts[0]) ckpts[0]->restore(model_, m.opt.get());
    model_->train();
    return *m.opt;
  }
  std::vector<double> member_decay;
  std::vector<SequenceModel> solo;
  for (size_t k = 0; k < members_.size(); ++k) {
    Member& m = members_[k];
    m.opt = make_adamw(*m.cfg, m.prep.model);
    if (ckpts[k]) ckpts[k]->restore(m.prep.model, m.opt.get());
    member_decay.push_back(m.cfg->get_float("train.weight_decay"));
    solo.push_back(m.prep.model);
  }
  pack_members(model_, solo);
  model_->to(device);
  opt_ = make_adamw(cfg0, model_, member_decay);
  for (size_t k = 0; k < members_.size(); ++k)
    if (ckpts[k]) opt_->copy_member_from(static_cast<int64_t>(k), *members_[k].opt);
  model_->train();
  return *opt_;
}

// A resumed member's train.csv and eval.csv rows up to its checkpoint; every member's TensorBoard writer. The
// checkpoints are let go.
void Run::restore_records(std::vector<std::optional<CheckpointReader>>& ckpts) {
  const int64_t start = members_[0].start;
  for (size_t k = 0; k < members_.size(); ++k) {
    Member& m = members_[k];
    if (ckpts[k]) {
      m.checkpoint_step = start;
      for (const auto& r : read_train_csv(m.dir))
        if (r.step <= start) m.train_rows.push_back(r);
      for (const auto& r : read_eval_csv(m.dir))
        if (r.step <= start)
          m.eval_rows.push_back({r.step, r.length_min, r.length_max, r.n, r.accuracy, r.normalized, r.accuracy_all,
                                 r.normalized_all});
      log_to(k, fmt::format("resuming {} from step {}", m.dir, start));
    }
    ckpts[k].reset();
    m.events = std::make_unique<EventWriter>(m.cfg->get_bool("train.tensorboard") ? m.dir : "", start);
  }
}

void Run::log_start(int64_t steps) {
  const Config& cfg0 = *members_[0].cfg;
  const Task& task = *members_[0].prep.task;
  logf("memlab train: task {} · model {} · {} parameters · device {} · {}{}", task.name(), cfg0.get_string("model.name"),
       model_->num_params(), device_description(members_[0].prep.device), members_[0].prep.bf16 ? "bf16" : "fp32",
       packed() ? fmt::format(" · {} runs packed", members_.size()) : "");
  for (size_t k = 0; k < members_.size(); ++k)
    log_to(k, fmt::format("run directory {}; {} steps of batch {}; train lengths {}-{}, evaluation lengths {}-{}{}",
                          members_[k].dir, steps, cfg0.get_int("train.batch_size"), task.train_range.min,
                          task.train_range.max, task.eval_range.min, task.eval_range.max,
                          packed() ? fmt::format("; seed {}, lr {}", members_[k].cfg->get_int("train.seed"),
                                                 members_[k].cfg->get_float("train.lr"))
                                   : ""));
}

// The in_window steps up to steps_done, for each member still training: its train.csv row, TensorBoard scalars and
// log line. A member whose loss or gradient went NaN/Inf (bad: step.first_bad, read on the host) stops there (a run
// alone throws). Returns how many train on.
int Run::log_window(const TrainStep& step, const torch::Tensor& bad, int64_t steps_done, int64_t steps,
                    int64_t in_window, const std::vector<double>& lrs, double ms, double elapsed_s) {
  auto loss = step.loss_sum.cpu().reshape({-1}), gnorm = step.gnorm_sum.cpu().reshape({-1});
  auto scored = step.scored.cpu().reshape({-1}), correct = step.correct.cpu().reshape({-1});
  int live = 0;
  for (size_t k = 0; k < members_.size(); ++k) {
    Member& m = members_[k];
    if (!m.failed.empty()) continue;
    const int64_t bad_step = bad[k].item<int64_t>();
    if (bad_step >= 0) {
      m.failed = fmt::format("loss or gradient became NaN/Inf at step {} (updates from then on were skipped); {} — "
                             "lower train.lr or raise train.warmup and start again",
                             bad_step, checkpoint_words(m));
      if (!packed()) throw NumericError(m.failed);
      log_to(k, "error: " + m.failed);
      continue;
    }
    ++live;
    TrainRecord row;
    row.step = steps_done;
    row.loss = loss[k].item<double>() / static_cast<double>(in_window);
    const auto n = scored[k].item<int64_t>();
    row.accuracy = n ? static_cast<double>(correct[k].item<int64_t>()) / static_cast<double>(n) : 0.0;
    row.lr = lrs[k];
    row.grad_norm = gnorm[k].item<double>() / static_cast<double>(in_window);
    row.ms_per_step = ms;
    row.elapsed_s = elapsed_s;
    m.train_rows.push_back(row);
    write_train_csv(m);
    const std::initializer_list<std::pair<const char*, double>> scalars = {{"train/loss", row.loss},
                                                                           {"train/accuracy", row.accuracy},
                                                                           {"train/lr", row.lr},
                                                                           {"train/grad_norm", row.grad_norm},
                                                                           {"train/ms_per_step", row.ms_per_step}};
    for (const auto& [name, value] : scalars) m.events->scalar(name, row.step, value);
    const double eta = ms * static_cast<double>(steps - steps_done) / 1000.0;
    log_to(k, fmt::format("step {:>6}/{} | loss {:.4f} | acc {:.3f} | lr {:.2e} | |g| {:.3f} | {:.2f} ms/step | "
                          "eta {}",
                          steps_done, steps, row.loss, row.accuracy, lrs[k], row.grad_norm, ms, format_duration(eta)));
  }
  return live;
}

// Stopped by a signal, after the checkpoint: says how to continue.
int Run::interrupted(int64_t steps_done) {
  log_close();
  std::string resume;
  for (const auto& m : members_) resume += " --resume " + m.dir;
  std::fprintf(stderr, "interrupted at step %lld; checkpoint saved. Continue with: memlab train%s\n",
               static_cast<long long>(steps_done), resume.c_str());
  return 130;
}

// After the last step: the final evaluation (unless that step's already ran), each member's summary.md (its time
// counting the evaluation) and length table on stdout; NumericError naming the members that stopped on NaN/Inf.
int Run::finish(int64_t start, int64_t whole_steps, double elapsed_prev, std::chrono::steady_clock::time_point t_start) {
  const size_t K = members_.size();
  const Task& task = *members_[0].prep.task;
  const bool live = std::any_of(members_.begin(), members_.end(), [](const Member& m) { return m.failed.empty(); });
  if (live) {
    const Member& m0 = members_[0];
    if (m0.eval_rows.empty() || m0.eval_rows.back().step != steps_done_) {
      evaluate_at(steps_done_, true);
    } else {
      for (auto& m : members_) {
        m.final_rows.clear();
        for (const auto& r : m.eval_rows)
          if (r.step == steps_done_) m.final_rows.push_back(r);
      }
    }
  }
  const double total_s = elapsed_prev + std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  if (whole_steps > 0)
    for (size_t k = 0; k < K; ++k)
      log_to(k, fmt::format("{} of the {} steps in this call ran whole: their batches did not fit the length buckets",
                            whole_steps, steps_done_ - start));
  int failed = 0;
  for (size_t k = 0; k < K; ++k) {
    Member& m = members_[k];
    if (!m.failed.empty()) {
      ++failed;
      continue;
    }
    write_summary(m, total_s);
    log_to(k, fmt::format("done: {} steps ({} in this call) in {}; results in {}", steps_done_, steps_done_ - start,
                          format_duration(total_s), m.dir));
  }
  log_close();
  for (auto& m : members_) {
    if (!m.failed.empty()) continue;
    const Config& cfg = *m.cfg;
    std::printf("\n%s · %s · seed %lld%s — %s normalised accuracy by length (bold: the evaluation range)\n\n%s",
                task.name().c_str(), cfg.get_string("model.name").c_str(),
                static_cast<long long>(cfg.get_int("train.seed")),
                packed() ? fmt::format(" · lr {:g} ({})", cfg.get_float("train.lr"), m.dir).c_str() : "",
                cfg.get_string("eval.split").c_str(),
                length_table(m.final_rows, task.eval_range, cfg.get_float("eval.threshold"), task.running_answer())
                    .c_str());
  }
  std::fflush(stdout);
  if (failed > 0) {
    std::string names;
    for (const auto& m : members_)
      if (!m.failed.empty()) names += (names.empty() ? "" : ", ") + m.dir;
    throw NumericError(fmt::format("{} of {} packed runs stopped on NaN/Inf ({}); the others finished", failed, K, names));
  }
  return 0;
}

int Run::go() {
  StopSignals stop;  // from the start: a SIGTERM during setup (a sweep's deadline) stops the run as one during training
  prepare_members();
  const size_t K = members_.size();
  const Config& cfg0 = *members_[0].cfg;
  const Task& task = *members_[0].prep.task;
  const int64_t steps = cfg0.get_int("train.steps"), B = cfg0.get_int("train.batch_size");
  const int64_t log_every = cfg0.get_int("train.log_every"), eval_every = cfg0.get_int("eval.every");
  const int64_t ckpt_every = cfg0.get_int("train.checkpoint_every");
  auto ckpts = read_checkpoints(steps);
  for (auto& m : members_) open_run_dir(m.dir, resume_, m.cfg->dump(), kOutputs);
  if (packed()) {  // every member's log.txt, in member order (open_run_dir left the last one open)
    log_open(join_path(members_[0].dir, "log.txt"));
    for (size_t k = 1; k < K; ++k) log_add(join_path(members_[k].dir, "log.txt"));
  }
  AdamW& opt = build_training(ckpts);
  restore_records(ckpts);
  log_start(steps);

  const int64_t start = members_[0].start;
  if (stop.requested() && start < steps) {
    checkpoint(start);
    return interrupted(start);
  }
  TrainStepOptions so = train_step_options(cfg0, task, members_[0].prep.bf16);
  if (packed())
    for (auto& m : members_) so.member_clip.push_back(m.cfg->get_float("train.clip"));
  TrainStep step(model_, opt, members_[0].prep.device, so, start);
  int64_t in_window = 0;
  const double elapsed_prev = members_[0].train_rows.empty() ? 0 : members_[0].train_rows.back().elapsed_s;
  double train_ms_total = 0;
  int64_t train_steps_timed = 0;
  const auto t_start = std::chrono::steady_clock::now();
  auto t_window = t_start;
  std::string mode_logged;
  steps_done_ = start;
  // A run stopped between a checkpoint and that step's evaluation (kill, SIGINT) evaluates it on resuming.
  if (start > 0 && start < steps && eval_every > 0 && start % eval_every == 0 &&
      (members_[0].eval_rows.empty() || members_[0].eval_rows.back().step != start))
    evaluate_at(start, false);

  struct Schedule {
    double peak, min_ratio;
    int64_t warmup, decay;
  };
  std::vector<Schedule> schedules;  // each member's, read once
  for (const auto& m : members_) {
    const Config& c = *m.cfg;
    schedules.push_back({c.get_float("train.lr"), c.get_float("train.min_lr_ratio"), c.get_int("train.warmup"),
                         c.get_int("train.decay_steps") > 0 ? c.get_int("train.decay_steps") : steps});
  }
  std::vector<Batch> batches(K);
  std::vector<const Task*> tasks;
  for (const auto& m : members_) tasks.push_back(m.prep.task.get());
  std::vector<double> lrs(K);
  int live = static_cast<int>(K);
  for (int64_t s = start; s < steps && live > 0; ++s) {
    for (size_t k = 0; k < K; ++k)
      lrs[k] = lr_at(s, schedules[k].peak, schedules[k].warmup, schedules[k].decay, schedules[k].min_ratio);
    with_memory_advice(fmt::format("training step {}", s + 1),
                       fmt::format("lower train.batch_size, task.train_len or the model's size ({})",
                                   checkpoint_words(members_[0])),
                       [&] {
                         batches = member_batches(tasks, Split::Train, static_cast<uint64_t>(s * B), B,
                                                  task.train_range);
                         step.run(batches, lrs);
                       });
    ++in_window;
    steps_done_ = s + 1;
    const bool last = s + 1 == steps;
    const bool do_log = (s + 1) % log_every == 0 || last || stop.requested();
    if (do_log) {
      // Read before the clock: on a GPU the host runs steps ahead, and the window ends when they have run.
      auto bad = step.first_bad.cpu().reshape({-1});
      if (step.mode() != mode_logged) {
        logf("training step: {}", step.mode());
        mode_logged = step.mode();
      }
      const auto now = std::chrono::steady_clock::now();
      const double window_ms = std::chrono::duration<double, std::milli>(now - t_window).count();
      train_ms_total += window_ms;
      train_steps_timed += in_window;
      live = log_window(step, bad, s + 1, steps, in_window, lrs, window_ms / static_cast<double>(in_window),
                        elapsed_prev + std::chrono::duration<double>(now - t_start).count());
      step.reset_window();
      in_window = 0;
    }
    if (live == 0) break;
    // The last step's checkpoint comes before its evaluation, which may run out of memory.
    const bool saved = (ckpt_every > 0 && (s + 1) % ckpt_every == 0) || last || stop.requested();
    if (saved) checkpoint(s + 1);
    const bool do_eval = eval_every > 0 && (s + 1) % eval_every == 0 && !last;
    if (do_eval) evaluate_at(s + 1, false);
    if (do_log || do_eval) t_window = std::chrono::steady_clock::now();
    if (stop.requested()) {
      if (!saved) checkpoint(s + 1);  // the signal came during the evaluation
      return interrupted(s + 1);
    }
  }
  stop.release();  // the final evaluation may be stopped like any program: the checkpoint is written
  ms_per_step_ = train_steps_timed ? train_ms_total / static_cast<double>(train_steps_timed)
                                   : (members_[0].train_rows.empty() ? 0.0 : members_[0].train_rows.back().ms_per_step);
  return finish(start, step.whole_steps(), elapsed_prev, t_start);
}

const char* kEvaluationHeader =
    "task,model,seed,step,split,length_min,length_max,n,accuracy,normalized_accuracy,accuracy_all,normalized_all,"
    "average,precision";

}  // namespace

// --pack auto's limits: calibrated on one H200 (results/reference/packed_runs_h200.md)
// (DeltaNet parity, hidden 128, 2 blocks, length 40: at batch 64 12 runs took 2.9x one run and 32 runs 6.3x; at batch
// 256 12 and 32 runs cost the same per run, 0.8 of one run alone; at batch 1024 4 runs took 4.5x one run, 12 took
// 11.2x; the step's peak memory was 2.4x memory_needs' lower bound per run, which kMeasuredOverNeed leaves room
// above for evaluation and other mixers).
constexpr double kPackMemoryShare = 0.6, kMeasuredOverNeed = 8, kSaturatingWork = 3.2e7;
constexpr int64_t kMaxPack = 16;
// A run whose step fills the GPU alone still packs, this many to a process where memory allows: their packed step
// costs about as much as their solo steps, but the process start, graph capture and evaluations come once. (H200,
// one HQLT Table 3 cell, 12 runs of batch 1024 packed: 659 s in all, 55 s a run, where solo runs took about 70 s,
// some 15 s of it beyond their steps; the packed step was 10-11x one run's. 4 runs packed stepped at 4.5x one run.)
constexpr int64_t kSaturatedPack = 12;

int evaluate_saved_run(const Config& cfg, const std::string& run_dir) {
  Prepared prep = prepare(cfg);
  const std::string ckpt_path = join_path(run_dir, "checkpoint.pt");
  if (!path_exists(ckpt_path)) throw UserError(fmt::format("cannot evaluate '{}': it holds no checkpoint.pt", run_dir));
  CheckpointReader ckpt(ckpt_path, prep.device);
  // The precision may differ from training's: evaluating in fp32 tells rounding apart from what the model learned.
  check_resumed_config(
      cfg, ckpt.config(), [](const std::string& k) { return k == "train.precision" || may_change_on_resume(k); },
      run_dir);
  ckpt.restore(prep.model, nullptr);
  prep.model->to(prep.device);
  const Task& task = *prep.task;
  const std::string split = cfg.get_string("eval.split"), average = cfg.get_string("eval.average");
  const std::string precision = prep.bf16 ? "bf16" : "fp32";
  std::fprintf(stderr, "memlab eval: %s at step %lld on %s, %s split, %lld examples per range, %s average, %s\n",
               run_dir.c_str(), static_cast<long long>(ckpt.step()), device_description(prep.device).c_str(),
               split.c_str(), static_cast<long long>(prep.spec.n), average.c_str(), precision.c_str());
  const auto rows = with_memory_advice(
      "the evaluation", "lower --batch-size, --n or the lengths",
      [&] { return evaluate(prep.model, task, prep.spec, prep.device, ckpt.step()); });

  // evaluation.csv: earlier rows, but those this call measured again. Rows of 12 columns, from before the average
  // column, were over tokens; rows from before the precision column leave it empty (not recorded).
  const std::string csv_path = join_path(run_dir, "evaluation.csv");
  std::vector<std::vector<std::string>> kept;
  for (auto c : read_csv(csv_path)) {
    if (c.size() == 12) c.push_back("tokens");
    if (c.size() == 13) c.push_back("");
    if (c.size() != 14) throw UserError(fmt::format("{}: expected 14 columns, found {}", csv_path, c.size()));
    bool again = false;
    for (const auto& r : rows)
      again = again || (c[3] == std::to_string(r.step) && c[4] == split && c[5] == std::to_string(r.length_min) &&
                        c[6] == std::to_string(r.length_max) && c[7] == std::to_string(r.n) && c[12] == average &&
                        c[13] == precision);
    if (!again) kept.push_back(c);
  }
  std::string out = std::string(kEvaluationHeader) + "\n";
  for (const auto& c : kept) out += fmt::format("{}\n", fmt::join(c, ","));
  for (const auto& r : rows)
    out += fmt::format("{},{},{},{},{},{},{},{},{:.6f},{:.6f},{:.6f},{:.6f},{},{}\n", cfg.get_string("task.name"),
                       cfg.get_string("model.name"), cfg.get_int("train.seed"), r.step, split, r.length_min,
                       r.length_max, r.n, r.accuracy, r.normalized, r.accuracy_all, r.normalized_all, average,
                       precision);
  const std::string table = length_table(rows, task.eval_range, cfg.get_float("eval.threshold"), task.running_answer());
  const std::string title = fmt::format(
      "{} · {} · seed {} — step {}, {} split, {} examples per range{}, {}", task.name(), cfg.get_string("model.name"),
      cfg.get_int("train.seed"), ckpt.step(), split, prep.spec.n, prep.spec.mad_average ? ", MAD's average" : "",
      prep.bf16 ? "bf16 autocast" : "fp32");
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
  s.add_bool("train.target_rows", true,
             "where every training example has one target (its answer), run the last block's MLP, the final norm "
             "and the head on those positions alone (the same loss, less work); false: on every position");
  s.add_string("train.length_buckets", "auto",
               "split each training batch into this many buckets of rows by length (1-16), each padded only to its "
               "own length: the same loss on fewer padded tokens, which pays where the GPU is full; 1 = off; auto = "
               "3 for a packed step of 6 or more runs on CUDA, else 1",
               {"auto", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15", "16"});
  s.add_string("train.precision", "auto", "auto = bf16 autocast on CUDA, fp32 on CPU", {"auto", "fp32", "bf16"});
  s.add_int("train.log_every", 50, "steps between progress lines and train.csv rows", 1);
  s.add_int("train.checkpoint_every", 1000, "steps between checkpoints; 0 = only at the end", 0);
  s.add_bool("train.tensorboard", true, "write TensorBoard event files (events.out.tfevents.*) in the run directory");
  s.add_int("eval.every", 100, "steps between evaluations; 0 = only at the end", 0);
  s.add_int("eval.n", 512, "examples per length range", 1);
  s.add_int("eval.batch_size", 256, "evaluation batch size", 1);
  s.add_string("eval.split", "val", "split evaluated", {"val", "test"});
  s.add_string("eval.average", "tokens",
               "tokens = accuracy over every scored token; mad = MAD's metric: each batch's mean over classes of their "
               "recall, averaged over batches by rows (MAD's test batches are its training batches: set "
               "eval.batch_size to train.batch_size to match)",
               {"tokens", "mad"});
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
  Run run({&cfg}, {req.out_dir}, req.resume);
  return run.go();
}

int run_packed_training(const std::vector<const Config*>& cfgs, const std::vector<std::string>& dirs, bool resume) {
  if (cfgs.empty() || cfgs.size() != dirs.size()) throw std::logic_error("run_packed_training: one directory per run");
  for (size_t i = 0; i < dirs.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (dirs[i] == dirs[j]) throw UserError(fmt::format("two packed runs would write to the same directory '{}'", dirs[i]));
  Run run(cfgs, dirs, resume);
  return run.go();
}

std::string pack_key(const Config& cfg) {
  std::string key;
  for (const auto& [k, v] : cfg.flat())
    if (!may_differ_in_pack(k)) key += k + "=" + v + "\n";
  static std::map<std::string, bool> packs;  // per key (a sweep asks for many runs of few keys)
  auto it = packs.find(key);
  if (it == packs.end()) {
    bool ok = true;
    try {  // a packed model of two members builds (the mixer packs, the head does)
      const auto task = make_task(cfg);
      torch::NoGradGuard ng;
      SequenceModel(cfg, static_cast<int64_t>(task->vocab().size()), 2);
    } catch (const UserError&) {
      ok = false;
    }
    it = packs.emplace(key, ok).first;
  }
  return it->second ? key : "";
}

namespace {
// Past about kSaturatingWork token-channels per step (batch x length x width x blocks, all runs together) the GPU is
// busy, and K runs packed take as long as K runs one after another, or longer: how many runs of this config fit in it.
double runs_before_gpu_fills(const Config& cfg, const Task& task) {
  const double work = static_cast<double>(cfg.get_int("train.batch_size")) *
                      static_cast<double>(task.max_input_length(task.train_range)) *
                      static_cast<double>(cfg.get_int("model.hidden")) * static_cast<double>(cfg.get_int("model.layers"));
  return kSaturatingWork / work;
}
}  // namespace

int64_t min_paying_pack(const Config& cfg) {
  return runs_before_gpu_fills(cfg, *make_task(cfg)) < kMinPayingPack ? kMinPayingPack : 1;
}

int64_t auto_pack_limit(const Config& cfg, double device_bytes) {
  if (device_bytes <= 0 || cfg.get_string("train.device") == "cpu") return 1;
  const auto task = make_task(cfg);
  const auto vocab = static_cast<int64_t>(task->vocab().size());
  double need = 0;
  for (const auto& n : memory_needs(cfg, *task, eval_ranges(cfg, *task), vocab, true))
    if (n.on_device) need += n.bytes;
  const double by_work = runs_before_gpu_fills(cfg, *task);
  auto limit = [&](double need_per_run) {
    // memory_needs are lower bounds: count a run as kMeasuredOverNeed times them
    const double by_memory = kPackMemoryShare * device_bytes / (kMeasuredOverNeed * std::max(need_per_run, 1.0));
    if (by_work < kMinPayingPack) return by_memory >= kSaturatedPack ? kSaturatedPack : int64_t{1};
    const auto k = static_cast<int64_t>(std::min({by_memory, by_work, double{kMaxPack}}));
    return k < kMinPayingPack ? int64_t{1} : k;  // a few runs of a step that nearly fills the GPU ran slower packed
  };
  // A graphed step split into length buckets runs a batch that fits no bucket whole and eagerly, beside the buckets'
  // graph pool: count its activations twice where the pack will split (never for a head that is not causal).
  const double split_need = need + step_activation_bytes(cfg, *task, vocab);
  const TrainStepOptions so = train_step_options(cfg, *task, false);
  if (!so.cuda_graph || so.graph_length <= 0 || so.length_buckets == 1) return limit(need);
  if (so.length_buckets > 1) return limit(split_need);
  // auto splits from 6 runs: where 6 split runs do not fit, 5 whole ones may (not for a saturating step, which packs
  // kSaturatedPack or nothing)
  const int64_t whole = limit(need);
  const int64_t unsplit = whole < kAutoBucketMembers ? whole : by_work < kMinPayingPack ? 1 : kAutoBucketMembers - 1;
  return std::max(limit(split_need), unsplit);
}

}  // namespace memlab
