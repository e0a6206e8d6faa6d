#pragma once
// Forms of the training step side by side in tests: one model, AdamW and TrainStep per set of step options, every
// model initialised from the same seed, so that the forms can be compared step by step.
#include <torch/torch.h>

#include <memory>
#include <vector>

#include "core/config.h"
#include "mixers/mixer.h"
#include "models/sequence_model.h"
#include "train/optimizer.h"
#include "train/train_step.h"

namespace memlab::testing {

struct StepForms {
  std::vector<SequenceModel> models;
  std::vector<std::unique_ptr<AdamW>> opts;
  std::vector<std::unique_ptr<TrainStep>> steps;
};

// member_decay: a packed model of that many members, each with its weight decay; empty: one model.
inline StepForms step_forms(const Config& c, int64_t vocab, uint64_t seed, const std::vector<double>& member_decay,
                            const torch::Device& device, const std::vector<TrainStepOptions>& forms) {
  StepForms f;
  const auto members = static_cast<int64_t>(member_decay.size());
  for (const auto& so : forms) {
    torch::manual_seed(seed);
    f.models.push_back(members == 0 ? SequenceModel(c, vocab) : SequenceModel(c, vocab, members));
    f.models.back()->to(device);
    f.opts.push_back(std::make_unique<AdamW>(f.models.back()->parameters(), AdamWOptions{},
                                             weight_decay_mask(*f.models.back()), member_decay));
    f.steps.push_back(std::make_unique<TrainStep>(f.models.back(), *f.opts.back(), device, so, 0));
  }
  return f;
}

}  // namespace memlab::testing
