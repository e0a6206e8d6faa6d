#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>

#include "core/config.h"
#include "core/errors.h"
#include "core/workers.h"
#include "tasks/counting.h"
#include "tasks/formal_languages.h"
#include "tasks/mad.h"
#include "tasks/regbench.h"
#include "tasks/state_tracking.h"
#include "tasks/task.h"

namespace memlab {
namespace {

using Factory = std::function<std::unique_ptr<Task>(const Config&)>;

// Tasks with a running answer, each with its task.<name>.target key.
const char* const kRunningAnswerTasks[] = {"parity", "sum_mod5", "s3", "s5", "cycle_nav"};

RegBenchParams regbench_params(const Config& c) {
  RegBenchParams p;
  auto get = [&c](const char* key) { return c.get_int(fmt::format("task.regbench.{}", key)); };
  p.min_states = get("min_states");
  p.max_states = get("max_states");
  p.min_alphabet = get("min_alphabet");
  p.max_alphabet = get("max_alphabet");
  p.max_out_degree = get("max_out_degree");
  p.min_strings = get("min_strings");
  p.max_strings = get("max_strings");
  p.max_string_len = get("max_string_len");
  p.heldout = get("heldout");
  if (p.max_states < p.min_states) c.fail("task.regbench.max_states", "must be >= task.regbench.min_states");
  if (p.max_alphabet < p.min_alphabet) c.fail("task.regbench.max_alphabet", "must be >= task.regbench.min_alphabet");
  if (p.max_strings < p.min_strings) c.fail("task.regbench.max_strings", "must be >= task.regbench.min_strings");
  // every state must be able to have max_out_degree edges on distinct letters to distinct other states
  if (p.max_out_degree > std::min(p.min_alphabet, p.min_states - 1))
    c.fail("task.regbench.max_out_degree", "must be <= task.regbench.min_alphabet and < task.regbench.min_states");
  return p;
}

const std::map<std::string, Factory>& factories() {
  static const std::map<std::string, Factory> f = {
      {"parity", [](const Config&) { return std::make_unique<ParityTask>(); }},
      {"mod_arith", [](const Config&) { return std::make_unique<ModArithTask>(); }},
      {"mod_arith_brackets",
       [](const Config& c) { return std::make_unique<ModArithBracketsTask>(c.get_bool("task.mod_arith_brackets.mult")); }},
      {"sum_mod5", [](const Config&) { return std::make_unique<SumMod5Task>(); }},
      {"s3", [](const Config&) { return std::make_unique<WordProblemTask>(3); }},
      {"s5", [](const Config&) { return std::make_unique<WordProblemTask>(5); }},
      {"cycle_nav", [](const Config&) { return std::make_unique<CycleNavTask>(); }},
      {"anbn", [](const Config&) { return std::make_unique<CountingLanguageTask>(2); }},
      {"anbncn", [](const Config&) { return std::make_unique<CountingLanguageTask>(3); }},
      {"majority", [](const Config& c) { return std::make_unique<MajorityTask>(static_cast<int>(c.get_int("task.majority.symbols"))); }},
      {"regbench", [](const Config& c) { return std::make_unique<RegBenchTask>(regbench_params(c)); }},
  };
  static const std::map<std::string, Factory> with_mad = [] {
    auto all = f;
    for (const auto& name : mad_task_names()) all.emplace(name, make_mad_task);
    return all;
  }();
  return with_mad;
}

LengthRange read_range(const Config& cfg, const std::string& key, int64_t min_allowed) {
  auto v = cfg.get_int_list(key);
  if (v.size() != 2) cfg.fail(key, "needs exactly two values [min, max]");
  if (v[0] < min_allowed) cfg.fail(key, fmt::format("min length must be >= {}", min_allowed));
  if (v[1] < v[0]) cfg.fail(key, "max must be >= min");
  return {v[0], v[1]};
}

}  // namespace

Split parse_split(const std::string& s) {
  if (s == "train") return Split::Train;
  if (s == "val") return Split::Val;
  if (s == "test") return Split::Test;
  throw UserError(fmt::format("unknown split '{}' (allowed: train, val, test)", s));
}

const char* split_name(Split s) {
  switch (s) {
    case Split::Train: return "train";
    case Split::Val: return "val";
    case Split::Test: return "test";
  }
  return "?";
}

std::vector<std::string> task_names() {
  std::vector<std::string> out;
  for (const auto& [k, v] : factories()) out.push_back(k);
  return out;
}

void register_task_keys(Schema& s) {
  s.add_string("task.name", "parity", "task to train on", task_names());
  s.add_int_list("task.train_len", {3, 40}, "training lengths [min, max] (answer slot included)", 3);
  s.add_int_list("task.eval_len", {40, 256}, "validation/test lengths [min, max]", 3);
  s.add_int("task.train_examples", 0, "size of a finite training set that training cycles through (MAD, RegBench); 0 = fresh examples every step", 0);
  // Per-task keys (formats in tasks/*.h).
  s.add_bool("task.mod_arith_brackets.mult", false, "mod_arith_brackets: allow '*' besides + and -");
  for (const char* t : kRunningAnswerTasks)
    s.add_string(fmt::format("task.{}.target", t), "last",
                 "training targets: the answer at the last position only, or the running answer at every position "
                 "(evaluation reports both)",
                 {"last", "every"});
  s.add_int("task.majority.symbols", 4, "majority: alphabet size", 2, 26);
  // MAD (tasks/mad.h); the length of an example is MAD's seq_len, so task.train_len [L, L] is MAD's setting L.
  s.add_int("task.mad.vocab", 0,
            "MAD vocabulary size V (model vocab V+1); 0 = the task's baseline: recall 16, noisy recall 32 (incl. noise), "
            "fuzzy recall 16, selective copy 16, compression 16, memorization 256", 0, 1 << 20);
  s.add_bool("task.mad.multi_query", true,
             "MAD recall tasks: score every repeated key's value at evaluation; false = only the final probe, after a copy-prefix token");
  s.add_int("task.mad.noise_vocab", 16, "mad_noisy_recall: noise symbols, part of task.mad.vocab", 0, 1 << 20);
  s.add_float("task.mad.frac_noise", 0.2, "mad_noisy_recall: probability that a (key, value) pair is replaced by two noise tokens", 0.0, 1.0);
  s.add_int("task.mad.motif", 3, "mad_fuzzy_recall: largest key/value motif (tokens per key or value)", 1, 64);
  s.add_int("task.mad.copy", 16, "mad_selective_copy: tokens to copy", 1, 1 << 20);
  s.add_int("task.mad.map_seed", 12345, "mad_memorization: seed of the fixed key->value map (independent of train.seed)", 0);
  s.add_int("task.regbench.min_states", 4, "regbench: fewest states of a drawn automaton", 2, 64);
  s.add_int("task.regbench.max_states", 12, "regbench: most states of a drawn automaton", 2, 64);
  s.add_int("task.regbench.min_alphabet", 4, "regbench: smallest alphabet (letters of a..r)", 1, 18);
  s.add_int("task.regbench.max_alphabet", 18, "regbench: largest alphabet (letters of a..r)", 1, 18);
  s.add_int("task.regbench.max_out_degree", 3, "regbench: out-edges per state are U{1..this}", 1, 18);
  s.add_int("task.regbench.min_strings", 10, "regbench: fewest strings per example", 1);
  s.add_int("task.regbench.max_strings", 19, "regbench: most strings per example", 1);
  s.add_int("task.regbench.max_string_len", 49, "regbench: string lengths are U{1..this}", 1);
  s.add_int("task.regbench.heldout", 500, "regbench: held-out automata (val: first half, test: the rest)", 2);
}

std::unique_ptr<Task> make_task(const Config& cfg) {
  auto t = factories().at(cfg.get_string("task.name"))(cfg);
  t->train_range = read_range(cfg, "task.train_len", 3);
  t->eval_range = read_range(cfg, "task.eval_len", 3);
  t->seed = static_cast<uint64_t>(cfg.get_int("train.seed"));
  t->train_examples = static_cast<uint64_t>(cfg.get_int("task.train_examples"));
  if (t->running_answer())
    t->train_targets =
        cfg.get_string("task." + t->name() + ".target") == "every" ? TrainTargets::Every : TrainTargets::Last;
  return t;
}

Batch Task::pad(const std::vector<Example>& examples) const {
  Batch b;
  b.B = static_cast<int64_t>(examples.size());
  b.pad_id = pad_id();
  for (const auto& e : examples) b.T = std::max<int64_t>(b.T, e.input.size());
  b.input.assign(b.B * b.T, pad_id());
  b.target.assign(b.B * b.T, -1);
  b.lengths.resize(b.B);
  for (int64_t i = 0; i < b.B; ++i) {
    const auto& e = examples[i];
    std::copy(e.input.begin(), e.input.end(), b.input.begin() + i * b.T);
    std::copy(e.target.begin(), e.target.end(), b.target.begin() + i * b.T);
    b.lengths[i] = static_cast<int64_t>(e.input.size());
    if (!e.accept.empty()) {
      if (b.accept.empty()) b.accept.assign(b.B * b.T, 0);
      std::copy(e.accept.begin(), e.accept.end(), b.accept.begin() + i * b.T);
    }
  }
  return b;
}

Example Task::example(Split split, uint64_t index, LengthRange range) const {
  if (split == Split::Train && train_examples > 0) index %= train_examples;
  Example ex = sample(split, index, range);
  if (split == Split::Train && running_answer() && train_targets == TrainTargets::Last)
    std::fill(ex.target.begin(), ex.target.end() - 1, -1);
  return ex;
}

std::vector<Example> Task::examples(Split split, uint64_t first, int64_t n, LengthRange range) const {
  return std::move(member_examples({this}, split, first, n, range)[0]);
}

std::vector<std::vector<Example>> member_examples(const std::vector<const Task*>& tasks, Split split, uint64_t first,
                                                  int64_t n, LengthRange range) {
  const auto K = static_cast<int64_t>(tasks.size());
  std::vector<std::vector<Example>> ex(tasks.size(), std::vector<Example>(static_cast<size_t>(n)));
  constexpr int64_t kExamplesPerChunk = 64;  // about 0.1 ms of a core, far above what handing out a chunk costs
  parallel_chunks(K * n, kExamplesPerChunk, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      ex[i / n][i % n] = tasks[i / n]->example(split, first + static_cast<uint64_t>(i % n), range);
  });
  return ex;
}

std::vector<Batch> member_batches(const std::vector<const Task*>& tasks, Split split, uint64_t first, int64_t n,
                                  LengthRange range) {
  const auto ex = member_examples(tasks, split, first, n, range);
  std::vector<Batch> out(tasks.size());
  parallel_chunks(static_cast<int64_t>(tasks.size()), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) out[k] = tasks[k]->pad(ex[k]);
  });
  return out;
}

Batch Task::batch(Split split, uint64_t first, int64_t n, LengthRange range) const {
  return pad(examples(split, first, n, range));
}

}  // namespace memlab
