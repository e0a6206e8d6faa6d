#pragma once
// A run directory's life, shared by memlab train and memlab rl:
//  - starting it: a new run needs a missing or empty directory; a resumed one needs its config.yaml, and a
//    run stopped before its first checkpoint starts again from the beginning;
//  - resuming it: the config a checkpoint was written under must match the one it is resumed with, but for
//    the keys that may change (more steps, logging, device);
//  - stopping it: SIGINT and SIGTERM are caught while it trains and put back when it is done.
#include <signal.h>

#include <atomic>
#include <csignal>
#include <functional>
#include <string>
#include <vector>

namespace memlab {

class Config;

// Prepares `dir` and returns true when it holds a checkpoint to continue from. `resume` false: dir must be
// missing or empty. `resume` true: dir must hold config.yaml; without checkpoint.pt (the run stopped before its
// first) the run starts again, and its `outputs` (result files besides config.yaml and log.txt) are removed.
// Either way temporaries of dead writers are removed, `config_yaml` is written to config.yaml and log.txt is
// opened for appending. UserError when the directory cannot be used.
bool open_run_dir(const std::string& dir, bool resume, const std::string& config_yaml,
                  const std::vector<std::string>& outputs);

// UserError naming every key (with both values) whose value in `now` differs from the checkpoint's config
// `saved_yaml`, but for those `may_change` accepts. Nothing to compare when `saved_yaml` is empty (a
// checkpoint of an older memlab).
void check_resumed_config(const Config& now, const std::string& saved_yaml,
                          const std::function<bool(const std::string&)>& may_change, const std::string& dir);

// While alive, SIGINT and SIGTERM set a flag instead of ending the process, also where they were blocked (unblocked on
// the main thread, so one sent before is taken at once); release() or the destructor puts back the handlers they had
// and blocks again on the main thread those it blocked. requested() still tells after release(). One at a time, made
// on the main thread.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  bool requested() const;
  void release();

 private:
  struct sigaction old_int_ {}, old_term_ {};
  sigset_t old_mask_ {};
  bool active_ = false;
};

}  // namespace memlab
