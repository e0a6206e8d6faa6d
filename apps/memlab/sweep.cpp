// memlab sweep: expand sweep files into runs, register them in the results store, and run them here (one per
// GPU or N on the CPU), one by index (a Slurm array task), or through a Slurm job array.
#include <fmt/format.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <sstream>
#include <vector>

#include "commands.h"
#include "core/config.h"
#include "core/errors.h"
#include "sweep/launcher.h"
#include "sweep/plan.h"
#include "sweep/slurm.h"
#include "sweep/store.h"
#include "train/trainer.h"

namespace memlab {

namespace {
struct SweepArgs {
  std::vector<std::string> files, grid, sets, sbatch;
  std::string results, name, gpus = "auto";
  int workers = 1, threads = 0, retries = 1, max_parallel = 0;
  double stale = 600;
  int64_t index = -1;
  bool retry_failed = false, slurm = false, submit = false, wait = false, list = false, status = false;
};

std::string self_exe() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) throw UserError("cannot find the memlab binary (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

std::vector<std::string> pick_gpus(const std::string& want) {
  if (want == "none") return {};
  std::vector<std::string> ids;
  if (want != "auto" && want != "all") {
    std::stringstream ss(want);
    for (std::string g; std::getline(ss, g, ',');)
      if (!g.empty()) ids.push_back(g);
    if (ids.empty()) throw UserError(fmt::format("--gpus '{}': expected auto, all, none or a list like 0,1", want));
    return ids;
  }
  const auto n = static_cast<size_t>(torch::cuda::device_count());
  if (n == 0) {
    if (want == "all") throw UserError("--gpus all: no CUDA device is visible");
    return {};
  }
  // Slots name devices as the parent sees them, so an outer CUDA_VISIBLE_DEVICES=2,3 is honoured.
  if (const char* vis = std::getenv("CUDA_VISIBLE_DEVICES"); vis && *vis) {
    std::stringstream ss(vis);
    for (std::string g; std::getline(ss, g, ',') && ids.size() < n;) ids.push_back(g);
  } else {
    for (size_t i = 0; i < n; ++i) ids.push_back(std::to_string(i));
  }
  return ids;
}
}  // namespace

std::function<int()> add_sweep_command(CLI::App& app) {
  auto a = std::make_shared<SweepArgs>();
  auto* cmd = app.add_subcommand("sweep", "run a grid of experiments, resumably, here or through Slurm");
  cmd->add_option("files", a->files, "sweep files (a top-level 'sweep:' map) or experiment configs");
  cmd->add_option("--results", a->results, "results folder (default results/<sweep name>)");
  cmd->add_option("--name", a->name, "sweep name in the results store (default from the sweep file)");
  cmd->add_option("--grid", a->grid, "extra grid axis KEY=V1,V2,... (repeatable)");
  cmd->add_option("--set", a->sets, "override a config key in every run: KEY=VALUE (repeatable)");
  cmd->add_option("--gpus", a->gpus, "auto (every visible GPU, else CPU), all, none, or a list like 0,1: one run per GPU");
  cmd->add_option("--workers", a->workers, "parallel runs on the CPU (when no GPU is used)")->check(CLI::Range(1, 1024));
  cmd->add_option("--threads", a->threads, "torch threads per run (default: the cores shared among CPU workers)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--retries", a->retries, "new attempts for a run whose process was killed (default 1)")
      ->check(CLI::Range(0, 100));
  cmd->add_flag("--retry-failed", a->retry_failed, "run failed runs again (from their checkpoints)");
  cmd->add_option("--stale", a->stale, "seconds without a heartbeat after which a running run counts as abandoned")
      ->check(CLI::Range(1.0, 1e9));
  cmd->add_option("--index", a->index, "run only the I-th run of the sweep (0-based), e.g. $SLURM_ARRAY_TASK_ID");
  cmd->add_flag("--slurm", a->slurm, "write RESULTS/slurm/NAME.sbatch, a job array over the unfinished runs");
  cmd->add_flag("--submit", a->submit, "with --slurm: submit it with sbatch");
  cmd->add_flag("--wait", a->wait, "with --submit: wait until the array has ended (sbatch --wait)");
  cmd->add_option("--sbatch", a->sbatch, "with --slurm: an extra #SBATCH option, e.g. --sbatch=--gres=gpu:1 (repeatable)");
  cmd->add_option("--max-parallel", a->max_parallel, "with --slurm: at most K array tasks at once")->check(CLI::Range(0, 1000000));
  cmd->add_flag("--list", a->list, "print the runs (index, id, status, label, task, lr, seed) and exit");
  cmd->add_flag("--status", a->status, "print progress and failures of the sweep and exit");
  cmd->footer(
      "Runs live in RESULTS/runs/<id> (id: a hash of the effective config, so a run is never done twice);\n"
      "RESULTS/results.sqlite holds their status and every train/eval row. Running the same command again\n"
      "skips finished runs and resumes interrupted ones from their last checkpoint. See configs/sweeps/.");
  return [cmd, a]() -> int {
    if (!cmd->parsed()) return -1;
    if ((a->submit || !a->sbatch.empty() || a->max_parallel) && !a->slurm)
      throw UserError("--submit, --sbatch and --max-parallel go with --slurm");
    if (a->wait && !a->submit) throw UserError("--wait goes with --submit");
    if (a->files.empty() && a->results.empty())
      throw UserError("memlab sweep needs sweep files, or --results DIR of a registered sweep (see memlab sweep --help)");
    std::string name = a->name;
    std::string results = a->results;
    if (!a->files.empty()) {
      PlanRequest req;
      req.files = a->files;
      req.grid = a->grid;
      req.sets = a->sets;
      req.name = a->name;
      req.validate = [](const Config& c) { check_training_config(c); };
      const Plan plan = make_plan(full_schema(), req);
      name = plan.name;
      if (results.empty()) results = "results/" + name;
      Store store(results);
      store.add_sweep(name, plan.runs);
      const SweepCounts n = store.counts(name);
      std::printf("sweep %s: %lld runs%s in %s (%lld done, %lld failed, %lld to run)\n", name.c_str(),
                  static_cast<long long>(n.total),
                  plan.duplicates ? fmt::format(" ({} repeated grid points dropped)", plan.duplicates).c_str() : "",
                  results.c_str(), static_cast<long long>(n.done), static_cast<long long>(n.failed),
                  static_cast<long long>(n.pending + n.running));
    } else {
      if (!a->grid.empty() || !a->sets.empty()) throw UserError("--grid and --set need the sweep files");
      if (name.empty()) {
        const auto sweeps = Store(results, false).sweeps();
        if (sweeps.size() != 1)
          throw UserError(fmt::format("'{}' holds {} sweeps; name one with --name", results, sweeps.size()));
        name = sweeps[0];
      }
    }
    LaunchOptions opt;
    opt.results = results;
    opt.sweep = name;
    opt.memlab = self_exe();
    opt.workers = a->workers;
    opt.threads = a->threads;
    opt.retries = a->retries;
    opt.retry_failed = a->retry_failed;
    opt.stale_s = a->stale;
    if (a->list) {
      Store store(results, false);
      std::printf("index  id                status   task        lr        seed  label\n");
      int64_t i = 0;
      for (const auto& r : store.runs(name))
        std::printf("%5lld  %s  %-7s  %-10s  %-8g  %4lld  %s\n", static_cast<long long>(i++), r.id.c_str(),
                    r.status.c_str(), r.task.c_str(), r.lr, static_cast<long long>(r.seed),
                    (r.label.empty() ? r.model : r.label).c_str());
      return 0;
    }
    if (a->status) {
      print_status(results, name);
      return 0;
    }
    if (a->index >= 0) {
      if (a->slurm) throw UserError("--index runs one run here; drop --slurm");
      opt.gpus = {};  // the scheduler (Slurm) already chose the GPU through CUDA_VISIBLE_DEVICES
      return run_index(opt, a->index);
    }
    if (a->slurm) {
      Store store(results, false);
      std::vector<int64_t> todo;
      int64_t i = 0;
      for (const auto& r : store.runs(name)) {
        if (r.status != "done" && (r.status != "failed" || a->retry_failed)) todo.push_back(i);
        ++i;
      }
      SlurmOptions so;
      so.sbatch_args = a->sbatch;
      so.max_parallel = a->max_parallel;
      const std::string script = write_sbatch(opt, todo, so);
      std::printf("wrote %s (%zu array tasks)\n", script.c_str(), todo.size());
      if (!a->submit) {
        std::printf("submit it with: sbatch %s\n", script.c_str());
        return 0;
      }
      const int rc = submit_sbatch(script, a->wait);
      if (rc != 0 && !a->wait) throw UserError(fmt::format("sbatch failed (exit {})", rc));
      if (a->wait) {
        print_status(results, name);
        const SweepCounts n = store.counts(name);
        return n.done == n.total ? 0 : 1;
      }
      return 0;
    }
    opt.gpus = pick_gpus(a->gpus);
    return run_local(opt);
  };
}

}  // namespace memlab
