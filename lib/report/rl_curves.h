#pragma once
// Learning curves of `memlab rl` runs: curve.csv read back, and the return and success charts against
// environment steps (greedy evaluation, solid; the sampled training episodes, dashed).
#include <string>
#include <vector>

#include "report/plot.h"

namespace memlab {

struct RlCurve {
  std::string label;  // the run's label key, else its model.name; then " s<seed>"
  std::vector<double> env_steps, ret, success, train_return, train_success;  // NaN where empty
};

// DIR/curve.csv and the label from DIR/config.yaml. UserError when the file is missing or malformed.
RlCurve read_rl_curve(const std::string& run_dir);
// "return" and "success" charts of one or more runs.
std::vector<std::pair<std::string, Chart>> rl_charts(const std::vector<RlCurve>& runs, const std::string& title);
// Writes DIR/curve_return.{png,svg} and DIR/curve_success.{png,svg}; returns the PNG paths.
std::vector<std::string> write_rl_plots(const std::vector<RlCurve>& runs, const std::string& title,
                                        const std::string& dir);

}  // namespace memlab
