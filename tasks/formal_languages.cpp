#include "tasks/formal_languages.h"

#include "core/rng.h"

namespace memlab {

Example ParityTask::sample(Split split, uint64_t index, LengthRange r) const {
  Rng rng = make_rng(seed, static_cast<uint64_t>(split), index);
  const int64_t size = uniform_int(rng, r.min, r.max);
  Example ex;
  ex.input.resize(size - 1);
  ex.target.resize(size - 1);
  int64_t ones = 0;
  for (int64_t i = 0; i < size - 1; ++i) {
    ex.input[i] = uniform_int(rng, 1, 2);
    ones += (ex.input[i] == 2);
    ex.target[i] = ones % 2 + 1;
  }
  return ex;
}

namespace {
constexpr int64_t kPlus = 1, kMinus = 2, kTimes = 3, kEquals = 4, kDigit0 = 5, kMod = 5;
}

int64_t ModArithTask::evaluate(const std::vector<int64_t>& expr) {
  // total of finished +/- terms, and the running product of the current term
  int64_t total = 0, term = expr.at(0) - kDigit0, sign = 1;
  for (size_t i = 1; i + 1 < expr.size(); i += 2) {
    const int64_t op = expr[i], x = expr[i + 1] - kDigit0;
    if (op == kTimes) {
      term = term * x % kMod;
    } else {
      total = (total + sign * term) % kMod;
      term = x;
      sign = op == kPlus ? 1 : -1;
    }
  }
  total = (total + sign * term) % kMod;
  return (total + kMod) % kMod;
}

Example ModArithTask::sample(Split split, uint64_t index, LengthRange r) const {
  Rng rng = make_rng(seed, static_cast<uint64_t>(split), index);
  const int64_t hi = (r.max + 1) / 2;
  const int64_t lo = std::min((r.min + 1) / 2, hi);
  const int64_t size = 2 * uniform_int(rng, lo, hi) - 1;  // odd, >= 1
  Example ex;
  ex.input.resize(size - 1);
  for (int64_t i = 0; i + 1 < size - 1; ++i)
    ex.input[i] = (i % 2 == 0) ? kDigit0 + uniform_int(rng, 0, kMod - 1) : uniform_int(rng, kPlus, kTimes);
  if (size >= 3) ex.input[size - 2] = kEquals;
  ex.target.assign(size - 1, -1);
  if (size >= 3) {
    std::vector<int64_t> expr(ex.input.begin(), ex.input.end() - 1);
    ex.target.back() = kDigit0 + evaluate(expr);
  }
  return ex;
}

namespace {
// Token ids of ModArithBracketsTask.
constexpr int64_t kBPlus = 1, kBMinus = 2, kBTimes = 3, kBOpen = 4, kBClose = 5, kBEquals = 6, kBDigit0 = 7;

// Appends an expression of exactly n tokens to `out` and returns its value mod 5 (grammar: see the header).
int64_t bracket_expression(Rng& rng, int64_t n, bool mult, std::vector<int64_t>& out) {
  if (n < 5) {
    const int64_t d = uniform_int(rng, 0, kMod - 1);
    const bool neg = n % 2 == 0, paren = n >= 3;
    if (paren) out.push_back(kBOpen);
    if (neg) out.push_back(kBMinus);
    out.push_back(kBDigit0 + d);
    if (paren) out.push_back(kBClose);
    return neg ? (kMod - d) % kMod : d;
  }
  const int64_t left = uniform_int(rng, 1, n - 4), right = n - 3 - left;
  out.push_back(kBOpen);
  const int64_t a = bracket_expression(rng, left, mult, out);
  const size_t op_at = out.size();
  out.push_back(0);  // operator, drawn after both operands (any fixed order would do)
  const int64_t b = bracket_expression(rng, right, mult, out);
  out.push_back(kBClose);
  const int64_t op = uniform_int(rng, kBPlus, mult ? kBTimes : kBMinus);
  out[op_at] = op;
  if (op == kBPlus) return (a + b) % kMod;
  if (op == kBMinus) return (a - b + kMod) % kMod;
  return a * b % kMod;
}
}  // namespace

Example ModArithBracketsTask::sample(Split split, uint64_t index, LengthRange r) const {
  Rng rng = make_rng(seed, static_cast<uint64_t>(split), index);
  const int64_t size = uniform_int(rng, r.min, r.max);
  Example ex;
  ex.input.reserve(size - 1);
  const int64_t value = bracket_expression(rng, size - 2, mult_, ex.input);
  ex.input.push_back(kBEquals);
  ex.target.assign(size - 1, -1);
  ex.target.back() = kBDigit0 + value;
  return ex;
}

Example SumMod5Task::sample(Split split, uint64_t index, LengthRange r) const {
  Rng rng = make_rng(seed, static_cast<uint64_t>(split), index);
  const int64_t size = uniform_int(rng, r.min, r.max);
  Example ex;
  ex.input.resize(size - 1);
  ex.target.resize(size - 1);
  int64_t sum = 0;
  for (int64_t i = 0; i < size - 1; ++i) {
    const int64_t d = uniform_int(rng, 0, kMod - 1);
    ex.input[i] = 1 + d;
    sum = (sum + d) % kMod;
    ex.target[i] = 1 + sum;
  }
  return ex;
}

}  // namespace memlab
