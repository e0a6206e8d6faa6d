#pragma once
// Supervised training of a sequence model on a task, with periodic evaluation over length ranges.
// Writes into the run directory: config.yaml, train.csv, eval.csv, summary.md, checkpoint.pt, log.txt.
#include <string>

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

}  // namespace memlab
