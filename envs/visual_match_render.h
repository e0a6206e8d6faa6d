#pragma once
// Pictures of a Visual Match state for people: the agent's 5x5 view and the whole 7x11 board with the
// view window outlined in black (the part of the window outside the board is not drawn).
#include <string>

#include "core/image.h"
#include "envs/visual_match.h"

namespace memlab {

// `px` pixels per cell.
Image view_image(const VisualMatchState& s, int px);
Image grid_image(const VisualMatchState& s, int px);
// Board and view side by side.
Image frame_image(const VisualMatchState& s, int px);
// One line: phase, steps, target colour, last reward, return, done/success.
std::string frame_caption(const VisualMatchState& s, float reward);
const char* cell_name(Cell c);

}  // namespace memlab
