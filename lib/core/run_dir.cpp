#include "core/run_dir.h"

#include <fmt/format.h>

#include "core/config.h"
#include "core/errors.h"
#include "core/io.h"
#include "core/log.h"

namespace memlab {

namespace {
// Atomic: the handler may run on any thread that has the signals unblocked. Lock-free, so safe in a handler.
std::atomic<int> g_stop{0};
static_assert(std::atomic<int>::is_always_lock_free);
void on_stop(int) { g_stop.store(1); }
}  // namespace

bool open_run_dir(const std::string& dir, bool resume, const std::string& config_yaml,
                  const std::vector<std::string>& outputs) {
  if (dir.empty()) throw UserError("the run directory (--out) is empty; name a directory");
  const std::string ckpt = join_path(dir, "checkpoint.pt");
  if (resume) {
    if (!path_exists(join_path(dir, "config.yaml")))
      throw UserError(fmt::format("cannot resume '{}': it holds no config.yaml", dir));
  } else if (dir_non_empty(dir)) {
    throw UserError(
        fmt::format("output directory '{}' is not empty (resume it with --resume {}, or pick another --out)", dir, dir));
  }
  ensure_writable_dir(dir);
  remove_stale_temporaries(dir);
  const bool from_checkpoint = resume && path_exists(ckpt);
  if (resume && !from_checkpoint)
    for (const auto& f : outputs) remove_tree(join_path(dir, f));
  write_file_atomic(join_path(dir, "config.yaml"), config_yaml);
  log_open(join_path(dir, "log.txt"));
  if (resume && !from_checkpoint) logf("{} holds no checkpoint yet: starting the run from step 0", dir);
  return from_checkpoint;
}

void check_resumed_config(const Config& now, const std::string& saved_yaml,
                          const std::function<bool(const std::string&)>& may_change, const std::string& dir) {
  if (saved_yaml.empty()) return;
  Config saved(now.schema());
  try {
    saved.merge_text(saved_yaml, "the checkpoint's config");
  } catch (const UserError& e) {
    throw UserError(fmt::format("cannot resume '{}': its checkpoint was written by another memlab version ({})", dir,
                                e.what()));
  }
  const auto a = saved.flat(), b = now.flat();
  std::string diff;
  int n = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].second == b[i].second || may_change(a[i].first)) continue;
    if (n++ < 4) diff += fmt::format("{}{} (checkpoint {}, now {})", diff.empty() ? "" : "; ", a[i].first, a[i].second,
                                     b[i].second);
  }
  if (n == 0) return;
  throw UserError(fmt::format("cannot resume '{}': its config differs from the one its checkpoint was written under in "
                              "{}{}; put config.yaml back or start a new run",
                              dir, diff, n > 4 ? fmt::format(" and {} more", n - 4) : ""));
}

StopSignals::StopSignals() {
  struct sigaction sa {};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  g_stop.store(0);
  sigaction(SIGINT, &sa, &old_int_);
  sigaction(SIGTERM, &sa, &old_term_);
  // A parent may have started us with them blocked (the mask survives exec): they would wait there until the
  // sweep's kill. Unblocked here, one already sent is taken now, as a stop requested before training.
  sigset_t both;
  sigemptyset(&both);
  sigaddset(&both, SIGINT);
  sigaddset(&both, SIGTERM);
  pthread_sigmask(SIG_UNBLOCK, &both, &old_mask_);
  active_ = true;
}

StopSignals::~StopSignals() { release(); }

bool StopSignals::requested() const { return g_stop.load() != 0; }

void StopSignals::release() {
  if (!active_) return;
  // The main thread blocks again those of the two it blocked before (threads started meanwhile keep them unblocked, so
  // a signal may still arrive there, acting as the handler put back says).
  sigset_t reblock;
  sigemptyset(&reblock);
  for (int sig : {SIGINT, SIGTERM})
    if (sigismember(&old_mask_, sig) == 1) sigaddset(&reblock, sig);
  pthread_sigmask(SIG_BLOCK, &reblock, nullptr);
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
  active_ = false;
}

}  // namespace memlab
