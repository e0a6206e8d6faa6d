// RegBench: automata as the spec draws them, their canonical minimal forms checked by enumerating strings,
// examples walked again over the automaton, accept sets recomputed, held-out automata kept out of training.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "tasks/regbench.h"

using namespace memlab;

namespace {

int popcount(uint64_t x) { return __builtin_popcountll(x); }

uint32_t letters_from(const Dfa& d, int s) {
  uint32_t m = 0;
  for (int c = 0; c < Dfa::kLetters; ++c) m |= (d.next[s][c] >= 0 ? 1u : 0u) << c;
  return m;
}

// Do the strings readable from state p of a and from state q of b differ within `depth` letters? Enumerates
// every string readable from both, letter by letter.
bool differ(const Dfa& a, int p, const Dfa& b, int q, int depth) {
  if (letters_from(a, p) != letters_from(b, q)) return true;
  if (depth == 0) return false;
  for (int c = 0; c < Dfa::kLetters; ++c)
    if (a.next[p][c] >= 0 && differ(a, a.next[p][c], b, b.next[q][c], depth - 1)) return true;
  return false;
}

std::vector<int> reachable(const Dfa& d) {
  std::vector<int> seen(d.states(), 0), stack{0};
  seen[0] = 1;
  while (!stack.empty()) {
    const int s = stack.back();
    stack.pop_back();
    for (int c = 0; c < Dfa::kLetters; ++c)
      if (d.next[s][c] >= 0 && !seen[d.next[s][c]]) seen[d.next[s][c]] = 1, stack.push_back(d.next[s][c]);
  }
  return seen;
}

Dfa from_edges(int n, const std::vector<std::tuple<int, char, int>>& edges) {
  Dfa d;
  std::array<int8_t, Dfa::kLetters> none;
  none.fill(-1);
  d.next.assign(n, none);
  for (auto [s, c, t] : edges) {
    d.next[s][c - 'a'] = static_cast<int8_t>(t);
    d.alphabet |= 1u << (c - 'a');
  }
  return d;
}

// The same automaton with states 1..n-1 relabelled by a random permutation (0 stays the start).
Dfa relabel(const Dfa& d, Rng& rng) {
  std::vector<int> perm(d.states());
  std::iota(perm.begin(), perm.end(), 0);
  for (int i = d.states() - 1; i > 1; --i) std::swap(perm[i], perm[uniform_int(rng, 1, i)]);
  Dfa out = d;
  for (int s = 0; s < d.states(); ++s)
    for (int c = 0; c < Dfa::kLetters; ++c) out.next[perm[s]][c] = d.next[s][c] < 0 ? -1 : perm[d.next[s][c]];
  return out;
}

// Walks `ex` over `d` from scratch: every string readable, accept sets and targets as documented.
// Returns the string lengths.
std::vector<int> check_walk(const Example& ex, const Dfa& d) {
  std::vector<int> lengths{0};
  EXPECT_EQ(ex.input.size(), ex.target.size());
  EXPECT_EQ(ex.input.size(), ex.accept.size());
  int s = 0;
  for (size_t t = 0; t < ex.input.size(); ++t) {
    const int64_t x = ex.input[t];
    if (x == RegBenchTask::kSeparator) {
      s = 0;
      lengths.push_back(0);
    } else {
      EXPECT_TRUE(x >= 1 && x <= 18) << x;
      const int c = static_cast<int>(x - 1);
      EXPECT_GE(d.next[s][c], 0) << "letter " << c << " not readable at position " << t;
      if (d.next[s][c] < 0) return lengths;
      s = d.next[s][c];
      ++lengths.back();
    }
    uint64_t want = 0;
    for (int c = 0; c < Dfa::kLetters; ++c)
      if (d.next[s][c] >= 0) want |= uint64_t(1) << (c + 1);
    EXPECT_EQ(ex.accept[t], want) << "position " << t;
    const bool last = t + 1 == ex.input.size();
    const int64_t next = last ? -1 : ex.input[t + 1];
    EXPECT_EQ(ex.target[t], last || next == RegBenchTask::kSeparator ? -1 : next) << "position " << t;
    if (ex.target[t] >= 0) EXPECT_TRUE((ex.accept[t] >> ex.target[t]) & 1) << "target outside its accept set";
  }
  return lengths;
}

}  // namespace

TEST(RegBench, Vocab) {
  RegBenchTask t;
  const auto v = t.vocab();
  ASSERT_EQ(v.size(), 20u);
  EXPECT_EQ(v[0], "<pad>");
  EXPECT_EQ(v[1], "a");
  EXPECT_EQ(v[18], "r");
  EXPECT_EQ(v[RegBenchTask::kSeparator], "|");
}

TEST(RegBench, RawAutomataFollowTheSpec) {
  const RegBenchParams p;
  std::set<int> sizes, alphabets, degrees;
  for (uint64_t i = 0; i < 2000; ++i) {
    Rng rng = make_rng(3, 9, i);
    const Dfa d = draw_raw_dfa(rng, p);
    sizes.insert(d.states());
    alphabets.insert(popcount(d.alphabet));
    for (int s = 0; s < d.states(); ++s) {
      std::set<int> targets;
      int out = 0;
      for (int c = 0; c < Dfa::kLetters; ++c) {
        const int t = d.next[s][c];
        if (t < 0) continue;
        ++out;
        ASSERT_TRUE((d.alphabet >> c) & 1) << "edge letter outside the alphabet";
        ASSERT_NE(t, s) << "self-loop";
        ASSERT_TRUE(t >= 0 && t < d.states());
        ASSERT_TRUE(targets.insert(t).second) << "two edges of one state to one target";
      }
      ASSERT_TRUE(out >= 1 && out <= 3) << out;
      degrees.insert(out);
    }
  }
  EXPECT_EQ(*sizes.begin(), 4);
  EXPECT_EQ(*sizes.rbegin(), 12);
  EXPECT_EQ(sizes.size(), 9u);
  EXPECT_EQ(*alphabets.begin(), 4);
  EXPECT_EQ(*alphabets.rbegin(), 18);
  EXPECT_EQ(degrees, (std::set<int>{1, 2, 3}));
}

TEST(RegBench, MinimisationHandExamples) {
  // a 3-cycle on 'a' reads a* from every state: one state with a self-loop
  Dfa cyc = canonical_dfa(from_edges(3, {{0, 'a', 1}, {1, 'a', 2}, {2, 'a', 0}}));
  ASSERT_EQ(cyc.states(), 1);
  EXPECT_EQ(cyc.next[0][0], 0);
  // 0 -a-> 1, 0 -b-> 2; 1 and 2 both read c to 3, 3 reads nothing: 1 and 2 merge; 4 is unreachable
  Dfa m = canonical_dfa(from_edges(5, {{0, 'a', 1}, {0, 'b', 2}, {1, 'c', 3}, {2, 'c', 3}, {4, 'a', 0}}));
  ASSERT_EQ(m.states(), 3);
  EXPECT_EQ(m.next[0][0], 1);
  EXPECT_EQ(m.next[0][1], 1);
  EXPECT_EQ(m.next[1][2], 2);
  EXPECT_EQ(letters_from(m, 2), 0u);
  // 1 reads "b", 2 reads "bb": kept apart; 4 reads "b" like 1: merged with it
  Dfa n = canonical_dfa(from_edges(5, {{0, 'a', 1}, {0, 'b', 2}, {1, 'b', 3}, {2, 'b', 4}, {4, 'b', 3}}));
  ASSERT_EQ(n.states(), 4);
  EXPECT_NE(n.next[0][0], n.next[0][1]);
  EXPECT_EQ(n.next[n.next[0][1]][1], n.next[0][0]);
}

TEST(RegBench, CanonicalFormIsMinimalTrimmedAndEquivalent) {
  const RegBenchParams p;
  int merged = 0, trimmed = 0;
  for (uint64_t i = 0; i < 400; ++i) {
    Rng rng = make_rng(5, 9, i);
    const Dfa raw = draw_raw_dfa(rng, p);
    const Dfa d = canonical_dfa(raw);
    ASSERT_LE(d.states(), raw.states());
    const auto seen = reachable(d);
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), d.states()) << "every state reachable";
    for (int s = 0; s < d.states(); ++s) {
      const int out = popcount(letters_from(d, s));
      EXPECT_TRUE(out >= 1 && out <= 3);
      EXPECT_EQ(letters_from(d, s) & ~raw.alphabet, 0u);
    }
    // minimal: every pair of states reads different strings (an n-state automaton with its sink tells two
    // states apart within n letters)
    for (int a = 0; a < d.states(); ++a)
      for (int b = a + 1; b < d.states(); ++b)
        ASSERT_TRUE(differ(d, a, d, b, d.states())) << "states " << a << " and " << b << " are equivalent";
    // the same language as drawn, for every string up to 10 letters
    EXPECT_FALSE(differ(raw, 0, d, 0, 10));
    // canonical: independent of the state labels, and a fixed point
    const Dfa again = canonical_dfa(relabel(raw, rng));
    EXPECT_TRUE(again == d);
    EXPECT_EQ(again.hash(), d.hash());
    EXPECT_TRUE(canonical_dfa(d) == d);
    const auto raw_seen = reachable(raw);
    trimmed += std::count(raw_seen.begin(), raw_seen.end(), 1) < raw.states();
    merged += d.states() < std::count(raw_seen.begin(), raw_seen.end(), 1);
  }
  EXPECT_GT(trimmed, 20);  // both steps do something on the drawn automata
  EXPECT_GT(merged, 3);
}

TEST(RegBench, ExamplesAreWalksWithTheirAcceptSets) {
  RegBenchTask t;
  t.seed = 7;
  std::set<int> string_lengths, string_counts;
  for (Split split : {Split::Train, Split::Val, Split::Test}) {
    for (uint64_t i = 0; i < 150; ++i) {
      const Example ex = t.sample(split, i, {3, 1024});  // never cut or extended at the defaults
      const auto lengths = check_walk(ex, t.automaton(split, i));
      string_counts.insert(static_cast<int>(lengths.size()));
      for (int len : lengths) {
        ASSERT_TRUE(len >= 1 && len <= 49) << len;
        string_lengths.insert(len);
      }
      ASSERT_EQ(ex.target.back(), -1);
    }
  }
  EXPECT_EQ(*string_counts.begin(), 10);
  EXPECT_EQ(*string_counts.rbegin(), 19);
  EXPECT_EQ(*string_lengths.begin(), 1);
  EXPECT_EQ(*string_lengths.rbegin(), 49);
}

TEST(RegBench, LengthsWithinTheRange) {
  RegBenchTask t;
  t.seed = 2;
  for (LengthRange r : {LengthRange{3, 40}, LengthRange{5, 5}, LengthRange{200, 260}, LengthRange{1500, 2000}}) {
    int extended = 0;
    for (uint64_t i = 0; i < 100; ++i) {
      const Example ex = t.sample(Split::Train, i, r);
      const int64_t n = static_cast<int64_t>(ex.input.size());
      ASSERT_TRUE(n >= r.min && n <= r.max) << n << " outside [" << r.min << ", " << r.max << "]";
      ASSERT_LE(n, t.max_input_length(r));
      const auto lengths = check_walk(ex, t.automaton(Split::Train, i));
      extended += lengths.size() > 19;
      ASSERT_TRUE(std::any_of(ex.target.begin(), ex.target.end(), [](int64_t y) { return y >= 0; }));
    }
    if (r.min >= 1500) EXPECT_EQ(extended, 100) << "more strings of the same automaton fill long ranges";
  }
}

TEST(RegBench, HeldOutAutomataNeverTrain) {
  RegBenchTask t;
  t.seed = 11;
  std::set<uint64_t> val, test;
  for (uint64_t i = 0; i < 250; ++i) {
    val.insert(t.automaton(Split::Val, i).hash());
    test.insert(t.automaton(Split::Test, i).hash());
  }
  EXPECT_EQ(val.size(), 250u);
  EXPECT_EQ(test.size(), 250u);
  for (auto h : val) EXPECT_EQ(test.count(h), 0u) << "val and test share an automaton";
  EXPECT_TRUE(t.automaton(Split::Val, 3) == t.automaton(Split::Val, 253)) << "val cycles through its half";
  for (uint64_t i = 0; i < 3000; ++i) {
    const uint64_t h = t.automaton(Split::Train, i).hash();
    ASSERT_TRUE(!val.count(h) && !test.count(h)) << "training index " << i;
  }
}

TEST(RegBench, HeldOutAutomataAreRedrawnWhereTheyCollide) {
  // tiny automata: the space is small enough that many draws hit the held-out pool
  RegBenchParams p;
  p.min_states = 2;
  p.max_states = 3;
  p.min_alphabet = p.max_alphabet = 2;
  p.max_out_degree = 1;
  p.heldout = 40;
  RegBenchTask t(p);
  t.seed = 4;
  std::set<uint64_t> pool;
  for (uint64_t i = 0; i < 20; ++i) pool.insert(t.automaton(Split::Val, i).hash());
  for (uint64_t i = 0; i < 20; ++i) pool.insert(t.automaton(Split::Test, i).hash());
  ASSERT_EQ(pool.size(), 40u);
  int hits = 0;
  for (uint64_t i = 0; i < 3000; ++i) {
    Rng rng = make_rng(99, 0, i);
    hits += pool.count(canonical_dfa(draw_raw_dfa(rng, p)).hash()) > 0;
    ASSERT_EQ(pool.count(t.automaton(Split::Train, i).hash()), 0u) << "training index " << i;
    check_walk(t.sample(Split::Train, i, {3, 200}), t.automaton(Split::Train, i));
  }
  EXPECT_GT(hits, 30) << "the check above would be vacuous";
}

TEST(RegBench, DeterministicPerSeedSplitIndex) {
  RegBenchTask a, b, c;
  a.seed = b.seed = 1;
  c.seed = 2;
  int same_seed = 0, same_split = 0;
  for (uint64_t i = 0; i < 100; ++i) {
    for (Split s : {Split::Train, Split::Val, Split::Test}) {
      const Example x = a.sample(s, i, {3, 1024}), y = b.sample(s, i, {3, 1024});
      ASSERT_EQ(x.input, y.input);
      ASSERT_EQ(x.target, y.target);
      ASSERT_EQ(x.accept, y.accept);
      same_seed += a.automaton(s, i) == c.automaton(s, i);
    }
    same_split += a.automaton(Split::Val, i) == a.automaton(Split::Test, i);
    same_split += a.automaton(Split::Train, i) == a.automaton(Split::Val, i);
  }
  EXPECT_LE(same_seed, 3);
  EXPECT_EQ(same_split, 0);
  // a seed change after first use rebuilds the pool
  a.seed = 2;
  EXPECT_TRUE(a.automaton(Split::Test, 5) == c.automaton(Split::Test, 5));
}

TEST(RegBench, ChanceIsTheRandomLetterAccuracy) {
  RegBenchTask t;
  t.seed = 8;
  // measured here on other automata (the test split of another seed) than the task's own estimate
  double hits = 0, scored = 0;
  for (uint64_t i = 0; i < 250; ++i) {
    const Example ex = t.sample(Split::Test, i, {3, 1024});
    for (size_t j = 0; j < ex.target.size(); ++j)
      if (ex.target[j] >= 0) hits += popcount(ex.accept[j]) / 18.0, scored += 1;
  }
  EXPECT_NEAR(t.chance(), hits / scored, 0.015);
  EXPECT_GT(t.chance(), 1.0 / 18);
  EXPECT_LT(t.chance(), 3.0 / 18);
}
