#pragma once
// Tasks and training batches built in tests (CPU and GPU).
#include <torch/torch.h>

#include <memory>
#include <string>

#include "core/config.h"
#include "tasks/task.h"
#include "train/trainer.h"

namespace memlab::testing {

// The task `name` as runs of these seeds draw it (defaults otherwise).
inline std::vector<std::unique_ptr<Task>> seeded_tasks(const std::string& name, const std::vector<int>& seeds) {
  std::vector<std::unique_ptr<Task>> out;
  for (int seed : seeds) {
    Config c(full_schema());
    c.set_value("task.name", name, "test");
    c.set_value("train.seed", std::to_string(seed), "test");
    out.push_back(make_task(c));
  }
  return out;
}

// A batch of the tensors' rows, [B, T] each.
inline Batch tensors_batch(const torch::Tensor& input, const torch::Tensor& target, std::vector<int64_t> lengths) {
  Batch b;
  b.B = input.size(0);
  b.T = input.size(1);
  auto in = input.contiguous(), tg = target.contiguous();
  b.input.assign(in.data_ptr<int64_t>(), in.data_ptr<int64_t>() + b.B * b.T);
  b.target.assign(tg.data_ptr<int64_t>(), tg.data_ptr<int64_t>() + b.B * b.T);
  b.lengths = std::move(lengths);
  return b;
}

// Rows of random lengths min_len..T (tokens past a row's length stay random, so a split batch that cut them off would
// differ from the whole one if the model were not causal): one target at the row's end, or one at every position.
inline Batch varlen_batch(int64_t B, int64_t T, int64_t V, uint64_t seed, bool one_target, int64_t min_len = 1) {
  torch::manual_seed(seed);
  auto in = torch::randint(1, V, {B, T});
  auto tg = torch::full({B, T}, -1, torch::kLong);
  auto len = torch::randint(min_len, T + 1, {B});
  for (int64_t i = 0; i < B; ++i) {
    const int64_t n = len[i].item<int64_t>();
    for (int64_t j = one_target ? n - 1 : 0; j < n; ++j) tg[i][j] = torch::randint(0, V, {1}).item<int64_t>();
  }
  return tensors_batch(in, tg, std::vector<int64_t>(len.data_ptr<int64_t>(), len.data_ptr<int64_t>() + B));
}

}  // namespace memlab::testing
