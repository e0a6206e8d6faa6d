#pragma once
// State tracking: word problems of the symmetric groups S3 and S5 (Merrill et al.; the subquadratic paper's
// S3 task) and cycle navigation (Deletang et al.).
#include <array>

#include "tasks/task.h"

namespace memlab {

// Word problem of S_n (n = 3 or 5): a sequence of group elements; the answer is their product.
// Elements are the permutations of {0..n-1} in lexicographic order of their one-line notation; element k
// is token 1+k and is named by that notation ("012" is the identity of S3, token 1). Token 0 is pad.
// Product convention: after reading g_1..g_t the state is the permutation p_t with
// p_t(i) = g_t(g_{t-1}(...g_1(i))), i.e. g_1 is applied first (left to right, as sympy's g_1*g_2*...*g_t).
// The answer reuses the element tokens (1 + index of p_t). Length L counts the answer slot: L-1 elements.
// The target at element t is p_t (the headline: the whole product, at the last element);
// task.<s3|s5>.target picks what training sees: last, or every (the word-problem protocol).
class WordProblemTask : public Task {
 public:
  explicit WordProblemTask(int n);
  std::string name() const override { return n_ == 3 ? "s3" : "s5"; }
  bool running_answer() const override { return true; }
  std::vector<std::string> vocab() const override;
  double chance() const override { return 1.0 / static_cast<double>(perms_.size()); }
  Example sample(Split split, uint64_t index, LengthRange range) const override;

 private:
  int n_;
  std::vector<std::array<int, 5>> perms_;  // one-line notation; entries past n_ unused
  std::vector<int64_t> then_;               // then_[a * |G| + b] = index of "apply a, then b"
};

// Cycle navigation (Deletang et al.): an agent starts at position 0 of a cycle of 5 positions and reads
// moves stay / +1 / -1 (uniform); the answer is its final position (the headline, at the last move), and the
// position after each move is the target at that move (task.cycle_nav.target picks what training sees).
// Tokens: 0 pad, 1 "stay", 2 "+1", 3 "-1", 4..8 positions "p0".."p4". Length L counts the answer slot:
// L-1 moves.
class CycleNavTask : public Task {
 public:
  std::string name() const override { return "cycle_nav"; }
  bool running_answer() const override { return true; }
  std::vector<std::string> vocab() const override {
    return {"<pad>", "stay", "+1", "-1", "p0", "p1", "p2", "p3", "p4"};
  }
  double chance() const override { return 0.2; }
  Example sample(Split split, uint64_t index, LengthRange range) const override;
};

}  // namespace memlab
