#pragma once
// Accuracy by length range: the length-generalisation measurement.
#include <torch/torch.h>

#include "models/sequence_model.h"
#include "tasks/task.h"

namespace memlab {

// accuracy: the headline (a running-answer task's answer at the last position; otherwise every scored
// position); accuracy_all: every scored position. normalized*: (accuracy - chance) / (1 - chance).
struct EvalRow {
  int64_t step = 0, length_min = 0, length_max = 0, n = 0;
  double accuracy = 0, normalized = 0, accuracy_all = 0, normalized_all = 0;
};

struct EvalSpec {
  std::vector<LengthRange> ranges;
  int64_t n = 1024;           // examples per range
  int64_t batch_size = 256;
  Split split = Split::Val;
  bool bf16 = false;          // autocast on CUDA
  bool mad_average = false;   // accuracy as MAD reports it (mad_accuracy, batch by batch), not over tokens
};

// An evaluation's examples, made once and evaluated again at every evaluation of a run: per range, its batches with
// the members' rows side by side, as host tensors (pinned by a run that keeps them on CUDA, so that their copies
// wait for nothing).
// Examples are drawn per range from `split` (indices h*2^32 + i, h a hash of the range's bounds, so a range has the
// same examples in any list of ranges and in memlab eval), sorted by length and batched so each batch pads only to
// its own longest example. tasks[k] draws member k's examples (its seed).
struct EvalBatch {
  torch::Tensor input;                        // int32 [B, T], or [B, T, K] for K > 1 members
  std::vector<torch::Tensor> target, accept;  // per member: int32 [B, T]; int64 bit masks, undefined if none has any
};
struct EvalBatches {
  std::vector<std::vector<EvalBatch>> ranges;  // [range][batch], in spec.ranges' order
  int64_t bytes() const;
  void pin();  // into page-locked memory
};
EvalBatches eval_batches(const std::vector<const Task*>& tasks, const EvalSpec& spec);

// Accuracy of each member of a packed model (SequenceModel) on `batches`, made by eval_batches from `tasks` and
// `spec`. Accuracy is over scored positions.
std::vector<std::vector<EvalRow>> evaluate_members(SequenceModel& model, const std::vector<const Task*>& tasks,
                                                   const EvalBatches& batches, const EvalSpec& spec,
                                                   const torch::Device& device, int64_t step);
// One model on one task, its batches made for this call.
std::vector<EvalRow> evaluate(SequenceModel& model, const Task& task, const EvalSpec& spec,
                              const torch::Device& device, int64_t step);

// The batch as [B, T] input and target tensors in host memory (pinned if asked), padded further to T or cut to
// T; with `rows`, those rows in that order.
std::pair<torch::Tensor, torch::Tensor> host_tensors(const Batch& b, int64_t T, bool pinned,
                                                     const std::vector<int64_t>* rows = nullptr);

// Scored positions of a batch: (correct, count) as tensors, without synchronising. With `accept` ([B, T] bit
// masks, 0 = none) a prediction is right where its bit is set, else where it equals the target.
std::pair<torch::Tensor, torch::Tensor> count_correct(const torch::Tensor& logits, const torch::Tensor& target,
                                                      const torch::Tensor& accept = {});

// As count_correct, over every scored position and over each row's last scored position only.
struct Hits {
  torch::Tensor correct, count, correct_last, count_last;
};
Hits count_hits(const torch::Tensor& logits, const torch::Tensor& target, const torch::Tensor& accept = {});

// MAD's accuracy of one batch (MAD scores with torchmetrics' multiclass accuracy, whose default average is macro): the
// mean over classes of each class's recall at the positions where `mask` is set, classes that are neither a target
// nor a prediction there left out; 0 where no class is. logits [B, T, V], target and mask [B, T]; a float scalar
// tensor, computed without synchronising. MAD then averages the batches' values weighted by their rows.
torch::Tensor mad_accuracy(const torch::Tensor& logits, const torch::Tensor& target, const torch::Tensor& mask);

// The batch's accept masks as an int64 [B, T] tensor padded to T (undefined when the batch has none).
torch::Tensor accept_tensor(const Batch& b, int64_t T);

}  // namespace memlab
