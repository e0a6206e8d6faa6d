#pragma once
// One optimiser step (forward, loss, backward, clipping, AdamW) with its running statistics kept on the
// device, so a step never waits for the GPU. On CUDA the whole step can be captured once as a CUDA graph
// and replayed: batches are then padded to a fixed length, which changes no result (the padding follows
// the scored positions and the model is causal).
#include <torch/torch.h>

#include <memory>

#include "models/sequence_model.h"
#include "tasks/task.h"
#include "train/cuda_graph.h"
#include "train/length_buckets.h"
#include "train/optimizer.h"

namespace c10::cuda {
struct CUDAEvent;
}

namespace memlab {

struct TrainStepOptions {
  double clip = 1.0;
  std::vector<double> member_clip;  // a packed model's: one per member (clip is then unused)
  bool bf16 = false;
  bool cuda_graph = false;  // honoured on CUDA only
  int64_t graph_length = 0;  // the fixed padded length for graph replay
  int64_t vocab = 0;
  // Every row has at most one target (checked on each batch): the loss reads the model at that position alone
  // (SequenceModelImpl::forward_rows), the same loss up to rounding.
  bool target_rows = false;
  // Rows split into this many buckets by length, each run padded to its own length (train/length_buckets.h);
  // 0: auto (auto_length_buckets, from the model's members and the device). bucket_margin: the buckets'
  // headroom, in standard deviations of a bucket's row count.
  int64_t length_buckets = 1;
  double bucket_margin = 5;
};

class Config;

// The optimiser and step options a run's config asks for (train.*), for the trainer and memlab bench step.
// member_decay: a packed model's (AdamW), one weight decay per member; empty: cfg's, one member.
std::unique_ptr<AdamW> make_adamw(const Config& cfg, SequenceModel& model, std::vector<double> member_decay = {});
TrainStepOptions train_step_options(const Config& cfg, const Task& task, bool bf16);

// With a packed model (K members, AdamW over its members) a step takes one batch and learning rate per member;
// each member's loss is its own batch's mean, its gradients are clipped by its own norm, and a member whose loss
// or gradient is not finite stops there: none of its later updates is applied.
class TrainStep {
 public:
  TrainStep(SequenceModel model, AdamW& opt, const torch::Device& device, TrainStepOptions opts, int64_t first_step);
  ~TrainStep();
  void run(const Batch& batch, double lr);
  void run(const std::vector<Batch>& batches, const std::vector<double>& lrs);  // one per member
  void reset_window();  // zero the running sums (after they were read)
  // Steps whose batch did not fit the length buckets and so ran whole, eagerly.
  int64_t whole_steps() const { return whole_steps_; }
  // The buckets' rows and lengths, from the first batch (one bucket: no split); empty before it.
  const std::vector<LengthBucket>& length_plan() const { return plan_; }
  // "eager", "cuda graph", or why the graph was not used
  const std::string& mode() const;

  // Running sums since reset_window(), and the first step whose loss or gradient was not finite (-1: none);
  // 0-d, or [K] for K members.
  torch::Tensor loss_sum, gnorm_sum, correct, scored, first_bad;

 private:
  // launch(), at most kStepsInFlight steps ahead of the GPU: far enough that the next batches are made while this
  // step runs, near enough that the pinned batches in flight stay few.
  void step(const std::vector<Batch>& batches);
  void launch(const std::vector<Batch>& batches);
  // One tensor per length bucket: [rows, len] (one member) or [rows, len, K].
  void compute(const std::vector<torch::Tensor>& inputs, const std::vector<torch::Tensor>& targets);
  void compute_members(const std::vector<torch::Tensor>& inputs, const std::vector<torch::Tensor>& targets);
  // Into inputs_ and targets_; false: the batch does not fit the length buckets, and is in whole_* instead.
  bool load_batch(const std::vector<Batch>& b, std::vector<torch::Tensor>& whole_input,
                  std::vector<torch::Tensor>& whole_target);
  void check_one_target(const Batch& b);  // throws where target_rows meets a row of several targets
  // The model's logits as the loss reads them; with target_rows, at each row's target, and `target` becomes
  // those targets.
  torch::Tensor forward(const torch::Tensor& input, torch::Tensor& target);

  SequenceModel model_;
  AdamW& opt_;
  torch::Device device_;
  TrainStepOptions opts_;
  std::vector<torch::Tensor> params_;
  int64_t members_ = 1;
  std::vector<LengthBucket> plan_;  // from the first batch
  std::vector<torch::Tensor> inputs_, targets_;
  int64_t whole_steps_ = 0;
  bool auto_buckets_ = false;  // train.length_buckets auto, resolved in the constructor
  torch::Tensor lr_, step_no_, max_norm_;
  std::unique_ptr<GraphedStep> graph_;
  static constexpr int64_t kStepsInFlight = 2;
  std::unique_ptr<c10::cuda::CUDAEvent> in_flight_[kStepsInFlight];  // each launched step's end, on CUDA
  int64_t launched_ = 0;
};

}  // namespace memlab
