#pragma once
// The length-generalisation summary of one evaluation: the longest length up to which accuracy stays at or
// above a threshold. Torch-free: the trainer's summary.md and memlab report both use it.
#include <cstdint>
#include <vector>

namespace memlab {

struct LengthAccuracy {
  int64_t min = 0, max = 0;
  double accuracy = 0;  // fraction in [0, 1]
};

// Only the finest bins count (a range holding another evaluated range, e.g. 40-256 over 40-64, is left out).
// Walking them by increasing length, the answer is the upper end of the last bin before the first whose
// accuracy is below `threshold`; 0 when the shortest bin is already below it, or when there is no bin.
int64_t longest_length_at(std::vector<LengthAccuracy> bins, double threshold);

}  // namespace memlab
