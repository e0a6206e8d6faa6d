#include "report/results.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "core/errors.h"
#include "core/io.h"
#include "core/run_files.h"
#include "sweep/store.h"

namespace fs = std::filesystem;

namespace memlab {

namespace {

void add_rows(RunResult& run, const std::vector<EvalRecord>& evals, const std::vector<TrainRecord>& train) {
  for (const auto& e : evals)
    run.evals.push_back(EvalPoint{e.step, {e.length_min, e.length_max}, e.n, e.accuracy, e.normalized,
                                  e.accuracy_all, e.normalized_all});
  for (const auto& t : train) run.train.push_back(TrainPoint{t.step, t.loss, t.accuracy});
}

std::string canonical(const std::string& p) {
  std::error_code ec;
  const auto c = fs::weakly_canonical(p, ec);
  return ec ? p : c.string();
}

struct Loader {
  LoadedRuns out;
  std::set<std::string> seen;  // canonical run directories, so a run named twice counts once
  int repeated = 0;

  bool fresh(const std::string& dir) {
    if (seen.insert(canonical(dir)).second) return true;
    ++repeated;
    return false;
  }

  void store(const std::string& dir) {
    Store st(dir, /*create=*/false);
    int64_t pending = 0, running = 0, failed = 0, total = 0;
    const auto recs = st.runs();
    for (const auto& rec : recs) {
      ++total;
      if (rec.status != "done") {
        pending += rec.status == "pending";
        running += rec.status == "running";
        failed += rec.status == "failed";
        continue;
      }
      const std::string run_dir = join_path(join_path(dir, "runs"), rec.id);
      if (!fresh(run_dir)) continue;
      RunResult run;
      read_run_config(run, rec.config, run_dir);
      run.label = rec.label;  // the store's: registering a sweep again updates it (and a run's config until it is done)
      add_rows(run, st.evals(rec.id), st.train_rows(rec.id));
      out.runs.push_back(std::move(run));
    }
    if (total == 0) out.notes.push_back(fmt::format("{}: the results store holds no runs", dir));
    if (pending + running + failed > 0)
      out.notes.push_back(fmt::format("{}: {} of {} runs not reported: {} pending, {} running, {} failed", dir,
                                      pending + running + failed, total, pending, running, failed));
    if (const std::string t = device_time_summary(recs); !t.empty()) out.notes.push_back(fmt::format("{}: {}", dir, t));
  }

  // A run directory; left out with a note when it holds no evaluation yet.
  void run_dir(const std::string& dir) {
    if (!fresh(dir)) return;
    if (!path_exists(join_path(dir, "eval.csv"))) {
      out.notes.push_back(fmt::format("{}: no eval.csv yet (not started, failed or interrupted early); left out", dir));
      return;
    }
    out.runs.push_back(read_run_dir(dir));
  }
};

// Accuracies of MAD's average and over tokens are different numbers: a mad run's label says so, which keeps it
// out of the rows, seeds and settings of tokens runs in every protocol.
void mark_mad_average(LoadedRuns& out) {
  int64_t n = 0;
  for (auto& run : out.runs)
    if (run.mad_average) {
      run.label += " (class-averaged)";
      ++n;
    }
  if (n > 0)
    out.notes.push_back(fmt::format("{} run{} with eval.average = mad, labelled \"(class-averaged)\": accuracy as "
                                    "MAD's code averages it (per batch the mean of the classes' recalls), not over "
                                    "tokens",
                                    n, n == 1 ? "" : "s"));
}

}  // namespace

RunResult read_run_dir(const std::string& dir) {
  RunResult run;
  const std::string cfg = join_path(dir, "config.yaml");
  read_run_config(run, read_file(cfg), dir);
  add_rows(run, read_eval_csv(dir), read_train_csv(dir));
  return run;
}

LoadedRuns load_results(const std::vector<std::string>& paths) {
  Loader L;
  for (const auto& p : paths) {
    std::error_code ec;
    if (!fs::is_directory(p, ec))
      throw UserError(fmt::format("no such results folder or run directory: '{}'", p));
    if (path_exists(Store::file_in(p))) {
      L.store(p);
    } else if (path_exists(join_path(p, "config.yaml"))) {
      L.run_dir(p);
    } else {
      std::vector<std::string> dirs;
      for (const auto& e : fs::directory_iterator(p, ec))
        if (e.is_directory() && path_exists(join_path(e.path().string(), "config.yaml"))) dirs.push_back(e.path().string());
      if (dirs.empty())
        throw UserError(fmt::format("'{}' is not a results folder (no {}), a run directory (no config.yaml) nor a "
                                    "folder of run directories",
                                    p, fs::path(Store::file_in(p)).filename().string()));
      std::sort(dirs.begin(), dirs.end());
      for (const auto& d : dirs) L.run_dir(d);
    }
  }
  if (L.repeated > 0)
    L.out.notes.push_back(fmt::format("{} run{} named more than once counted once", L.repeated, L.repeated == 1 ? "" : "s"));
  assign_labels(L.out.runs);
  mark_mad_average(L.out);
  return std::move(L.out);
}

LoadedRuns every_position(const LoadedRuns& loaded) {
  LoadedRuns out;
  out.notes = loaded.notes;
  int64_t older = 0;
  for (RunResult run : loaded.runs) {
    const bool have = std::all_of(run.evals.begin(), run.evals.end(), [](const EvalPoint& e) {
      return !std::isnan(e.accuracy_all);
    });
    if (!have) {
      ++older;
      continue;
    }
    for (auto& e : run.evals) {
      e.accuracy = e.accuracy_all;
      e.normalized = e.normalized_all;
    }
    out.runs.push_back(std::move(run));
  }
  if (older > 0)
    out.notes.push_back(fmt::format("{} run{} left out of the every-position scores: recorded without them (an older "
                                    "memlab)", older, older == 1 ? "" : "s"));
  return out;
}

}  // namespace memlab
