#pragma once
// Learning curves of `memlab rl` runs: curve.csv read back; runs of one label taken as seeds and drawn as
// their mean with a 95% interval against environment steps, as the HQLT paper's Figure 2 (Ni et al.'s code
// aligns the seeds the same way: each run interpolated onto one grid of env steps, never extrapolated);
// a table of every seed's final and best success; the return and success charts.
#include <string>
#include <utility>
#include <vector>

#include "report/plot.h"

namespace memlab {

struct RlCurve {
  std::string dir;
  std::string label;  // the run's label key, else its model.name, else its directory
  std::string seed;   // rl.seed; empty when the config does not say
  // One entry per evaluation (curve.csv row); NaN where empty.
  std::vector<double> episodes, env_steps, ret, success, train_return, train_success;
  std::string name() const;  // label, then " s<seed>"
};

// DIR/curve.csv and the label and seed from DIR/config.yaml. UserError when the file is missing or malformed.
RlCurve read_rl_curve(const std::string& run_dir);

// The 95% interval of the mean of a few seeds' values.
//   Bootstrap: percentile interval of the resampled means (numpy's linear percentile), as seaborn draws the
//     paper's bands; exact over all n^n resamples up to 6 values, else 20,000 resamples from a fixed seed (Boost's
//     draws, the same on every platform).
//   T: Student's t, mean ± t(0.975, n-1) s / sqrt(n).
// {NaN, NaN} for fewer than 2 values.
enum class RlInterval { Bootstrap, T };
RlInterval parse_rl_interval(const std::string& s);  // "bootstrap" | "t"; UserError otherwise
std::pair<double, double> mean_interval(const std::vector<double>& values, RlInterval kind);

struct RlBand {
  std::vector<double> mean, lo, hi;
  std::vector<int> seeds;  // values behind each point
};

// The seeds of one label on one grid of env steps.
struct RlGroup {
  std::string label;
  std::vector<size_t> runs;  // indices into the curves given
  std::vector<double> env_steps;
  RlBand ret, success;
};

struct RlGroupOptions {
  RlInterval interval = RlInterval::Bootstrap;
  int points = 0;  // grid points per label; 0: as many as its longest run has evaluations (at least 2)
  int smooth = 1;  // trailing moving average over this many evaluations, per run, before the grid
  bool each = false;  // every run a group of its own, named label and seed (then a run may repeat another's)
};

// Groups the runs by label, in order of first appearance. Each group's grid is evenly spaced over the span of env
// steps that all its runs cover (the latest first evaluation to the earliest last one), so every point is the mean
// of the same seeds, but for a run with no value next to a point (RlBand::seeds counts them); a group of one run
// keeps that run's evaluations unless opt.points is set. Where a run has several evaluations at one env step, the
// last with a value stands for them. The success rate's interval is held to [0, 1]. UserError
// when one label and seed is given twice (unless opt.each), or a run has no evaluation or a row without env steps.
std::vector<RlGroup> group_rl_curves(const std::vector<RlCurve>& runs, const RlGroupOptions& opt);

// Per run: evaluations, env steps, final and best success (with the env steps of the best), final and best
// return; then, where some label has several seeds, per label: the mean of the seeds' final and best success with
// its interval (held to [0, 1]) and of their final return. As Markdown (first) and CSV (second).
std::pair<std::string, std::string> rl_seed_tables(const std::vector<RlCurve>& runs, const std::vector<RlGroup>& groups,
                                                   RlInterval interval);
// The groups' curves, one row per label and grid point; `seeds` counts the runs behind its success rate.
std::string rl_group_csv(const std::vector<RlGroup>& groups);

// "return" and "success" charts: one line per run (training episodes dashed), or with groups, one line per label
// (its seeds' mean) with its interval shaded.
std::vector<std::pair<std::string, Chart>> rl_charts(const std::vector<RlCurve>& runs, const std::string& title);
std::vector<std::pair<std::string, Chart>> rl_group_charts(const std::vector<RlGroup>& groups, const std::string& title);
// Writes DIR/<name>.{png,svg} for each chart; returns the PNG paths.
std::vector<std::string> write_rl_plots(const std::vector<std::pair<std::string, Chart>>& charts, const std::string& dir);

}  // namespace memlab
