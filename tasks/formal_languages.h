#pragma once
// Regular-language tasks of Deletang et al. as used by Grazzi et al. and the HQLT paper.
#include "tasks/task.h"

namespace memlab {

// Parity: bits, answer = parity of the number of 1s, the headline scored at the last bit; the running
// answer (parity of the prefix) is the target at every bit (task.parity.target picks what training sees).
// Tokens: 0 pad, 1 bit "0", 2 bit "1"; the answer reuses 1 = even, 2 = odd.
// Length L counts the answer slot: an example has L-1 input bits.
class ParityTask : public Task {
 public:
  std::string name() const override { return "parity"; }
  bool running_answer() const override { return true; }
  std::vector<std::string> vocab() const override { return {"<pad>", "0", "1"}; }
  double chance() const override { return 0.5; }
  Example sample(Split split, uint64_t index, LengthRange range) const override;
};

// Modular arithmetic mod 5 without brackets: "n op n op ... n =", `*` before `+`/`-`, left to right.
// Tokens: 0 pad, 1 '+', 2 '-', 3 '*', 4 '=', 5..9 digits 0..4. Lengths are odd: L = 2*U{(min+1)/2, (max+1)/2} - 1
// counts the answer slot, so the input is the expression and '=' (L-1 tokens), answer scored at '='.
class ModArithTask : public Task {
 public:
  std::string name() const override { return "mod_arith"; }
  bool single_answer() const override { return true; }
  std::vector<std::string> vocab() const override { return {"<pad>", "+", "-", "*", "=", "0", "1", "2", "3", "4"}; }
  double chance() const override { return 0.2; }
  Example sample(Split split, uint64_t index, LengthRange range) const override;
  // Value of tokens (digits and + - *) mod 5 with the usual precedence.
  static int64_t evaluate(const std::vector<int64_t>& expr);
};

// Modular arithmetic mod 5 with brackets (Deletang et al.'s grammar, as in Grazzi et al.'s generator).
// An expression of exactly n tokens is: n=1 "d"; n=2 "-d"; n=3 "(d)"; n=4 "(-d)"; n>=5 "(A op B)" with |A|
// uniform in [1, n-4], |B| = n-3-|A|, A and B generated the same way, op uniform over + and - (and * when
// task.mod_arith_brackets.mult is true; default false, the generators' default). Digits are uniform in 0..4.
// Tokens: 0 pad, 1 '+', 2 '-', 3 '*', 4 '(', 5 ')', 6 '=', 7..11 digits 0..4 (12 tokens, as Grazzi's vocab 12).
// Length L counts the answer slot: the input is an expression of L-2 tokens and '=', answer scored at '='.
// (Grazzi's sequence length also counts a trailing pad token and is at least 5; ours is L = theirs - 1.)
class ModArithBracketsTask : public Task {
 public:
  explicit ModArithBracketsTask(bool mult = false) : mult_(mult) {}
  std::string name() const override { return "mod_arith_brackets"; }
  bool single_answer() const override { return true; }
  std::vector<std::string> vocab() const override {
    return {"<pad>", "+", "-", "*", "(", ")", "=", "0", "1", "2", "3", "4"};
  }
  double chance() const override { return 0.2; }
  Example sample(Split split, uint64_t index, LengthRange range) const override;

 private:
  bool mult_;
};

// Running sum mod 5 (the subquadratic paper's "Z_5: running sum modulo 5"): digits 0..4, no operators.
// Tokens: 0 pad, 1..5 digits 0..4; the answer reuses the digit tokens (1 + sum mod 5).
// Length L counts the answer slot: L-1 digits. The target at every digit is the sum of the prefix (the
// headline: the sum of all digits, at the last one); task.sum_mod5.target picks what training sees.
class SumMod5Task : public Task {
 public:
  std::string name() const override { return "sum_mod5"; }
  bool running_answer() const override { return true; }
  std::vector<std::string> vocab() const override { return {"<pad>", "0", "1", "2", "3", "4"}; }
  double chance() const override { return 0.2; }
  Example sample(Split split, uint64_t index, LengthRange range) const override;
};

}  // namespace memlab
