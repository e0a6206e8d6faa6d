#pragma once
// The six MAD tasks (Poli et al. 2024, "Mechanistic Design and Scaling of Hybrid Architectures"), as their
// reference generator (athms/mad-lab mad/data/instances.py) builds them, in memlab's conventions.
//
// Symbols: MAD's V symbols 0..V-1 are memlab ids 1..V (id 0 is memlab's batch pad), so the model vocab
// is V+1; `memlab tasks vocab` names them. Every random choice comes from make_rng(seed, split, index).
//
// Length: one example of memlab length L is MAD's setting seq_len = L, so `task.train_len: [L, L]` gives
// MAD's seq_len-L data. L is drawn uniformly from the range, raised to the task's minimum length
// (min_length(); a range whose max is below it is an error for task.train_len/eval_len, and gives the
// minimum for other ranges), and, for recall, noisy recall and memorisation, rounded down to even.
// The input length is then whatever MAD's is for that seq_len (max_input_length() follows it):
//   recall, noisy recall: L-1 (MAD's L tokens, shifted by one for next-token targets), L without multi_query
//                         (the copy-prefix token adds one);
//   fuzzy recall:         L (MAD left-pads the sequence to L+1, then shifts);
//   selective copying, compression, memorisation: L (MAD does not shift these: targets sit on the input
//                         positions).
//
// Targets (-1 = not scored). Recall-type tasks train as a language model: the Train split's target at
// every position is the next token. Val/Test score only the values of keys seen earlier in the sequence
// (multi_query) or only the final probe's value (multi_query false), at the position before the value.
// The other three tasks have the same targets in every split.
//
// Tasks (V = task.mad.vocab, 0 = the baseline given with each):
//  mad_recall (16): keys are the first half of the non-special symbols, values the second half; a fresh
//    key->value map per sequence; L/2-1 (key, value) pairs, then a probe: a key seen before and its value.
//    multi_query false reserves symbol V-1 as a copy prefix placed before the probe.
//  mad_noisy_recall (32, 16 of them noise): as recall; task.mad.noise_vocab symbols after the values are
//    noise; each pair is replaced with probability task.mad.frac_noise by two uniform noise tokens (never
//    scored); one pair, uniform among the L/2-1 before the probe, is always real (MAD draws it among all
//    L/2 pairs, so with the probe's slot drawn it can have no real pair and fail; here it cannot).
//  mad_fuzzy_recall (16): keys and values are motifs of 1..m = task.mad.motif distinct tokens (uniform size,
//    uniform ordered draw); symbol V-1 is MAD's left-padding symbol "pad" (a real token, not memlab's id
//    0); without multi_query V-1 is the copy prefix and "pad" is V-2. Val/Test keys always have m tokens. Pairs are added until
//    the context holds at least L - |probe| - 2m tokens; the probe pair is inserted once the context reaches
//    a uniform position, and at the latest when the next pair could end the context (MAD's reference can
//    end the context before inserting it, leaving the final probe unanswerable), then the probe repeats.
//  mad_selective_copy (16): n = task.mad.copy tokens of V-2 symbols with L-2n-1 blanks ("blank" = V-2)
//    scattered among them, then "copy" (V-1) and n blanks; the targets are the n tokens in order at the
//    last n positions. Each blank goes before a uniform one of the n tokens, as MAD's np.insert with
//    randint(0, n) does (so none follows the last token); MAD draws these from numpy's global, unseeded
//    rng, here they are seeded like everything else.
//  mad_compression (16): L-1 uniform tokens of V-1 symbols, then "compress" (V-1); the target at every
//    position is the input token there (the whole sequence is reconstructed: model.head autoencoder).
//  mad_memorization (256): one fixed key->value map for every seed and split, drawn from task.mad.map_seed:
//    the (V-1)/2 keys (first half of V-1 symbols) map injectively into the values (the rest); L/2 pairs
//    (key, "insert" = V-1) with the key's value the target at "insert". Facts live in the weights.
//
// Chance: 1 / the number of values (recall types, memorisation), 1 / the copyable symbols (selective
// copying), 1 / the token symbols (compression).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "tasks/task.h"

namespace memlab {

class Config;

enum class MadKind { Recall, NoisyRecall, FuzzyRecall, SelectiveCopy, Compression, Memorization };

struct MadOptions {
  int64_t vocab = 0;  // MAD's V; 0 = the task's baseline
  bool multi_query = true;
  int64_t noise_vocab = 16;
  double frac_noise = 0.2;
  int64_t motif = 3;
  int64_t copy = 16;
  uint64_t map_seed = 12345;
};

class MadTask : public Task {
 public:
  MadTask(MadKind kind, MadOptions opts);
  std::string name() const override;
  std::vector<std::string> vocab() const override;
  double chance() const override;
  Example sample(Split split, uint64_t index, LengthRange range) const override;
  int64_t max_input_length(LengthRange range) const override;

  int64_t min_length() const;  // the shortest L the task can build

 private:
  int64_t seq_len(Rng& rng, LengthRange range) const;  // MAD's seq_len for one example
  int64_t input_length(int64_t L) const;
  Example recall(Rng& rng, int64_t L, bool train) const;
  Example fuzzy_recall(Rng& rng, int64_t L, bool train) const;
  Example selective_copy(Rng& rng, int64_t L) const;
  Example compression(Rng& rng, int64_t L) const;
  Example memorization(Rng& rng, int64_t L) const;

  MadKind kind_;
  MadOptions o_;
  int64_t V_ = 0, keys_ = 0, values_ = 0, noise_ = 0;  // symbol counts; keys are 0.., values follow
  std::vector<int64_t> map_;                             // memorisation: key symbol -> value symbol
};

const std::vector<std::string>& mad_task_names();
// A MAD task from task.name and task.mad.*: one clear error (cfg.fail) for a combination no example can
// satisfy, including a task.train_len / task.eval_len whose max is below the task's minimum length.
std::unique_ptr<Task> make_mad_task(const Config& cfg);

}  // namespace memlab
