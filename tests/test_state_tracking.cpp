// S3/S5 word problems and cycle navigation against answers computed here from explicit permutation arrays.
#include <gtest/gtest.h>

#include <array>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "tasks/state_tracking.h"

using namespace memlab;

namespace {

using Perm = std::vector<int>;

// The elements of S3 written out, in lexicographic order of the one-line notation (element k = token 1+k).
const std::vector<Perm> kS3 = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};

// The elements of S5 by five nested loops over distinct values: lexicographic by construction.
std::vector<Perm> s5_elements() {
  std::vector<Perm> out;
  for (int a = 0; a < 5; ++a)
    for (int b = 0; b < 5; ++b)
      for (int c = 0; c < 5; ++c)
        for (int d = 0; d < 5; ++d)
          for (int e = 0; e < 5; ++e) {
            std::set<int> s = {a, b, c, d, e};
            if (s.size() == 5) out.push_back({a, b, c, d, e});
          }
  return out;
}

// Prefix products as token ids: state(i) = g_t(...g_1(i)), g_1 applied first.
std::vector<int64_t> prefix_products(const std::vector<Perm>& G, const std::vector<int64_t>& tokens) {
  Perm state(G[0].size());
  for (size_t i = 0; i < state.size(); ++i) state[i] = static_cast<int>(i);
  std::vector<int64_t> out;
  for (int64_t t : tokens) {
    const Perm& g = G.at(t - 1);
    for (auto& x : state) x = g[x];
    int64_t k = 0;
    while (G[k] != state) ++k;
    out.push_back(1 + k);
  }
  return out;
}

std::string name_of(const Perm& p) {
  std::string s;
  for (int x : p) s += static_cast<char>('0' + x);
  return s;
}

// Training examples as training sees them under `targets`; evaluation examples always carry every position.
void check_word_problem(int n, const std::vector<Perm>& G, TrainTargets targets, int samples) {
  WordProblemTask t(n);
  t.train_targets = targets;
  t.seed = 5;
  const auto v = t.vocab();
  ASSERT_EQ(v.size(), G.size() + 1);
  EXPECT_EQ(v[0], "<pad>");
  for (size_t k = 0; k < G.size(); ++k) EXPECT_EQ(v[k + 1], name_of(G[k]));
  EXPECT_DOUBLE_EQ(t.chance(), 1.0 / G.size());
  std::map<int64_t, int> answers;
  std::set<int64_t> sizes;
  for (uint64_t i = 0; i < static_cast<uint64_t>(samples); ++i) {
    auto ex = t.example(Split::Train, i, {3, 40});
    const int64_t L = static_cast<int64_t>(ex.input.size()) + 1;
    ASSERT_GE(L, 3);
    ASSERT_LE(L, 40);
    sizes.insert(L);
    ASSERT_EQ(ex.target.size(), ex.input.size());
    for (auto x : ex.input) ASSERT_TRUE(x >= 1 && x <= static_cast<int64_t>(G.size()));
    const auto want = prefix_products(G, ex.input);
    for (size_t j = 0; j < want.size(); ++j) {
      if (targets == TrainTargets::Every || j + 1 == want.size()) ASSERT_EQ(ex.target[j], want[j]) << "position " << j;
      else ASSERT_EQ(ex.target[j], -1);
    }
    for (auto y : ex.target) answers[y] += y >= 0;
  }
  EXPECT_EQ(sizes.size(), 38u);
  // The product of uniform elements is uniform: every class near (scored positions)/|G|.
  int scored = 0;
  for (auto [k, c] : answers) scored += c;
  EXPECT_EQ(scored == samples, targets == TrainTargets::Last);
  answers.erase(-1);
  EXPECT_EQ(answers.size(), G.size());
  const double expect = static_cast<double>(scored) / G.size();
  for (auto [k, c] : answers) {
    EXPECT_GT(c, 0.5 * expect) << k;
    EXPECT_LT(c, 1.6 * expect) << k;
  }
  for (uint64_t i = 0; i < 50; ++i) {  // long evaluation lengths: the running product at every position
    auto ex = t.example(Split::Test, i, {2048, 2048});
    ASSERT_EQ(ex.input.size(), 2047u);
    ASSERT_EQ(ex.target, prefix_products(G, ex.input));
  }
}

}  // namespace

TEST(WordProblem, ConventionHandExample) {
  // "102" (swap 0,1) then "021" (swap 1,2): 0 -> 1 -> 2, 1 -> 0 -> 0, 2 -> 2 -> 1, i.e. "201" = token 5.
  EXPECT_EQ(prefix_products(kS3, {3, 2}), (std::vector<int64_t>{3, 5}));
  // The task agrees on that pair: find an example of two elements with input (3, 2).
  WordProblemTask t(3);
  t.seed = 1;
  bool found = false;
  for (uint64_t i = 0; i < 2000 && !found; ++i) {
    auto ex = t.sample(Split::Train, i, {3, 3});
    if (ex.input == std::vector<int64_t>{3, 2}) {
      EXPECT_EQ(ex.target, (std::vector<int64_t>{3, 5}));
      found = true;
    }
  }
  EXPECT_TRUE(found);
}

TEST(WordProblem, S3LastAndEvery) {
  check_word_problem(3, kS3, TrainTargets::Last, 3000);
  check_word_problem(3, kS3, TrainTargets::Every, 3000);
}

TEST(WordProblem, S5LastAndEvery) {
  const auto G = s5_elements();
  ASSERT_EQ(G.size(), 120u);
  check_word_problem(5, G, TrainTargets::Last, 12000);
  check_word_problem(5, G, TrainTargets::Every, 2000);
}

TEST(WordProblem, DeterministicAndSplitsDiffer) {
  WordProblemTask a(5), b(5);
  a.seed = b.seed = 9;
  int same_split = 0;
  for (uint64_t i = 0; i < 100; ++i) {
    auto x = a.sample(Split::Val, i, {10, 60});
    auto y = b.sample(Split::Val, i, {10, 60});
    ASSERT_EQ(x.input, y.input);
    ASSERT_EQ(x.target, y.target);
    same_split += x.input == a.sample(Split::Test, i, {10, 60}).input;
  }
  EXPECT_EQ(same_split, 0);
}

TEST(CycleNav, AnswersLengthsAndVocab) {
  CycleNavTask t;
  t.seed = 3;
  const auto v = t.vocab();
  ASSERT_EQ(v.size(), 9u);
  EXPECT_EQ(v[1], "stay");
  EXPECT_EQ(v[2], "+1");
  EXPECT_EQ(v[3], "-1");
  EXPECT_EQ(v[4], "p0");
  EXPECT_DOUBLE_EQ(t.chance(), 0.2);
  std::map<int64_t, int> answers;
  std::set<int64_t> sizes;
  for (uint64_t i = 0; i < 3000; ++i) {
    auto ex = t.example(Split::Train, i, {3, 40});  // training targets: the last position only (default)
    const auto full = t.example(Split::Val, i, {3, 40});  // evaluation: the position after every move
    const int64_t L = static_cast<int64_t>(ex.input.size()) + 1;
    ASSERT_GE(L, 3);
    ASSERT_LE(L, 40);
    sizes.insert(L);
    long long up = 0, down = 0;
    for (size_t j = 0; j < full.input.size(); ++j) {
      const int64_t x = full.input[j];
      ASSERT_TRUE(x >= 1 && x <= 3);
      up += x == 2;
      down += x == 3;
      ASSERT_EQ(full.target[j], 4 + (((up - down) % 5) + 5) % 5) << "position " << j;
    }
    up = down = 0;
    for (auto x : ex.input) {
      up += x == 2;
      down += x == 3;
    }
    for (size_t j = 0; j + 1 < ex.target.size(); ++j) ASSERT_EQ(ex.target[j], -1);
    const long long pos = (((up - down) % 5) + 5) % 5;
    ASSERT_EQ(ex.target.back(), 4 + pos);
    answers[ex.target.back()]++;
  }
  EXPECT_EQ(sizes.size(), 38u);
  EXPECT_EQ(answers.size(), 5u);
  for (auto [k, c] : answers) {  // close to uniform over positions once walks are a few steps long
    EXPECT_GT(c, 0.12 * 3000) << k;
    EXPECT_LT(c, 0.30 * 3000) << k;
  }
}
