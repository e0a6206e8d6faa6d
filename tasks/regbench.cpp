#include "tasks/regbench.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>

#include "core/errors.h"

namespace memlab {

namespace {
constexpr uint64_t kPoolStream = 0x7265676265ULL;   // "regbe": held-out automata, apart from the split streams
constexpr uint64_t kChanceSeed = 0x6368616e6365ULL;  // "chance": a fixed sample, the same for every run seed
constexpr int kMaxRedraws = 100000;

// The first `k` entries of `v` become a uniform sample without replacement.
void partial_shuffle(std::vector<int>& v, int64_t k, Rng& rng) {
  for (int64_t i = 0; i < k; ++i) std::swap(v[i], v[uniform_int(rng, i, static_cast<int64_t>(v.size()) - 1)]);
}
}  // namespace

uint32_t Dfa::out_letters(int s) const {
  uint32_t m = 0;
  for (int c = 0; c < kLetters; ++c)
    if (next[s][c] >= 0) m |= 1u << c;
  return m;
}

uint64_t Dfa::hash() const {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a
  auto mix = [&h](uint64_t x) { h = (h ^ x) * 1099511628211ULL; };
  mix(next.size());
  for (const auto& row : next)
    for (int8_t t : row) mix(static_cast<uint64_t>(t + 1));
  return h;
}

Dfa draw_raw_dfa(Rng& rng, const RegBenchParams& p) {
  const int64_t n = uniform_int(rng, p.min_states, p.max_states);
  const int64_t k = uniform_int(rng, p.min_alphabet, p.max_alphabet);
  std::vector<int> letters(Dfa::kLetters);
  std::iota(letters.begin(), letters.end(), 0);
  partial_shuffle(letters, k, rng);
  letters.resize(k);
  Dfa d;
  for (int c : letters) d.alphabet |= 1u << c;
  std::array<int8_t, Dfa::kLetters> none;
  none.fill(-1);
  d.next.assign(n, none);
  for (int64_t s = 0; s < n; ++s) {
    const int64_t out = uniform_int(rng, 1, std::min({p.max_out_degree, k, n - 1}));
    std::vector<int> sym = letters, to;
    for (int64_t t = 0; t < n; ++t)
      if (t != s) to.push_back(static_cast<int>(t));
    partial_shuffle(sym, out, rng);
    partial_shuffle(to, out, rng);
    for (int64_t e = 0; e < out; ++e) d.next[s][sym[e]] = static_cast<int8_t>(to[e]);
  }
  return d;
}

Dfa canonical_dfa(const Dfa& raw) {
  const int n = raw.states();
  // trim: `order` lists the states reachable from 0, id[s] is s's place in it
  std::vector<int> id(n, -1), order{0};
  id[0] = 0;
  for (size_t i = 0; i < order.size(); ++i)
    for (int c = 0; c < Dfa::kLetters; ++c) {
      const int t = raw.next[order[i]][c];
      if (t >= 0 && id[t] < 0) {
        id[t] = static_cast<int>(order.size());
        order.push_back(t);
      }
    }
  const int m = static_cast<int>(order.size());
  // Moore refinement; the sink is the block -1, so a missing transition tells states apart
  std::vector<int> block(m, 0);
  for (int blocks = 1;;) {
    std::map<std::vector<int>, int> sig_ids;
    std::vector<int> refined(m);
    for (int i = 0; i < m; ++i) {
      std::vector<int> sig{block[i]};
      for (int c = 0; c < Dfa::kLetters; ++c) {
        const int t = raw.next[order[i]][c];
        sig.push_back(t < 0 ? -1 : block[id[t]]);
      }
      refined[i] = sig_ids.emplace(sig, static_cast<int>(sig_ids.size())).first->second;
    }
    block = refined;
    if (static_cast<int>(sig_ids.size()) == blocks) break;  // refinement only splits: no split, stable
    blocks = static_cast<int>(sig_ids.size());
  }
  const int blocks = *std::max_element(block.begin(), block.end()) + 1;
  std::vector<int> rep(blocks, -1);
  for (int i = m - 1; i >= 0; --i) rep[block[i]] = i;
  // renumber breadth-first from the start, letters in order
  std::vector<int> num(blocks, -1), queue{block[0]};
  num[block[0]] = 0;
  for (size_t q = 0; q < queue.size(); ++q)
    for (int c = 0; c < Dfa::kLetters; ++c) {
      const int t = raw.next[order[rep[queue[q]]]][c];
      if (t >= 0 && num[block[id[t]]] < 0) {
        num[block[id[t]]] = static_cast<int>(queue.size());
        queue.push_back(block[id[t]]);
      }
    }
  Dfa out;
  out.alphabet = raw.alphabet;
  std::array<int8_t, Dfa::kLetters> none;
  none.fill(-1);
  out.next.assign(blocks, none);
  for (size_t q = 0; q < queue.size(); ++q)
    for (int c = 0; c < Dfa::kLetters; ++c) {
      const int t = raw.next[order[rep[queue[q]]]][c];
      if (t >= 0) out.next[q][c] = static_cast<int8_t>(num[block[id[t]]]);
    }
  return out;
}

RegBenchTask::RegBenchTask(RegBenchParams p) : p_(p) {
  double hits = 0, scored = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    Rng rng = make_rng(kChanceSeed, 0, i);
    const Example ex = strings(canonical_dfa(draw_raw_dfa(rng, p_)), rng, {1, std::numeric_limits<int64_t>::max()});
    for (size_t t = 0; t < ex.target.size(); ++t)
      if (ex.target[t] >= 0) {
        hits += __builtin_popcountll(ex.accept[t]);
        scored += 1;
      }
  }
  chance_ = hits / (scored * Dfa::kLetters);
}

std::vector<std::string> RegBenchTask::vocab() const {
  std::vector<std::string> v = {"<pad>"};
  for (int c = 0; c < Dfa::kLetters; ++c) v.push_back(std::string(1, static_cast<char>('a' + c)));
  v.push_back("|");
  return v;
}

void RegBenchTask::build_pool() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (pool_built_ && pool_seed_ == seed) return;
  pool_.clear();
  pool_hashes_.clear();
  for (uint64_t j = 0; static_cast<int64_t>(pool_.size()) < p_.heldout; ++j) {
    if (j > static_cast<uint64_t>(kMaxRedraws) + 100 * static_cast<uint64_t>(p_.heldout))
      throw UserError(fmt::format("task.regbench.heldout: only {} distinct automata found for {} requested; "
                                  "ask for fewer or allow more states or letters",
                                  pool_.size(), p_.heldout));
    Rng rng = make_rng(seed, kPoolStream, j);
    Dfa d = canonical_dfa(draw_raw_dfa(rng, p_));
    if (pool_hashes_.insert(d.hash()).second) pool_.push_back(std::move(d));
  }
  pool_seed_ = seed;
  pool_built_ = true;
}

Dfa RegBenchTask::draw(Split split, uint64_t index, Rng& rng) const {
  build_pool();
  const uint64_t half = static_cast<uint64_t>(p_.heldout / 2), rest = static_cast<uint64_t>(p_.heldout) - half;
  if (split == Split::Val) return pool_[index % half];
  if (split == Split::Test) return pool_[half + index % rest];
  for (int tries = 0; tries < kMaxRedraws; ++tries) {
    Dfa d = canonical_dfa(draw_raw_dfa(rng, p_));
    if (!pool_hashes_.count(d.hash())) return d;
  }
  throw UserError("task.regbench: every training automaton drawn is held out; allow more states or letters, "
                  "or set task.regbench.heldout lower");
}

Dfa RegBenchTask::automaton(Split split, uint64_t index) const {
  Rng rng = make_rng(seed, static_cast<uint64_t>(split), index);
  return draw(split, index, rng);
}

Example RegBenchTask::sample(Split split, uint64_t index, LengthRange range) const {
  Rng rng = make_rng(seed, static_cast<uint64_t>(split), index);
  const Dfa d = draw(split, index, rng);
  return strings(d, rng, range);
}

Example RegBenchTask::strings(const Dfa& d, Rng& rng, LengthRange range) const {
  const int64_t count = uniform_int(rng, p_.min_strings, p_.max_strings);
  const uint64_t start_set = static_cast<uint64_t>(d.out_letters(0)) << 1;  // letter c is token 1 + c
  Example ex;
  auto& in = ex.input;
  for (int64_t k = 0; (k < count || static_cast<int64_t>(in.size()) < range.min) &&
                      static_cast<int64_t>(in.size()) < range.max;
       ++k) {
    if (k > 0) {
      in.push_back(kSeparator);
      ex.accept.push_back(start_set);
    }
    const int64_t len = uniform_int(rng, 1, p_.max_string_len);
    int s = 0;
    for (int64_t i = 0; i < len; ++i) {
      std::vector<int> out;
      for (int c = 0; c < Dfa::kLetters; ++c)
        if (d.next[s][c] >= 0) out.push_back(c);
      const int c = out[uniform_int(rng, 0, static_cast<int64_t>(out.size()) - 1)];
      s = d.next[s][c];
      in.push_back(1 + c);
      ex.accept.push_back(static_cast<uint64_t>(d.out_letters(s)) << 1);
    }
  }
  if (static_cast<int64_t>(in.size()) > range.max) {
    in.resize(range.max);
    ex.accept.resize(range.max);
  }
  ex.target.assign(in.size(), -1);
  for (size_t t = 0; t + 1 < in.size(); ++t)
    if (in[t + 1] != kSeparator) ex.target[t] = in[t + 1];
  return ex;
}

}  // namespace memlab
