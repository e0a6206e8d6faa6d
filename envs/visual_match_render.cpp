#include "envs/visual_match_render.h"

#include <fmt/format.h>

namespace memlab {

namespace {
constexpr Rgb kOutline = {0, 0, 0};
constexpr Rgb kGap = {255, 255, 255};
}  // namespace

const char* cell_name(Cell c) {
  switch (c) {
    case Cell::Background: return "background";
    case Cell::Wall: return "wall";
    case Cell::Apple: return "apple";
    case Cell::Red: return "red";
    case Cell::Green: return "green";
    case Cell::Blue: return "blue";
  }
  return "?";
}

Image view_image(const VisualMatchState& s, int px) {
  uint8_t chw[kObsSize];
  render_view(s, chw);
  Image img(kView * px, kView * px, cell_colour(Cell::Background));
  constexpr int plane = kView * kView;
  for (int r = 0; r < kView; ++r)
    for (int c = 0; c < kView; ++c) {
      const int k = r * kView + c;
      img.fill(c * px, r * px, px, px, {chw[k], chw[plane + k], chw[2 * plane + k]});
    }
  return img;
}

Image grid_image(const VisualMatchState& s, int px) {
  Image img(kGridCols * px, kGridRows * px, cell_colour(Cell::Background));
  for (int r = 0; r < kGridRows; ++r)
    for (int c = 0; c < kGridCols; ++c) img.fill(c * px, r * px, px, px, cell_colour(s.at(r, c)));
  img.fill(s.col * px, s.row * px, px, px, player_colour());
  img.outline((s.col - kView / 2) * px, (s.row - kView / 2) * px, kView * px, kView * px, kOutline);
  return img;
}

Image frame_image(const VisualMatchState& s, int px) { return hstack({grid_image(s, px), view_image(s, px)}, px, kGap); }

std::string frame_caption(const VisualMatchState& s, float reward) {
  return fmt::format("step {} | {} phase step {} | target {} | reward {:g} | return {:g}{}", s.episode_step,
                     phase_name(s.phase), s.phase_step, cell_name(s.target), reward, s.episode_return,
                     s.done ? (s.success ? " | done, success" : " | done, no success") : "");
}

}  // namespace memlab
