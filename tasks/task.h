#pragma once
// A supervised sequence task: deterministic examples in (seed, split, index), no knowledge of models.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace memlab {

class Config;
class Schema;

enum class Split { Train = 0, Val = 1, Test = 2 };
Split parse_split(const std::string& s);  // UserError on anything but train|val|test
const char* split_name(Split s);

struct LengthRange {
  int64_t min = 0, max = 0;
};

// One example: `input` token ids, and `target` ids of the same length with -1 where nothing is scored.
// `accept` (optional, RegBench): per position, the set of predictions that count as right, as a bit mask over
// token ids (bit v = token v; vocabularies up to 64 tokens); where it is set, accuracy uses it instead of target.
struct Example {
  std::vector<int64_t> input, target;
  std::vector<uint64_t> accept;
};

// What training sees of a task with a running answer: the answer at the final position only (the HQLT and
// subquadratic papers' protocol), or the running answer at every position (Merrill et al., Grazzi et al.).
enum class TrainTargets { Last, Every };

// A padded batch, row-major [B, T]; T is the batch's own longest example.
struct Batch {
  int64_t B = 0, T = 0, pad_id = 0;
  std::vector<int64_t> input, target, lengths;
  std::vector<uint64_t> accept;  // [B, T] when any example has accept sets, else empty
};

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;
  virtual std::vector<std::string> vocab() const = 0;
  virtual double chance() const = 0;
  virtual int64_t pad_id() const { return 0; }
  // Example `index` of `split` with its length drawn from `range` (the task's own length convention).
  virtual Example sample(Split split, uint64_t index, LengthRange range) const = 0;
  // True for tasks whose answer is defined after every input token (parity of the prefix, running product):
  // their examples carry it at every position, evaluation reports the last position (the headline) and all
  // positions, and training sees what train_targets says.
  virtual bool running_answer() const { return false; }
  // True where an example's `accept` sets, not one target, say which predictions are right (RegBench).
  virtual bool answer_sets() const { return false; }
  // True where every example carries one target, its answer (after '=', say), and nothing else is scored.
  virtual bool single_answer() const { return false; }
  // True where no training example carries more than one target, so training may read the model's output at
  // that position alone (TrainStepOptions::target_rows).
  bool one_training_target() const {
    return running_answer() ? train_targets == TrainTargets::Last : single_answer();
  }
  // Longest input an example drawn from `range` can have (lengths count the answer slot).
  virtual int64_t max_input_length(LengthRange range) const { return range.max - 1; }
  // The range sampled by default for a split (train range for Train, evaluation range otherwise).
  LengthRange default_range(Split split) const { return split == Split::Train ? train_range : eval_range; }

  // Example `index` of `split` as training and evaluation see it: with a finite training set
  // (train_examples > 0) training indices wrap around it, so a run makes epochs over the same examples;
  // a training example of a running-answer task keeps only its last target unless train_targets is Every.
  Example example(Split split, uint64_t index, LengthRange range) const;
  // Examples first..first+n-1, made on the worker threads (core/workers.h): an example depends only on its index,
  // so they are what example() gives one after another. Made serially, a packed step's K batches of 1024 (1-3 ms
  // of one core each) and the evaluations' examples kept the GPU waiting.
  std::vector<Example> examples(Split split, uint64_t first, int64_t n, LengthRange range) const;
  // The same examples, padded to the longest of them.
  Batch batch(Split split, uint64_t first, int64_t n, LengthRange range) const;
  Batch pad(const std::vector<Example>& examples) const;

  uint64_t seed = 0;
  uint64_t train_examples = 0;  // 0: every training step sees fresh examples
  TrainTargets train_targets = TrainTargets::Last;
  LengthRange train_range, eval_range;
};

// Examples first..first+n-1 of each task (a packed run's members, each its own seed), made together on the worker
// threads so that small batches of many members still spread over the cores; member_batches pads each member's.
std::vector<std::vector<Example>> member_examples(const std::vector<const Task*>& tasks, Split split, uint64_t first,
                                                  int64_t n, LengthRange range);
std::vector<Batch> member_batches(const std::vector<const Task*>& tasks, Split split, uint64_t first, int64_t n,
                                  LengthRange range);

// Registry: every task family registers its names here.
void register_task_keys(Schema& schema);
std::unique_ptr<Task> make_task(const Config& cfg);
std::vector<std::string> task_names();

}  // namespace memlab
