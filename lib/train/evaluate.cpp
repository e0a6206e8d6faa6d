#include "train/evaluate.h"

#include <ATen/autocast_mode.h>

#include <algorithm>
#include <numeric>

namespace memlab {

std::pair<torch::Tensor, torch::Tensor> count_correct(const torch::Tensor& logits, const torch::Tensor& target,
                                                      const torch::Tensor& accept) {
  auto scored = target.ge(0);
  auto pred = logits.argmax(-1);
  auto hit = pred.eq(target);
  if (accept.defined()) {
    auto in_set = accept.bitwise_right_shift(pred).bitwise_and(1).eq(1);
    hit = torch::where(accept.ne(0), in_set, hit);
  }
  hit = hit.logical_and(scored);
  return {hit.sum(), scored.sum()};
}

torch::Tensor accept_tensor(const Batch& b, int64_t T) {
  if (b.accept.empty()) return {};
  auto out = torch::zeros({b.B, T}, torch::kLong);
  auto* p = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < b.B; ++i)
    for (int64_t j = 0; j < b.T; ++j) p[i * T + j] = static_cast<int64_t>(b.accept[i * b.T + j]);
  return out;
}

std::pair<torch::Tensor, torch::Tensor> host_tensors(const Batch& b, int64_t T, bool pinned) {
  auto opts = torch::TensorOptions().dtype(torch::kLong).pinned_memory(pinned);
  auto in = torch::full({b.B, T}, b.pad_id, opts), tg = torch::full({b.B, T}, -1, opts);
  auto* pi = in.data_ptr<int64_t>();
  auto* pt = tg.data_ptr<int64_t>();
  for (int64_t i = 0; i < b.B; ++i) {
    std::copy(b.input.begin() + i * b.T, b.input.begin() + (i + 1) * b.T, pi + i * T);
    std::copy(b.target.begin() + i * b.T, b.target.begin() + (i + 1) * b.T, pt + i * T);
  }
  return {in, tg};
}

std::vector<EvalRow> evaluate(SequenceModel& model, const Task& task, const EvalSpec& spec,
                              const torch::Device& device, int64_t step) {
  torch::NoGradGuard ng;
  const bool was_training = model->is_training();
  model->eval();
  const bool autocast = spec.bf16 && device.is_cuda();
  if (autocast) {
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
  }
  std::vector<EvalRow> rows;
  for (size_t r = 0; r < spec.ranges.size(); ++r) {
    const LengthRange range = spec.ranges[r];
    std::vector<Example> ex;
    ex.reserve(spec.n);
    for (int64_t i = 0; i < spec.n; ++i) ex.push_back(task.example(spec.split, (uint64_t(r) << 32) + i, range));
    std::sort(ex.begin(), ex.end(), [](const Example& a, const Example& b) { return a.input.size() < b.input.size(); });
    auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
    auto count = correct.clone();
    for (int64_t s = 0; s < spec.n; s += spec.batch_size) {
      const int64_t e = std::min<int64_t>(spec.n, s + spec.batch_size);
      Batch b = task.pad(std::vector<Example>(ex.begin() + s, ex.begin() + e));
      auto [input, target] = host_tensors(b, b.T, /*pinned=*/false);
      auto accept = accept_tensor(b, b.T);
      if (accept.defined()) accept = accept.to(device);
      auto [c, n] = count_correct(model->forward(input.to(device)), target.to(device), accept);
      correct += c;
      count += n;
    }
    EvalRow row;
    row.step = step;
    row.length_min = range.min;
    row.length_max = range.max;
    row.n = spec.n;
    const double cnt = static_cast<double>(count.item<int64_t>());
    row.accuracy = cnt > 0 ? static_cast<double>(correct.item<int64_t>()) / cnt : 0.0;
    row.normalized = (row.accuracy - task.chance()) / (1.0 - task.chance());
    rows.push_back(row);
  }
  if (autocast) {
    at::autocast::set_autocast_enabled(at::kCUDA, false);
    at::autocast::clear_cache();
  }
  if (was_training) model->train();
  return rows;
}

}  // namespace memlab
