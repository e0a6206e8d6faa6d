#include "train/length_buckets.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace memlab {

std::vector<int64_t> needed_lengths(const Batch& b) {
  std::vector<int64_t> out(b.B, 1);
  for (int64_t i = 0; i < b.B; ++i)
    for (int64_t j = b.T - 1; j >= 0; --j)
      if (b.target[i * b.T + j] >= 0) {
        out[i] = j + 1;
        break;
      }
  return out;
}

std::vector<LengthBucket> plan_length_buckets(const std::vector<std::vector<int64_t>>& needed, int64_t buckets,
                                              int64_t longest, double margin) {
  if (needed.empty()) throw std::invalid_argument("plan_length_buckets: no batch");
  const int64_t B = static_cast<int64_t>(needed[0].size());
  for (const auto& n : needed)
    if (static_cast<int64_t>(n.size()) != B) throw std::invalid_argument("plan_length_buckets: batches of unequal rows");
  const int64_t N = std::max<int64_t>(1, std::min(buckets, B));
  std::vector<std::vector<int64_t>> sorted = needed;
  for (auto& s : sorted) std::sort(s.begin(), s.end());
  std::vector<LengthBucket> plan;
  int64_t before = 0;
  for (int64_t j = 0; j < N; ++j) {
    const int64_t end = B * (j + 1) / N;  // rows in buckets 0..j
    LengthBucket bk{end - before, longest};
    if (j + 1 < N) {
      const double q = static_cast<double>(end) / static_cast<double>(B);
      const auto extra = static_cast<int64_t>(std::ceil(margin * std::sqrt(static_cast<double>(B) * q * (1 - q))));
      const int64_t rank = end - 1 + extra;
      int64_t len = longest;  // a margin past the batch's last row: no sample backs a shorter length
      if (rank < B) {
        len = 1;
        for (const auto& s : sorted) len = std::max(len, s[rank]);
      }
      bk.len = std::min(len, longest);
    }
    before = end;
    // a bucket as long as the next gains nothing apart from it: the next takes its rows
    if (!plan.empty() && plan.back().len >= bk.len) {
      bk.rows += plan.back().rows;
      plan.pop_back();
    }
    plan.push_back(bk);
  }
  return plan;
}

std::vector<std::vector<int64_t>> assign_length_buckets(const std::vector<int64_t>& needed,
                                                        const std::vector<LengthBucket>& plan) {
  std::vector<int64_t> order(needed.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return needed[a] < needed[b]; });
  std::vector<std::vector<int64_t>> out;
  size_t at = 0;
  for (size_t j = 0; j < plan.size(); ++j) {
    const auto n = static_cast<size_t>(plan[j].rows);
    if (at + n > order.size()) return {};
    // sorted, so the bucket's last row needs the most
    if (j + 1 < plan.size() && n > 0 && needed[order[at + n - 1]] > plan[j].len) return {};
    out.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(at), order.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  }
  if (at != order.size()) return {};
  return out;
}

std::string describe_length_buckets(const std::vector<LengthBucket>& plan) {
  std::string out;
  for (const auto& bk : plan)
    out += (out.empty() ? "" : ", ") + std::to_string(bk.rows) + " to " + std::to_string(bk.len);
  return out;
}

}  // namespace memlab
