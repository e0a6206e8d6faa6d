#include "train/train_step.h"

#include <fmt/format.h>

#include "core/config.h"
#include "core/log.h"
#include "mixers/mixer.h"
#include "mixers/ops.h"
#include "train/evaluate.h"

namespace memlab {

std::unique_ptr<AdamW> make_adamw(const Config& cfg, SequenceModel& model) {
  AdamWOptions ao;
  ao.beta1 = cfg.get_float("train.beta1");
  ao.beta2 = cfg.get_float("train.beta2");
  ao.eps = cfg.get_float("train.eps");
  ao.weight_decay = cfg.get_float("train.weight_decay");
  return std::make_unique<AdamW>(model->parameters(), ao, weight_decay_mask(*model));
}

TrainStepOptions train_step_options(const Config& cfg, const Task& task, bool bf16) {
  TrainStepOptions so;
  so.clip = cfg.get_float("train.clip");
  so.bf16 = bf16;
  so.cuda_graph = cfg.get_bool("train.cuda_graph");
  so.graph_length = task.max_input_length(task.train_range);
  so.vocab = static_cast<int64_t>(task.vocab().size());
  return so;
}

TrainStep::TrainStep(SequenceModel model, AdamW& opt, const torch::Device& device, TrainStepOptions opts,
                     int64_t first_step)
    : model_(std::move(model)), opt_(opt), device_(device), opts_(opts), params_(model_->parameters()) {
  const auto fopt = torch::TensorOptions().dtype(torch::kFloat).device(device_);
  const auto lopt = torch::TensorOptions().dtype(torch::kLong).device(device_);
  loss_sum = torch::zeros({}, fopt);
  gnorm_sum = torch::zeros({}, fopt);
  correct = torch::zeros({}, lopt);
  scored = torch::zeros({}, lopt);
  first_bad = torch::full({}, -1, lopt);
  step_no_ = torch::full({}, first_step, lopt);
  lr_ = torch::zeros({}, fopt);
  const bool use_graph = opts_.cuda_graph && device_.is_cuda() && opts_.graph_length > 0;
  graph_ = std::make_unique<GraphedStep>(use_graph, opts_.cuda_graph && device_.is_cuda() && !use_graph
                                                        ? "eager (no fixed length for a CUDA graph)"
                                                        : "eager");
  if (use_graph) input_ = torch::zeros({0}, lopt);
}

const std::string& TrainStep::mode() const { return graph_->mode(); }

TrainStep::~TrainStep() = default;

void TrainStep::reset_window() {
  loss_sum.zero_();
  gnorm_sum.zero_();
  correct.zero_();
  scored.zero_();
}

void TrainStep::load_batch(const Batch& b) {
  const bool fixed = graph_->active();
  const int64_t T = fixed ? std::max(opts_.graph_length, b.T) : b.T;
  auto [in, tg] = host_tensors(b, T, /*pinned=*/device_.is_cuda());
  if (fixed && input_.defined() && input_.sizes() == in.sizes()) {
    input_.copy_(in, /*non_blocking=*/true);
    target_.copy_(tg, /*non_blocking=*/true);
  } else {
    if (fixed && graph_->captured())
      graph_->drop(fmt::format("a batch longer than the captured length {}", opts_.graph_length));
    input_ = in.to(device_, /*non_blocking=*/true);
    target_ = tg.to(device_, /*non_blocking=*/true);
  }
}

void TrainStep::compute() {
  torch::Tensor logits, loss;
  {
    Bf16Autocast autocast(opts_.bf16);
    logits = model_->forward(input_);
    loss = torch::nn::functional::cross_entropy(logits.reshape({-1, opts_.vocab}).to(torch::kFloat),
                                                target_.reshape({-1}),
                                                torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1));
  }
  opt_.zero_grad();
  loss.backward();
  auto gnorm = clip_grad_norm(params_, opts_.clip);
  auto bad = gnorm.isfinite().logical_and(loss.isfinite()).logical_not();
  opt_.step(lr_, bad);
  torch::NoGradGuard ng;
  auto [c, n] = count_correct(logits.detach(), target_);
  correct.add_(c);
  scored.add_(n);
  loss_sum.add_(loss.detach());
  gnorm_sum.add_(gnorm);
  step_no_.add_(1);
  first_bad.copy_(torch::where(bad.logical_and(first_bad.lt(0)), step_no_, first_bad));
}

void TrainStep::run(const Batch& b, double lr) {
  load_batch(b);
  lr_.fill_(lr);
  graph_->run([this] { compute(); });
}

}  // namespace memlab
