// The MAD tasks against answers rebuilt from each example itself (key->value pairs read back from the
// tokens, the copied tokens as the non-blank ones, ...), token names from vocab(); lengths; train vs
// evaluation targets; the fixed memorisation map; config errors.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>

#include "core/config.h"
#include "core/errors.h"
#include "tasks/mad.h"

using namespace memlab;

namespace {

const Schema& schema() {
  static const Schema s = [] {
    Schema x;
    register_task_keys(x);
    x.add_int("train.seed", 1, "seed", 0);
    return x;
  }();
  return s;
}

Config mad_config(const std::string& name, uint64_t seed, const std::vector<std::pair<std::string, std::string>>& sets) {
  Config c(schema());
  c.set_value("task.name", name, "test");
  c.set_value("train.seed", std::to_string(seed), "test");
  for (const auto& [k, v] : sets) c.set_value(k, v, "test");
  return c;
}

std::unique_ptr<Task> mad(const std::string& name, uint64_t seed = 1,
                          const std::vector<std::pair<std::string, std::string>>& sets = {}) {
  return make_task(mad_config(name, seed, sets));
}

// Token classes by vocab name: 'k' key, 'v' value, 'n' noise, 't' plain token, else the name itself.
struct Names {
  std::vector<std::string> v;
  explicit Names(const Task& t) : v(t.vocab()) {}
  char cls(int64_t id) const { return v.at(id).size() > 1 && isdigit(v[id][1]) ? v[id][0] : '?'; }
  bool is(int64_t id, const std::string& name) const { return v.at(id) == name; }
  int count(char c) const {
    int n = 0;
    for (size_t i = 1; i < v.size(); ++i) n += cls(i) == c;
    return n;
  }
};

// The whole sequence an example was cut from: its input and the token after it (the last target, which
// every recall-type example scores in both splits).
std::vector<int64_t> whole(const Example& ex) {
  auto s = ex.input;
  s.push_back(ex.target.back());
  return s;
}

void expect_next_token_targets(const Example& ex) {
  const auto s = whole(ex);
  for (size_t j = 0; j < ex.target.size(); ++j) ASSERT_EQ(ex.target[j], s[j + 1]) << "train target " << j;
}

// Recall and noisy recall: reads the (key, value) pairs back, checks the map is a function, and that
// exactly the values of keys seen before (multi-query) or only the final probe are scored.
struct RecallStats {
  int pairs = 0, noise_pairs = 0, scored = 0;
};
RecallStats check_recall(const Task& t, const Example& ex, bool train, bool multi) {
  RecallStats st;
  const Names nm(t);
  const auto s = whole(ex);
  if (train) {
    expect_next_token_targets(ex);
    return st;
  }
  const size_t n = s.size(), probe = n - 2;
  if (!multi) EXPECT_TRUE(nm.is(s[n - 3], "copy"));
  const size_t context_end = multi ? probe : n - 3;
  EXPECT_EQ(context_end % 2, 0u);
  std::map<int64_t, int64_t> value_of;
  std::vector<int64_t> want(n, -1);  // scored token per position of s
  for (size_t i = 0; i < context_end; i += 2) {
    if (nm.cls(s[i]) == 'n') {
      EXPECT_EQ(nm.cls(s[i + 1]), 'n');
      ++st.noise_pairs;
      continue;
    }
    EXPECT_EQ(nm.cls(s[i]), 'k');
    EXPECT_EQ(nm.cls(s[i + 1]), 'v');
    ++st.pairs;
    auto it = value_of.find(s[i]);
    if (it != value_of.end()) {
      EXPECT_EQ(it->second, s[i + 1]) << "a key maps to one value within a sequence";
      if (multi) want[i + 1] = s[i + 1];
    }
    value_of[s[i]] = s[i + 1];
  }
  EXPECT_GE(st.pairs, 1) << "at least one real pair";
  EXPECT_TRUE(value_of.count(s[probe])) << "the probe's key appeared before";
  EXPECT_EQ(value_of[s[probe]], s[probe + 1]);
  want[probe + 1] = s[probe + 1];
  for (size_t j = 0; j < ex.target.size(); ++j) {
    EXPECT_EQ(ex.target[j], want[j + 1]) << "eval target at " << j;
    st.scored += ex.target[j] >= 0;
  }
  return st;
}

// Fuzzy recall: runs of key tokens followed by runs of value tokens, after a left padding.
struct FuzzyStats {
  std::set<size_t> key_sizes, value_sizes;
};
void check_fuzzy(const Task& t, const Example& ex, bool train, bool multi, int64_t m, FuzzyStats& st) {
  const Names nm(t);
  const auto s = whole(ex);
  if (train) expect_next_token_targets(ex);
  size_t i = 0;
  while (i < s.size() && nm.is(s[i], "pad")) ++i;
  struct Pair {
    std::vector<int64_t> k, v;
    size_t v_at;
  };
  std::vector<Pair> pairs;
  size_t copy_at = 0;
  while (i < s.size()) {
    if (nm.is(s[i], "copy")) {
      copy_at = i++;
      continue;
    }
    Pair p;
    while (i < s.size() && nm.cls(s[i]) == 'k') p.k.push_back(s[i++]);
    p.v_at = i;
    while (i < s.size() && nm.cls(s[i]) == 'v') p.v.push_back(s[i++]);
    ASSERT_FALSE(p.k.empty());
    ASSERT_FALSE(p.v.empty());
    for (auto* motif : {&p.k, &p.v}) {
      ASSERT_LE(static_cast<int64_t>(motif->size()), m);
      EXPECT_EQ(std::set<int64_t>(motif->begin(), motif->end()).size(), motif->size()) << "distinct tokens";
    }
    if (!train) EXPECT_EQ(static_cast<int64_t>(p.k.size()), m) << "evaluation keys have the maximal size";
    st.key_sizes.insert(p.k.size());
    st.value_sizes.insert(p.v.size());
    pairs.push_back(p);
  }
  ASSERT_GE(pairs.size(), 2u);
  if (!multi) EXPECT_EQ(copy_at + 1 + pairs.back().k.size(), pairs.back().v_at);
  std::map<std::vector<int64_t>, std::vector<int64_t>> value_of;
  std::vector<int64_t> want(s.size(), -1);
  for (size_t p = 0; p < pairs.size(); ++p) {
    const auto& pr = pairs[p];
    auto it = value_of.find(pr.k);
    const bool last = p + 1 == pairs.size();
    if (last) EXPECT_NE(it, value_of.end()) << "the probe's key appeared before";
    if (it != value_of.end()) {
      EXPECT_EQ(it->second, pr.v) << "a key maps to one value within a sequence";
      if (multi || last)
        for (size_t j = 0; j < pr.v.size(); ++j) want[pr.v_at + j] = pr.v[j];
    }
    value_of[pr.k] = pr.v;
  }
  if (!train)
    for (size_t j = 0; j < ex.target.size(); ++j) EXPECT_EQ(ex.target[j], want[j + 1]) << "eval target at " << j;
}

}  // namespace

TEST(Mad, RecallPairsAndScoring) {
  for (bool multi : {true, false}) {
    auto t = mad("mad_recall", 3, {{"task.mad.multi_query", multi ? "true" : "false"}});
    const Names nm(*t);
    EXPECT_EQ(t->vocab().size(), 17u);
    EXPECT_EQ(nm.count('k'), multi ? 8 : 7);
    EXPECT_EQ(nm.count('v'), multi ? 8 : 8);
    EXPECT_DOUBLE_EQ(t->chance(), 1.0 / 8);
    const LengthRange r{128, 128};
    EXPECT_EQ(t->max_input_length(r), multi ? 127 : 128);
    int scored = 0;
    for (uint64_t i = 0; i < 200; ++i) {
      for (Split split : {Split::Train, Split::Test}) {
        auto ex = t->sample(split, i, r);
        ASSERT_EQ(static_cast<int64_t>(ex.input.size()), t->max_input_length(r));
        const auto st = check_recall(*t, ex, split == Split::Train, multi);
        if (split == Split::Test) {
          EXPECT_EQ(st.pairs, 63);
          scored += st.scored;
        }
      }
    }
    // with 8 keys over 63 pairs, nearly every value repeats a key (multi-query); one probe otherwise
    if (multi) EXPECT_GT(scored, 200 * 50);
    else EXPECT_EQ(scored, 200);
  }
}

TEST(Mad, RecallLengthsFromTheRange) {
  auto t = mad("mad_recall");
  std::set<size_t> sizes;
  for (uint64_t i = 0; i < 400; ++i) {
    auto ex = t->sample(Split::Val, i, {20, 41});
    const int64_t L = ex.input.size() + 1;
    ASSERT_EQ(L % 2, 0);
    ASSERT_GE(L, 20);
    ASSERT_LE(L, 40);
    sizes.insert(L);
    check_recall(*t, ex, false, true);
  }
  EXPECT_EQ(sizes.size(), 11u);  // 20, 22, ..., 40
  EXPECT_EQ(t->max_input_length({20, 41}), 39);
  // a range below the minimum gives the minimum (one pair and the probe)
  EXPECT_EQ(t->sample(Split::Val, 0, {3, 3}).input.size(), 3u);
}

TEST(Mad, NoisyRecallNeverScoresNoise) {
  for (double frac : {0.2, 0.8}) {
    auto t = mad("mad_noisy_recall", 5, {{"task.mad.frac_noise", std::to_string(frac)}});
    const Names nm(*t);
    EXPECT_EQ(t->vocab().size(), 33u);
    EXPECT_EQ(nm.count('n'), 16);
    EXPECT_EQ(nm.count('k'), 8);
    int pairs = 0, noise = 0;
    for (uint64_t i = 0; i < 300; ++i) {
      auto ex = t->sample(Split::Test, i, {128, 128});
      const auto st = check_recall(*t, ex, false, true);
      pairs += st.pairs;
      noise += st.noise_pairs;
      for (size_t j = 0; j < ex.target.size(); ++j)
        if (ex.target[j] >= 0) ASSERT_EQ(nm.cls(ex.target[j]), 'v');
      check_recall(*t, t->sample(Split::Train, i, {128, 128}), true, true);
    }
    // every pair but the guaranteed real one is noise with probability frac
    EXPECT_NEAR(static_cast<double>(noise) / (pairs + noise), frac * 62 / 63, 0.02);
  }
  // nearly all noise over 3 pairs: still always one real pair
  auto t = mad("mad_noisy_recall", 5, {{"task.mad.frac_noise", "0.95"}});
  for (uint64_t i = 0; i < 300; ++i) check_recall(*t, t->sample(Split::Val, i, {8, 8}), false, true);
}

TEST(Mad, FuzzyRecallMotifsAndScoring) {
  for (bool multi : {true, false}) {
    auto t = mad("mad_fuzzy_recall", 7, {{"task.mad.multi_query", multi ? "true" : "false"}});
    const Names nm(*t);
    EXPECT_EQ(nm.count('k'), multi ? 7 : 7);
    EXPECT_EQ(nm.count('v'), multi ? 8 : 7);
    EXPECT_EQ(t->max_input_length({128, 128}), 128);
    FuzzyStats train, test;
    for (uint64_t i = 0; i < 300; ++i) {
      auto a = t->sample(Split::Train, i, {128, 128}), b = t->sample(Split::Test, i, {128, 128});
      ASSERT_EQ(a.input.size(), 128u);
      ASSERT_EQ(b.input.size(), 128u);
      check_fuzzy(*t, a, true, multi, 3, train);
      check_fuzzy(*t, b, false, multi, 3, test);
    }
    EXPECT_EQ(train.key_sizes, (std::set<size_t>{1, 2, 3}));
    EXPECT_EQ(test.key_sizes, (std::set<size_t>{3}));
    EXPECT_EQ(test.value_sizes, (std::set<size_t>{1, 2, 3}));
  }
  // the shortest sequences still hold the probe pair before the final query
  auto t = mad("mad_fuzzy_recall", 7, {{"task.train_len", "[13, 20]"}});
  FuzzyStats st;
  for (uint64_t i = 0; i < 500; ++i) check_fuzzy(*t, t->sample(Split::Val, i, {13, 16}), false, true, 3, st);
}

TEST(Mad, SelectiveCopyTargetsAreTheTokensInOrder) {
  for (int64_t n : {16, 5}) {
    auto t = mad("mad_selective_copy", 9, {{"task.mad.copy", std::to_string(n)}});
    const Names nm(*t);
    EXPECT_EQ(nm.count('t'), 14);
    EXPECT_DOUBLE_EQ(t->chance(), 1.0 / 14);
    std::set<std::vector<int64_t>> layouts;
    for (uint64_t i = 0; i < 300; ++i) {
      for (Split split : {Split::Train, Split::Test}) {
        auto ex = t->sample(split, i, {256, 256});
        ASSERT_EQ(ex.input.size(), 256u);
        const size_t copy_at = 256 - n - 1;
        ASSERT_TRUE(nm.is(ex.input[copy_at], "copy"));
        std::vector<int64_t> tokens, blanks;
        for (size_t j = 0; j < copy_at; ++j) {
          if (nm.is(ex.input[j], "blank")) blanks.push_back(j);
          else tokens.push_back(ex.input[j]);
        }
        EXPECT_FALSE(nm.is(ex.input[copy_at - 1], "blank"));  // MAD never puts a blank after the last token
        for (size_t j = copy_at + 1; j < 256; ++j) ASSERT_TRUE(nm.is(ex.input[j], "blank"));
        ASSERT_EQ(static_cast<int64_t>(tokens.size()), n);
        for (auto x : tokens) ASSERT_EQ(nm.cls(x), 't');
        std::vector<int64_t> want(256 - n, -1);
        want.insert(want.end(), tokens.begin(), tokens.end());
        ASSERT_EQ(ex.target, want);
        layouts.insert(blanks);
      }
    }
    EXPECT_GT(layouts.size(), 500u);  // blanks are placed anew for every example
  }
}

TEST(Mad, CompressionTargetsAreTheInputs) {
  auto t = mad("mad_compression", 2, {{"task.mad.vocab", "8"}});
  const Names nm(*t);
  EXPECT_EQ(nm.count('t'), 7);
  for (uint64_t i = 0; i < 300; ++i) {
    auto ex = t->sample(Split::Val, i, {32, 32});
    ASSERT_EQ(ex.input.size(), 32u);
    EXPECT_EQ(ex.target, ex.input);
    EXPECT_TRUE(nm.is(ex.input.back(), "compress"));
    for (size_t j = 0; j + 1 < ex.input.size(); ++j) ASSERT_EQ(nm.cls(ex.input[j]), 't');
  }
}

TEST(Mad, MemorizationUsesOneFixedMapForEverySeedAndSplit) {
  std::map<int64_t, int64_t> value_of;  // key id -> value id over all runs
  for (uint64_t seed : {1, 2, 3}) {
    auto t = mad("mad_memorization", seed);
    const Names nm(*t);
    EXPECT_EQ(nm.count('k'), 127);
    EXPECT_EQ(nm.count('v'), 128);
    EXPECT_TRUE(nm.is(256, "insert"));
    for (Split split : {Split::Train, Split::Val, Split::Test}) {
      for (uint64_t i = 0; i < 200; ++i) {
        auto ex = t->sample(split, i, {32, 32});
        ASSERT_EQ(ex.input.size(), 32u);
        for (size_t j = 0; j < 32; j += 2) {
          ASSERT_EQ(nm.cls(ex.input[j]), 'k');
          ASSERT_TRUE(nm.is(ex.input[j + 1], "insert"));
          ASSERT_EQ(ex.target[j], -1);
          ASSERT_EQ(nm.cls(ex.target[j + 1]), 'v');
          auto [it, fresh] = value_of.emplace(ex.input[j], ex.target[j + 1]);
          ASSERT_EQ(it->second, ex.target[j + 1]) << "one value per key, in every seed and split";
        }
      }
    }
  }
  EXPECT_EQ(value_of.size(), 127u);
  std::set<int64_t> values;
  for (auto [k, v] : value_of) values.insert(v);
  EXPECT_EQ(values.size(), 127u) << "distinct keys get distinct values";
  // another map seed gives another map
  auto other = mad("mad_memorization", 1, {{"task.mad.map_seed", "7"}});
  int same = 0;
  for (uint64_t i = 0; i < 50; ++i) {
    auto ex = other->sample(Split::Train, i, {32, 32});
    for (size_t j = 0; j < 32; j += 2) same += value_of[ex.input[j]] == ex.target[j + 1];
  }
  EXPECT_LT(same, 50);
}

TEST(Mad, TrainingSetWrapsAndSeedsDiffer) {
  for (const auto& name : mad_task_names()) {
    auto t = mad(name, 4, {{"task.train_examples", "10"}});
    const LengthRange r = {64, 64};
    EXPECT_EQ(t->example(Split::Train, 23, r).input, t->sample(Split::Train, 3, r).input) << name;
    EXPECT_EQ(t->example(Split::Train, 23, r).target, t->sample(Split::Train, 3, r).target) << name;
    EXPECT_EQ(t->example(Split::Test, 23, r).input, t->sample(Split::Test, 23, r).input) << name;
    auto again = mad(name, 4);
    EXPECT_EQ(again->sample(Split::Val, 5, r).input, t->sample(Split::Val, 5, r).input) << name;
    EXPECT_NE(mad(name, 5)->sample(Split::Val, 5, r).input, t->sample(Split::Val, 5, r).input) << name;
  }
}

TEST(Mad, ImpossibleSettingsFailWithOneLine) {
  auto message = [](const std::string& name, std::vector<std::pair<std::string, std::string>> sets) {
    try {
      make_task(mad_config(name, 1, sets));
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("mad_recall", {{"task.mad.vocab", "1"}}).find("task.mad.vocab"), std::string::npos);
  EXPECT_NE(message("mad_noisy_recall", {{"task.mad.vocab", "17"}}).find("task.mad.vocab"), std::string::npos);
  EXPECT_NE(message("mad_fuzzy_recall", {{"task.mad.vocab", "6"}}).find("task.mad.motif"), std::string::npos);
  EXPECT_NE(message("mad_noisy_recall", {{"task.mad.frac_noise", "1"}}).find("task.mad.frac_noise"), std::string::npos);
  const auto copy = message("mad_selective_copy", {{"task.mad.copy", "32"}, {"task.train_len", "[40, 60]"}});
  EXPECT_NE(copy.find("task.train_len"), std::string::npos) << copy;
  EXPECT_NE(copy.find(">= 66"), std::string::npos) << copy;
  EXPECT_EQ(message("mad_selective_copy", {{"task.mad.copy", "32"}, {"task.train_len", "[66, 66]"},
                                           {"task.eval_len", "[66, 66]"}}),
            "no error");
}
