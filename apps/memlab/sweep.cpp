// memlab sweep: expand sweep files into runs, register them in the results store, and run them here (one per
// GPU or N on the CPU), one by index (a Slurm array task), or through a Slurm job array.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <sstream>
#include <vector>

#include "commands.h"
#include "core/config.h"
#include "core/device.h"
#include "core/errors.h"
#include "core/io.h"
#include "sweep/launcher.h"
#include "sweep/plan.h"
#include "sweep/slurm.h"
#include "sweep/store.h"
#include "train/checkpoint.h"
#include "train/trainer.h"

namespace memlab {

namespace {
struct SweepArgs {
  std::vector<std::string> files, grid, sets, sbatch;
  std::string results, name, gpus = "auto", pack = "auto";
  int workers = 1, threads = 0, retries = 1, max_parallel = 0;
  double stale = 600, deadline = 0, fill = 0;
  int64_t index = -1;
  bool retry_failed = false, slurm = false, submit = false, wait = false, list = false, status = false;
};

std::string self_exe() {
  char buf[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) throw UserError("cannot find the memlab binary (/proc/self/exe)");
  return std::string(buf, static_cast<size_t>(n));
}

// The devices this process sees, named as a child's CUDA_VISIBLE_DEVICES must name them (an outer
// CUDA_VISIBLE_DEVICES=2,3 is honoured).
std::vector<std::string> visible_gpus() {
  const auto n = static_cast<size_t>(torch::cuda::device_count());
  std::vector<std::string> ids;
  if (const char* vis = std::getenv("CUDA_VISIBLE_DEVICES"); vis && *vis) {
    std::stringstream ss(vis);
    for (std::string g; std::getline(ss, g, ',') && ids.size() < n;) ids.push_back(g);
  } else {
    for (size_t i = 0; i < n; ++i) ids.push_back(std::to_string(i));
  }
  return ids;
}

std::vector<std::string> pick_gpus(const std::string& want) {
  if (want == "none") return {};
  const std::vector<std::string> visible = visible_gpus();
  if (want == "auto") return visible;
  if (want == "all") {
    if (visible.empty()) throw UserError("--gpus all: no CUDA device is visible");
    return visible;
  }
  std::vector<std::string> ids;
  std::stringstream ss(want);
  for (std::string g; std::getline(ss, g, ',');) {
    if (g.empty() || g.find_first_not_of("0123456789") != std::string::npos)
      throw UserError(fmt::format("--gpus '{}': expected auto, all, none or a list of device numbers like 0,1", want));
    if (std::find(visible.begin(), visible.end(), g) == visible.end())
      throw UserError(visible.empty() ? fmt::format("--gpus {}: no CUDA device is visible (use --gpus none)", want)
                                      : fmt::format("--gpus {}: device {} is not visible (visible: {})", want, g,
                                                    fmt::join(visible, ",")));
    ids.push_back(g);
  }
  if (ids.empty()) throw UserError(fmt::format("--gpus '{}': expected auto, all, none or a list like 0,1", want));
  return ids;
}
// "size:mtime" of a file, to tell whether it changed.
std::string file_stamp(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return "";
  return fmt::format("{}:{}.{}", static_cast<long long>(st.st_size), static_cast<long long>(st.st_mtim.tv_sec),
                     static_cast<long long>(st.st_mtim.tv_nsec));
}

void print_runs(const std::vector<RunRecord>& runs) {
  std::printf("index  id                status   task        lr        seed  label\n");
  int64_t i = 0;
  for (const auto& r : runs)
    std::printf("%5lld  %s  %-7s  %-10s  %-8g  %4lld  %s\n", static_cast<long long>(i++), r.id.c_str(), r.status.c_str(),
                r.task.c_str(), r.lr, static_cast<long long>(r.seed), (r.label.empty() ? r.model : r.label).c_str());
}
}  // namespace

std::function<int()> add_sweep_command(CLI::App& app) {
  auto a = std::make_shared<SweepArgs>();
  auto* cmd = app.add_subcommand("sweep", "run a grid of experiments, resumably, here or through Slurm");
  cmd->add_option("files", a->files, "sweep files (a top-level 'sweep:' map) or experiment configs");
  cmd->add_option("--results", a->results, "results folder (default results/<sweep name>)")->check(non_empty());
  cmd->add_option("--name", a->name, "sweep name in the results store (default from the sweep file)");
  cmd->add_option("--grid", a->grid, "extra grid axis KEY=V1,V2,... (repeatable)");
  cmd->add_option("--set", a->sets, "override a config key in every run: KEY=VALUE (repeatable)");
  cmd->add_option("--gpus", a->gpus, "auto (every visible GPU, else CPU), all, none, or a list like 0,1: one run per GPU");
  auto* pack = cmd->add_option("--pack", a->pack,
                               "runs trained together in one process where they can be (they differ only in seed, lr, "
                               "weight decay, clipping or schedule): auto (default: as many as fit and pay on a GPU, "
                               "12 where one run's step fills it, none on the CPU), off, or at most K");
  auto* deadline = cmd->add_option("--deadline", a->deadline,
                                   "stop after SECS seconds, as Ctrl-C does (running runs checkpoint and are resumed by "
                                   "the next call), and start no run expected to end after that, judged by the "
                                   "sweep's finished runs with a fifth to spare (a pack that would not fit starts with as many of its runs "
                                   "as do; later runs that fit go before one that does not): for a batch job or a "
                                   "borrowed machine")
                       ->type_name("SECS")
                       ->check(CLI::Range(1e-3, 1e9));
  auto* fill = cmd->add_option("--fill", a->fill,
                               "with --deadline: where no run would end before it, one run starts alone anyway while at "
                               "least SECS are left (enough to start and checkpoint: a minute is safe); it trains until "
                               "it ends or the deadline stops it, checkpointing, and the next call resumes it (for "
                               "slices that follow one another: the slice's last minutes train)")
                   ->type_name("SECS")
                   ->check(CLI::Range(0.0, 1e9));
  cmd->add_option("--workers", a->workers, "parallel runs on the CPU (when no GPU is used)")->check(CLI::Range(1, 1024));
  cmd->add_option("--threads", a->threads, "torch threads per run (default: the cores shared among the parallel runs)")
      ->check(CLI::Range(0, 4096));
  cmd->add_option("--retries", a->retries, "new attempts for a run whose process was killed (default 1)")
      ->check(CLI::Range(0, 100));
  cmd->add_flag("--retry-failed", a->retry_failed, "run failed runs again (from their checkpoints)");
  cmd->add_option("--stale", a->stale, "seconds without a heartbeat after which a running run counts as abandoned")
      ->check(CLI::Range(1.0, 1e9));
  auto* index = cmd->add_option("--index", a->index,
                                "run only the I-th run of the sweep (0-based), e.g. $SLURM_ARRAY_TASK_ID")
                    ->check(CLI::Validator(
                        [](std::string& v) -> std::string {
                          return v.empty() || v[0] == '-' ? "must be a run number, 0 or more" : "";
                        },
                        "INDEX"));
  cmd->add_flag("--slurm", a->slurm, "write RESULTS/slurm/NAME.sbatch, a job array over the unfinished runs");
  cmd->add_flag("--submit", a->submit, "with --slurm: submit it with sbatch");
  cmd->add_flag("--wait", a->wait, "with --submit: wait until the array has ended (sbatch --wait)");
  cmd->add_option("--sbatch", a->sbatch, "with --slurm: an extra #SBATCH option, e.g. --sbatch=--gres=gpu:1 (repeatable)");
  cmd->add_option("--max-parallel", a->max_parallel, "with --slurm: at most K array tasks at once")->check(CLI::Range(0, 1000000));
  cmd->add_flag("--list", a->list,
                "print the runs (index, id, status, label, task, lr, seed) and exit; before the sweep's first run, "
                "the plan alone (nothing written)");
  cmd->add_flag("--status", a->status,
                "print progress, failures, the device time spent and an estimate of the device time left, and exit");
  cmd->footer(
      "Runs live in RESULTS/runs/<id> (id: a hash of the effective config, so a run is never done twice);\n"
      "RESULTS/results.sqlite holds their status and every train/eval row. Running the same command again\n"
      "skips finished runs and resumes interrupted ones from their last checkpoint. See configs/sweeps/.");
  return [cmd, a, index, pack, deadline, fill]() -> int {
    if (!cmd->parsed()) return -1;
    const bool by_index = index->count() > 0;
    const bool inspect = a->list || a->status;
    if ((a->submit || !a->sbatch.empty() || a->max_parallel) && !a->slurm)
      throw UserError("--submit, --sbatch and --max-parallel go with --slurm");
    if (a->wait && !a->submit) throw UserError("--wait goes with --submit");
    if (a->files.empty() && a->results.empty())
      throw UserError("memlab sweep needs sweep files, or --results DIR of a registered sweep (see memlab sweep --help)");
    // Options are checked before the results store is touched.
    const bool runs_here = !by_index && !a->slurm && !inspect;
    if (pack->count() && !runs_here) throw UserError("--pack goes with running the sweep here (not --index, --slurm, --list or --status)");
    if (deadline->count() && !runs_here)
      throw UserError("--deadline goes with running the sweep here (not --index, --slurm, --list or --status)");
    if (fill->count() && !deadline->count()) throw UserError("--fill goes with --deadline");
    int64_t pack_k = 0;  // 0: auto
    if (a->pack == "off") {
      pack_k = 1;
    } else if (a->pack != "auto") {
      try {
        size_t used = 0;
        pack_k = std::stoll(a->pack, &used);
        if (used != a->pack.size() || pack_k < 1 || pack_k > 4096) throw std::invalid_argument("");
      } catch (const std::exception&) {
        throw UserError(fmt::format("--pack '{}': expected auto, off or a number of runs from 1 to 4096", a->pack));
      }
    }
    const std::vector<std::string> gpus = runs_here ? pick_gpus(a->gpus) : std::vector<std::string>{};
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
      if (by_index && a->index >= static_cast<int64_t>(plan.runs.size()))
        throw UserError(fmt::format("--index {} is out of range: sweep '{}' has {} runs (0-{})", a->index, name,
                                    plan.runs.size(), plan.runs.size() - 1));
      if (a->list && !path_exists(Store::file_in(results))) {  // the plan alone, nothing written
        print_runs(plan.runs);
        return 0;
      }
      if (a->status && !path_exists(Store::file_in(results)))
        throw UserError(fmt::format("'{}' holds no results store yet: run the sweep first", results));
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
      if (!path_exists(Store::file_in(results)))
        throw UserError(fmt::format("'{}' holds no results store (results.sqlite): give the sweep files, or the results "
                                    "folder of a sweep that ran",
                                    results));
      if (!name.empty()) {
        const auto sweeps = Store(results, false).sweeps();
        if (std::find(sweeps.begin(), sweeps.end(), name) == sweeps.end())
          throw UserError(fmt::format("'{}' holds no sweep named '{}' (it holds: {})", results, name,
                                      fmt::join(sweeps, ", ")));
      }
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
    opt.deadline_s = a->deadline;
    opt.fill_s = fill->count() ? a->fill : -1;
    if (a->list) {
      print_runs(Store(results, false).runs(name));
      return 0;
    }
    if (a->status) {
      print_status(results, name, a->stale);
      return 0;
    }
    if (by_index) {
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
        print_status(results, name, a->stale);
        const SweepCounts n = store.counts(name);
        return n.done == n.total ? 0 : 1;
      }
      return 0;
    }
    opt.gpus = gpus;
    // Packing: a run's pack key and limit from its config, read once per run.
    auto configs = std::make_shared<std::map<std::string, std::shared_ptr<Config>>>();
    auto config_of = [configs](const RunRecord& r) -> const Config& {
      auto& c = (*configs)[r.id];
      if (!c) {
        c = std::make_shared<Config>(full_schema());
        c->merge_text(r.config, "run " + r.id);
      }
      return *c;
    };
    // Keys are asked for while the store is locked: each run's key, and each checkpoint's step (by its size and
    // time), is worked out once.
    auto keys = std::make_shared<std::map<std::string, std::string>>();
    auto steps = std::make_shared<std::map<std::string, std::pair<std::string, int64_t>>>();
    opt.pack = static_cast<int>(std::max<int64_t>(pack_k, 1));
    opt.pack_key = [config_of, keys, steps](const RunRecord& r, const std::string& checkpoint) {
      auto it = keys->find(r.id);
      if (it == keys->end()) it = keys->emplace(r.id, pack_key(config_of(r))).first;
      if (it->second.empty()) return std::string();
      int64_t step = 0;  // only runs at one step resume together
      if (!checkpoint.empty()) {
        const std::string stamp = file_stamp(checkpoint);
        auto& [seen, at] = (*steps)[checkpoint];
        if (seen != stamp) {
          try {
            at = CheckpointReader(checkpoint, torch::Device(torch::kCPU)).step();
          } catch (const UserError&) {
            at = -1;  // a damaged checkpoint: the run alone, whose trainer names the damage
          }
          seen = stamp;
        }
        if (at < 0) return std::string();
        step = at;
      }
      return it->second + fmt::format("checkpoint step={}", step);
    };
    if (pack_k == 0) {
      double device_bytes = 0;  // the smallest of the GPUs the runs may get
      const auto visible = visible_gpus();
      for (const auto& g : gpus) {
        const auto d = std::find(visible.begin(), visible.end(), g) - visible.begin();
        const double b = device_memory_bytes(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(d)));
        device_bytes = device_bytes == 0 ? b : std::min(device_bytes, b);
      }
      auto limits = std::make_shared<std::map<std::string, int64_t>>();
      opt.pack_limit = [config_of, limits, device_bytes](const RunRecord& r) {
        auto it = limits->find(r.id);
        if (it == limits->end()) it = limits->emplace(r.id, auto_pack_limit(config_of(r), device_bytes)).first;
        return it->second;
      };
    }
    if (!opt.gpus.empty() && pack_k != 1) {  // packs: auto or K
      auto mins = std::make_shared<std::map<std::string, int64_t>>();  // per run id: a config is built once
      opt.min_pack = [config_of, mins](const RunRecord& r) {
        auto it = mins->find(r.id);
        if (it == mins->end()) it = mins->emplace(r.id, min_paying_pack(config_of(r))).first;
        return it->second;
      };
    }
    return run_local(opt);
  };
}

}  // namespace memlab
