#pragma once
// What one finished training run contributes to a report: its identity (label, task, lr, seed), the
// length ranges of its task, and its evaluation and training rows. Filled from the results store or
// from a run directory (report/results.h), or by hand in tests.
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace memlab {

struct Range {
  int64_t min = 0, max = 0;
  bool operator==(const Range& o) const { return min == o.min && max == o.max; }
  bool operator!=(const Range& o) const { return !(*this == o); }
  bool operator<(const Range& o) const { return min != o.min ? min < o.min : max < o.max; }
};
std::string range_name(const Range& r);  // "40-256"

struct EvalPoint {
  int64_t step = 0;
  Range lengths;
  int64_t n = 0;
  double accuracy = 0, normalized = 0;  // fractions, as in eval.csv: the headline
  double accuracy_all = std::nan(""), normalized_all = std::nan("");  // every scored position (NaN: not recorded)
};

struct TrainPoint {
  int64_t step = 0;
  double loss = 0, accuracy = 0;
};

struct RunResult {
  std::string source;  // run id or directory, for messages
  std::string label;   // row name; filled by assign_labels when the config left it empty
  std::string task, model;
  double lr = 0;
  int64_t seed = 0;
  int64_t steps = 0;  // train.steps of the config (0 = unknown)
  bool mad_average = false;  // eval.average = mad: its accuracies are MAD's macro average, not over tokens
  Range train_len, eval_len;
  // Scalar model.* keys other than model.name, and those of the mixer's own section, e.g.
  // "hidden" -> "128", "variant" -> "synchronous": what tells apart runs that share model.name.
  std::map<std::string, std::string> model_keys;
  // Every task.* key but task.name, e.g. "mad.vocab" -> "32", "train_len" -> "[128, 128]": a run's task
  // setting (the MAD protocol averages over settings).
  std::map<std::string, std::string> task_keys;
  std::vector<EvalPoint> evals;
  std::vector<TrainPoint> train;
};

// Fills label, task, model, lr, seed, steps, the average, lengths and model_keys from an effective config
// (YAML text as written to config.yaml or kept in the results store; no eval.average, as before memlab had
// it, reads as tokens). UserError naming `source` and the key when a needed key is missing or malformed.
void read_run_config(RunResult& run, const std::string& yaml_text, const std::string& source);

// Gives every run without a label one: model.name, and where runs of the same task share model.name
// but differ in other model keys, those keys: "hqlt (variant=delayed_chunk)".
void assign_labels(std::vector<RunResult>& runs);

}  // namespace memlab
