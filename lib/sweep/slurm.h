#pragma once
// Slurm launcher: a job array whose tasks each run one run of a registered sweep
// (`memlab sweep --results DIR --name NAME --index $SLURM_ARRAY_TASK_ID`). Scale-out is Slurm's job.
#include <cstdint>
#include <string>
#include <vector>

#include "sweep/launcher.h"

namespace memlab {

struct SlurmOptions {
  std::vector<std::string> sbatch_args;  // extra #SBATCH lines, e.g. "--gres=gpu:1", "--time=02:00:00"
  int max_parallel = 0;                  // array throttle (%K); 0 = Slurm's default
};

// "0-3,5,7-9"
std::string array_spec(const std::vector<int64_t>& indices);

// Writes RESULTS/slurm/NAME.sbatch for these run indices and returns its path.
std::string write_sbatch(const LaunchOptions& opt, const std::vector<int64_t>& indices, const SlurmOptions& slurm);

// Runs sbatch on the script (with --wait, until the array has ended). Prints sbatch's answer; returns its exit code.
int submit_sbatch(const std::string& script, bool wait);

}  // namespace memlab
