#include "envs/visual_match_oracle.h"

#include <cstdlib>
#include <limits>

namespace memlab {

namespace {
constexpr int64_t kN = 0, kS = 1, kW = 2, kE = 3;

// Rows first, then columns: the distractor room has no inner walls.
int64_t toward(const VisualMatchState& s, int r, int c) {
  if (r < s.row) return kN;
  if (r > s.row) return kS;
  if (c < s.col) return kW;
  return kE;
}
}  // namespace

int64_t oracle_action(const VisualMatchState& s) {
  switch (s.phase) {
    case Phase::Explore: return kN;  // the agent cannot move; any action does
    case Phase::Distractor: {
      int best = std::numeric_limits<int>::max(), br = s.row, bc = s.col;
      for (const auto& rc : apple_slots()) {
        if (s.at(rc[0], rc[1]) != Cell::Apple) continue;
        const int d = std::abs(rc[0] - s.row) + std::abs(rc[1] - s.col);
        if (d < best) best = d, br = rc[0], bc = rc[1];
      }
      if (best == std::numeric_limits<int>::max()) {
        // Nothing to eat: wait next to the slot that comes back first.
        int soonest = std::numeric_limits<int>::max();
        for (const auto& rc : apple_slots()) {
          const int t = s.eaten_at[static_cast<size_t>(rc[0] * kGridCols + rc[1])];
          if (t >= 0 && t < soonest) soonest = t, br = rc[0], bc = rc[1];
        }
        if (br == s.row && bc == s.col) return s.row > 1 ? kN : kS;
      }
      return toward(s, br, bc);
    }
    case Phase::Reward: {
      int c = kDoorCols[1];
      for (int k = 0; k < 3; ++k)
        if (s.doors[static_cast<size_t>(k)] == s.target) c = kDoorCols[k];
      // Up the corridor to row 3, across, then up to the door.
      if (s.col != c) return s.row >= 4 ? kN : (c < s.col ? kW : kE);
      return kN;
    }
  }
  return kN;
}

}  // namespace memlab
