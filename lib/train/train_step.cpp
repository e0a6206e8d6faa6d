#include "train/train_step.h"

#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDACachingAllocator.h>

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "core/config.h"
#include "core/log.h"
#include "mixers/mixer.h"
#include "mixers/ops.h"
#include "train/evaluate.h"
#include "train/length_buckets.h"

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
  // The split cuts each row after its last target, which only a causal model's loss ignores: the autoencoder head
  // pools the row's last token (auto leaves it whole).
  const std::string buckets = cfg.get_string("train.length_buckets");
  const bool causal = cfg.get_string("model.head") == "lm";
  so.length_buckets = buckets == "auto" ? (causal ? 0 : 1) : std::stoll(buckets);
  if (so.length_buckets > 1 && !causal)
    cfg.fail("train.length_buckets", fmt::format("needs model.head lm (a causal read), not {}",
                                                 cfg.get_string("model.head")));
  return so;
}

TrainStep::TrainStep(SequenceModel model, AdamW& opt, const torch::Device& device, TrainStepOptions opts,
                     int64_t first_step)
    : model_(std::move(model)), opt_(opt), device_(device), opts_(opts), params_(model_->parameters()) {
  members_ = model_->members();
  auto_buckets_ = opts_.length_buckets == 0;
  if (auto_buckets_) opts_.length_buckets = auto_length_buckets(members_, device_.is_cuda());
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
}

const std::string& TrainStep::mode() const { return graph_->mode(); }

TrainStep::~TrainStep() = default;

void TrainStep::reset_window() {
  loss_sum.zero_();
  gnorm_sum.zero_();
  correct.zero_();
  scored.zero_();
}

bool TrainStep::load_batch(const std::vector<Batch>& batches, std::vector<torch::Tensor>& whole_input,
                           std::vector<torch::Tensor>& whole_target) {
  const bool fixed = graph_->active(), pinned = device_.is_cuda();
  const auto K = static_cast<int64_t>(batches.size());
  int64_t longest = 0;
  for (const auto& b : batches) {
    longest = std::max(longest, b.T);
    if (opts_.target_rows) check_one_target(b);
  }
  const int64_t T = fixed ? std::max(opts_.graph_length, longest) : longest;
  std::vector<std::vector<int64_t>> needed;
  if (opts_.length_buckets > 1 && plan_.size() != 1)  // a plan of one bucket splits nothing
    for (const auto& b : batches) needed.push_back(needed_lengths(b));
  if (plan_.empty()) {
    plan_ = opts_.length_buckets > 1 ? plan_length_buckets(needed, opts_.length_buckets, T, opts_.bucket_margin)
                                     : std::vector<LengthBucket>{{batches[0].B, T}};
    if (opts_.length_buckets > 1)
      logf("training batches in {} length bucket{} (train.length_buckets {}{}), rows to length: {}", plan_.size(),
           plan_.size() == 1 ? "" : "s", auto_buckets_ ? "auto: " : "", opts_.length_buckets,
           describe_length_buckets(plan_));
  }
  // each member's rows in each bucket; none where a batch does not fit the buckets
  std::vector<std::vector<std::vector<int64_t>>> rows;
  bool fits = plan_.size() > 1;
  for (int64_t k = 0; fits && k < K; ++k) {
    rows.push_back(assign_length_buckets(needed[k], plan_));
    fits = !rows.back().empty();
  }
  std::vector<LengthBucket> shape = fits ? plan_ : std::vector<LengthBucket>{{batches[0].B, T}};
  for (auto& bk : shape) bk.len = std::min(bk.len, T);
  shape.back().len = T;
  std::vector<torch::Tensor> ins, tgs;
  for (size_t j = 0; j < shape.size(); ++j) {
    torch::Tensor in, tg;
    if (K == 1) {
      std::tie(in, tg) = host_tensors(batches[0], shape[j].len, pinned, fits ? &rows[0][j] : nullptr);
    } else {  // [n, L, K]: member k's rows in [..., k]
      std::vector<torch::Tensor> mi, mt;
      for (int64_t k = 0; k < K; ++k) {
        auto [i, t] = host_tensors(batches[k], shape[j].len, /*pinned=*/false, fits ? &rows[k][j] : nullptr);
        mi.push_back(i);
        mt.push_back(t);
      }
      in = torch::stack(mi, -1);
      tg = torch::stack(mt, -1);
      if (pinned) {
        in = in.pin_memory();
        tg = tg.pin_memory();
      }
    }
    ins.push_back(in);
    tgs.push_back(tg);
  }
  if (plan_.size() > 1 && !fits) {  // this batch runs whole, outside the graph
    whole_input = {ins[0].to(device_, /*non_blocking=*/true)};
    whole_target = {tgs[0].to(device_, /*non_blocking=*/true)};
    return false;
  }
  bool same = fixed && inputs_.size() == ins.size();
  for (size_t j = 0; same && j < ins.size(); ++j) same = inputs_[j].sizes() == ins[j].sizes();
  if (same) {
    for (size_t j = 0; j < ins.size(); ++j) {
      inputs_[j].copy_(ins[j], /*non_blocking=*/true);
      targets_[j].copy_(tgs[j], /*non_blocking=*/true);
    }
  } else {
    if (fixed && graph_->captured())
      graph_->drop(fmt::format("a batch longer than the captured length {}", opts_.graph_length));
    inputs_.clear();
    targets_.clear();
    for (size_t j = 0; j < ins.size(); ++j) {
      inputs_.push_back(ins[j].to(device_, /*non_blocking=*/true));
      targets_.push_back(tgs[j].to(device_, /*non_blocking=*/true));
    }
  }
  return true;
}

void TrainStep::step(const std::vector<Batch>& batches) {
  if (!device_.is_cuda()) return launch(batches);
  auto& done = in_flight_[launched_++ % kStepsInFlight];
  if (!done) done = std::make_unique<c10::cuda::CUDAEvent>();
  done->synchronize();  // the step kStepsInFlight back (nothing before it is recorded)
  launch(batches);
  done->record(c10::cuda::getCurrentCUDAStream(device_.index()));
}

void TrainStep::launch(const std::vector<Batch>& batches) {
  std::vector<torch::Tensor> whole_input, whole_target;
  if (load_batch(batches, whole_input, whole_target)) {
    graph_->run([this] { compute(inputs_, targets_); });
    return;
  }
  if (whole_steps_++ == 0)
    logf("note: a training batch did not fit the length buckets; such a step runs whole and without the CUDA graph");
  compute(whole_input, whole_target);
  whole_input.clear();
  whole_target.clear();
  // Beside a captured graph's pool, this step's memory would stay cached (and its gradients alive, as replays do
  // not reset them): hand both back, so that a rare whole step does not double what the run holds.
  if (graph_->captured()) {
    opt_.zero_grad();
    c10::cuda::CUDACachingAllocator::emptyCache();
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

void TrainStep::compute(const std::vector<torch::Tensor>& inputs, const std::vector<torch::Tensor>& targets) {
  if (members_ > 1) return compute_members(inputs, targets);
  const size_t n = inputs.size();  // length buckets
  std::vector<torch::Tensor> logits(n), target = targets;
  torch::Tensor loss;
  {
    Bf16Autocast autocast(opts_.bf16);
    namespace F = torch::nn::functional;
    if (n == 1) {
      logits[0] = forward(inputs[0], target[0]);
      loss = F::cross_entropy(logits[0].reshape({-1, opts_.vocab}).to(torch::kFloat), target[0].reshape({-1}),
                              F::CrossEntropyFuncOptions().ignore_index(-1));
    } else {  // the whole batch's mean: every bucket's sum over the batch's scored positions
      torch::Tensor sum, count;
      for (size_t j = 0; j < n; ++j) {
        logits[j] = forward(inputs[j], target[j]);
        auto s = F::cross_entropy(logits[j].reshape({-1, opts_.vocab}).to(torch::kFloat), target[j].reshape({-1}),
                                  F::CrossEntropyFuncOptions().ignore_index(-1).reduction(torch::kSum));
        auto c = target[j].ge(0).sum();
        sum = j == 0 ? s : sum + s;
        count = j == 0 ? c : count + c;
      }
      loss = sum / count.to(torch::kFloat);
    }
  }
  opt_.zero_grad();
  loss.backward();
  auto gnorm = clip_grad_norm(params_, opts_.clip);
  auto bad = gnorm.isfinite().logical_and(loss.isfinite()).logical_not();
  opt_.step(lr_, bad);
  torch::NoGradGuard ng;
  for (size_t j = 0; j < n; ++j) {
    auto [c, k] = count_correct(logits[j].detach(), target[j]);
    correct.add_(c);
    scored.add_(k);
  }
  loss_sum.add_(loss.detach());
  gnorm_sum.add_(gnorm);
  step_no_.add_(1);
  first_bad.copy_(torch::where(bad.logical_and(first_bad.lt(0)), step_no_, first_bad));
}

void TrainStep::compute_members(const std::vector<torch::Tensor>& inputs, const std::vector<torch::Tensor>& targets) {
  const int64_t K = members_;
  const size_t n = inputs.size();  // length buckets
  // [B, T, K, V] ([B, K, V] at target rows) per bucket; each member's scored positions and losses, [K]
  std::vector<torch::Tensor> logits(n), target = targets;
  torch::Tensor scored_k, nll_k, losses;
  for (size_t j = 0; j < n; ++j) {
    auto s = targets[j].ge(0).reshape({-1, K}).sum(0);
    scored_k = j == 0 ? s : scored_k + s;
  }
  {
    Bf16Autocast autocast(opts_.bf16);
    for (size_t j = 0; j < n; ++j) {
      logits[j] = forward(inputs[j], target[j]);
      auto nll = torch::nn::functional::cross_entropy(
          logits[j].reshape({-1, opts_.vocab}).to(torch::kFloat), target[j].reshape({-1}),
          torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1).reduction(torch::kNone));
      auto s = nll.view({-1, K}).sum(0);
      nll_k = j == 0 ? s : nll_k + s;
    }
    // each member's mean over its own scored positions, as its solo run's loss
    losses = nll_k / scored_k.to(torch::kFloat);
  }
  opt_.zero_grad();
  losses.sum().backward();
  auto gnorm = clip_grad_norm_members(params_, max_norm_);
  // a member that went bad once stays stopped: its parameters keep their last finite values
  auto bad = gnorm.isfinite().logical_and(losses.isfinite()).logical_not().logical_or(first_bad.ge(0));
  opt_.step(lr_, bad);
  torch::NoGradGuard ng;
  for (size_t j = 0; j < n; ++j) {
    auto hit = logits[j].detach().argmax(-1).eq(target[j]).logical_and(target[j].ge(0));  // [B, T, K] or [B, K]
    correct.add_(hit.reshape({-1, K}).sum(0));
  }
  scored.add_(scored_k);
  loss_sum.add_(losses.detach());
  gnorm_sum.add_(gnorm);
  step_no_.add_(1);
  first_bad.copy_(torch::where(bad.logical_and(first_bad.lt(0)), step_no_, first_bad));
}

void TrainStep::run(const Batch& b, double lr) {
  TORCH_CHECK(members_ == 1, "TrainStep: a packed model takes one batch per member");
  lr_.fill_(lr);
  step({b});
}

void TrainStep::run(const std::vector<Batch>& batches, const std::vector<double>& lrs) {
  TORCH_CHECK(static_cast<int64_t>(batches.size()) == members_ && lrs.size() == batches.size(),
              "TrainStep: one batch and learning rate per member");
  if (members_ == 1) return run(batches[0], lrs[0]);
  // from pinned memory without blocking: a pageable copy would wait for the previous step at every step
  auto host = torch::tensor(lrs, torch::kDouble).to(torch::kFloat);
  lr_.copy_(device_.is_cuda() ? host.pin_memory() : host, /*non_blocking=*/true);
  step(batches);
}

}  // namespace memlab
