#pragma once
// Checkpoints: model parameters, optimiser state and the step reached, written atomically.
#include <string>

#include "models/sequence_model.h"
#include "train/optimizer.h"

namespace memlab {

// Writes the archive to path.tmp.<pid>, then renames it over path.
void save_archive_atomic(torch::serialize::OutputArchive& ar, const std::string& path);
void save_checkpoint(const std::string& path, SequenceModel& model, const AdamW& opt, int64_t step);
// Returns the step stored in the checkpoint. UserError when the file is missing or does not fit the model.
int64_t load_checkpoint(const std::string& path, SequenceModel& model, AdamW& opt);

}  // namespace memlab
