#include "train/evaluate.h"

#include <algorithm>
#include <numeric>

#include "mixers/ops.h"

namespace memlab {

namespace {
// The examples of a length range are its own, wherever it stands in the list: a 32-bit mix of its bounds.
uint64_t range_seed(const LengthRange& r) {
  uint64_t z = (static_cast<uint64_t>(r.min) << 32) ^ static_cast<uint64_t>(r.max);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return (z ^ (z >> 31)) & 0xffffffffULL;
}

// Right predictions at scored positions, [B, T] bool.
torch::Tensor hit_mask(const torch::Tensor& logits, const torch::Tensor& target, const torch::Tensor& accept) {
  auto pred = logits.argmax(-1);
  auto hit = pred.eq(target);
  if (accept.defined()) {
    auto in_set = accept.bitwise_right_shift(pred).bitwise_and(1).eq(1);
    hit = torch::where(accept.ne(0), in_set, hit);
  }
  return hit.logical_and(target.ge(0));
}

// Each row's last scored position, [B, T] bool.
torch::Tensor last_scored(const torch::Tensor& target) {
  auto scored = target.ge(0);
  // the largest t + 1 among scored positions
  auto t1 = torch::arange(1, target.size(1) + 1, target.options()).unsqueeze(0);
  auto last = (scored.to(torch::kLong) * t1).argmax(1, /*keepdim=*/true);
  return torch::zeros_like(scored).scatter(1, last, scored.any(1, /*keepdim=*/true));
}
}  // namespace

torch::Tensor mad_accuracy(const torch::Tensor& logits, const torch::Tensor& target, const torch::Tensor& mask) {
  const int64_t V = logits.size(-1);
  auto pred = logits.argmax(-1).flatten(), tgt = target.clamp_min(0).flatten();
  auto w = mask.logical_and(target.ge(0)).flatten().to(torch::kFloat);
  auto zeros = torch::zeros({V}, w.options());
  auto support = zeros.index_add(0, tgt, w), predicted = zeros.index_add(0, pred, w);
  auto tp = zeros.index_add(0, tgt, w * pred.eq(tgt).to(torch::kFloat));
  auto counted = (support + predicted - tp).gt(0).to(torch::kFloat);  // a target or a prediction somewhere
  return (tp / support.clamp_min(1) * counted).sum() / counted.sum().clamp_min(1);
}

std::pair<torch::Tensor, torch::Tensor> count_correct(const torch::Tensor& logits, const torch::Tensor& target,
                                                      const torch::Tensor& accept) {
  return {hit_mask(logits, target, accept).sum(), target.ge(0).sum()};
}

Hits count_hits(const torch::Tensor& logits, const torch::Tensor& target, const torch::Tensor& accept) {
  auto scored = target.ge(0);
  auto hit = hit_mask(logits, target, accept);
  auto last = last_scored(target);
  return {hit.sum(), scored.sum(), hit.logical_and(last).sum(), last.sum()};
}

torch::Tensor accept_tensor(const Batch& b, int64_t T) {
  if (b.accept.empty()) return {};
  auto out = torch::zeros({b.B, T}, torch::kLong);
  auto* p = out.data_ptr<int64_t>();
  for (int64_t i = 0; i < b.B; ++i)
    for (int64_t j = 0; j < b.T; ++j) p[i * T + j] = static_cast<int64_t>(b.accept[i * b.T + j]);
  return out;
}

std::pair<torch::Tensor, torch::Tensor> host_tensors(const Batch& b, int64_t T, bool pinned,
                                                     const std::vector<int64_t>* rows) {
  const int64_t n = rows ? static_cast<int64_t>(rows->size()) : b.B, cols = std::min(T, b.T);
  auto opts = torch::TensorOptions().dtype(torch::kLong).pinned_memory(pinned);
  auto in = torch::full({n, T}, b.pad_id, opts), tg = torch::full({n, T}, -1, opts);
  auto* pi = in.data_ptr<int64_t>();
  auto* pt = tg.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = rows ? (*rows)[i] : i;
    std::copy(b.input.begin() + r * b.T, b.input.begin() + r * b.T + cols, pi + i * T);
    std::copy(b.target.begin() + r * b.T, b.target.begin() + r * b.T + cols, pt + i * T);
  }
  return {in, tg};
}

namespace {
// fn on every tensor the batches hold (const or not, as `batches` is)
template <class Batches, class Fn>
void each_tensor(Batches& batches, Fn fn) {
  for (auto& range : batches.ranges)
    for (auto& b : range) {
      fn(b.input);
      for (auto& t : b.target) fn(t);
      for (auto& t : b.accept) fn(t);
    }
}
}  // namespace

int64_t EvalBatches::bytes() const {
  int64_t n = 0;
  each_tensor(*this, [&n](const torch::Tensor& t) {
    if (t.defined()) n += t.numel() * static_cast<int64_t>(t.element_size());
  });
  return n;
}

void EvalBatches::pin() {
  each_tensor(*this, [](torch::Tensor& t) {
    if (t.defined()) t = t.pin_memory();
  });
}

EvalBatches eval_batches(const std::vector<const Task*>& tasks, const EvalSpec& spec) {
  const auto K = static_cast<int64_t>(tasks.size());
  EvalBatches out;
  for (const LengthRange& range : spec.ranges) {
    auto ex = member_examples(tasks, spec.split, range_seed(range) << 32, spec.n, range);
    for (auto& e : ex)
      std::sort(e.begin(), e.end(), [](const Example& a, const Example& b) { return a.input.size() < b.input.size(); });
    auto& batches = out.ranges.emplace_back();
    for (int64_t s = 0; s < spec.n; s += spec.batch_size) {
      const int64_t e = std::min<int64_t>(spec.n, s + spec.batch_size);
      std::vector<Batch> b;
      int64_t T = 0;
      for (int64_t k = 0; k < K; ++k) {
        b.push_back(tasks[k]->pad(std::vector<Example>(ex[k].begin() + s, ex[k].begin() + e)));
        T = std::max(T, b.back().T);
      }
      EvalBatch eb;
      std::vector<torch::Tensor> inputs;
      bool any_accept = false;
      for (int64_t k = 0; k < K; ++k) {
        auto [input, target] = host_tensors(b[k], T, /*pinned=*/false);
        inputs.push_back(input.to(torch::kInt));
        eb.target.push_back(target.to(torch::kInt));
        eb.accept.push_back(accept_tensor(b[k], T));
        any_accept = any_accept || eb.accept.back().defined();
      }
      // a member without masks among members with them: none of its predictions is in a set
      for (int64_t k = 0; k < K; ++k)
        if (any_accept && !eb.accept[k].defined()) eb.accept[k] = torch::zeros({b[k].B, T}, torch::kLong);
      eb.input = K == 1 ? inputs[0] : torch::stack(inputs, -1);
      batches.push_back(std::move(eb));
    }
  }
  return out;
}

std::vector<EvalRow> evaluate(SequenceModel& model, const Task& task, const EvalSpec& spec,
                              const torch::Device& device, int64_t step) {
  const std::vector<const Task*> tasks{&task};
  return evaluate_members(model, tasks, eval_batches(tasks, spec), spec, device, step).at(0);
}

std::vector<std::vector<EvalRow>> evaluate_members(SequenceModel& model, const std::vector<const Task*>& tasks,
                                                   const EvalBatches& batches, const EvalSpec& spec,
                                                   const torch::Device& device, int64_t step) {
  torch::NoGradGuard ng;
  const int64_t K = static_cast<int64_t>(tasks.size());
  TORCH_CHECK(K == model->members(), "evaluate: one task per member");
  TORCH_CHECK(batches.ranges.size() == spec.ranges.size(), "evaluate: batches of other ranges");
  const bool was_training = model->is_training();
  model->eval();
  std::vector<std::vector<EvalRow>> rows(K);
  Bf16Autocast autocast(spec.bf16 && device.is_cuda());
  auto on_device = [&device](const torch::Tensor& t) {
    return t.to(device, /*non_blocking=*/true).to(torch::kLong);
  };
  for (size_t r = 0; r < spec.ranges.size(); ++r) {
    const LengthRange range = spec.ranges[r];
    auto zero = torch::zeros({}, torch::TensorOptions().dtype(torch::kLong).device(device));
    std::vector<Hits> sum(K, Hits{zero, zero, zero, zero});
    // with mad_average: Σ rows x each batch's mad_accuracy over every scored position and over the last ones
    auto fzero = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat).device(device));
    std::vector<torch::Tensor> mad_all(K, fzero), mad_last(K, fzero);
    for (const EvalBatch& b : batches.ranges[r]) {
      TORCH_CHECK(static_cast<int64_t>(b.target.size()) == K, "evaluate: batches of another pack");
      auto logits = model->forward(on_device(b.input));
      const double rows_b = static_cast<double>(b.input.size(0));
      for (int64_t k = 0; k < K; ++k) {
        auto accept = b.accept[k].defined() ? b.accept[k].to(device, /*non_blocking=*/true) : torch::Tensor();
        const auto lk = K == 1 ? logits : logits.select(2, k);
        const auto tk = on_device(b.target[k]);
        const Hits h = count_hits(lk, tk, accept);
        sum[k] = {sum[k].correct + h.correct, sum[k].count + h.count, sum[k].correct_last + h.correct_last,
                  sum[k].count_last + h.count_last};
        if (spec.mad_average) {
          TORCH_CHECK(!accept.defined(), "evaluate: MAD's average scores single answers, not answer sets");
          mad_all[k] = mad_all[k] + rows_b * mad_accuracy(lk, tk, tk.ge(0));
          mad_last[k] = mad_last[k] + rows_b * mad_accuracy(lk, tk, last_scored(tk));
        }
      }
    }
    auto fraction = [](const torch::Tensor& c, const torch::Tensor& n) {
      const double d = static_cast<double>(n.item<int64_t>());
      return d > 0 ? static_cast<double>(c.item<int64_t>()) / d : 0.0;
    };
    for (int64_t k = 0; k < K; ++k) {
      const Task& task = *tasks[k];
      auto normalise = [&task](double a) { return (a - task.chance()) / (1.0 - task.chance()); };
      EvalRow row;
      row.step = step;
      row.length_min = range.min;
      row.length_max = range.max;
      row.n = spec.n;
      if (spec.mad_average) {
        const double rows = static_cast<double>(spec.n);  // every batch's rows
        row.accuracy_all = mad_all[k].item<double>() / rows;
        row.accuracy = task.running_answer() ? mad_last[k].item<double>() / rows : row.accuracy_all;
      } else {
        row.accuracy_all = fraction(sum[k].correct, sum[k].count);
        row.accuracy = task.running_answer() ? fraction(sum[k].correct_last, sum[k].count_last) : row.accuracy_all;
      }
      row.normalized = normalise(row.accuracy);
      row.normalized_all = normalise(row.accuracy_all);
      rows[k].push_back(row);
    }
  }
  if (was_training) model->train();
  return rows;
}

}  // namespace memlab
