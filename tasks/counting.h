#pragma once
// Counting tasks of the subquadratic paper (App. F.4): A^nB^n, A^nB^nC^n (accept/reject) and Majority.
// The paper leaves their formats open; the choices are documented here and in the vocab names.
#include "tasks/task.h"

namespace memlab {

// Membership in a^n b^n (k = 2, "anbn") or a^n b^n c^n (k = 3, "anbncn"), n >= 1.
// Example: a string of k*n symbols, then '=', the answer scored at '='. Length L counts the answer slot,
// so L = k*n + 2 (128, 512 and 2048 are all of this form for k = 2 and 3); n is uniform over the values
// whose L lies in the range (a range holding none gives the nearest n >= 1 below its max, or n = 1).
// Tokens: 0 pad, then "a", "b" (, "c"), "=", "reject", "accept".
// Classes are balanced (accept with probability 1/2). Every negative has the same length k*n as a positive,
// so length is no cue, and each is one of two kinds with probability 1/2:
//  - count: the blocks stay in order but two of them (a pair of distinct blocks, uniform) are off by
//    d = U{1, min(3, n)}: d symbols move from one block to the other (e.g. a^(n+1) b^(n-1)); rejecting
//    needs exact counts, not order;
//  - order: every symbol occurs exactly n times but not in order: either one symbol of one block swapped
//    with one of a later block (a single local defect, e.g. a^(n-1) b a b^(n-1)) or a uniform shuffle
//    (probability 1/2 each); rejecting needs order, not counts.
// A model that checks only counts or only order scores 75%.
class CountingLanguageTask : public Task {
 public:
  explicit CountingLanguageTask(int k) : k_(k) {}
  std::string name() const override { return k_ == 2 ? "anbn" : "anbncn"; }
  bool single_answer() const override { return true; }
  std::vector<std::string> vocab() const override;
  double chance() const override { return 0.5; }
  Example sample(Split split, uint64_t index, LengthRange range) const override;
  int64_t max_input_length(LengthRange range) const override;

 private:
  int k_;
};

// Majority: the most frequent symbol of a string over an alphabet of task.majority.symbols letters
// (default 4: the paper does not give it, and its reported 0.268 for Gated DeltaNet at length 2048 is below
// chance for 2 or 3 symbols but just above it for 4). Symbols are uniform; strings whose top count is shared
// by two symbols are redrawn (ties never occur), so the answer is uniform over the symbols.
// Example: a string of L-2 symbols, then '=', the answer scored at '='. Tokens: 0 pad, 1..k symbols "a",
// "b", ..., then "="; the answer reuses the symbol tokens.
class MajorityTask : public Task {
 public:
  explicit MajorityTask(int symbols = 4) : k_(symbols) {}
  std::string name() const override { return "majority"; }
  bool single_answer() const override { return true; }
  std::vector<std::string> vocab() const override;
  double chance() const override { return 1.0 / k_; }
  Example sample(Split split, uint64_t index, LengthRange range) const override;

 private:
  int k_;
};

}  // namespace memlab
