#pragma once
// The results store of a sweep: one SQLite file per results folder (RESULTS/results.sqlite) holding the
// runs, their effective configs and status, and every training and evaluation row of finished runs.
// Safe for several processes at once (WAL journal, immediate transactions, busy timeout) and against a
// process killed at any moment: a run's rows and its "done" status are written in one transaction.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/run_files.h"

struct sqlite3;

namespace memlab {

struct RunRecord {
  std::string id;      // stable id: hash of the effective config (run_id in sweep/run_id.h)
  std::string label;   // row name in reports
  std::string task, model;
  double lr = 0;
  int64_t seed = 0;
  std::string config;  // the effective config, YAML
  std::string status = "pending";  // pending | running | done | failed
  std::string worker;  // host:pid of the process running it
  std::string error;   // the error line of a failed attempt
  int attempts = 0;    // processes started for it
  int stops = 0;       // of those, the ones the sweep itself stopped (Ctrl-C, --deadline): not held against --retries
  double started = 0, finished = 0, heartbeat = 0;  // unix seconds
  double seconds = 0;  // the finished run's training time over all its attempts (train.csv's last elapsed_s; the
                       // finishing attempt's wall time where train.csv has no row)
  // The device time it took: over its attempts, each attempt's wall time (process start to end) shared among the
  // runs packed into that process. Attempts whose launcher was killed are missing; 0 where nothing was recorded (a
  // store of memlab before 2026-12-07).
  double device_seconds = 0;
};

// A finished run's device time as the store's other columns give it, where device_seconds was not recorded, and its
// pack: its own time (its training time over all attempts, or the wall time from the last claim to the finish where
// that is longer: setup and evaluations) shared among the runs that the same worker claimed at the same moment (a
// pack's runs are claimed together). Done runs of `runs` only, by id. The work of attempts that a stop cut off after
// their last checkpoint is not in it.
struct FinishedCost {
  double seconds = 0;
  int64_t pack = 1;
};
std::map<std::string, FinishedCost> finished_costs(const std::vector<RunRecord>& runs);
// "device time 3h59m for its 154 finished runs (1m33s a run), ..." : what the runs took, recorded (device_seconds) or
// else estimated for finished runs (finished_costs), saying which; and the attempts of runs not finished. Empty where
// no run has any.
std::string device_time_summary(const std::vector<RunRecord>& runs);

struct SweepCounts {
  int64_t total = 0, pending = 0, running = 0, done = 0, failed = 0;
};

class Store {
 public:
  // Opens (creating when `create`) RESULTS/results.sqlite; UserError naming the path when it cannot.
  explicit Store(const std::string& results_dir, bool create = true);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  static std::string file_in(const std::string& results_dir);  // RESULTS/results.sqlite

  // Registers a sweep's runs in order (index 0..n-1). Runs already known (same id) keep their status and
  // rows, so registering a sweep again, or another sweep sharing runs, never repeats work. Those not yet run
  // (pending, failed) take the new config: it can differ only in keys the id ignores (train.length_buckets,
  // model.kernels...), which a resumed run may change; the launcher puts them in a resumed run's config.yaml.
  void add_sweep(const std::string& sweep, const std::vector<RunRecord>& runs);
  std::vector<std::string> sweeps() const;
  // The runs of a sweep in its order; all runs (in order of registration) when sweep is empty.
  std::vector<RunRecord> runs(const std::string& sweep = "") const;
  std::optional<RunRecord> run(const std::string& id) const;
  SweepCounts counts(const std::string& sweep) const;

  // Claims a run for `worker` (marks it running, attempts + 1): the given one, or when `id` is empty the
  // first claimable run of the sweep in order. Claimable: pending; running but abandoned (its worker is
  // on this host and its process is gone, or its heartbeat is older than stale_s); failed when
  // retry_failed. Returns nothing when no run is claimable.
  // `tried`: runs this launcher started already; a failed one among them is not retried (once per call).
  std::optional<RunRecord> claim(const std::string& sweep, const std::string& id, const std::string& worker,
                                 double stale_s, bool retry_failed, const std::set<std::string>& tried = {});
  // A group of runs claimed together (runs packed into one process): the first claimable run as `claim` finds
  // it, then each later claimable run of the sweep that `joins(claimed so far, run)` accepts, in one transaction.
  // joins runs while the store is locked for writing: it should be quick.
  using Joins = std::function<bool(const std::vector<RunRecord>& group, const RunRecord& r)>;
  // `before`, when given, receives the claimed runs as they were before the claim (for unclaim). Runs in `skip` are
  // not claimed (runs that would not end before a deadline, so that later, shorter ones can start).
  std::vector<RunRecord> claim_group(const std::string& sweep, const std::string& id, const std::string& worker,
                                     double stale_s, bool retry_failed, const std::set<std::string>& tried,
                                     const Joins& joins, std::vector<RunRecord>* before = nullptr,
                                     const std::set<std::string>& skip = {});
  // A running run whose worker is known to be gone (same host) or has sent no heartbeat for stale_s.
  static bool abandoned(const RunRecord& r, double stale_s);
  void heartbeat(const std::string& id, const std::string& worker);
  // Replaces the run's rows by these and marks it done, in one transaction.
  void finish(const std::string& id, const std::vector<TrainRecord>& train, const std::vector<EvalRecord>& evals,
              double seconds);
  void fail(const std::string& id, const std::string& error);
  // Adds `seconds` to each run's device_seconds (an attempt's wall time over the runs packed in it).
  void add_device_time(const std::vector<std::string>& ids, double seconds);
  // Gives a claimed run back (pending) without counting it as failed. stopped: the sweep itself stopped it
  // (interrupted, its deadline), which counts a stop, so that the attempt is not held against --retries.
  void release(const std::string& id, bool stopped = false);
  // Undoes a claim whose run never started (it would not end before a deadline): the run as `before` was, as long
  // as it is still running for the claim.
  void unclaim(const RunRecord& before);

  std::vector<EvalRecord> evals(const std::string& run_id) const;
  std::vector<TrainRecord> train_rows(const std::string& run_id) const;

  // "host:pid" of this process.
  static std::string this_worker();

 private:
  sqlite3* db_ = nullptr;
  std::string path_;
};

}  // namespace memlab
