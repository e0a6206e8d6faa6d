#pragma once
// Training batches split by length (train.length_buckets): a batch's rows sorted by the length they need
// (their last scored position + 1), the shortest in the first bucket, each bucket padded only to its own
// length. A step then runs one forward per bucket. Its loss and gradients are those of the whole batch (the
// model is causal and nothing past a row's last target is scored), on fewer padded tokens.
//
// Each bucket has a fixed number of rows and a fixed length, so that a CUDA graph can replay the step: both
// come from the first batch, each bucket's length raised to the length a few standard deviations of rows further
// on, so that later batches fit with near certainty. A batch that does not fit runs whole.
#include <cstdint>
#include <string>
#include <vector>

#include "tasks/task.h"

namespace memlab {

struct LengthBucket {
  int64_t rows = 0, len = 0;
};

// Each row's length as training reads it: its last scored position + 1 (1 for a row with no target).
std::vector<int64_t> needed_lengths(const Batch& b);

// At most `buckets` buckets for batches like these (one per member of a packed run, all of B rows), the last
// of length `longest`: equal row counts, each bucket's length the needed length `margin` standard deviations of
// a binomial row count past its last row (the longest over the members). Buckets that would be as long as the
// next are merged into it, so one bucket (no split) comes back where a split gains nothing.
std::vector<LengthBucket> plan_length_buckets(const std::vector<std::vector<int64_t>>& needed, int64_t buckets,
                                              int64_t longest, double margin);

// The rows of one batch in each bucket, shortest first (a stable sort by needed length), or nothing where a
// bucket's rows need more than its length. The last bucket's length is not checked (the caller pads it to the
// batch).
std::vector<std::vector<int64_t>> assign_length_buckets(const std::vector<int64_t>& needed,
                                                        const std::vector<LengthBucket>& plan);

// "512 to 24, 512 to 39": each bucket's rows and length, for logs and benchmarks.
std::string describe_length_buckets(const std::vector<LengthBucket>& plan);

// train.length_buckets auto: the split pays only where the step fills the GPU. On an H200, 3 buckets took 2-16%
// off a step of 6 packed Table 3 runs and added 7-44% to one run alone (results/reference/length_buckets_h200.txt),
// so auto splits a packed step of at least 6 runs on CUDA into 3, and leaves anything smaller whole.
constexpr int64_t kAutoLengthBuckets = 3, kAutoBucketMembers = 6;
inline int64_t auto_length_buckets(int64_t members, bool cuda) {
  return cuda && members >= kAutoBucketMembers ? kAutoLengthBuckets : 1;
}

}  // namespace memlab
