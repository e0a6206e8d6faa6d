// Task generators against independent computations of their answers; determinism; length ranges.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "core/config.h"
#include "tasks/formal_languages.h"
#include "tasks/task.h"

using namespace memlab;

namespace {

// Independent Mod Arith evaluation: first fold every '*' into its left operand (a rewrite of the token
// list), then evaluate the remaining +/- chain left to right with exact integers, then reduce mod 5.
int64_t eval_independently(std::vector<int64_t> toks) {
  std::vector<long long> vals;
  std::vector<int64_t> ops;
  vals.push_back(toks[0] - 5);
  for (size_t i = 1; i + 1 < toks.size(); i += 2) {
    if (toks[i] == 3) {
      vals.back() = (vals.back() * (toks[i + 1] - 5)) % 1000003;  // exact enough: only the residue mod 5 matters
    } else {
      ops.push_back(toks[i]);
      vals.push_back(toks[i + 1] - 5);
    }
  }
  long long acc = vals[0];
  for (size_t j = 0; j < ops.size(); ++j) acc += (ops[j] == 1 ? 1 : -1) * vals[j + 1];
  return ((acc % 5) + 5) % 5;
}

}  // namespace

TEST(Parity, AnswersLengthsAndVocab) {
  ParityTask t;
  t.seed = 7;
  t.train_range = {3, 40};
  t.eval_range = {40, 256};
  EXPECT_EQ(t.vocab().size(), 3u);
  EXPECT_DOUBLE_EQ(t.chance(), 0.5);
  std::set<int64_t> sizes;
  for (uint64_t i = 0; i < 3000; ++i) {
    auto ex = t.sample(Split::Train, i, t.train_range);
    const int64_t L = static_cast<int64_t>(ex.input.size()) + 1;
    ASSERT_GE(L, 3);
    ASSERT_LE(L, 40);
    sizes.insert(L);
    int ones = 0;
    for (auto x : ex.input) {
      ASSERT_TRUE(x == 1 || x == 2);
      ones += x == 2;
    }
    for (size_t j = 0; j + 1 < ex.target.size(); ++j) ASSERT_EQ(ex.target[j], -1);
    ASSERT_EQ(ex.target.back(), (ones % 2 == 0) ? 1 : 2);
  }
  EXPECT_EQ(sizes.size(), 38u);  // every length 3..40 occurs
  for (uint64_t i = 0; i < 500; ++i) {
    auto ex = t.sample(Split::Val, i, t.eval_range);
    ASSERT_GE(ex.input.size() + 1, 40u);
    ASSERT_LE(ex.input.size() + 1, 256u);
  }
}

TEST(ModArith, AnswersLengthsAndStructure) {
  ModArithTask t;
  t.seed = 11;
  t.train_range = {3, 40};
  t.eval_range = {40, 256};
  EXPECT_EQ(t.vocab().size(), 10u);
  EXPECT_DOUBLE_EQ(t.chance(), 0.2);
  std::set<int64_t> sizes;
  std::map<int64_t, int> answers;
  for (uint64_t i = 0; i < 3000; ++i) {
    auto ex = t.sample(Split::Train, i, t.train_range);
    const int64_t L = static_cast<int64_t>(ex.input.size()) + 1;
    ASSERT_EQ(L % 2, 1);
    ASSERT_GE(L, 3);
    ASSERT_LE(L, 39);
    sizes.insert(L);
    ASSERT_EQ(ex.input.back(), 4);  // '='
    std::vector<int64_t> expr(ex.input.begin(), ex.input.end() - 1);
    for (size_t j = 0; j < expr.size(); ++j) {
      if (j % 2 == 0) ASSERT_TRUE(expr[j] >= 5 && expr[j] <= 9);
      else ASSERT_TRUE(expr[j] >= 1 && expr[j] <= 3);
    }
    ASSERT_EQ(ex.target.back(), 5 + eval_independently(expr));
    answers[ex.target.back()]++;
  }
  EXPECT_EQ(sizes.size(), 19u);  // 3, 5, ..., 39
  EXPECT_EQ(answers.size(), 5u);
  for (uint64_t i = 0; i < 300; ++i) {
    auto ex = t.sample(Split::Val, i, t.eval_range);
    const int64_t L = static_cast<int64_t>(ex.input.size()) + 1;
    ASSERT_GE(L, 39);
    ASSERT_LE(L, 255);
    std::vector<int64_t> expr(ex.input.begin(), ex.input.end() - 1);
    ASSERT_EQ(ex.target.back(), 5 + eval_independently(expr));
  }
}

TEST(ModArith, PrecedenceHandExamples) {
  // 2 + 3 * 4 = 14 -> 4;  4 - 2 * 3 = -2 -> 3;  1 * 2 * 3 - 4 = 2;  3 = 3
  EXPECT_EQ(ModArithTask::evaluate({7, 1, 8, 3, 9}), 4);
  EXPECT_EQ(ModArithTask::evaluate({9, 2, 7, 3, 8}), 3);
  EXPECT_EQ(ModArithTask::evaluate({6, 3, 7, 3, 8, 2, 9}), 2);
  EXPECT_EQ(ModArithTask::evaluate({8}), 3);
}

TEST(Tasks, DeterministicPerSeedSplitIndex) {
  for (std::string name : {"parity", "mod_arith"}) {
    Schema s;
    register_task_keys(s);
    s.add_int("train.seed", 1, "seed", 0);
    Config c(s);
    c.set_value("task.name", name, "test");
    auto a = make_task(c), b = make_task(c);
    for (uint64_t i = 0; i < 50; ++i) {
      EXPECT_EQ(a->sample(Split::Train, i, a->train_range).input, b->sample(Split::Train, i, b->train_range).input);
    }
    // different split or seed -> different data
    int same_split = 0, same_seed = 0;
    c.set_value("train.seed", "2", "test");
    auto other = make_task(c);
    for (uint64_t i = 0; i < 50; ++i) {
      same_split += a->sample(Split::Train, i, {40, 60}).input == a->sample(Split::Val, i, {40, 60}).input;
      same_seed += a->sample(Split::Train, i, {40, 60}).input == other->sample(Split::Train, i, {40, 60}).input;
    }
    EXPECT_EQ(same_split, 0) << name;
    EXPECT_EQ(same_seed, 0) << name;
  }
}

TEST(Tasks, BatchPadsToItsOwnLongest) {
  ParityTask t;
  t.seed = 3;
  auto b = t.batch(Split::Train, 0, 16, {3, 10});
  int64_t longest = 0;
  for (int64_t i = 0; i < 16; ++i) longest = std::max<int64_t>(longest, t.sample(Split::Train, i, {3, 10}).input.size());
  EXPECT_EQ(b.T, longest);
  EXPECT_LE(b.T, 9);
  for (int64_t i = 0; i < b.B; ++i) {
    for (int64_t j = b.lengths[i]; j < b.T; ++j) {
      EXPECT_EQ(b.input[i * b.T + j], 0);
      EXPECT_EQ(b.target[i * b.T + j], -1);
    }
  }
}

// Golden values: the data are a pure function of (seed, split, index) through Boost.Random and must stay the
// same on every machine and across versions; a change here means every earlier result used other data.
TEST(Tasks, GoldenSamplesAreStable) {
  auto fingerprint = [](const Task& t, Split split, LengthRange r) {
    uint64_t h = 1469598103934665603ULL;  // FNV-1a over the tokens of the first 200 examples
    for (uint64_t i = 0; i < 200; ++i) {
      auto ex = t.sample(split, i, r);
      for (auto x : ex.input) h = (h ^ static_cast<uint64_t>(x)) * 1099511628211ULL;
      h = (h ^ static_cast<uint64_t>(ex.target.back() + 100)) * 1099511628211ULL;
    }
    return h;
  };
  ParityTask p;
  p.seed = 1;
  ModArithTask m;
  m.seed = 1;
  EXPECT_EQ(fingerprint(p, Split::Train, {3, 40}), 9208744178914936739ULL);
  EXPECT_EQ(fingerprint(m, Split::Val, {40, 256}), 14921569432983874816ULL);
}
