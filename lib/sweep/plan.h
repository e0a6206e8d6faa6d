#pragma once
// A sweep's plan: sweep files (or plain experiment configs) and command-line axes expanded into the list of
// runs, each with its effective config and a stable id derived from it.
//
// A sweep file has a top-level `sweep:` map (any other YAML file is one experiment config):
//   sweep:
//     name: hqlt_table3             # default: the file's name without .yaml
//     extends: base_sweep.yaml      # optional: start from another sweep file (relative to this one)
//     experiments:                  # config files or globs (relative to this file), or maps
//       - ../hqlt/parity_*.yaml
//       - {config: ../hqlt/parity_deltanet_neg.yaml, label: "DeltaNet [-1,1]", set: {train.lr: 5.0e-3}}
//     grid:                         # cartesian product over any config keys, in this order
//       train.lr: [5.0e-3, 1.0e-3]
//       train.seed: [1, 2, 3]
//     set: {train.steps: 20000}     # every run
// Each run's config: defaults, the experiment's file, the sweep's `set`, the experiment's `set`, its label,
// one grid point, then the command line's --set. Runs are ordered experiment by experiment, the last grid
// axis fastest; a run that equals an earlier one (same id) is kept once.
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "sweep/store.h"

namespace memlab {

class Config;
class Schema;

struct PlanRequest {
  std::vector<std::string> files;
  std::vector<std::string> grid;  // "key=v1,v2,..." or "key=[v1, v2]"
  std::vector<std::string> sets;  // "key=value"
  std::string name;               // overrides the sweep's name
  std::function<void(const Config&)> validate;  // throws UserError for a config that cannot run
};

struct Plan {
  std::string name;
  std::vector<RunRecord> runs;
  int64_t duplicates = 0;  // grid points that repeated an earlier run
};

Plan make_plan(const Schema& schema, const PlanRequest& req);

// 16 hex digits of a 64-bit FNV-1a hash of every key that changes what a run computes (device, logging,
// checkpoint spacing, evaluation batch size and label do not). A new config key changes every id: runs made
// by an older memlab are then run again rather than mistaken for the new ones.
std::string run_id(const Config& cfg);
// The keys run_id ignores (how a run runs, not what it computes); a resumed run may change each of them.
const std::set<std::string>& keys_ids_ignore();

}  // namespace memlab
