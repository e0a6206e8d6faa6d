#pragma once
// Supervised training of a sequence model on a task, with periodic evaluation over length ranges.
// Writes into the run directory: config.yaml, train.csv, eval.csv, summary.md, checkpoint.pt, log.txt.
#include <string>
#include <vector>

namespace memlab {

class Config;
class Schema;

void register_train_keys(Schema& schema);

// The whole experiment schema: task, model and training keys.
Schema& full_schema();

struct TrainRequest {
  std::string out_dir;
  bool resume = false;  // continue from out_dir/checkpoint.pt
};

// Builds what a run starts from (task, device, model, evaluation) to find every error it would meet at start.
void check_training_config(const Config& cfg);

// Validates everything it can (task, model, values) before it writes anything; returns the exit code.
int run_training(const Config& cfg, const TrainRequest& req);

// Packed runs: K runs of one experiment that differ only in seed, learning rate, weight decay, clipping and
// schedule, trained together as one packed model (SequenceModel with K members) in one process. Each run keeps
// its own data, initialisation, optimiser, evaluation and directory, with the files `memlab train` writes
// there, so each is resumable alone and equals its solo run (to rounding). A run whose loss turns NaN/Inf stops
// alone; NumericError at the end names it. `resume`: every directory is resumed (their checkpoints must be at one
// step).
int run_packed_training(const std::vector<const Config*>& cfgs, const std::vector<std::string>& dirs, bool resume);

// `memlab sweep --pack`: runs whose configs give the same non-empty key may be packed together (every key but those
// packed runs may differ in). "" when the config's model cannot be packed.
std::string pack_key(const Config& cfg);

// `memlab sweep --pack auto`: the most runs of this config to pack into one process on a GPU of `device_bytes`
// (1 on the CPU, device_bytes <= 0): as many as fit in memory with room to spare, and no more than still step faster
// packed than one after another; where one run's step fills the GPU alone, 12 where they fit, which saves the
// process starts and evaluations of 11 (see results/reference/packed_runs_h200.md).
int64_t auto_pack_limit(const Config& cfg, double device_bytes);

// Where one run's step fills the GPU, fewer runs than this, packed, did not step faster on an H200 than one after
// another (a pack of 4 of batch 1024 took 4.5x one run; packs of 2 and 3 of Table 3's Mamba and DeltaNet runs took
// 1.28-1.36x their solo runs' sum).
constexpr int64_t kMinPayingPack = 4;

// The fewest runs of this config a pack should hold on a GPU: kMinPayingPack where one run's step fills the GPU,
// else 1 (smaller packs still pay).
int64_t min_paying_pack(const Config& cfg);

// memlab eval: the model in run_dir/checkpoint.pt evaluated under `cfg` (the run's config with eval.* and
// train.device as asked). Prints the length table and adds its rows to run_dir/evaluation.csv (a row of the
// same step, split, lengths and n replaces the earlier one) and the table to run_dir/evaluation.md; the
// training files are not touched. Returns the exit code.
int evaluate_saved_run(const Config& cfg, const std::string& run_dir);

}  // namespace memlab
