#pragma once
// Aggregation over seeds as in the HQLT paper's Tables 3 and 6: per (label, task) the learning rate whose
// best seed is highest gives "best" (max over seeds), the learning rate whose median is highest gives
// "median ± MAD" (median absolute deviation, unscaled). A run's score is its accuracy (in %) on the
// task's headline lengths (task.eval_len) at the final evaluated step or at its best one.
#include <optional>
#include <string>
#include <vector>

#include "report/run_result.h"

namespace memlab {

enum class Select { Final, Best };
enum class Metric { Normalized, Accuracy };

struct PaperValues;

struct ReportOptions {
  Select select = Select::Final;
  Metric metric = Metric::Normalized;
  std::string task;                  // only this task when non-empty
  const PaperValues* paper = nullptr;  // shown beside the best and median tables (report/paper_values.h)
};

double median(std::vector<double> v);
double median_abs_deviation(const std::vector<double>& v);  // median of |x - median(x)|

// One run's score: the value (in %) on its headline range at the selected step.
struct Score {
  const RunResult* run = nullptr;
  int64_t step = 0;
  double value = 0;
};
// Nothing when the run has no evaluation of its headline range.
std::optional<Score> score_run(const RunResult& run, const ReportOptions& opt);
// Value (in %) of one evaluation row under the metric.
double metric_value(const EvalPoint& e, Metric metric);

struct LrGroup {
  double lr = 0;
  std::vector<Score> seeds;  // in input order
  double max = 0, median = 0, mad = 0;
  const Score* best() const;  // the seed with the highest score (first of ties)
};

struct Cell {  // one (label, task)
  std::string label, task;
  std::vector<LrGroup> lrs;  // in order of first appearance
  size_t best_lr = 0;        // index into lrs: highest max (first of ties)
  size_t median_lr = 0;      // index into lrs: highest median (first of ties)
  const LrGroup& by_max() const { return lrs[best_lr]; }
  const LrGroup& by_median() const { return lrs[median_lr]; }
  const Score& best_run() const { return *by_max().best(); }
};

struct Report {
  ReportOptions options;
  std::vector<std::string> labels, tasks;  // first appearance
  std::vector<Cell> cells;                 // one per (label, task) that has runs
  // Per task: the length ranges evaluated (all but the training range), ordered by min then max.
  std::vector<std::vector<Range>> ranges;
  std::vector<Range> train_len, eval_len;  // per task, of its first run
  std::vector<std::string> notes;          // footnotes: runs left out and why
  const Cell* cell(const std::string& label, const std::string& task) const;
  size_t task_index(const std::string& task) const;
};

// Aggregates the runs (labels assigned). `notes` come along into the report's footnotes. UserError when
// nothing is left to report.
Report aggregate(const std::vector<RunResult>& runs, const ReportOptions& opt, std::vector<std::string> notes = {});

// The row of `run` at `step` on `lengths`, if evaluated.
const EvalPoint* find_eval(const RunResult& run, int64_t step, const Range& lengths);

// "Parity", "Mod Arith": task names as the paper's column titles.
std::string task_title(const std::string& task);
const char* metric_name(Metric m);  // "normalized" | "accuracy"
const char* select_name(Select s);  // "final" | "best"

}  // namespace memlab
