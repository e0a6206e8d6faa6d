#include "train/train_step.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "core/config.h"
#include "core/log.h"
#include "mixers/mixer.h"
#include "mixers/ops.h"
#include "train/evaluate.h"

namespace memlab {

std::unique_ptr<AdamW> make_adamw(const Config& cfg, SequenceModel& model, std::vector<double> member_decay) {
  AdamWOptions ao;
  ao.beta1 = cfg.get_float("train.beta1");
  ao.beta2 = cfg.get_float("train.beta2");
  ao.eps = cfg.get_float("train.eps");
  ao.weight_decay = cfg.get_float("train.weight_decay");
  return std::make_unique<AdamW>(model->parameters(), ao, weight_decay_mask(*model), std::move(member_decay));
}

TrainStepOptions train_step_options(const Config& cfg, const Task& task, bool bf16) {
  TrainStepOptions so;
  so.clip = cfg.get_float("train.clip");
  so.bf16 = bf16;
  so.cuda_graph = cfg.get_bool("train.cuda_graph");
  so.graph_length = task.max_input_length(task.train_range);
  so.vocab = static_cast<int64_t>(task.vocab().size());
  so.target_rows = cfg.get_bool("train.target_rows") && task.one_training_target() &&
                   cfg.get_string("model.head") == "lm";
  return so;
}

TrainStep::TrainStep(SequenceModel model, AdamW& opt, const torch::Device& device, TrainStepOptions opts,
                     int64_t first_step)
    : model_(std::move(model)), opt_(opt), device_(device), opts_(opts), params_(model_->parameters()) {
  members_ = model_->members();
  TORCH_CHECK(opt_.members() == members_, "TrainStep: an optimiser of ", opt_.members(), " members for a model of ",
              members_);
  const auto fopt = torch::TensorOptions().dtype(torch::kFloat).device(device_);
  const auto lopt = torch::TensorOptions().dtype(torch::kLong).device(device_);
  const auto shape = members_ == 1 ? std::vector<int64_t>{} : std::vector<int64_t>{members_};
  loss_sum = torch::zeros(shape, fopt);
  gnorm_sum = torch::zeros(shape, fopt);
  correct = torch::zeros(shape, lopt);
  scored = torch::zeros(shape, lopt);
  first_bad = torch::full(shape, -1, lopt);
  step_no_ = torch::full({}, first_step, lopt);
  lr_ = torch::zeros(shape, fopt);
  if (members_ > 1) {
    TORCH_CHECK(static_cast<int64_t>(opts_.member_clip.size()) == members_, "TrainStep: one clip value per member");
    max_norm_ = torch::tensor(opts_.member_clip, torch::kDouble).to(fopt);
  }
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

void TrainStep::load_batch(const std::vector<Batch>& batches) {
  const bool fixed = graph_->active();
  int64_t longest = 0;
  for (const auto& b : batches) {
    longest = std::max(longest, b.T);
    if (opts_.target_rows) check_one_target(b);
  }
  const int64_t T = fixed ? std::max(opts_.graph_length, longest) : longest;
  torch::Tensor in, tg;
  if (batches.size() == 1) {
    std::tie(in, tg) = host_tensors(batches[0], T, /*pinned=*/device_.is_cuda());
  } else {  // [B, T, K]: member k's batch in [..., k]
    std::vector<torch::Tensor> ins, tgs;
    for (const auto& b : batches) {
      auto [i, t] = host_tensors(b, T, /*pinned=*/false);
      ins.push_back(i);
      tgs.push_back(t);
    }
    in = torch::stack(ins, -1);
    tg = torch::stack(tgs, -1);
    if (device_.is_cuda()) {
      in = in.pin_memory();
      tg = tg.pin_memory();
    }
  }
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

namespace {
// A row's one target and its position: [B, T(, K)] -> [B(, K)] each (a row without one: position 0, target -1).
std::pair<torch::Tensor, torch::Tensor> target_positions(const torch::Tensor& target) {
  auto rows = target.ge(0).to(torch::kLong).argmax(1);
  return {rows, target.gather(1, rows.unsqueeze(1)).squeeze(1)};
}
}  // namespace

void TrainStep::check_one_target(const Batch& b) {
  for (int64_t i = 0; i < b.B; ++i) {
    const auto row = b.target.begin() + i * b.T;
    if (std::count_if(row, row + b.T, [](int64_t t) { return t >= 0; }) > 1)
      throw std::logic_error(fmt::format("TrainStep: row {} of a batch has more than one target, but its task "
                                         "declared one per training example (Task::one_training_target); "
                                         "--set train.target_rows=false trains on every position meanwhile",
                                         i));
  }
}

torch::Tensor TrainStep::forward(const torch::Tensor& input, torch::Tensor& target) {
  if (!opts_.target_rows) return model_->forward(input);
  auto [rows, tg] = target_positions(target);
  target = tg;
  return model_->forward_rows(input, rows);
}

void TrainStep::compute() {
  if (members_ > 1) return compute_members();
  torch::Tensor logits, loss, target = target_;
  {
    Bf16Autocast autocast(opts_.bf16);
    logits = forward(input_, target);
    loss = torch::nn::functional::cross_entropy(logits.reshape({-1, opts_.vocab}).to(torch::kFloat),
                                                target.reshape({-1}),
                                                torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1));
  }
  opt_.zero_grad();
  loss.backward();
  auto gnorm = clip_grad_norm(params_, opts_.clip);
  auto bad = gnorm.isfinite().logical_and(loss.isfinite()).logical_not();
  opt_.step(lr_, bad);
  torch::NoGradGuard ng;
  auto [c, n] = count_correct(logits.detach(), target);
  correct.add_(c);
  scored.add_(n);
  loss_sum.add_(loss.detach());
  gnorm_sum.add_(gnorm);
  step_no_.add_(1);
  first_bad.copy_(torch::where(bad.logical_and(first_bad.lt(0)), step_no_, first_bad));
}

void TrainStep::compute_members() {
  const int64_t K = members_;
  torch::Tensor logits, losses, target = target_;  // [B, T, K, V] ([B, K, V] at target rows), [K]
  const auto scored_k = target_.ge(0).reshape({-1, K}).sum(0);  // each member's scored positions
  {
    Bf16Autocast autocast(opts_.bf16);
    logits = forward(input_, target);
    auto nll = torch::nn::functional::cross_entropy(
        logits.reshape({-1, opts_.vocab}).to(torch::kFloat), target.reshape({-1}),
        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1).reduction(torch::kNone));
    // each member's mean over its own scored positions, as its solo run's loss
    losses = nll.view({-1, K}).sum(0) / scored_k.to(torch::kFloat);
  }
  opt_.zero_grad();
  losses.sum().backward();
  auto gnorm = clip_grad_norm_members(params_, max_norm_);
  // a member that went bad once stays stopped: its parameters keep their last finite values
  auto bad = gnorm.isfinite().logical_and(losses.isfinite()).logical_not().logical_or(first_bad.ge(0));
  opt_.step(lr_, bad);
  torch::NoGradGuard ng;
  auto hit = logits.detach().argmax(-1).eq(target).logical_and(target.ge(0));  // [B, T, K] or [B, K]
  correct.add_(hit.reshape({-1, K}).sum(0));
  scored.add_(scored_k);
  loss_sum.add_(losses.detach());
  gnorm_sum.add_(gnorm);
  step_no_.add_(1);
  first_bad.copy_(torch::where(bad.logical_and(first_bad.lt(0)), step_no_, first_bad));
}

void TrainStep::run(const Batch& b, double lr) {
  TORCH_CHECK(members_ == 1, "TrainStep: a packed model takes one batch per member");
  load_batch({b});
  lr_.fill_(lr);
  graph_->run([this] { compute(); });
}

void TrainStep::run(const std::vector<Batch>& batches, const std::vector<double>& lrs) {
  TORCH_CHECK(static_cast<int64_t>(batches.size()) == members_ && lrs.size() == batches.size(),
              "TrainStep: one batch and learning rate per member");
  if (members_ == 1) return run(batches[0], lrs[0]);
  load_batch(batches);
  lr_.copy_(torch::tensor(lrs, torch::kDouble).to(torch::kFloat));
  graph_->run([this] { compute(); });
}

}  // namespace memlab
