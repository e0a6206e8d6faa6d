#include "sweep/slurm.h"

#include <fmt/format.h>

#include <cstdio>
#include <sys/wait.h>

#include "core/errors.h"
#include "core/io.h"

namespace memlab {

namespace {
std::string quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}
}  // namespace

std::string array_spec(const std::vector<int64_t>& idx) {
  std::string out;
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    while (j + 1 < idx.size() && idx[j + 1] == idx[j] + 1) ++j;
    out += (out.empty() ? "" : ",") + (j == i ? std::to_string(idx[i]) : fmt::format("{}-{}", idx[i], idx[j]));
    i = j + 1;
  }
  return out;
}

std::string write_sbatch(const LaunchOptions& opt, const std::vector<int64_t>& indices, const SlurmOptions& slurm) {
  if (indices.empty()) throw UserError(fmt::format("sweep '{}' has no unfinished runs to submit", opt.sweep));
  const std::string dir = join_path(opt.results, "slurm");
  ensure_writable_dir(dir);
  std::string s = "#!/bin/bash\n";
  s += fmt::format("# memlab sweep '{}': one array task per unfinished run, each `memlab sweep --index`.\n", opt.sweep);
  s += fmt::format("#SBATCH --job-name=memlab-{}\n", opt.sweep);
  s += fmt::format("#SBATCH --array={}{}\n", array_spec(indices),
                   slurm.max_parallel > 0 ? fmt::format("%{}", slurm.max_parallel) : "");
  s += fmt::format("#SBATCH --output={}/%A_%a.out\n", dir);
  for (const auto& a : slurm.sbatch_args) s += fmt::format("#SBATCH {}\n", a);
  s += "set -euo pipefail\n";
  s += fmt::format("exec {} sweep --results {} --name {} --index \"$SLURM_ARRAY_TASK_ID\" --threads \"${{SLURM_CPUS_PER_TASK:-1}}\"\n",
                   quote(opt.memlab), quote(opt.results), quote(opt.sweep));
  const std::string path = join_path(dir, opt.sweep + ".sbatch");
  write_file_atomic(path, s);
  return path;
}

int submit_sbatch(const std::string& script, bool wait) {
  const std::string cmd = fmt::format("sbatch --parsable {}{} 2>&1", wait ? "--wait " : "", quote(script));
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw UserError("cannot run sbatch");
  char buf[512];
  std::string out;
  bool first = true;
  while (fgets(buf, sizeof(buf), p)) {
    out += buf;
    if (first) {
      std::printf("sbatch: %s", buf);  // the job id, at once, also while --wait blocks
      std::fflush(stdout);
      first = false;
    } else {
      std::printf("%s", buf);
    }
  }
  const int status = pclose(p);
  if (status == -1) throw UserError("sbatch did not run");
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
    throw UserError("sbatch not found on PATH (is this a Slurm submit host?)");
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace memlab
