#pragma once
// Checkpoints: model parameters, optimiser state and the step reached, written atomically.
#include <string>

#include "models/sequence_model.h"
#include "train/optimizer.h"

namespace memlab {

void save_checkpoint(const std::string& path, SequenceModel& model, const AdamW& opt, int64_t step);
// Returns the step stored in the checkpoint. UserError when the file is missing or does not fit the model.
int64_t load_checkpoint(const std::string& path, SequenceModel& model, AdamW& opt);

}  // namespace memlab
