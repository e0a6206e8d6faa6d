#pragma once
// The rows of a run directory's train.csv and eval.csv (the file contract of DESIGN.md), read back by
// sweeps and reports without torch.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace memlab {

// accuracy: the headline; accuracy_all: every scored position (NaN in files of memlab before 2026-11-23).
struct EvalRecord {
  std::string run_id;
  int64_t step = 0, length_min = 0, length_max = 0, n = 0;
  double accuracy = 0, normalized = 0;
  double accuracy_all = std::nan(""), normalized_all = std::nan("");
};

struct TrainRecord {
  std::string run_id;
  int64_t step = 0;
  double loss = 0, accuracy = 0, lr = 0, grad_norm = 0, ms_per_step = 0, elapsed_s = 0;
};

// Comma-separated rows after the header line; nothing when the file does not exist.
std::vector<std::vector<std::string>> read_csv(const std::string& path);

// DIR/train.csv and DIR/eval.csv; run_id is left for the caller. UserError naming the file for a malformed row.
// eval.csv has 11 columns, or the 9 of older runs (no accuracy_all, normalized_all).
std::vector<TrainRecord> read_train_csv(const std::string& run_dir);
std::vector<EvalRecord> read_eval_csv(const std::string& run_dir);

}  // namespace memlab
