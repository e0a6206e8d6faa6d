#pragma once
// Runs a registered sweep's runs: each as a `memlab train` child process in RESULTS/runs/<id>, either
// several at once on this machine (one per GPU, or N on the CPU) or one chosen by index (a Slurm array task).
// Runs that can be packed are claimed in groups and trained by one process (`memlab train --resume D1 --resume D2`,
// each directory holding its config.yaml); each still finishes, fails or resumes as its own run.
// Runs are claimed in the results store, so any number of launchers may work on one sweep together; a run
// whose launcher died is resumed from its last checkpoint by the next launcher that finds it.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "sweep/store.h"

namespace memlab {

struct LaunchOptions {
  std::string results;  // results folder (holds results.sqlite)
  std::string sweep;    // sweep name in the store
  std::string memlab;   // the memlab binary that trains
  // One slot per entry, each a CUDA_VISIBLE_DEVICES value ("0", "1", ...); empty: `workers` CPU slots.
  std::vector<std::string> gpus;
  int workers = 1;
  int threads = 0;      // torch threads per run; 0 = the machine's cores shared among the slots
  int retries = 1;      // new attempts for a run whose process was killed (by a signal, not by an error)
  bool retry_failed = false;
  double stale_s = 600;     // a running run with no heartbeat for this long is abandoned
  double progress_s = 30;   // seconds between progress lines while nothing changes
  // > 0: this call stops after deadline_s seconds, as Ctrl-C stops it (running runs checkpoint and go back to
  // pending), and starts no run, or pack, expected to end after that (expected_seconds); a pack that would not fit
  // starts with as many of its runs as do (runs_before_deadline); a run that would not end in time waits for the
  // next call, and later runs that would end in time start in its place.
  double deadline_s = 0;
  // >= 0, with a deadline (--fill SECS): a slot that no run would fill before the deadline takes one run alone anyway
  // while at least fill_s seconds are left. It trains until it ends or the deadline stops it (then it checkpoints and
  // goes back to pending), so that the last minutes of a slice train where the next call resumes them. < 0: such
  // slots stay idle.
  double fill_s = -1;
  // Packed runs (memlab sweep --pack): runs whose pack_key is one non-empty string train together in one process,
  // at most pack_limit(first run) of them (unset: `pack`). pack_key gets the run and its checkpoint's path ("" when
  // it has none), so that only runs at the same step resume together.
  int pack = 1;
  std::function<std::string(const RunRecord&, const std::string& checkpoint)> pack_key;
  std::function<int64_t(const RunRecord&)> pack_limit;
  // A pack the deadline cuts to fewer runs than min_pack(its first run) starts one run alone (unset: 1): smaller
  // packs of a step that fills the GPU took longer than their runs one after another.
  std::function<int64_t(const RunRecord&)> min_pack;
};

// Runs claimable runs until none is left; prints progress and a summary of failures. Exit code: 0 when
// every run of the sweep is done, 1 when some failed, 130 when interrupted or stopped by the deadline (runs
// given back, checkpoints kept).
int run_local(const LaunchOptions& opt);

// Runs the sweep's index-th run (0-based) here. 0 when it is done (now or before, or another launcher
// holds it), 1 when it failed.
int run_index(const LaunchOptions& opt, int64_t index);

// A sweep's runs of one label, task and model, which differ only in what a grid varies.
using Experiment = std::tuple<std::string, std::string, std::string>;
inline Experiment experiment_of(const RunRecord& r) { return {r.label, r.task, r.model}; }

// The pace of a sweep's finished runs, read from the store once. seconds(group): how long the runs of `group`,
// trained together, are expected to take: the sum over them of the steps each has left times the seconds per step
// per pack member of its experiment (runs of one label, task and model, which differ only in what a grid varies;
// the median of its finished runs, each timed as it ran, over the size of its pack); a tenth more for a group smaller
// than the packs timed; 0 when no run of the sweep has finished. An experiment none of whose runs has finished is
// estimated by rate_of's stand-ins.
class SweepPace {
 public:
  SweepPace(const Store& store, const LaunchOptions& opt);
  double seconds(const std::vector<RunRecord>& group) const;

 private:
  struct Rate {
    double per_member = 0;
    int64_t pack = 1;
  };
  Rate rate_of(const RunRecord& r) const;
  const LaunchOptions& opt_;
  std::map<Experiment, Rate> experiments_;  // the median of each experiment's finished runs
  // (task, other task) -> the median over the labels timed on both of the first's rate over the second's
  std::map<std::pair<std::string, std::string>, double> task_ratio_;
  Rate slowest_;
};
double expected_seconds(const Store& store, const LaunchOptions& opt, const std::vector<RunRecord>& group);

// A claimed pack of `claimed` runs with `left` seconds before the deadline: `fit`, the most of its runs whose
// expected time (seconds(n) for the first n, growing with n) fits with a fifth to spare, 0 when not even one does;
// `start`, how many of them start: one where the deadline cut the pack to fewer than min_pack, else fit.
struct DeadlineCut {
  size_t fit = 0, start = 0;
};
DeadlineCut runs_before_deadline(const std::function<double(size_t)>& seconds, size_t claimed, double left,
                                 size_t min_pack);

// Prints the sweep's counts, its running runs with their latest step (and those whose launcher is gone, by
// its process or by stale_s seconds without a heartbeat) and its failed runs with their error.
void print_status(const std::string& results, const std::string& sweep, double stale_s);

}  // namespace memlab
