#include "tasks/mad.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

#include "core/config.h"

namespace memlab {

namespace {

const std::vector<std::pair<std::string, MadKind>>& kinds() {
  static const std::vector<std::pair<std::string, MadKind>> k = {
      {"mad_recall", MadKind::Recall},
      {"mad_noisy_recall", MadKind::NoisyRecall},
      {"mad_fuzzy_recall", MadKind::FuzzyRecall},
      {"mad_selective_copy", MadKind::SelectiveCopy},
      {"mad_compression", MadKind::Compression},
      {"mad_memorization", MadKind::Memorization}};
  return k;
}

int64_t baseline_vocab(MadKind k) {
  switch (k) {
    case MadKind::NoisyRecall: return 32;
    case MadKind::Memorization: return 256;
    default: return 16;
  }
}

bool is_recall(MadKind k) { return k == MadKind::Recall || k == MadKind::NoisyRecall; }

// True with probability p (53-bit resolution).
bool bernoulli(Rng& rng, double p) {
  constexpr int64_t kOne = int64_t{1} << 53;
  return static_cast<double>(uniform_int(rng, 0, kOne - 1)) < p * static_cast<double>(kOne);
}

// `size` distinct symbols of first..first+count-1 in uniform random order (a partial Fisher-Yates shuffle).
std::vector<int64_t> motif(Rng& rng, int64_t first, int64_t count, int64_t size) {
  std::vector<int64_t> pool(count);
  for (int64_t i = 0; i < count; ++i) pool[i] = first + i;
  for (int64_t i = 0; i < size; ++i) std::swap(pool[i], pool[uniform_int(rng, i, count - 1)]);
  pool.resize(size);
  return pool;
}

// MAD symbols -> memlab ids (+1); targets keep -1.
Example to_ids(std::vector<int64_t> input, std::vector<int64_t> target) {
  for (auto& x : input) ++x;
  for (auto& y : target)
    if (y >= 0) ++y;
  return {std::move(input), std::move(target), {}};
}

// A sequence with next-token targets: `seq` has one token more than the input; `scored` holds -1 or the
// token per position of `seq` (evaluation targets). Train targets are every next token.
Example shifted(const std::vector<int64_t>& seq, const std::vector<int64_t>& scored, bool train) {
  std::vector<int64_t> in(seq.begin(), seq.end() - 1);
  std::vector<int64_t> tg = train ? std::vector<int64_t>(seq.begin() + 1, seq.end())
                                  : std::vector<int64_t>(scored.begin() + 1, scored.end());
  return to_ids(std::move(in), std::move(tg));
}

}  // namespace

const std::vector<std::string>& mad_task_names() {
  static const std::vector<std::string> n = [] {
    std::vector<std::string> v;
    for (const auto& [name, kind] : kinds()) v.push_back(name);
    return v;
  }();
  return n;
}

MadTask::MadTask(MadKind kind, MadOptions o) : kind_(kind), o_(o) {
  V_ = o_.vocab > 0 ? o_.vocab : baseline_vocab(kind);
  int64_t plain = 0;  // symbols holding keys and values (or copyable tokens)
  switch (kind) {
    case MadKind::Recall:
    case MadKind::NoisyRecall:
      noise_ = kind == MadKind::NoisyRecall ? o_.noise_vocab : 0;
      plain = V_ - (o_.multi_query ? 0 : 1) - noise_;
      break;
    case MadKind::FuzzyRecall: plain = V_ - (o_.multi_query ? 1 : 2); break;
    case MadKind::SelectiveCopy: plain = V_ - 2; break;
    case MadKind::Compression:
    case MadKind::Memorization: plain = V_ - 1; break;
  }
  if (kind == MadKind::SelectiveCopy || kind == MadKind::Compression) {
    values_ = plain;  // every plain symbol is a possible answer
  } else {
    keys_ = plain / 2;
    values_ = plain - keys_;
  }
  if (kind == MadKind::Memorization && keys_ > 0) {
    // Fixed for every run seed and split: the facts are the same in training and evaluation.
    Rng rng = make_rng(o_.map_seed, 0x6d656d6f, static_cast<uint64_t>(V_));
    map_ = motif(rng, keys_, values_, keys_);
  }
}

std::string MadTask::name() const {
  for (const auto& [n, k] : kinds())
    if (k == kind_) return n;
  return "?";
}

std::vector<std::string> MadTask::vocab() const {
  std::vector<std::string> v = {"<pad>"};
  auto add = [&](const char* prefix, int64_t n) {
    for (int64_t i = 0; i < n; ++i) v.push_back(fmt::format("{}{}", prefix, i));
  };
  switch (kind_) {
    case MadKind::Recall:
    case MadKind::NoisyRecall:
      add("k", keys_);
      add("v", values_);
      add("n", noise_);
      if (!o_.multi_query) v.push_back("copy");
      break;
    case MadKind::FuzzyRecall:
      add("k", keys_);
      add("v", values_);
      v.push_back("pad");
      if (!o_.multi_query) v.push_back("copy");
      break;
    case MadKind::SelectiveCopy:
      add("t", values_);
      v.insert(v.end(), {"blank", "copy"});
      break;
    case MadKind::Compression:
      add("t", values_);
      v.push_back("compress");
      break;
    case MadKind::Memorization:
      add("k", keys_);
      add("v", values_);
      v.push_back("insert");
      break;
  }
  return v;
}

double MadTask::chance() const { return 1.0 / static_cast<double>(kind_ == MadKind::Memorization ? keys_ : values_); }

int64_t MadTask::min_length() const {
  switch (kind_) {
    case MadKind::Recall:
    case MadKind::NoisyRecall: return 4;  // one pair and the probe
    case MadKind::FuzzyRecall: return 4 * o_.motif + 1;  // context of >= 1 token for any probe size
    case MadKind::SelectiveCopy: return 2 * o_.copy + 2;  // at least one blank among the tokens
    case MadKind::Compression:
    case MadKind::Memorization: return 2;
  }
  return 2;
}

int64_t MadTask::input_length(int64_t L) const {
  return is_recall(kind_) && o_.multi_query ? L - 1 : L;
}

int64_t MadTask::seq_len(Rng& rng, LengthRange r) const {
  const int64_t lo = std::max(r.min, min_length()), hi = std::max(r.max, min_length());
  int64_t L = lo == hi ? lo : uniform_int(rng, lo, hi);
  if (is_recall(kind_) || kind_ == MadKind::Memorization) L -= L % 2;
  return L;
}

int64_t MadTask::max_input_length(LengthRange r) const {
  int64_t L = std::max(r.max, min_length());
  if (is_recall(kind_) || kind_ == MadKind::Memorization) L -= L % 2;
  return input_length(L);
}

Example MadTask::sample(Split split, uint64_t index, LengthRange range) const {
  Rng rng = make_rng(seed, static_cast<uint64_t>(split), index);
  const int64_t L = seq_len(rng, range);
  const bool train = split == Split::Train;
  switch (kind_) {
    case MadKind::Recall:
    case MadKind::NoisyRecall: return recall(rng, L, train);
    case MadKind::FuzzyRecall: return fuzzy_recall(rng, L, train);
    case MadKind::SelectiveCopy: return selective_copy(rng, L);
    case MadKind::Compression: return compression(rng, L);
    case MadKind::Memorization: return memorization(rng, L);
  }
  return {};
}

Example MadTask::recall(Rng& rng, int64_t L, bool train) const {
  const int64_t pairs = L / 2 - 1, noise_first = keys_ + values_;
  const double frac = kind_ == MadKind::NoisyRecall ? o_.frac_noise : 0.0;
  const int64_t always_real = uniform_int(rng, 0, pairs - 1);
  std::vector<int64_t> value_of(keys_, -1), seq, scored;
  std::vector<int64_t> presented;  // distinct keys in order of first appearance
  for (int64_t i = 0; i < pairs; ++i) {
    if (frac > 0 && i != always_real && bernoulli(rng, frac)) {
      for (int j = 0; j < 2; ++j) seq.push_back(noise_first + uniform_int(rng, 0, noise_ - 1));
      scored.insert(scored.end(), {-1, -1});
      continue;
    }
    const int64_t k = uniform_int(rng, 0, keys_ - 1);
    const bool seen = value_of[k] >= 0;
    if (!seen) {
      value_of[k] = keys_ + uniform_int(rng, 0, values_ - 1);
      presented.push_back(k);
    }
    seq.insert(seq.end(), {k, value_of[k]});
    scored.insert(scored.end(), {-1, seen && o_.multi_query ? value_of[k] : -1});
  }
  if (!o_.multi_query) {
    seq.push_back(V_ - 1);
    scored.push_back(-1);
  }
  const int64_t k = presented[uniform_int(rng, 0, static_cast<int64_t>(presented.size()) - 1)];
  seq.insert(seq.end(), {k, value_of[k]});
  scored.insert(scored.end(), {-1, value_of[k]});
  return shifted(seq, scored, train);
}

Example MadTask::fuzzy_recall(Rng& rng, int64_t L, bool train) const {
  const int64_t m = o_.motif, pad = o_.multi_query ? V_ - 1 : V_ - 2;
  auto key = [&](int64_t size) { return motif(rng, 0, keys_, size); };
  auto value = [&](int64_t size) { return motif(rng, keys_, values_, size); };
  auto key_size = [&] { return train ? uniform_int(rng, 1, m) : m; };
  const auto k_probe = key(key_size());
  const auto v_probe = value(uniform_int(rng, 1, m));
  const int64_t probe = static_cast<int64_t>(k_probe.size() + v_probe.size());
  const int64_t context = L - probe - 2 * m;  // >= 1 by min_length()
  const int64_t probe_at = uniform_int(rng, 0, L - 2 * probe - 1);
  std::map<std::vector<int64_t>, std::vector<int64_t>> value_of = {{k_probe, v_probe}};
  std::set<std::vector<int64_t>> presented;
  std::vector<int64_t> seq, scored;
  bool probe_added = false;
  auto put = [&](const std::vector<int64_t>& k, const std::vector<int64_t>& v) {
    const bool seen = presented.count(k) > 0;
    seq.insert(seq.end(), k.begin(), k.end());
    seq.insert(seq.end(), v.begin(), v.end());
    scored.insert(scored.end(), k.size(), -1);
    if (seen && o_.multi_query) scored.insert(scored.end(), v.begin(), v.end());
    else scored.insert(scored.end(), v.size(), -1);
    presented.insert(k);
    probe_added = probe_added || k == k_probe;
  };
  while (static_cast<int64_t>(seq.size()) < context) {
    const int64_t len = static_cast<int64_t>(seq.size());
    if (!probe_added && (len >= probe_at || len + 2 * m >= context)) {
      put(k_probe, v_probe);
      continue;
    }
    const auto k = key(key_size());
    const int64_t v_size = uniform_int(rng, 1, m);
    auto it = value_of.find(k);
    if (it == value_of.end()) it = value_of.emplace(k, value(v_size)).first;
    put(k, it->second);
  }
  if (!o_.multi_query) {
    seq.push_back(V_ - 1);
    scored.push_back(-1);
  }
  seq.insert(seq.end(), k_probe.begin(), k_probe.end());
  seq.insert(seq.end(), v_probe.begin(), v_probe.end());
  scored.insert(scored.end(), k_probe.size(), -1);
  scored.insert(scored.end(), v_probe.begin(), v_probe.end());
  const int64_t fill = L + 1 - static_cast<int64_t>(seq.size());  // left padding to L+1 tokens
  seq.insert(seq.begin(), fill, pad);
  scored.insert(scored.begin(), fill, -1);
  return shifted(seq, scored, train);
}

Example MadTask::selective_copy(Rng& rng, int64_t L) const {
  const int64_t n = o_.copy, blanks = L - 2 * n - 1, blank = V_ - 2, copy = V_ - 1;
  std::vector<int64_t> tokens(n), before(n, 0);
  for (auto& t : tokens) t = uniform_int(rng, 0, values_ - 1);
  for (int64_t b = 0; b < blanks; ++b) ++before[uniform_int(rng, 0, n - 1)];
  std::vector<int64_t> seq;
  for (int64_t i = 0; i < n; ++i) {
    seq.insert(seq.end(), before[i], blank);
    seq.push_back(tokens[i]);
  }
  seq.push_back(copy);
  seq.insert(seq.end(), n, blank);
  std::vector<int64_t> target(L - n, -1);
  target.insert(target.end(), tokens.begin(), tokens.end());
  return to_ids(std::move(seq), std::move(target));
}

Example MadTask::compression(Rng& rng, int64_t L) const {
  std::vector<int64_t> seq(L);
  for (int64_t i = 0; i + 1 < L; ++i) seq[i] = uniform_int(rng, 0, values_ - 1);
  seq.back() = V_ - 1;
  return to_ids(seq, seq);
}

Example MadTask::memorization(Rng& rng, int64_t L) const {
  std::vector<int64_t> seq, target;
  for (int64_t i = 0; i < L / 2; ++i) {
    const int64_t k = uniform_int(rng, 0, keys_ - 1);
    seq.insert(seq.end(), {k, V_ - 1});
    target.insert(target.end(), {-1, map_[k]});
  }
  return to_ids(std::move(seq), std::move(target));
}

std::unique_ptr<Task> make_mad_task(const Config& cfg) {
  const std::string name = cfg.get_string("task.name");
  const auto it = std::find_if(kinds().begin(), kinds().end(), [&](const auto& p) { return p.first == name; });
  const MadKind kind = it->second;
  MadOptions o;
  o.vocab = cfg.get_int("task.mad.vocab");
  o.multi_query = cfg.get_bool("task.mad.multi_query");
  o.noise_vocab = cfg.get_int("task.mad.noise_vocab");
  o.frac_noise = cfg.get_float("task.mad.frac_noise");
  o.motif = cfg.get_int("task.mad.motif");
  o.copy = cfg.get_int("task.mad.copy");
  o.map_seed = static_cast<uint64_t>(cfg.get_int("task.mad.map_seed"));
  auto t = std::make_unique<MadTask>(kind, o);
  const int64_t V = o.vocab > 0 ? o.vocab : baseline_vocab(kind);
  auto need = [&](bool ok, const std::string& key, const std::string& what) {
    if (!ok) cfg.fail(key, fmt::format("{}: {}", name, what));
  };
  switch (kind) {
    case MadKind::Recall:
    case MadKind::NoisyRecall: {
      const int64_t extra = (o.multi_query ? 0 : 1) + (kind == MadKind::NoisyRecall ? o.noise_vocab : 0);
      need(V - extra >= 2, "task.mad.vocab",
           fmt::format("{} symbols leave no key and value besides {} noise/copy symbols (need >= {})", V, extra, extra + 2));
      if (kind == MadKind::NoisyRecall) {
        need(o.frac_noise < 1.0, "task.mad.frac_noise", "must be < 1 (at least one real pair per sequence)");
        need(o.frac_noise == 0.0 || o.noise_vocab > 0, "task.mad.noise_vocab", "must be > 0 when task.mad.frac_noise > 0");
      }
      break;
    }
    case MadKind::FuzzyRecall: {
      const int64_t plain = V - (o.multi_query ? 1 : 2);
      need(plain / 2 >= o.motif, "task.mad.vocab",
           fmt::format("{} symbols give {} keys, fewer than task.mad.motif = {} distinct tokens per key (need vocab >= {})",
                       V, plain / 2, o.motif, 2 * o.motif + V - plain));
      break;
    }
    case MadKind::SelectiveCopy:
      need(V >= 3, "task.mad.vocab", "needs >= 3 symbols (tokens, blank, copy)");
      break;
    case MadKind::Compression:
    case MadKind::Memorization:
      need(V >= 3, "task.mad.vocab", "needs >= 3 symbols (two tokens and the special one)");
      break;
  }
  for (const char* key : {"task.train_len", "task.eval_len"}) {
    const auto r = cfg.get_int_list(key);
    if (r.size() == 2 && r[1] < t->min_length())
      cfg.fail(key, fmt::format("{} needs lengths >= {}{} (max is {})", name, t->min_length(),
                                kind == MadKind::SelectiveCopy ? " = 2 * task.mad.copy + 2" : "", r[1]));
  }
  return t;
}

}  // namespace memlab
