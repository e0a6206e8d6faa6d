#include "train/train_step.h"

#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <fmt/format.h>

#include "core/log.h"
#include "train/evaluate.h"

namespace memlab {

struct TrainStep::Graph {
  at::cuda::CUDAGraph graph;
  bool captured = false;
};

namespace {
constexpr int kWarmSteps = 3;  // eager steps on a side stream before capture (allocator, cuBLAS handles)
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
  if (opts_.cuda_graph && device_.is_cuda() && opts_.graph_length > 0) {
    graph_ = std::make_unique<Graph>();
    input_ = torch::zeros({0}, lopt);
  } else if (opts_.cuda_graph && device_.is_cuda()) {
    mode_ = "eager (no fixed length for a CUDA graph)";
  }
}

TrainStep::~TrainStep() = default;

void TrainStep::reset_window() {
  loss_sum.zero_();
  gnorm_sum.zero_();
  correct.zero_();
  scored.zero_();
}

void TrainStep::load_batch(const Batch& b) {
  const bool fixed = graph_ != nullptr;
  const int64_t T = fixed ? std::max(opts_.graph_length, b.T) : b.T;
  auto [in, tg] = host_tensors(b, T, /*pinned=*/device_.is_cuda());
  if (fixed && input_.defined() && input_.sizes() == in.sizes()) {
    input_.copy_(in, /*non_blocking=*/true);
    target_.copy_(tg, /*non_blocking=*/true);
  } else {
    if (fixed && graph_->captured) {  // a longer batch than the graph was captured for: drop the graph
      graph_.reset();
      mode_ = fmt::format("eager (a batch longer than the captured length {})", opts_.graph_length);
      logf("note: training continues without the CUDA graph: {}", mode_);
    }
    input_ = in.to(device_, /*non_blocking=*/true);
    target_ = tg.to(device_, /*non_blocking=*/true);
  }
}

void TrainStep::compute() {
  if (opts_.bf16) {
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
  }
  auto logits = model_->forward(input_);
  auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, opts_.vocab}).to(torch::kFloat),
                                                   target_.reshape({-1}),
                                                   torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-1));
  if (opts_.bf16) {
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
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
  if (!graph_) {
    compute();
    return;
  }
  if (graph_->captured) {
    graph_->graph.replay();
    return;
  }
  // Warm-up steps are real training steps, run eagerly on a side stream as graph capture requires.
  auto side = c10::cuda::getStreamFromPool();
  torch::cuda::synchronize();
  if (warm_steps_ < kWarmSteps) {
    {
      c10::cuda::CUDAStreamGuard guard(side);
      compute();
    }
    torch::cuda::synchronize();
    ++warm_steps_;
    return;
  }
  at::autocast::set_autocast_cache_enabled(false);
  try {
    {
      c10::cuda::CUDAStreamGuard guard(side);
      graph_->graph.capture_begin();
      compute();
      graph_->graph.capture_end();
    }
    torch::cuda::synchronize();
    graph_->captured = true;
    mode_ = fmt::format("cuda graph (length {})", opts_.graph_length);
    graph_->graph.replay();  // capture recorded this step without running it
  } catch (const c10::Error& e) {
    std::string msg = e.what_without_backtrace();
    graph_.reset();
    mode_ = "eager (CUDA graph capture failed: " + msg.substr(0, msg.find('\n')) + ")";
    logf("note: {}", mode_);
    torch::cuda::synchronize();
    compute();  // the step the failed capture did not run
  }
}

}  // namespace memlab
