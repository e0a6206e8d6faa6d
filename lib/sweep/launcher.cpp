#include "sweep/launcher.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "core/config.h"
#include "core/errors.h"
#include "core/io.h"
#include "core/log.h"
#include "core/run_dir.h"
#include "core/run_files.h"
#include "sweep/plan.h"
#include "sweep/store.h"

namespace memlab {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string run_dir(const LaunchOptions& o, const std::string& id) { return join_path(join_path(o.results, "runs"), id); }
std::string log_path(const LaunchOptions& o, const std::string& id) { return join_path(join_path(o.results, "logs"), id + ".log"); }

// The last "error: ..." line a run printed (after the first `from` bytes of its log), which names what went wrong.
std::string error_line(const std::string& log, size_t from = 0) {
  if (!path_exists(log)) return "";
  const std::string text = read_file(log);
  std::istringstream in(from < text.size() ? text.substr(from) : std::string());
  std::string line, last;
  while (std::getline(in, line)) {
    // "error: ...", or "[DIR] error: ..." in a packed member's log.txt
    if (line.rfind("[", 0) == 0 && line.find("] error: ") != std::string::npos)
      line = line.substr(line.find("] error: ") + 2);
    if (line.rfind("error: ", 0) == 0) last = line.substr(7);
  }
  return last;
}

// The middle of `v` by `less` (the upper one of an even count).
template <class T, class Less>
T middle(std::vector<T> v, Less less) {
  auto mid = v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2);
  std::nth_element(v.begin(), mid, v.end(), less);
  return *mid;
}

int64_t config_steps(const std::string& config_yaml) {
  try {
    return YAML::Load(config_yaml)["train"]["steps"].as<int64_t>();
  } catch (const std::exception&) {
    return 0;
  }
}

// Latest training step written by a run, 0 when none yet.
int64_t latest_step(const LaunchOptions& o, const std::string& id) {
  try {
    const auto rows = read_train_csv(run_dir(o, id));
    return rows.empty() ? 0 : rows.back().step;
  } catch (const UserError&) {
    return 0;  // a row being written
  }
}

std::string checkpoint_of(const LaunchOptions& o, const std::string& id) {
  const std::string dir = run_dir(o, id), ckpt = join_path(dir, "checkpoint.pt");
  return path_exists(ckpt) && path_exists(join_path(dir, "config.yaml")) ? ckpt : "";
}

// The step a run would resume from: 0 without a checkpoint (it starts again); else its latest train.csv row, which
// may run a few steps past the checkpoint.
int64_t resume_step(const LaunchOptions& o, const std::string& id) {
  return checkpoint_of(o, id).empty() ? 0 : latest_step(o, id);
}

void append_file(const std::string& path, const std::string& text) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw UserError(fmt::format("cannot write the run log '{}': {}", path, std::strerror(errno)));
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  if (!ok) throw UserError(fmt::format("cannot write the run log '{}': {}", path, std::strerror(errno)));
}

size_t file_size(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 ? static_cast<size_t>(st.st_size) : 0;
}

// A resumed run's saved config with the store's values of the keys its id ignores: the sweep file may have changed
// them since the run started (Store::add_sweep), and the resume checks them against the checkpoint. Other keys stay
// as saved, so a config that no longer matches its checkpoint still fails there.
std::string resumed_config(const std::string& saved_path, const std::string& stored) {
  YAML::Node saved = YAML::LoadFile(saved_path);
  const YAML::Node now = YAML::Load(stored);
  for (const auto& key : keys_ids_ignore()) {
    const YAML::Node value = yaml_at(now, key);
    const size_t dot = key.rfind('.');
    YAML::Node section = dot == std::string::npos ? saved : yaml_at(saved, key.substr(0, dot));
    if (!value || value.IsNull() || !section.IsMap()) continue;
    section[dot == std::string::npos ? key : key.substr(dot + 1)] = YAML::Clone(value);
  }
  YAML::Emitter out;
  out << saved;
  return std::string(out.c_str()) + "\n";
}

std::string describe(const RunRecord& r) {
  return fmt::format("{} ({} · {} · lr {:g} · seed {})", r.id, r.task, r.label.empty() ? r.model : r.label, r.lr, r.seed);
}

// A run or pack starts before a deadline only if its estimate times this fits: one pack's wall time differed by 20%
// between two H200 machines (results/reference/hqlt_table3_sweep.md), and a pack stopped near its end redoes its tail.
constexpr double kDeadlineSpare = 1.2;

struct Child {
  std::vector<RunRecord> runs;  // one, or the runs packed into this process
  size_t slot = 0;
  double t0 = 0;
  std::vector<size_t> log_from;  // packed: each run's log.txt size at the start (what this attempt wrote follows)
  int64_t from_step = 0;  // the step its runs resumed from (a pack resumes at one step), for time estimates
};

class Executor {
 public:
  Executor(const LaunchOptions& opt, Store& store, size_t slots) : opt_(opt), store_(store), busy_(slots, false) {
    worker_ = Store::this_worker();
    // Runs share the machine's cores, GPU runs too: their batches are made on the CPU, and two processes
    // that each spin up a thread per core slowed each other by 60% on a 2-GPU host.
    threads_ = opt.threads > 0 ? opt.threads
                               : std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / static_cast<int>(slots));
    for (const char* d : {"runs", "logs", "configs"}) ensure_writable_dir(join_path(opt.results, d));
  }

  // Claims and runs until `claim` gives nothing and every child has ended. Returns 130 when interrupted. `claim`
  // fills its argument with the claimed runs as they were before (Store::claim_group's `before`).
  // Runs in `skip` are not to be claimed.
  using Claim =
      std::function<std::vector<RunRecord>(std::vector<RunRecord>* before, const std::set<std::string>& skip)>;
  int run(const Claim& claim, bool show_progress) {
    signals_.emplace();
    const double t_start = now_s();
    double last_beat = t_start, last_print = 0, last_claim_try = 0;
    bool exhausted = false, forwarded = false, killed = false;
    std::string last_counts;
    while (true) {
      if (!deadline_hit_ && past_deadline(t_start)) {
        deadline_hit_ = true;
        if (!children_.empty())
          std::printf("sweep %s: its deadline of %s has come: the running runs checkpoint and stop\n", opt_.sweep.c_str(),
                      format_duration(opt_.deadline_s).c_str());
      }
      if (deadline_hit_ && !killed && !children_.empty() && now_s() - t_start >= opt_.deadline_s + kDeadlineGrace) {
        // A run that has not checkpointed and stopped by now is killed: it resumes from its last checkpoint.
        std::printf("sweep %s: runs still running %s after the deadline are killed\n", opt_.sweep.c_str(),
                    format_duration(kDeadlineGrace).c_str());
        for (auto& [p, c] : children_) kill(p, SIGKILL);
        killed = true;
      }
      if (!stopping() && !draining_ && (!exhausted || now_s() - last_claim_try > 30)) {
        last_claim_try = now_s();
        exhausted = false;
        std::optional<SweepPace> pace;
        for (size_t s = 0; s < busy_.size() && !exhausted && !draining_; ++s) {
          if (busy_[s]) continue;
          std::vector<RunRecord> before, runs;
          // Before a deadline, runs that would not end in time wait for the next call, and later runs that would
          // (of a shorter experiment) start in their place. The finished runs' pace is read once per pass.
          while (true) {
            if (stopping() || past_deadline(t_start)) {
              runs.clear();
              break;
            }
            runs = claim(&before, deferred_);
            if (runs.empty() || opt_.deadline_s <= 0) break;
            if (!pace) pace.emplace(store_, opt_);
            if (fits_before_deadline(runs, before, t_start, *pace)) break;
            for (const auto& r : runs) deferred_.insert(r.id);
          }
          if (runs.empty() && !deferred_.empty() && fill_now(t_start)) {
            runs = claim_filler(claim, t_start);
            if (!runs.empty()) {
              start(runs, s);
              continue;
            }
          }
          if (runs.empty()) {
            exhausted = true;
            if (!deferred_.empty() && children_.empty() && !stopping()) {
              draining_ = true;
              std::printf("sweep %s: no run left would end before the deadline: no more runs start\n",
                          opt_.sweep.c_str());
            }
            break;
          }
          start(runs, s);
        }
      }
      if (show_progress) {
        // A line when a run ends (once its slot is refilled), and every progress_s seconds in between.
        const SweepCounts n = store_.counts(opt_.sweep);
        const std::string key = fmt::format("{}/{}", n.done, n.failed);
        if (key != last_counts || now_s() - last_print > opt_.progress_s) {
          std::printf("%s\n", progress_line(t_start, n).c_str());
          std::fflush(stdout);
          last_counts = key;
          last_print = now_s();
        }
      }
      if (children_.empty() && (exhausted || stopping() || draining_)) break;
      int status = 0;
      const pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid > 0 && children_.count(pid)) {
        ended(pid, status);
        exhausted = false;
        deferred_.clear();  // judged again at the pace that includes the runs just ended
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
      if (stopping() && !forwarded) {
        // The trainer checkpoints on SIGTERM and exits; its run is given back below.
        for (auto& [p, c] : children_) kill(p, SIGTERM);
        forwarded = true;
      }
      if (now_s() - last_beat > 10) {
        for (auto& [p, c] : children_)
          for (const auto& r : c.runs) store_.heartbeat(r.id, worker_);
        last_beat = now_s();
      }
    }
    signals_->release();  // requested() still tells what stopped it
    return stopping() || draining_ ? 130 : 0;
  }

  // Cuts `runs` (claimed together, `before` as they were) to those that fit before the deadline and gives the others
  // back; false, with all given back, where not even one fits. A pack that does not fit starts with as many of its
  // runs as fit, or one where fewer than min_pack do.
  bool fits_before_deadline(std::vector<RunRecord>& runs, const std::vector<RunRecord>& before, double t_start,
                            const SweepPace& pace) {
    const double left = seconds_left(t_start);
    const size_t claimed = runs.size();
    const DeadlineCut cut = runs_before_deadline(
        [&](size_t n) { return pace.seconds(std::vector<RunRecord>(runs.begin(), runs.begin() + n)); },
        claimed, left, static_cast<size_t>(std::max<int64_t>(1, opt_.min_pack ? opt_.min_pack(runs[0]) : 1)));
    give_back_beyond(runs, before, std::max<size_t>(cut.start, 1));
    const double need = pace.seconds(runs);
    if (cut.start == 0) {
      store_.unclaim(before[0]);
      if (told_late_.insert(experiment_of(runs[0])).second)
        std::printf("sweep %s: the next run, %s, would take about %s (%s with a fifth to spare) with %s left before "
                    "the deadline: it waits for the next call, and runs after it that would end in time may start first%s\n",
                    opt_.sweep.c_str(), describe(runs[0]).c_str(), format_duration(need).c_str(),
                    format_duration(kDeadlineSpare * need).c_str(), format_duration(std::max(0.0, left)).c_str(),
                    opt_.fill_s >= 0 ? " (where none would, --fill starts one anyway)" : "");
      return false;
    }
    if (cut.start < cut.fit)
      std::printf("sweep %s: %zu of the pack of %zu fit before the deadline, too few to pay packed: one starts "
                  "alone (about %s); the others wait\n",
                  opt_.sweep.c_str(), cut.fit, claimed, format_duration(need).c_str());
    else if (cut.fit < claimed)
      std::printf("sweep %s: %zu of the pack of %zu fit before the deadline (about %s): %s; the others wait\n",
                  opt_.sweep.c_str(), cut.fit, claimed, format_duration(need).c_str(),
                  cut.fit == 1 ? "it starts" : "they start");
    return true;
  }

  // --fill: a free slot that no run would fill before the deadline takes a run anyway while fill_s seconds are left.
  bool fill_now(double t_start) const {
    const double left = seconds_left(t_start);
    return opt_.fill_s >= 0 && opt_.deadline_s > 0 && !stopping() && left > 0 && left >= opt_.fill_s;
  }

  // The first claimable run, alone (the rest of its pack given back): it trains until it ends or the deadline stops it.
  std::vector<RunRecord> claim_filler(const Claim& claim, double t_start) {
    std::vector<RunRecord> before;
    auto runs = claim(&before, {});
    give_back_beyond(runs, before, 1);
    if (!runs.empty())
      std::printf("sweep %s: no run would end before the deadline; %s starts alone anyway (--fill) for the %s left: it "
                  "checkpoints at the deadline and the next call resumes it\n",
                  opt_.sweep.c_str(), describe(runs[0]).c_str(),
                  format_duration(std::max(0.0, seconds_left(t_start))).c_str());
    return runs;
  }

  // Keeps the first `keep` of `runs` (claimed together, `before` as they were) and gives the others back.
  void give_back_beyond(std::vector<RunRecord>& runs, const std::vector<RunRecord>& before, size_t keep) {
    while (runs.size() > keep) {
      store_.unclaim(before[runs.size() - 1]);
      runs.pop_back();
    }
  }

  double seconds_left(double t_start) const { return opt_.deadline_s - (now_s() - t_start); }

  bool past_deadline(double t_start) const { return opt_.deadline_s > 0 && now_s() - t_start >= opt_.deadline_s; }
  // Stopping at the user's signal or at the deadline: claim nothing more, and count runs that end now as stopped.
  bool interrupted() const { return signals_ && signals_->requested(); }
  bool stopping() const { return interrupted() || deadline_hit_; }
  // Stopped by its deadline, or ended early because the next runs would not have finished before it.
  bool stopped_by_deadline() const { return !interrupted() && (deadline_hit_ || draining_); }

  int64_t failed_here() const { return failed_; }
  // Runs started by this launcher: a failed one among them is retried at most once per call.
  const std::set<std::string>& started() const { return started_; }
  // Runs whose pack failed as a whole (out of memory, say): this launcher runs each of them alone.
  const std::set<std::string>& alone() const { return alone_; }

 private:
  void start(const std::vector<RunRecord>& runs, size_t slot) {
    const bool packed = runs.size() > 1;
    const std::string log = log_path(opt_, runs[0].id);
    std::vector<std::string> args{opt_.memlab, "train"};
    std::string ids;
    for (const auto& r : runs) ids += (ids.empty() ? "" : ", ") + r.id;
    const std::string gpu = opt_.gpus.empty() ? "" : opt_.gpus[slot];
    std::vector<size_t> log_from;
    const int64_t from_step = resume_step(opt_, runs[0].id);
    for (const auto& r : runs) {
      const std::string dir = run_dir(opt_, r.id);
      // a packed run's summary.md, written when it finishes, tells which members of a failed pack finished
      if (packed) remove_tree(join_path(dir, "summary.md"));
      log_from.push_back(file_size(join_path(dir, "log.txt")));
      const bool resume = !checkpoint_of(opt_, r.id).empty();
      const std::string cfg_file = join_path(join_path(opt_.results, "configs"), r.id + ".yaml");
      if (!resume) {
        remove_tree(dir);  // an attempt that died before its first checkpoint
        write_file_atomic(cfg_file, r.config);
      } else {
        const std::string saved = join_path(dir, "config.yaml");
        if (path_exists(saved)) write_file_atomic(saved, resumed_config(saved, r.config));
      }
      if (!packed) {
        const std::vector<std::string> more = resume ? std::vector<std::string>{"--resume", dir}
                                                     : std::vector<std::string>{"--config", cfg_file, "--out", dir};
        args.insert(args.end(), more.begin(), more.end());
      } else {
        // a packed process resumes every directory; a fresh one holds only its config.yaml
        if (!resume) {
          ensure_writable_dir(dir);
          write_file_atomic(join_path(dir, "config.yaml"), r.config);
        }
        args.insert(args.end(), {"--resume", dir});
      }
      const std::string head =
          fmt::format("== memlab sweep: attempt {} of run {} on {}{}{}{}\n", r.attempts, r.id, worker_,
                      gpu.empty() ? "" : ", GPU " + gpu, resume ? ", resuming its checkpoint" : "",
                      packed ? fmt::format(", one of {} runs packed into one process ({}){}", runs.size(), ids,
                                           &r == &runs[0] ? "" : "; its output is in " + log)
                             : "");
      append_file(log_path(opt_, r.id), head);
    }
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) throw UserError(fmt::format("cannot write the run log '{}': {}", log, std::strerror(errno)));
    const pid_t parent = getpid();
    const pid_t pid = fork();
    if (pid < 0) {
      close(fd);
      throw std::runtime_error(fmt::format("fork failed: {}", std::strerror(errno)));
    }
    if (pid == 0) {
      // The run dies with its launcher (a killed launcher leaves no orphan that keeps the GPU).
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(137);
      dup2(fd, 1);
      dup2(fd, 2);
      if (!opt_.gpus.empty()) setenv("CUDA_VISIBLE_DEVICES", gpu.c_str(), 1);
      if (threads_ > 0) {
        const std::string t = std::to_string(threads_);
        setenv("OMP_NUM_THREADS", t.c_str(), 1);
        setenv("MKL_NUM_THREADS", t.c_str(), 1);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(opt_.memlab.c_str(), argv.data());
      std::fprintf(stderr, "error: cannot start %s: %s\n", opt_.memlab.c_str(), std::strerror(errno));
      _exit(127);
    }
    close(fd);
    for (const auto& r : runs) started_.insert(r.id);
    children_[pid] = Child{runs, slot, now_s(), log_from, from_step};
    busy_[slot] = true;
  }

  // The run's rows into the store, and the run done; failed when its files do not hold a finished run. `c`: the
  // process it ran in.
  void finish(const RunRecord& r, const Child& c) {
    const std::string dir = run_dir(opt_, r.id);
    try {
      auto train = read_train_csv(dir);
      auto evals = read_eval_csv(dir);
      if (evals.empty()) throw UserError("the run ended without evaluation rows");
      for (auto& t : train) t.run_id = r.id;
      for (auto& e : evals) e.run_id = r.id;
      store_.finish(r.id, train, evals, train.empty() ? now_s() - c.t0 : train.back().elapsed_s);
      // A whole run's time: this attempt's, per run of its pack, scaled up when it resumed partway.
      const int64_t steps = config_steps(r.config);
      const double whole = steps > c.from_step ? static_cast<double>(steps) / static_cast<double>(steps - c.from_step) : 1;
      durations_.push_back((now_s() - c.t0) / static_cast<double>(c.runs.size()) * whole);
    } catch (const UserError& e) {
      store_.fail(r.id, e.what());
      ++failed_;
    }
  }

  void ended(pid_t pid, int status) {
    Child c = children_[pid];
    children_.erase(pid);
    busy_[c.slot] = false;
    const size_t K = c.runs.size();
    std::vector<std::string> ids;
    for (const auto& r : c.runs) ids.push_back(r.id);
    store_.add_device_time(ids, (now_s() - c.t0) / static_cast<double>(K));
    // A packed run that stopped on NaN/Inf wrote its error to its own log.txt in this attempt: it fails, whatever
    // became of its pack (the others may finish, or be interrupted and resumed).
    std::vector<std::string> own(K);
    if (K > 1)
      for (size_t i = 0; i < K; ++i)
        own[i] = error_line(join_path(run_dir(opt_, c.runs[i].id), "log.txt"), c.log_from[i]);
    auto fail = [&](const RunRecord& r, const std::string& why) {
      store_.fail(r.id, why);
      ++failed_;
    };
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      for (const auto& r : c.runs) finish(r, c);
      return;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 130) {  // interrupted: checkpoints kept, back to pending
      // a stop of the sweep's own only when it was stopping (not a SIGINT sent to the run alone)
      for (size_t i = 0; i < K; ++i)
        own[i].empty() ? store_.release(c.runs[i].id, stopping()) : fail(c.runs[i], own[i]);
      return;
    }
    if (WIFSIGNALED(status)) {
      const int sig = WTERMSIG(status);
      for (size_t i = 0; i < K; ++i) {
        const RunRecord& r = c.runs[i];
        if (!own[i].empty()) {
          fail(r, own[i]);
        } else if (stopping()) {
          // A second signal while it checkpointed (timeout(1) signals the whole process group, then the launcher
          // forwards its own): it resumes from the last checkpoint it wrote.
          store_.release(r.id, true);
          std::printf("run %s ended by signal %d (%s) as the sweep stopped; it resumes from its last checkpoint\n",
                      r.id.c_str(), sig, strsignal(sig));
        } else if (r.attempts - r.stops <= opt_.retries) {
          store_.release(r.id);  // killed from outside (OOM, preemption): try again from its checkpoint
          std::printf("run %s was killed by signal %d (%s); it will be resumed\n", r.id.c_str(), sig, strsignal(sig));
        } else {
          fail(r, fmt::format("killed by signal {} ({}) in {} attempts{}", sig, strsignal(sig), r.attempts,
                              r.stops ? fmt::format(" ({} of them stopped by the sweep)", r.stops) : ""));
        }
      }
      return;
    }
    const std::string log = log_path(opt_, c.runs[0].id), err = error_line(log);
    const std::string why = err.empty() ? fmt::format("exited with code {} (see {})", WEXITSTATUS(status), log) : err;
    std::vector<bool> finished(K);  // a packed run whose pack-mate stopped on NaN/Inf, and which finished
    for (size_t i = 0; i < K; ++i) finished[i] = K > 1 && path_exists(join_path(run_dir(opt_, c.runs[i].id), "summary.md"));
    const bool none = std::none_of(finished.begin(), finished.end(), [](bool f) { return f; }) &&
                      std::all_of(own.begin(), own.end(), [](const std::string& e) { return e.empty(); });
    if (K > 1 && none) {
      // The pack failed as a whole (out of memory, a bad checkpoint): its runs go back, each to run alone, where
      // each fails or not on its own.
      std::printf("a pack of %zu runs failed (%s); its runs will run one by one\n", K, why.c_str());
      for (const auto& r : c.runs) {
        alone_.insert(r.id);
        store_.release(r.id);
      }
      return;
    }
    for (size_t i = 0; i < K; ++i) {
      const RunRecord& r = c.runs[i];
      if (!own[i].empty())
        fail(r, own[i]);
      else if (finished[i])
        finish(r, c);
      else
        fail(r, why);
    }
  }

  std::string progress_line(double t_start, const SweepCounts& n) {
    double per_run = 0;
    if (!durations_.empty()) {
      for (double d : durations_) per_run += d;
      per_run /= static_cast<double>(durations_.size());
    } else {
      // Nothing finished yet: project the running ones from their progress.
      int k = 0;
      for (auto& [p, c] : children_) {
        const int64_t steps = config_steps(c.runs[0].config), step = latest_step(opt_, c.runs[0].id);
        if (steps > 0 && step > c.from_step) {  // a pack of n runs: n runs in that time
          per_run += (now_s() - c.t0) * static_cast<double>(steps) / static_cast<double>(step - c.from_step) /
                     static_cast<double>(c.runs.size());
          ++k;
        }
      }
      per_run = k ? per_run / k : 0;
    }
    const double left = per_run * (static_cast<double>(n.pending) + 0.5 * static_cast<double>(n.running)) /
                        static_cast<double>(busy_.size());
    return fmt::format("sweep {}: {}/{} done · {} running · {} failed · {} pending · elapsed {}{}", opt_.sweep, n.done,
                       n.total, n.running, n.failed, n.pending, format_duration(now_s() - t_start),
                       per_run > 0 && (n.pending + n.running) > 0 ? " · about " + format_duration(left) + " left" : "");
  }

  const LaunchOptions& opt_;
  Store& store_;
  std::vector<bool> busy_;
  std::map<pid_t, Child> children_;
  std::vector<double> durations_;
  std::string worker_;
  std::set<std::string> started_, alone_;
  std::set<std::string> deferred_;   // runs that would not end before the deadline: not claimed again in this call
  std::set<Experiment> told_late_;  // experiments whose runs were said to wait for the next call
  std::optional<StopSignals> signals_;  // SIGINT and SIGTERM while run() runs
  bool deadline_hit_ = false, draining_ = false;
  static constexpr double kDeadlineGrace = 120;  // seconds past the deadline that running runs get to checkpoint
  int threads_ = 0;
  int64_t failed_ = 0;
};

void print_failures(const LaunchOptions& o, const Store& store) {
  for (const auto& r : store.runs(o.sweep))
    if (r.status == "failed")
      std::printf("  failed %s: %s\n    log: %s\n", describe(r).c_str(), r.error.c_str(), log_path(o, r.id).c_str());
}

}  // namespace

DeadlineCut runs_before_deadline(const std::function<double(size_t)>& seconds, size_t claimed, double left,
                                 size_t min_pack) {
  DeadlineCut cut;
  cut.fit = claimed;
  while (cut.fit > 0 && kDeadlineSpare * seconds(cut.fit) > left) --cut.fit;
  cut.start = cut.fit < claimed && cut.fit > 1 && cut.fit < min_pack ? 1 : cut.fit;
  return cut;
}

int run_local(const LaunchOptions& opt) {
  Store store(opt.results, /*create=*/false);
  const size_t slots = opt.gpus.empty() ? static_cast<size_t>(std::max(1, opt.workers)) : opt.gpus.size();
  Executor ex(opt, store, slots);
  std::printf("sweep %s: %zu %s in %s\n", opt.sweep.c_str(), slots,
              opt.gpus.empty() ? (slots == 1 ? "CPU worker" : "CPU workers") : (slots == 1 ? "GPU" : "GPUs"),
              opt.results.c_str());
  // Runs join the first claimed one while its limit allows and their pack keys agree.
  Store::Joins joins;
  auto key_of = [&](const RunRecord& r) { return opt.pack_key(r, checkpoint_of(opt, r.id)); };
  if (opt.pack_key && (opt.pack > 1 || opt.pack_limit))
    joins = [&](const std::vector<RunRecord>& group, const RunRecord& r) {
      const int64_t limit = opt.pack_limit ? opt.pack_limit(group[0]) : opt.pack;
      if (static_cast<int64_t>(group.size()) >= limit || ex.alone().count(group[0].id) || ex.alone().count(r.id))
        return false;
      const std::string k0 = key_of(group[0]);
      return !k0.empty() && k0 == key_of(r);
    };
  const int rc = ex.run(
      [&](std::vector<RunRecord>* before, const std::set<std::string>& skip) {
        return store.claim_group(opt.sweep, "", Store::this_worker(), opt.stale_s, opt.retry_failed, ex.started(),
                                 joins, before, skip);
      },
      true);
  const SweepCounts n = store.counts(opt.sweep);
  if (rc == 130 && ex.stopped_by_deadline()) {
    std::printf("sweep %s stopped at its deadline: %lld/%lld done, %lld failed; running it again continues from the "
                "checkpoints\n",
                opt.sweep.c_str(), static_cast<long long>(n.done), static_cast<long long>(n.total),
                static_cast<long long>(n.failed));
    if (n.failed) print_failures(opt, store);
    return 130;
  }
  if (rc == 130) {
    std::printf("sweep %s interrupted: %lld/%lld done; running it again continues from the checkpoints\n",
                opt.sweep.c_str(), static_cast<long long>(n.done), static_cast<long long>(n.total));
    return 130;
  }
  std::printf("sweep %s: %lld/%lld done, %lld failed, %lld pending, %lld running elsewhere\n", opt.sweep.c_str(),
              static_cast<long long>(n.done), static_cast<long long>(n.total), static_cast<long long>(n.failed),
              static_cast<long long>(n.pending), static_cast<long long>(n.running));
  if (n.failed) {
    print_failures(opt, store);
    std::printf(opt.retry_failed ? "(each was tried again once in this call)\n" : "(run them again with --retry-failed)\n");
  }
  return n.failed ? 1 : 0;
}

int run_index(const LaunchOptions& opt, int64_t index) {
  Store store(opt.results, /*create=*/false);
  const auto runs = store.runs(opt.sweep);
  if (runs.empty()) throw UserError(fmt::format("'{}' holds no sweep named '{}'", opt.results, opt.sweep));
  if (index < 0 || index >= static_cast<int64_t>(runs.size()))
    throw UserError(fmt::format("--index {} is out of range: sweep '{}' has {} runs (0-{})", index, opt.sweep,
                                runs.size(), runs.size() - 1));
  const std::string id = runs[static_cast<size_t>(index)].id;
  Executor ex(opt, store, 1);
  bool claimed = false;
  const int rc = ex.run(
      [&](std::vector<RunRecord>* before, const std::set<std::string>&) -> std::vector<RunRecord> {
        if (claimed) return {};
        claimed = true;
        return store.claim_group(opt.sweep, id, Store::this_worker(), opt.stale_s, opt.retry_failed, {}, nullptr,
                                 before);
      },
      false);
  const auto r = store.run(id);
  std::printf("sweep %s run %lld: %s is %s%s\n", opt.sweep.c_str(), static_cast<long long>(index), describe(*r).c_str(),
              r->status.c_str(), r->status == "failed" ? (": " + r->error).c_str() : "");
  if (rc == 130) return 130;
  return r->status == "failed" ? 1 : 0;
}

SweepPace::SweepPace(const Store& store, const LaunchOptions& opt) : opt_(opt) {
  // Each finished run's seconds per training step and per member of its pack: its own time shared in its pack
  // (finished_costs: the finishing attempt's wall time or its training time over all attempts, whichever is longer),
  // over its steps. Not its recorded device time, which holds what stops cut off and was done again.
  const auto all = store.runs(opt.sweep);
  const auto costs = finished_costs(all);
  std::map<Experiment, std::vector<Rate>> rates;  // experiment -> its finished runs
  for (const auto& r : all) {
    if (r.status != "done") continue;
    const int64_t steps = config_steps(r.config);
    if (steps <= 0) continue;
    const FinishedCost& cost = costs.at(r.id);
    const Rate rate{cost.seconds / static_cast<double>(steps), cost.pack};
    if (!(rate.per_member > 0)) continue;
    rates[experiment_of(r)].push_back(rate);
    if (rate.per_member > slowest_.per_member) slowest_ = rate;
  }
  for (auto& [e, v] : rates)
    experiments_[e] = middle(std::move(v), [](const Rate& a, const Rate& b) { return a.per_member < b.per_member; });
  // Each pair of tasks' cost ratio, for the stand-ins of rate_of.
  std::map<std::pair<std::string, std::string>, std::vector<double>> ratios;
  for (const auto& [f, to] : experiments_)
    for (const auto& [g, from] : experiments_)
      if (std::get<0>(f) == std::get<0>(g) && std::get<1>(f) != std::get<1>(g))
        ratios[{std::get<1>(f), std::get<1>(g)}].push_back(to.per_member / from.per_member);
  for (auto& [tasks, v] : ratios) task_ratio_[tasks] = middle(std::move(v), std::less<double>());
}

SweepPace::Rate SweepPace::rate_of(const RunRecord& r) const {
  if (const auto it = experiments_.find(experiment_of(r)); it != experiments_.end()) return it->second;
  // Not timed yet. A label's cost on one task against another is about the same for every label (mod arith over
  // parity in HQLT Table 3: 1.38-1.57 for Transformer, Mamba and DeltaNet), so: this label's rate on another task
  // times the two tasks' ratio (task_ratio_); else the rate of another label of this model on this task (another
  // configuration of the model); else the sweep's slowest finished run. Where several stand-ins are found, the
  // slowest.
  std::optional<Rate> got;
  const auto keep = [&](const Rate& c) {
    if (!got || c.per_member > got->per_member) got = c;
  };
  for (const auto& [e, rate] : experiments_) {
    const auto& [label, task, model] = e;
    if (label != r.label || task == r.task) continue;
    if (const auto it = task_ratio_.find({r.task, task}); it != task_ratio_.end())
      keep({rate.per_member * it->second, rate.pack});
  }
  if (got) return *got;
  for (const auto& [e, rate] : experiments_)
    if (std::get<1>(e) == r.task && std::get<2>(e) == r.model) keep(rate);
  return got ? *got : slowest_;
}

double SweepPace::seconds(const std::vector<RunRecord>& group) const {
  // A pack costs its members' sum (a pack of 12 took 10.8 times one run on an H200: packed_runs_h200.md), plus a
  // tenth where it is smaller than the packs timed, whose fixed costs it shares among fewer members.
  double need = 0;
  int64_t timed_pack = 1;
  for (const auto& r : group) {
    const Rate rate = rate_of(r);
    timed_pack = std::max(timed_pack, rate.pack);
    const int64_t steps = config_steps(r.config), step = resume_step(opt_, r.id);
    need += rate.per_member * static_cast<double>(std::max<int64_t>(0, steps - step));
  }
  return static_cast<int64_t>(group.size()) < timed_pack ? need * 1.1 : need;
}

double expected_seconds(const Store& store, const LaunchOptions& opt, const std::vector<RunRecord>& group) {
  return SweepPace(store, opt).seconds(group);
}

void print_status(const std::string& results, const std::string& sweep, double stale_s) {
  Store store(results, false);
  LaunchOptions o;
  o.results = results;
  o.sweep = sweep;
  const SweepCounts n = store.counts(sweep);
  if (n.total == 0) throw UserError(fmt::format("'{}' holds no sweep named '{}'", results, sweep));
  const auto runs = store.runs(sweep);
  int64_t stopped = 0;
  for (const auto& r : runs) stopped += r.status == "running" && Store::abandoned(r, stale_s);
  std::printf("sweep %s in %s: %lld runs: %lld done, %lld running, %lld failed, %lld pending%s\n", sweep.c_str(),
              results.c_str(), static_cast<long long>(n.total), static_cast<long long>(n.done),
              static_cast<long long>(n.running - stopped), static_cast<long long>(n.failed),
              static_cast<long long>(n.pending),
              stopped ? fmt::format(", {} stopped (their launcher is gone)", stopped).c_str() : "");
  for (const auto& r : runs) {
    if (r.status != "running") continue;
    const auto step = static_cast<long long>(latest_step(o, r.id)), of = static_cast<long long>(config_steps(r.config));
    if (Store::abandoned(r, stale_s))
      std::printf("  stopped %s: step %lld/%lld; its launcher %s is gone (running the sweep again resumes it)\n",
                  describe(r).c_str(), step, of, r.worker.c_str());
    else
      std::printf("  running %s on %s: step %lld/%lld\n", describe(r).c_str(), r.worker.c_str(), step, of);
  }
  if (const std::string spent = device_time_summary(runs); !spent.empty()) std::printf("spent: %s\n", spent.c_str());
  std::vector<RunRecord> left;  // failed runs run again only with --retry-failed: not counted
  for (const auto& r : runs)
    if (r.status == "pending" || r.status == "running") left.push_back(r);
  if (!left.empty()) {
    const double need = SweepPace(store, o).seconds(left);
    if (need > 0)
      std::printf("left: about %s of device time for the %zu runs pending or running, at the pace of the finished runs "
                  "(each experiment's, or a stand-in's, per run of their packs; from their checkpoints)\n",
                  format_duration(need).c_str(), left.size());
    else
      std::printf("left: %zu runs pending or running; no estimate until one has finished\n", left.size());
  }
  print_failures(o, store);
}

}  // namespace memlab
