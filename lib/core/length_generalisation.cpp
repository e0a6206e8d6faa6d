#include "core/length_generalisation.h"

#include <algorithm>

namespace memlab {

int64_t longest_length_at(std::vector<LengthAccuracy> bins, double threshold) {
  std::vector<LengthAccuracy> fine;
  for (const auto& b : bins) {
    const bool holds_another = std::any_of(bins.begin(), bins.end(), [&](const LengthAccuracy& o) {
      return o.min >= b.min && o.max <= b.max && (o.min != b.min || o.max != b.max);
    });
    if (!holds_another) fine.push_back(b);
  }
  std::sort(fine.begin(), fine.end(),
            [](const LengthAccuracy& a, const LengthAccuracy& b) { return a.max != b.max ? a.max < b.max : a.min < b.min; });
  int64_t longest = 0;
  for (const auto& b : fine) {
    if (b.accuracy < threshold) break;
    longest = std::max(longest, b.max);
  }
  return longest;
}

}  // namespace memlab
