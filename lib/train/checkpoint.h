#pragma once
// Checkpoints: torch archives serialised in memory and written atomically (a full disk leaves the old
// checkpoint and no temporary behind), holding the effective config they were written under. Reading one
// checks every entry's CRC-32 first, so a truncated or damaged file is named as such.
#include <string>

#include "models/sequence_model.h"
#include "train/optimizer.h"

namespace memlab {

class Config;

void save_archive_atomic(torch::serialize::OutputArchive& ar, const std::string& path);
// UserError naming the file when it is missing, truncated or damaged.
void load_archive(torch::serialize::InputArchive& ar, const std::string& path, const torch::Device& device);

// The effective config as an archive entry, and back ("" in archives of memlab before 2026-11-23).
void write_config(torch::serialize::OutputArchive& ar, const Config& cfg);
std::string read_config(torch::serialize::InputArchive& ar);

// A training checkpoint's bytes (model, optimiser, step, config), for write_file_atomic or write_temporary.
std::string checkpoint_bytes(SequenceModel& model, const AdamW& opt, int64_t step, const Config& cfg);

// A checkpoint read back in two steps: open() (integrity, the step and config it was written under), then
// restore() into a model and optimiser built from the config.
class CheckpointReader {
 public:
  CheckpointReader(const std::string& path, const torch::Device& device);
  int64_t step() const { return step_; }
  const std::string& config() const { return config_; }
  // Loads the model (and the optimiser when given). UserError when the parameters do not fit.
  void restore(SequenceModel& model, AdamW* opt);

 private:
  std::string path_, config_;
  int64_t step_ = 0;
  torch::serialize::InputArchive ar_;
};

// The first line of a torch error, without its C++ backtrace.
std::string torch_message(const c10::Error& e);

}  // namespace memlab
