#pragma once
// A scripted policy that reads the full state (so it cheats on memory): it eats the nearest apple in
// the distractor phase and walks to the door of the target colour in the reward phase. It shows what
// a perfect agent earns and drives rendering and tests.
#include <cstdint>

#include "envs/visual_match.h"

namespace memlab {

int64_t oracle_action(const VisualMatchState& s);

}  // namespace memlab
