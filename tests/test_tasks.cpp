// Task generators against independent computations of their answers; determinism; length ranges.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "core/config.h"
#include "tasks/formal_languages.h"
#include "tasks/task.h"
#include "tests/test_batches.h"
#include "train/trainer.h"

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

// Independent evaluation of a bracketed expression (vocab of ModArithBracketsTask) by recursive descent with
// the usual grammar: expr = term {(+|-) term}; term = factor {* factor}; factor = - factor | digit | (expr).
// Residues mod 5 are exact because reduction mod 5 commutes with + - *.
struct BracketParser {
  const std::vector<int64_t>& t;
  size_t i = 0;
  bool ok = true;
  int64_t expr() {
    int64_t v = term();
    while (i < t.size() && (t[i] == 1 || t[i] == 2)) {
      const bool plus = t[i++] == 1;
      const int64_t w = term();
      v = plus ? v + w : v - w;
    }
    return ((v % 5) + 5) % 5;
  }
  int64_t term() {
    int64_t v = factor();
    while (i < t.size() && t[i] == 3) {
      ++i;
      v = v * factor() % 5;
    }
    return v;
  }
  int64_t factor() {
    if (i >= t.size()) return ok = false, 0;
    const int64_t x = t[i++];
    if (x == 2) return (5 - factor()) % 5;
    if (x >= 7 && x <= 11) return x - 7;
    if (x == 4) {
      const int64_t v = expr();
      if (i >= t.size() || t[i++] != 5) ok = false;
      return v;
    }
    ok = false;
    return 0;
  }
};

std::unique_ptr<Task> task_named(const std::string& name, uint64_t seed,
                                 const std::vector<std::pair<std::string, std::string>>& sets = {}) {
  Schema s;
  register_task_keys(s);
  s.add_int("train.seed", 1, "seed", 0);
  Config c(s);
  c.set_value("task.name", name, "test");
  c.set_value("train.seed", std::to_string(seed), "test");
  for (const auto& [k, v] : sets) c.set_value(k, v, "test");
  return make_task(c);
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
    auto ex = t.example(Split::Train, i, t.train_range);  // training targets: the last bit only (default)
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
    // the generator's example carries the parity of every prefix
    auto full = t.sample(Split::Train, i, t.train_range);
    ASSERT_EQ(full.input, ex.input);
    ones = 0;
    for (size_t j = 0; j < full.input.size(); ++j) {
      ones += full.input[j] == 2;
      ASSERT_EQ(full.target[j], (ones % 2 == 0) ? 1 : 2) << "position " << j;
    }
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

TEST(ModArithBrackets, ParserHandExamples) {
  // (3-(-2)) = 5 -> 0;  (2*(1-4)) = -6 -> 4;  -3 -> 2;  (4) -> 4
  auto ev = [](std::vector<int64_t> t) {
    BracketParser p{t};
    const int64_t v = p.expr();
    EXPECT_TRUE(p.ok && p.i == t.size());
    return v;
  };
  EXPECT_EQ(ev({4, 10, 2, 4, 2, 9, 5, 5}), 0);
  EXPECT_EQ(ev({4, 9, 3, 4, 8, 2, 11, 5, 5}), 4);
  EXPECT_EQ(ev({2, 10}), 2);
  EXPECT_EQ(ev({4, 11, 5}), 4);
}

TEST(ModArithBrackets, AnswersLengthsAndStructure) {
  for (bool mult : {false, true}) {
    auto t = task_named("mod_arith_brackets", 17, {{"task.mod_arith_brackets.mult", mult ? "true" : "false"}});
    EXPECT_EQ(t->vocab().size(), 12u);
    EXPECT_EQ(t->vocab()[6], "=");
    EXPECT_DOUBLE_EQ(t->chance(), 0.2);
    std::set<int64_t> sizes;
    std::map<int64_t, int> answers;
    int times = 0, nested = 0;
    const int n = 3000;
    for (uint64_t i = 0; i < n; ++i) {
      auto ex = t->sample(Split::Train, i, {3, 40});
      const int64_t L = static_cast<int64_t>(ex.input.size()) + 1;
      ASSERT_GE(L, 3);
      ASSERT_LE(L, 40);
      sizes.insert(L);
      ASSERT_EQ(ex.input.back(), 6);
      std::vector<int64_t> expr(ex.input.begin(), ex.input.end() - 1);
      int depth = 0, deepest = 0;
      for (auto x : expr) {
        ASSERT_TRUE(x >= 1 && x <= 11 && x != 6);
        depth += (x == 4) - (x == 5);
        ASSERT_GE(depth, 0);
        deepest = std::max(deepest, depth);
        times += x == 3;
      }
      ASSERT_EQ(depth, 0);
      nested += deepest >= 2;
      BracketParser p{expr};
      const int64_t v = p.expr();
      ASSERT_TRUE(p.ok && p.i == expr.size());
      for (size_t j = 0; j + 1 < ex.target.size(); ++j) ASSERT_EQ(ex.target[j], -1);
      ASSERT_EQ(ex.target.back(), 7 + v);
      answers[v]++;
    }
    EXPECT_EQ(sizes.size(), 38u);
    EXPECT_GT(nested, n / 2);
    EXPECT_EQ(times > 0, mult);
    EXPECT_EQ(answers.size(), 5u);
    if (!mult) {  // sums and differences of uniform digits: uniform answers
      for (auto [k, c] : answers) EXPECT_NEAR(c, n / 5, n * 0.04) << k;
    }
    for (uint64_t i = 0; i < 200; ++i) {
      auto ex = t->sample(Split::Val, i, {40, 256});
      ASSERT_GE(ex.input.size() + 1, 40u);
      ASSERT_LE(ex.input.size() + 1, 256u);
      std::vector<int64_t> expr(ex.input.begin(), ex.input.end() - 1);
      BracketParser p{expr};
      const int64_t v = p.expr();
      ASSERT_TRUE(p.ok && p.i == expr.size());
      ASSERT_EQ(ex.target.back(), 7 + v);
    }
  }
}

TEST(SumMod5, LastAndEvery) {
  for (std::string mode : {"last", "every"}) {
    auto t = task_named("sum_mod5", 23, {{"task.sum_mod5.target", mode}});
    EXPECT_EQ(t->vocab(), (std::vector<std::string>{"<pad>", "0", "1", "2", "3", "4"}));
    EXPECT_DOUBLE_EQ(t->chance(), 0.2);
    std::set<int64_t> sizes;
    std::map<int64_t, int> answers;
    const int n = 3000;
    for (uint64_t i = 0; i < n; ++i) {
      auto ex = t->example(Split::Train, i, {3, 40});
      const int64_t L = static_cast<int64_t>(ex.input.size()) + 1;
      ASSERT_GE(L, 3);
      ASSERT_LE(L, 40);
      sizes.insert(L);
      long long total = 0;
      for (size_t j = 0; j < ex.input.size(); ++j) {
        ASSERT_TRUE(ex.input[j] >= 1 && ex.input[j] <= 5);
        total += ex.input[j] - 1;
        const bool scored = mode == "every" || j + 1 == ex.input.size();
        ASSERT_EQ(ex.target[j], scored ? 1 + total % 5 : -1);
      }
      answers[ex.target.back()]++;
    }
    EXPECT_EQ(sizes.size(), 38u);
    for (auto [k, c] : answers) EXPECT_NEAR(c, n / 5, n * 0.04) << k;
  }
}

TEST(Tasks, EveryTaskIsRegisteredWithItsName) {
  const auto names = task_names();
  for (std::string want : {"parity", "mod_arith", "mod_arith_brackets", "sum_mod5", "s3", "s5", "cycle_nav", "anbn",
                           "anbncn", "majority", "mad_recall", "mad_noisy_recall", "mad_fuzzy_recall", "mad_selective_copy",
                           "mad_compression", "mad_memorization", "regbench"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  for (const auto& name : names) EXPECT_EQ(task_named(name, 1)->name(), name);
}

// A task has a task.<name>.target key exactly when it has a running answer, and the key sets what training
// sees: every position of the running answer, or the last one only; evaluation always sees every position.
TEST(Tasks, RunningAnswerTasksHaveTrainingTargetKeys) {
  Schema schema;
  register_task_keys(schema);
  for (const auto& name : task_names()) {
    const bool keyed = schema.find("task." + name + ".target") != nullptr;
    EXPECT_EQ(task_named(name, 1)->running_answer(), keyed) << name;
    if (!keyed) continue;
    for (std::string mode : {"last", "every"}) {
      auto t = task_named(name, 4, {{"task." + name + ".target", mode}});
      for (uint64_t i = 0; i < 50; ++i) {
        const auto full = t->sample(Split::Train, i, t->train_range);
        const auto train = t->example(Split::Train, i, t->train_range);
        const auto val = t->example(Split::Val, i, t->train_range);
        ASSERT_TRUE(std::all_of(full.target.begin(), full.target.end(), [](int64_t y) { return y > 0; })) << name;
        ASSERT_EQ(train.input, full.input) << name;
        ASSERT_EQ(train.target.back(), full.target.back()) << name;
        for (size_t j = 0; j + 1 < train.target.size(); ++j)
          ASSERT_EQ(train.target[j], mode == "every" ? full.target[j] : -1) << name << " " << mode;
        ASSERT_TRUE(std::all_of(val.target.begin(), val.target.end(), [](int64_t y) { return y > 0; })) << name;
      }
    }
  }
}

// one_training_target (which lets training read one position per row) holds exactly where training examples carry
// one target: counted here over every task, in both target modes of the running-answer tasks.
TEST(Tasks, OneTrainingTargetIsWhatTheExamplesCarry) {
  Schema schema;
  register_task_keys(schema);
  std::set<std::string> declared;
  for (const auto& name : task_names()) {
    std::vector<std::string> modes{""};
    if (schema.find("task." + name + ".target")) modes = {"last", "every"};
    for (const auto& mode : modes) {
      auto t = mode.empty() ? task_named(name, 5) : task_named(name, 5, {{"task." + name + ".target", mode}});
      int64_t most = 0;
      for (uint64_t i = 0; i < 100; ++i) {
        const auto ex = t->example(Split::Train, i, t->train_range);
        most = std::max<int64_t>(most, std::count_if(ex.target.begin(), ex.target.end(), [](int64_t y) { return y >= 0; }));
      }
      EXPECT_EQ(t->one_training_target(), most == 1) << name << " " << mode << ": up to " << most << " targets";
      if (t->one_training_target()) declared.insert(name);
    }
  }
  for (std::string want : {"parity", "mod_arith", "mod_arith_brackets", "anbn", "anbncn", "majority", "s3"})
    EXPECT_TRUE(declared.count(want)) << want;
}

TEST(Tasks, VocabCoversEveryToken) {
  for (const auto& name : task_names()) {
    auto t = task_named(name, 3);
    const int64_t V = static_cast<int64_t>(t->vocab().size());
    EXPECT_EQ(t->vocab()[t->pad_id()], "<pad>") << name;
    for (Split split : {Split::Train, Split::Test}) {
      for (uint64_t i = 0; i < 300; ++i) {
        auto ex = t->sample(split, i, t->default_range(split));
        ASSERT_EQ(ex.input.size(), ex.target.size()) << name;
        ASSERT_LE(static_cast<int64_t>(ex.input.size()), t->max_input_length(t->default_range(split))) << name;
        for (auto x : ex.input) ASSERT_TRUE(x > 0 && x < V) << name << ": input token " << x;
        for (auto y : ex.target) ASSERT_TRUE(y == -1 || (y > 0 && y < V)) << name << ": target " << y;
        // answer tasks score the last position; next-token tasks (regbench) have nothing to predict there
        ASSERT_TRUE(std::any_of(ex.target.begin(), ex.target.end(), [](int64_t y) { return y >= 0; }))
            << name << ": no position scored";
        if (!ex.accept.empty()) {  // accept sets: one per position, holding the target where one is scored
          ASSERT_LE(V, 64) << name;
          ASSERT_EQ(ex.accept.size(), ex.input.size()) << name;
          for (size_t j = 0; j < ex.target.size(); ++j)
            if (ex.target[j] >= 0) ASSERT_TRUE((ex.accept[j] >> ex.target[j]) & 1) << name << ": position " << j;
        }
      }
    }
  }
}

TEST(Tasks, DeterministicPerSeedSplitIndex) {
  for (std::string name : task_names()) {
    Schema s;
    register_task_keys(s);
    s.add_int("train.seed", 1, "seed", 0);
    Config c(s);
    c.set_value("task.name", name, "test");
    auto a = make_task(c), b = make_task(c);
    for (uint64_t i = 0; i < 50; ++i) {
      const auto x = a->sample(Split::Train, i, a->train_range), y = b->sample(Split::Train, i, b->train_range);
      EXPECT_EQ(x.input, y.input) << name;
      EXPECT_EQ(x.target, y.target) << name;
    }
    // different split or seed -> different data (a^n b^n has one positive per n, so a few may coincide)
    int same_split = 0, same_seed = 0;
    c.set_value("train.seed", "2", "test");
    auto other = make_task(c);
    for (uint64_t i = 0; i < 50; ++i) {
      const auto x = a->sample(Split::Train, i, {200, 260});
      same_split += x.input == a->sample(Split::Val, i, {200, 260}).input;
      same_seed += x.input == other->sample(Split::Train, i, {200, 260}).input;
    }
    EXPECT_LE(same_split, 4) << name;
    EXPECT_LE(same_seed, 4) << name;
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

TEST(Tasks, FiniteTrainingSetWrapsAround) {
  ParityTask t;
  t.seed = 5;
  t.train_examples = 7;
  auto a = t.batch(Split::Train, 0, 7, {3, 40}), b = t.batch(Split::Train, 14, 7, {3, 40});
  EXPECT_EQ(a.input, b.input);
  EXPECT_EQ(a.target, b.target);
  EXPECT_EQ(t.example(Split::Train, 9, {3, 40}).input, t.sample(Split::Train, 2, {3, 40}).input);
  // evaluation splits are never wrapped
  EXPECT_EQ(t.example(Split::Val, 9, {3, 40}).input, t.sample(Split::Val, 9, {3, 40}).input);
  int distinct = 0;
  for (uint64_t i = 0; i < 7; ++i) distinct += t.example(Split::Train, i, {3, 40}).input != t.sample(Split::Train, i + 7, {3, 40}).input;
  EXPECT_GE(distinct, 5);
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
  const std::vector<std::pair<std::string, uint64_t>> golden = {
      {"mod_arith_brackets", 68821650111438467ULL}, {"sum_mod5", 2647360401429346259ULL},
      {"s3", 13279549569063902941ULL},              {"s5", 6725333761302627468ULL},
      {"cycle_nav", 13806255922022170523ULL},       {"anbn", 4925192908341774910ULL},
      {"anbncn", 7388267182878896880ULL},           {"majority", 4362811527728808127ULL},
      {"mad_recall", 5038652061829448129ULL},       {"mad_noisy_recall", 10706521099638027978ULL},
      {"mad_fuzzy_recall", 5897854580727845057ULL}, {"mad_selective_copy", 11798923497558139099ULL},
      {"mad_compression", 14729409586465110220ULL}, {"mad_memorization", 14442904801626159332ULL},
      {"regbench", 13605470655258093846ULL}};
  for (const auto& [name, want] : golden) EXPECT_EQ(fingerprint(*task_named(name, 1), Split::Test, {40, 256}), want) << name;
}

// Examples made on the worker threads are the examples by index, each task's from its own seed; the batch pads them,
// and a packed step's member batches are each member's batch.
TEST(Tasks, ExamplesAreTheExamplesByIndex) {
  const auto tasks = memlab::testing::seeded_tasks("mod_arith", {1, 2});
  const LengthRange range{3, 40};
  std::vector<std::vector<Example>> ex;
  for (const auto& t : tasks) ex.push_back(t->examples(Split::Train, 5000, 300, range));
  for (size_t k = 0; k < 2; ++k) {
    ASSERT_EQ(ex[k].size(), 300u);
    for (uint64_t i = 0; i < 300; ++i) {
      const Example want = tasks[k]->example(Split::Train, 5000 + i, range);
      EXPECT_EQ(ex[k][i].input, want.input) << "task " << k << ", example " << i;
      EXPECT_EQ(ex[k][i].target, want.target) << "task " << k << ", example " << i;
    }
  }
  EXPECT_NE(ex[0][0].input, ex[1][0].input);  // the seeds differ
  const Batch b = tasks[1]->batch(Split::Train, 5000, 300, range);
  ASSERT_EQ(b.B, 300);
  for (int64_t i = 0; i < b.B; ++i) {
    const auto& e = ex[1][static_cast<size_t>(i)];
    ASSERT_EQ(b.lengths[i], static_cast<int64_t>(e.input.size()));
    EXPECT_TRUE(std::equal(e.input.begin(), e.input.end(), b.input.begin() + i * b.T)) << "row " << i;
    EXPECT_TRUE(std::equal(e.target.begin(), e.target.end(), b.target.begin() + i * b.T)) << "row " << i;
  }
  // a packed step's batches: member k's is task k's own batch (batches of 30 rows: fewer than a chunk per member)
  const auto packed = member_batches({tasks[0].get(), tasks[1].get()}, Split::Train, 5000, 30, range);
  ASSERT_EQ(packed.size(), 2u);
  for (size_t k = 0; k < 2; ++k) {
    const Batch want = tasks[k]->batch(Split::Train, 5000, 30, range);
    EXPECT_EQ(packed[k].T, want.T) << "member " << k;
    EXPECT_EQ(packed[k].input, want.input) << "member " << k;
    EXPECT_EQ(packed[k].target, want.target) << "member " << k;
    EXPECT_EQ(packed[k].lengths, want.lengths) << "member " << k;
  }
}
