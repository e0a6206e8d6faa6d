#pragma once
// Regular-language tasks of Deletang et al. as used by Grazzi et al. and the HQLT paper.
#include "tasks/task.h"

namespace memlab {

// Parity: bits, answer = parity of the number of 1s, scored at the last bit.
// Tokens: 0 pad, 1 bit "0", 2 bit "1"; the answer reuses 1 = even, 2 = odd.
// Length L counts the answer slot: an example has L-1 input bits.
class ParityTask : public Task {
 public:
  std::string name() const override { return "parity"; }
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
  std::vector<std::string> vocab() const override { return {"<pad>", "+", "-", "*", "=", "0", "1", "2", "3", "4"}; }
  double chance() const override { return 0.2; }
  Example sample(Split split, uint64_t index, LengthRange range) const override;
  // Value of tokens (digits and + - *) mod 5 with the usual precedence.
  static int64_t evaluate(const std::vector<int64_t>& expr);
};

}  // namespace memlab
