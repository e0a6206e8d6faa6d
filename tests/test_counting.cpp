// A^nB^n, A^nB^nC^n and Majority against direct checks of the strings; class balance; hard negatives.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "tasks/counting.h"

using namespace memlab;

namespace {

// Letters of the string before '=' (tokens 1.. map to 'a'..).
std::string letters(const Example& ex) {
  std::string s;
  for (size_t i = 0; i + 1 < ex.input.size(); ++i) s += static_cast<char>('a' + ex.input[i] - 1);
  return s;
}

// Is s = a^n b^n (k = 2) or a^n b^n c^n (k = 3) for some n >= 1, written out directly.
bool in_language(const std::string& s, int k) {
  if (s.empty() || s.size() % k) return false;
  const size_t n = s.size() / k;
  for (size_t i = 0; i < s.size(); ++i)
    if (s[i] != static_cast<char>('a' + i / n)) return false;
  return true;
}

struct NegativeKinds {
  int positive = 0, negative = 0, count_only = 0, order_only = 0;
};

NegativeKinds check_counting(int k, LengthRange r, int samples, Split split = Split::Train) {
  CountingLanguageTask t(k);
  t.seed = 13;
  const auto v = t.vocab();
  const int64_t eq = k + 1, reject = k + 2, accept = k + 3;
  EXPECT_EQ(v.size(), static_cast<size_t>(k + 4));
  EXPECT_EQ(v[eq], "=");
  EXPECT_EQ(v[reject], "reject");
  EXPECT_EQ(v[accept], "accept");
  EXPECT_DOUBLE_EQ(t.chance(), 0.5);
  NegativeKinds kinds;
  for (uint64_t i = 0; i < static_cast<uint64_t>(samples); ++i) {
    auto ex = t.sample(split, i, r);
    const int64_t L = static_cast<int64_t>(ex.input.size()) + 1;
    EXPECT_GE(L, r.min);
    EXPECT_LE(L, r.max);
    EXPECT_LE(L - 1, t.max_input_length(r));
    EXPECT_EQ((L - 2) % k, 0) << "negatives and positives share the lengths k*n + 2";
    EXPECT_EQ(ex.input.back(), eq);
    for (size_t j = 0; j + 1 < ex.input.size(); ++j) EXPECT_TRUE(ex.input[j] >= 1 && ex.input[j] <= k);
    for (size_t j = 0; j + 1 < ex.target.size(); ++j) EXPECT_EQ(ex.target[j], -1);
    const std::string s = letters(ex);
    const bool yes = in_language(s, k);
    EXPECT_EQ(ex.target.back(), yes ? accept : reject) << s;
    if (yes) {
      ++kinds.positive;
      continue;
    }
    ++kinds.negative;
    std::map<char, size_t> count;
    for (char c : s) ++count[c];
    bool counts_right = true;
    for (int b = 0; b < k; ++b) counts_right = counts_right && count['a' + b] == s.size() / k;
    const bool sorted = std::is_sorted(s.begin(), s.end());
    EXPECT_TRUE(counts_right != sorted) << "a negative has exactly one defect: " << s;
    if (sorted) {  // off by at most 3 in every block
      ++kinds.count_only;
      for (int b = 0; b < k; ++b) {
        const long long diff = static_cast<long long>(count['a' + b]) - static_cast<long long>(s.size() / k);
        EXPECT_LE(std::abs(diff), 3) << s;
      }
    }
    if (counts_right) ++kinds.order_only;
  }
  return kinds;
}

void expect_balanced(const NegativeKinds& kinds, int samples) {
  EXPECT_NEAR(kinds.positive, samples / 2, samples * 0.04);
  EXPECT_NEAR(kinds.count_only, samples / 4, samples * 0.04);
  EXPECT_NEAR(kinds.order_only, samples / 4, samples * 0.04);
}

}  // namespace

TEST(Counting, LanguageCheckHandExamples) {
  EXPECT_TRUE(in_language("ab", 2));
  EXPECT_TRUE(in_language("aaabbb", 2));
  EXPECT_FALSE(in_language("aabbb", 2));
  EXPECT_FALSE(in_language("abab", 2));
  EXPECT_FALSE(in_language("ba", 2));
  EXPECT_TRUE(in_language("aabbcc", 3));
  EXPECT_FALSE(in_language("aabcbc", 3));
  EXPECT_FALSE(in_language("aaabcc", 3));
}

TEST(Counting, AnBnAnswersBalanceAndLengths) {
  expect_balanced(check_counting(2, {3, 40}, 4000), 4000);
  expect_balanced(check_counting(2, {128, 128}, 2000), 2000);
  check_counting(2, {512, 512}, 300, Split::Test);
  check_counting(2, {2048, 2048}, 100, Split::Test);
}

TEST(Counting, AnBnCnAnswersBalanceAndLengths) {
  expect_balanced(check_counting(3, {3, 40}, 4000), 4000);
  expect_balanced(check_counting(3, {128, 128}, 2000), 2000);
  check_counting(3, {512, 512}, 300, Split::Test);
  check_counting(3, {2048, 2048}, 100, Split::Test);
}

TEST(Counting, LengthsCoverTheRange) {
  CountingLanguageTask a(2), c(3);
  std::set<int64_t> la, lc;
  for (uint64_t i = 0; i < 2000; ++i) {
    la.insert(a.sample(Split::Train, i, {3, 40}).input.size() + 1);
    lc.insert(c.sample(Split::Train, i, {3, 40}).input.size() + 1);
  }
  EXPECT_EQ(la, (std::set<int64_t>{4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30, 32, 34, 36, 38, 40}));
  EXPECT_EQ(lc, (std::set<int64_t>{5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35, 38}));
  // A range with no length k*n+2 inside gives n = 1, and max_input_length says so.
  auto ex = c.sample(Split::Train, 0, {3, 4});
  EXPECT_EQ(ex.input.size(), 4u);
  EXPECT_EQ(c.max_input_length({3, 4}), 4);
}

TEST(Counting, PositivesAndNegativesShareLengths) {
  // Length is no cue: the mean length of positives and negatives agree.
  CountingLanguageTask t(3);
  t.seed = 2;
  double sum[2] = {0, 0};
  int cnt[2] = {0, 0};
  for (uint64_t i = 0; i < 4000; ++i) {
    auto ex = t.sample(Split::Val, i, {40, 256});
    const int y = ex.target.back() == 6;
    sum[y] += ex.input.size();
    cnt[y]++;
  }
  EXPECT_NEAR(sum[0] / cnt[0], sum[1] / cnt[1], 6.0);
}

TEST(Majority, AnswersTiesAndBalance) {
  for (int k : {2, 4, 7}) {
    MajorityTask t(k);
    t.seed = 4;
    const auto v = t.vocab();
    ASSERT_EQ(v.size(), static_cast<size_t>(k + 2));
    EXPECT_EQ(v[1], "a");
    EXPECT_EQ(v[k + 1], "=");
    EXPECT_DOUBLE_EQ(t.chance(), 1.0 / k);
    std::map<int64_t, int> answers;
    std::set<int64_t> sizes;
    const int samples = 3000;
    for (uint64_t i = 0; i < samples; ++i) {
      auto ex = t.sample(Split::Train, i, {3, 40});
      const int64_t L = static_cast<int64_t>(ex.input.size()) + 1;
      ASSERT_GE(L, 3);
      ASSERT_LE(L, 40);
      sizes.insert(L);
      ASSERT_EQ(ex.input.back(), k + 1);
      std::map<int64_t, int> count;
      for (size_t j = 0; j + 1 < ex.input.size(); ++j) {
        ASSERT_TRUE(ex.input[j] >= 1 && ex.input[j] <= k);
        ++count[ex.input[j]];
      }
      int top = 0, at_top = 0;
      int64_t arg = -1;
      for (auto [s, c] : count) {
        if (c > top) top = c, arg = s, at_top = 1;
        else if (c == top) ++at_top;
      }
      ASSERT_EQ(at_top, 1) << "ties must not occur";
      for (size_t j = 0; j + 1 < ex.target.size(); ++j) ASSERT_EQ(ex.target[j], -1);
      ASSERT_EQ(ex.target.back(), arg);
      answers[arg]++;
    }
    EXPECT_EQ(sizes.size(), 38u);
    ASSERT_EQ(answers.size(), static_cast<size_t>(k));
    for (auto [s, c] : answers) EXPECT_NEAR(c, samples / k, samples * 0.05) << "k=" << k << " symbol " << s;
  }
}

TEST(Counting, DeterministicAndSplitsDiffer) {
  CountingLanguageTask a(3), b(3);
  MajorityTask m(4), m2(4);
  a.seed = b.seed = m.seed = m2.seed = 21;
  int same = 0;
  for (uint64_t i = 0; i < 100; ++i) {
    ASSERT_EQ(a.sample(Split::Train, i, {20, 80}).input, b.sample(Split::Train, i, {20, 80}).input);
    ASSERT_EQ(m.sample(Split::Train, i, {20, 80}).input, m2.sample(Split::Train, i, {20, 80}).input);
    same += m.sample(Split::Train, i, {20, 80}).input == m.sample(Split::Val, i, {20, 80}).input;
  }
  EXPECT_EQ(same, 0);
}
