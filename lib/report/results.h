#pragma once
// Where a report's runs come from. Each RESULTS argument is one of:
//  - a results folder of `memlab sweep` (holding results.sqlite): its runs in registration order, of
//    which those with status "done" are reported;
//  - a run directory of `memlab train` (config.yaml, eval.csv, train.csv);
//  - a folder of run directories, one level down (e.g. RESULTS/runs).
#include <string>
#include <vector>

#include "report/run_result.h"

namespace memlab {

struct LoadedRuns {
  std::vector<RunResult> runs;      // labels assigned; those of eval.average = mad runs end in " (class-averaged)"
  std::vector<std::string> notes;   // runs left out and why; what the class average is, where a run has it
};

// UserError naming the path when it is none of the three.
LoadedRuns load_results(const std::vector<std::string>& paths);

// One run directory; UserError naming the file when config.yaml or a csv cannot be read.
RunResult read_run_dir(const std::string& dir);

// The runs scored over every scored position instead of the headline (a running answer's last position):
// each evaluation's accuracy_all becomes its accuracy. Runs recorded before memlab kept accuracy_all are
// left out, with a note.
LoadedRuns every_position(const LoadedRuns& loaded);

}  // namespace memlab
