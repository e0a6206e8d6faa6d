#include "tasks/state_tracking.h"

#include <algorithm>
#include <map>

#include "core/rng.h"

namespace memlab {

WordProblemTask::WordProblemTask(int n) : n_(n) {
  std::array<int, 5> p{};
  for (int i = 0; i < 5; ++i) p[i] = i;
  do perms_.push_back(p);
  while (std::next_permutation(p.begin(), p.begin() + n_));
  std::map<std::array<int, 5>, int64_t> index;
  for (size_t k = 0; k < perms_.size(); ++k) index[perms_[k]] = static_cast<int64_t>(k);
  const size_t G = perms_.size();
  then_.resize(G * G);
  for (size_t a = 0; a < G; ++a) {
    for (size_t b = 0; b < G; ++b) {
      std::array<int, 5> c = perms_[a];
      for (int i = 0; i < n_; ++i) c[i] = perms_[b][perms_[a][i]];
      then_[a * G + b] = index.at(c);
    }
  }
}

std::vector<std::string> WordProblemTask::vocab() const {
  std::vector<std::string> v = {"<pad>"};
  for (const auto& p : perms_) {
    std::string s;
    for (int i = 0; i < n_; ++i) s += static_cast<char>('0' + p[i]);
    v.push_back(s);
  }
  return v;
}

Example WordProblemTask::sample(Split split, uint64_t index, LengthRange r) const {
  Rng rng = make_rng(seed, static_cast<uint64_t>(split), index);
  const int64_t size = uniform_int(rng, r.min, r.max);
  const int64_t G = static_cast<int64_t>(perms_.size());
  Example ex;
  ex.input.resize(size - 1);
  ex.target.resize(size - 1);
  int64_t state = 0;  // the identity
  for (int64_t i = 0; i < size - 1; ++i) {
    const int64_t g = uniform_int(rng, 0, G - 1);
    ex.input[i] = 1 + g;
    state = then_[state * G + g];
    ex.target[i] = 1 + state;
  }
  return ex;
}

Example CycleNavTask::sample(Split split, uint64_t index, LengthRange r) const {
  constexpr int64_t kCycle = 5, kStay = 1, kUp = 2, kPos0 = 4;
  Rng rng = make_rng(seed, static_cast<uint64_t>(split), index);
  const int64_t size = uniform_int(rng, r.min, r.max);
  Example ex;
  ex.input.resize(size - 1);
  ex.target.resize(size - 1);
  int64_t pos = 0;
  for (int64_t i = 0; i < size - 1; ++i) {
    const int64_t t = uniform_int(rng, kStay, kStay + 2);
    ex.input[i] = t;
    pos = (pos + (t == kStay ? 0 : t == kUp ? 1 : kCycle - 1)) % kCycle;
    ex.target[i] = kPos0 + pos;
  }
  return ex;
}

}  // namespace memlab
