#include "envs/visual_match.h"

#include <fmt/format.h>

#include <cmath>

#include "core/errors.h"
#include "core/rng.h"

namespace memlab {

namespace {

// Board layouts (the reference's grids): '#' wall, 'a' apple slot, 'p' explore ring, 'b'/'c'/'e' the
// three doors, '+' the agent's start, ' ' background.
constexpr const char* kExploreGrid[kGridRows] = {
    "           ",
    "    ppp    ",
    "    p+p    ",
    "    ppp    ",
    "           ",
    "           ",
    "           ",
};
constexpr const char* kDistractorGrid[kGridRows] = {
    "###########",
    "#a a a a a#",
    "# a a a a #",
    "#a a a a a#",
    "# a a a a #",
    "#a a + a a#",
    "###########",
};
constexpr const char* kRewardGrid[kGridRows] = {
    "###########",
    "# b  c  e #",
    "#         #",
    "#         #",
    "####   ####",
    "   # + #   ",
    "   #####   ",
};

std::vector<std::array<int, 2>> cells_of(const char* const* grid, char ch) {
  std::vector<std::array<int, 2>> out;
  for (int r = 0; r < kGridRows; ++r)
    for (int c = 0; c < kGridCols; ++c)
      if (grid[r][c] == ch) out.push_back({r, c});
  return out;
}

// Load a layout: walls stay, every other symbol becomes background (apples, ring and doors are placed
// by the caller); returns the agent's start.
std::array<int, 2> load_grid(const char* const* grid, VisualMatchState& s) {
  std::array<int, 2> start{0, 0};
  for (int r = 0; r < kGridRows; ++r)
    for (int c = 0; c < kGridCols; ++c) {
      const char ch = grid[r][c];
      s.cells[r * kGridCols + c] = ch == '#' ? Cell::Wall : Cell::Background;
      if (ch == '+') start = {r, c};
    }
  return start;
}

// Reference palette in 0..1000, scaled by 255/1000 and truncated (numpy's float -> uint8 cast).
constexpr uint8_t scale(int v) { return static_cast<uint8_t>(v * 255 / 1000); }
constexpr Rgb kPalette[] = {
    {scale(800), scale(800), scale(800)},  // background
    {scale(100), scale(100), scale(100)},  // wall
    {scale(550), scale(700), scale(0)},    // apple
    {scale(1000), 0, 0},                   // hue 0
    {0, scale(1000), 0},                   // hue 1/3
    {0, 0, scale(1000)},                   // hue 2/3
};
constexpr Rgb kPlayer = {scale(898), scale(584), scale(430)};

bool is_colour(Cell c) { return c == Cell::Red || c == Cell::Green || c == Cell::Blue; }

void shuffle3(std::array<Cell, 3>& a, Rng& rng) {
  for (int k = 2; k > 0; --k) std::swap(a[k], a[uniform_int(rng, 0, k)]);
}

int phase_len(const VisualMatchConfig& cfg, Phase p) {
  switch (p) {
    case Phase::Explore: return cfg.explore_len;
    case Phase::Distractor: return cfg.distractor_len;
    case Phase::Reward: return cfg.reward_len;
  }
  return 0;
}

void check_range(const char* name, double v, double lo, double hi) {
  if (!(v >= lo && v <= hi))
    throw UserError(fmt::format("visual match {} = {} is out of range (allowed: {} to {})", name, v, lo, hi));
}

}  // namespace

const std::vector<std::array<int, 2>>& apple_slots() {
  static const auto v = cells_of(kDistractorGrid, 'a');
  return v;
}

const std::vector<std::array<int, 2>>& ring_cells() {
  static const auto v = cells_of(kExploreGrid, 'p');
  return v;
}

Rgb cell_colour(Cell c) { return kPalette[static_cast<int>(c)]; }
Rgb player_colour() { return kPlayer; }

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::Explore: return "explore";
    case Phase::Distractor: return "distractor";
    case Phase::Reward: return "reward";
  }
  return "?";
}

void VisualMatchConfig::validate() const {
  check_range("distractor_len", distractor_len, 0, 1e7);
  check_range("explore_len", explore_len, 1, 1e6);
  check_range("reward_len", reward_len, 1, 1e6);
  check_range("n_apples", n_apples, 0, static_cast<double>(apple_slots().size()));
  check_range("respawn_every", respawn_every, 0, 1e7);
  check_range("apple_reward", apple_reward, -1e6, 1e6);
  check_range("final_reward", final_reward, -1e6, 1e6);
}

RewardPhaseVariant parse_reward_phase(const std::string& name) {
  if (name == "paper") return RewardPhaseVariant::Paper;
  if (name == "reference") return RewardPhaseVariant::Reference;
  throw UserError(fmt::format("visual match reward phase '{}' is not known (allowed: paper, reference)", name));
}

ColourShuffle parse_colour_shuffle(const std::string& name) {
  if (name == "episode") return ColourShuffle::Episode;
  if (name == "fixed") return ColourShuffle::Fixed;
  throw UserError(fmt::format("visual match colour shuffle '{}' is not known (allowed: episode, fixed)", name));
}

uint64_t episode_seed(uint64_t base, uint64_t index) { return derive_seed(base, kVisualMatchStream, index); }

void render_view(const VisualMatchState& s, uint8_t* out) {
  constexpr int plane = kView * kView;
  for (int dr = 0; dr < kView; ++dr)
    for (int dc = 0; dc < kView; ++dc) {
      const int r = s.row + dr - kView / 2, c = s.col + dc - kView / 2;
      Rgb rgb;
      if (r == s.row && c == s.col)
        rgb = kPlayer;
      else if (r < 0 || r >= kGridRows || c < 0 || c >= kGridCols)
        rgb = kPalette[static_cast<int>(Cell::Background)];  // the cropper's pad character
      else
        rgb = kPalette[static_cast<int>(s.at(r, c))];
      const int k = dr * kView + dc;
      out[k] = rgb[0];
      out[plane + k] = rgb[1];
      out[2 * plane + k] = rgb[2];
    }
}

VisualMatch::VisualMatch(int64_t n_envs, VisualMatchConfig cfg) : cfg_(cfg) {
  if (n_envs < 1 || n_envs > (int64_t(1) << 24))
    throw UserError(fmt::format("visual match n_envs = {} is out of range (allowed: 1 to {})", n_envs, 1 << 24));
  cfg_.validate();
  fixed_doors_ = {Cell::Red, Cell::Green, Cell::Blue};
  Rng rng = make_rng(cfg_.colour_seed, kVisualMatchStream + 1, 0);
  shuffle3(fixed_doors_, rng);
  const auto n = static_cast<size_t>(n_envs);
  states_.resize(n);
  obs_.assign(n * kObsSize, 0);
  done_.assign(n, 0);
  success_.assign(n, 0);
  rewards_.assign(n, 0.0f);
  reset(uint64_t(0));
}

void VisualMatch::reset(const std::vector<uint64_t>& seeds) {
  if (static_cast<int64_t>(seeds.size()) != size())
    throw UserError(fmt::format("visual match reset: {} seeds for {} envs", seeds.size(), size()));
  for (int64_t i = 0; i < size(); ++i) reset_one(i, seeds[static_cast<size_t>(i)]);
}

void VisualMatch::reset(uint64_t base_seed) {
  for (int64_t i = 0; i < size(); ++i) reset_one(i, episode_seed(base_seed, static_cast<uint64_t>(i)));
}

void VisualMatch::reset_one(int64_t i, uint64_t seed) {
  VisualMatchState& s = states_[static_cast<size_t>(i)];
  s = VisualMatchState{};
  // Fixed draw order, so an episode is a pure function of the seed.
  Rng rng = make_rng(seed, kVisualMatchStream, 0);
  s.doors = {Cell::Red, Cell::Green, Cell::Blue};
  if (cfg_.colours == ColourShuffle::Episode)
    shuffle3(s.doors, rng);
  else
    s.doors = fixed_doors_;
  s.target = s.doors[static_cast<size_t>(uniform_int(rng, 0, 2))];
  s.ring_cell = static_cast<int>(uniform_int(rng, 0, static_cast<int64_t>(ring_cells().size()) - 1));
  std::vector<int> slots(apple_slots().size());
  for (size_t k = 0; k < slots.size(); ++k) slots[k] = static_cast<int>(k);
  for (int k = 0; k < cfg_.n_apples; ++k) {
    std::swap(slots[static_cast<size_t>(k)], slots[static_cast<size_t>(uniform_int(rng, k, int64_t(slots.size()) - 1))]);
    s.apple_slots |= 1u << slots[static_cast<size_t>(k)];
  }
  enter_phase(s, Phase::Explore);
  rewards_[static_cast<size_t>(i)] = 0.0f;
  done_[static_cast<size_t>(i)] = 0;
  success_[static_cast<size_t>(i)] = 0;
  render_obs(i);
}

void VisualMatch::enter_phase(VisualMatchState& s, Phase p) {
  s.phase = p;
  s.phase_step = 0;
  s.eaten_at.fill(-1);
  std::array<int, 2> start{};
  switch (p) {
    case Phase::Explore: {
      start = load_grid(kExploreGrid, s);
      const auto& ring = ring_cells();
      for (size_t k = 0; k < ring.size(); ++k)
        s.cells[ring[k][0] * kGridCols + ring[k][1]] = static_cast<int>(k) == s.ring_cell ? s.target : Cell::Wall;
      break;
    }
    case Phase::Distractor: {
      start = load_grid(kDistractorGrid, s);
      const auto& slots = apple_slots();
      for (size_t k = 0; k < slots.size(); ++k)
        if (s.apple_slots >> k & 1u) s.cells[slots[k][0] * kGridCols + slots[k][1]] = Cell::Apple;
      break;
    }
    case Phase::Reward: {
      start = load_grid(kRewardGrid, s);
      for (int k = 0; k < 3; ++k) s.cells[kDoorRow * kGridCols + kDoorCols[k]] = s.doors[static_cast<size_t>(k)];
      break;
    }
  }
  s.row = start[0];
  s.col = start[1];
}

float VisualMatch::step_one(VisualMatchState& s, int64_t action) {
  static constexpr int kDr[kNumActions] = {-1, 1, 0, 0}, kDc[kNumActions] = {0, 0, -1, 1};
  ++s.phase_step;
  ++s.episode_step;
  const int r = s.row + kDr[action], c = s.col + kDc[action];
  if (r >= 0 && r < kGridRows && c >= 0 && c < kGridCols) {
    const Cell to = s.at(r, c);
    // Walls never let the agent through; in the passive explore phase neither does the colour.
    if (to != Cell::Wall && !(s.phase == Phase::Explore && is_colour(to))) {
      s.row = r;
      s.col = c;
    }
  }
  float reward = 0.0f;
  const int here = s.row * kGridCols + s.col;
  if (s.phase == Phase::Distractor) {
    if (s.cells[here] == Cell::Apple) {
      s.cells[here] = Cell::Background;
      s.eaten_at[here] = s.phase_step;
      reward += cfg_.apple_reward;
    }
    // After the pick-up check, as the reference's apple drape does.
    if (cfg_.respawn_every > 0)
      for (const auto& rc : apple_slots()) {
        const int k = rc[0] * kGridCols + rc[1];
        if (s.eaten_at[k] >= 0 && s.phase_step > s.eaten_at[k] + cfg_.respawn_every) {
          s.cells[k] = Cell::Apple;
          s.eaten_at[k] = -1;
        }
      }
  } else if (s.phase == Phase::Reward && is_colour(s.cells[here])) {
    if (s.cells[here] == s.target) reward += cfg_.final_reward;
    s.reward_phase_reward += reward;
    for (int k = 0; k < 3; ++k) s.cells[kDoorRow * kGridCols + kDoorCols[k]] = Cell::Background;
    if (cfg_.reward_phase == RewardPhaseVariant::Paper) s.done = true;
  }
  // A zero-length distractor phase is skipped.
  while (!s.done && s.phase_step >= phase_len(cfg_, s.phase)) {
    if (s.phase == Phase::Reward)
      s.done = true;
    else
      enter_phase(s, static_cast<Phase>(static_cast<int>(s.phase) + 1));
  }
  if (s.done) s.success = s.reward_phase_reward > 0.0f;
  s.episode_return += reward;
  return reward;
}

void VisualMatch::render_obs(int64_t i) { render_view(states_[static_cast<size_t>(i)], obs_.data() + i * kObsSize); }

void VisualMatch::step(const int64_t* actions) {
  for (int64_t i = 0; i < size(); ++i)
    if (actions[i] < 0 || actions[i] >= kNumActions)
      throw UserError(fmt::format("visual match action {} for env {} is out of range (allowed: 0 to 3)", actions[i], i));
  for (int64_t i = 0; i < size(); ++i) {
    const auto u = static_cast<size_t>(i);
    VisualMatchState& s = states_[u];
    if (s.done) {
      rewards_[u] = 0.0f;
      continue;
    }
    rewards_[u] = step_one(s, actions[i]);
    done_[u] = s.done;
    success_[u] = s.success;
    render_obs(i);
  }
}

void VisualMatch::step(const std::vector<int64_t>& actions) {
  if (static_cast<int64_t>(actions.size()) != size())
    throw UserError(fmt::format("visual match step: {} actions for {} envs", actions.size(), size()));
  step(actions.data());
}

}  // namespace memlab
