#include "tasks/counting.h"

#include <algorithm>

#include "core/rng.h"

namespace memlab {

namespace {
// The block count n of a^n b^n (c^n) drawn for `range`: L = k*n + 2 within it (see the header).
std::pair<int64_t, int64_t> block_counts(int k, LengthRange r) {
  const int64_t hi = std::max<int64_t>(1, (r.max - 2) / k);
  const int64_t lo = std::min(hi, std::max<int64_t>(1, (r.min - 2 + k - 1) / k));
  return {lo, hi};
}
}  // namespace

std::vector<std::string> CountingLanguageTask::vocab() const {
  std::vector<std::string> v = {"<pad>", "a", "b"};
  if (k_ == 3) v.push_back("c");
  v.insert(v.end(), {"=", "reject", "accept"});
  return v;
}

int64_t CountingLanguageTask::max_input_length(LengthRange range) const {
  return k_ * block_counts(k_, range).second + 1;
}

Example CountingLanguageTask::sample(Split split, uint64_t index, LengthRange r) const {
  Rng rng = make_rng(seed, static_cast<uint64_t>(split), index);
  const auto [lo, hi] = block_counts(k_, r);
  const int64_t n = uniform_int(rng, lo, hi);
  const int64_t equals = k_ + 1, reject = k_ + 2, accept = k_ + 3;
  const bool positive = uniform_int(rng, 0, 1) == 1;
  std::vector<int64_t> count(k_, n);
  // one symbol of block u swapped with one of block v > u; positions are within the sorted string
  auto swap_across_blocks = [&](std::vector<int64_t>& s) {
    const int64_t u = uniform_int(rng, 0, k_ - 2), v = uniform_int(rng, u + 1, k_ - 1);
    std::swap(s[u * n + uniform_int(rng, 0, n - 1)], s[v * n + uniform_int(rng, 0, n - 1)]);
  };
  Example ex;
  auto& s = ex.input;
  if (!positive && uniform_int(rng, 0, 1) == 0) {  // count defect
    const int64_t from = uniform_int(rng, 0, k_ - 1);
    const int64_t to = (from + uniform_int(rng, 1, k_ - 1)) % k_;
    const int64_t d = uniform_int(rng, 1, std::min<int64_t>(3, n));
    count[from] -= d;
    count[to] += d;
  }
  for (int b = 0; b < k_; ++b) s.insert(s.end(), count[b], 1 + b);
  if (!positive && count == std::vector<int64_t>(k_, n)) {  // order defect
    if (uniform_int(rng, 0, 1) == 0) {
      swap_across_blocks(s);
    } else {
      const std::vector<int64_t> sorted = s;
      for (size_t i = s.size() - 1; i > 0; --i) std::swap(s[i], s[uniform_int(rng, 0, static_cast<int64_t>(i))]);
      if (s == sorted) swap_across_blocks(s);
    }
  }
  s.push_back(equals);
  ex.target.assign(s.size(), -1);
  ex.target.back() = positive ? accept : reject;
  return ex;
}

std::vector<std::string> MajorityTask::vocab() const {
  std::vector<std::string> v = {"<pad>"};
  for (int i = 0; i < k_; ++i) v.push_back(std::string(1, static_cast<char>('a' + i)));
  v.push_back("=");
  return v;
}

Example MajorityTask::sample(Split split, uint64_t index, LengthRange r) const {
  Rng rng = make_rng(seed, static_cast<uint64_t>(split), index);
  const int64_t size = uniform_int(rng, r.min, r.max);
  Example ex;
  ex.input.resize(size - 1);
  std::vector<int64_t> count(k_);
  int64_t best = 0;
  for (bool tie = true; tie;) {  // redraw until the top count is unique
    std::fill(count.begin(), count.end(), 0);
    for (int64_t i = 0; i < size - 2; ++i) {
      ex.input[i] = uniform_int(rng, 1, k_);
      ++count[ex.input[i] - 1];
    }
    best = std::max_element(count.begin(), count.end()) - count.begin();
    tie = std::count(count.begin(), count.end(), count[best]) > 1;
  }
  ex.input.back() = k_ + 1;  // '='
  ex.target.assign(size - 1, -1);
  ex.target.back() = 1 + best;
  return ex;
}

}  // namespace memlab
