#pragma once
// Accuracy by length range: the length-generalisation measurement.
#include <torch/torch.h>

#include "models/sequence_model.h"
#include "tasks/task.h"

namespace memlab {

struct EvalRow {
  int64_t step = 0, length_min = 0, length_max = 0, n = 0;
  double accuracy = 0, normalized = 0;
};

struct EvalSpec {
  std::vector<LengthRange> ranges;
  int64_t n = 1024;           // examples per range
  int64_t batch_size = 256;
  Split split = Split::Val;
  bool bf16 = false;          // autocast on CUDA
};

// Examples are drawn per range from `split` (range r uses indices r*2^32 + i), sorted by length and batched
// so each batch pads only to its own longest example. Accuracy is over scored positions.
std::vector<EvalRow> evaluate(SequenceModel& model, const Task& task, const EvalSpec& spec,
                              const torch::Device& device, int64_t step);

// The batch as [B, T] input and target tensors in host memory (pinned if asked), padded further to T >= b.T.
std::pair<torch::Tensor, torch::Tensor> host_tensors(const Batch& b, int64_t T, bool pinned);

// Scored positions of a batch: (correct, count) as tensors, without synchronising. With `accept` ([B, T] bit
// masks, 0 = none) a prediction is right where its bit is set, else where it equals the target.
std::pair<torch::Tensor, torch::Tensor> count_correct(const torch::Tensor& logits, const torch::Tensor& target,
                                                      const torch::Tensor& accept = {});

// The batch's accept masks as an int64 [B, T] tensor padded to T (undefined when the batch has none).
torch::Tensor accept_tensor(const Batch& b, int64_t T);

}  // namespace memlab
