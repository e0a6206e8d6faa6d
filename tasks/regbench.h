#pragma once
// RegBench (Akyürek et al. 2024, "In-Context Language Learning"): in-context learning of random regular
// languages. Each example is strings of one random automaton; the model predicts the next letter, and a
// prediction is right when the automaton has a transition on it (the "DFA accuracy" of the paper).
//
// Automaton: n = U{min_states..max_states} states, an alphabet of U{min_alphabet..max_alphabet} letters drawn
// from a..r, each state U{1..max_out_degree} out-edges on distinct letters of that alphabet to distinct other
// states (no self-loops), start state 0, every state accepting. It is then trimmed (states unreachable from 0
// dropped) and minimised (partition refinement; a missing transition goes to an implicit rejecting sink, so
// two states are equal when the same strings can be read from them), and renumbered in breadth-first order
// from the start with letters in order: this canonical form identifies the language, and its hash() the
// automaton. The minimal automaton may have self-loops (merged states); out-degrees stay in 1..max_out_degree.
//
// Example: U{min_strings..max_strings} strings joined by '|', each a random walk of U{1..max_string_len}
// letters from the start (next letter uniform among the current state's out-letters). Its length is its token
// count: strings are appended beyond the drawn count while it is shorter than range.min, and it is cut at
// range.max tokens (the defaults, 10..19 strings of 1..49 letters, give 19..949 tokens, so a range [3, 1024]
// leaves them as drawn; the reference cuts its character string at 4096).
// Tokens: 0 "<pad>" (the reference's no-op '.'), 1..18 the letters "a".."r", 19 "|".
// Targets: the next token; -1 where it is '|' or where there is none (the last position).
// accept[t]: the letters (bit 1 + c for letter c) with a transition from the state reached by the current
// string's prefix up to t (from the start at a '|'); evaluation counts argmax right when it is in this set.
//
// Held-out automata: a pool of `heldout` distinct automata, a pure function of the seed. Val draws from its
// first half and Test from the rest (example i uses pool entry i mod the half's size, so eval.n up to 250
// sees distinct automata at the defaults, as the reference's 250/250). Train examples redraw any automaton
// whose hash is in the pool; training automata are not de-duplicated among themselves.
// chance(): the expected DFA accuracy of a uniform guess over the 18 letters (mean of |accept|/18 over scored
// positions), estimated once per task from 1000 examples of a fixed seed; about 0.1 at the defaults.
#include <array>
#include <cstdint>
#include <mutex>
#include <unordered_set>
#include <vector>

#include "core/rng.h"
#include "tasks/task.h"

namespace memlab {

struct RegBenchParams {
  int64_t min_states = 4, max_states = 12;
  int64_t min_alphabet = 4, max_alphabet = 18;
  int64_t max_out_degree = 3;
  int64_t min_strings = 10, max_strings = 19;
  int64_t max_string_len = 49;
  int64_t heldout = 500;
};

// A partial automaton over the letters a..r whose states all accept; state 0 is the start.
struct Dfa {
  static constexpr int kLetters = 18;
  // next[s][c]: the state reached from s on letter c (0 = 'a'), -1 where there is no transition.
  std::vector<std::array<int8_t, kLetters>> next;
  uint32_t alphabet = 0;  // the letters it was drawn over (bit c = letter c)

  int states() const { return static_cast<int>(next.size()); }
  uint32_t out_letters(int s) const;  // bit c set where s has a transition on c
  uint64_t hash() const;              // of the transition table
  bool operator==(const Dfa& o) const { return next == o.next; }
};

// One random automaton as drawn, before trimming and minimisation.
Dfa draw_raw_dfa(Rng& rng, const RegBenchParams& p);
// Trimmed, minimised and renumbered (the canonical form above).
Dfa canonical_dfa(const Dfa& raw);

class RegBenchTask : public Task {
 public:
  static constexpr int64_t kSeparator = 19;

  explicit RegBenchTask(RegBenchParams p = {});
  std::string name() const override { return "regbench"; }
  std::vector<std::string> vocab() const override;
  double chance() const override { return chance_; }
  bool answer_sets() const override { return true; }
  Example sample(Split split, uint64_t index, LengthRange range) const override;
  int64_t max_input_length(LengthRange range) const override { return range.max; }

  // The canonical automaton behind example `index` of `split`.
  Dfa automaton(Split split, uint64_t index) const;
  const RegBenchParams& params() const { return p_; }

 private:
  Example strings(const Dfa& dfa, Rng& rng, LengthRange range) const;
  Dfa draw(Split split, uint64_t index, Rng& rng) const;
  void build_pool() const;  // for the current seed, once

  RegBenchParams p_;
  double chance_ = 0;
  mutable std::mutex mu_;
  mutable bool pool_built_ = false;
  mutable uint64_t pool_seed_ = 0;
  mutable std::vector<Dfa> pool_;
  mutable std::unordered_set<uint64_t> pool_hashes_;
};

}  // namespace memlab
