#pragma once
// Runs a registered sweep's runs: each as a `memlab train` child process in RESULTS/runs/<id>, either
// several at once on this machine (one per GPU, or N on the CPU) or one chosen by index (a Slurm array task).
// Runs are claimed in the results store, so any number of launchers may work on one sweep together; a run
// whose launcher died is resumed from its last checkpoint by the next launcher that finds it.
#include <cstdint>
#include <string>
#include <vector>

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
};

// Runs claimable runs until none is left; prints progress and a summary of failures. Exit code: 0 when
// every run of the sweep is done, 1 when some failed, 130 when interrupted (runs given back, checkpoints kept).
int run_local(const LaunchOptions& opt);

// Runs the sweep's index-th run (0-based) here. 0 when it is done (now or before, or another launcher
// holds it), 1 when it failed.
int run_index(const LaunchOptions& opt, int64_t index);

// Prints the sweep's counts, its running runs with their latest step (and those whose launcher is gone, by
// its process or by stale_s seconds without a heartbeat) and its failed runs with their error.
void print_status(const std::string& results, const std::string& sweep, double stale_s);

}  // namespace memlab
