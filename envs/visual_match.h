#pragma once
// Passive Visual Match (Hung et al. 2019, as used by Ni et al. 2023 and the HQLT paper, Sec. 4.4): a
// batch of independent 7x11 grid worlds stepped in lock-step. Torch-free.
//
// An episode has three phases, counted in agent steps (one step = one action):
//   explore    (cfg.explore_len = 15): the agent is boxed into a 3x3 ring at (2,5); one random ring cell
//              shows the target colour, the other 7 are walls; walls and the colour are impassable.
//   distractor (cfg.distractor_len = L): a walled room, the agent starts at (5,5); cfg.n_apples of the
//              22 apple slots hold an apple (reward cfg.apple_reward each).
//   reward     (at most cfg.reward_len = 15): a room with three colour cells ("doors") at (1,2), (1,5),
//              (1,8); the agent starts at (5,5) at the bottom of a corridor.
// reset() shows the first explore view; the step that completes a phase returns the first view of the
// next phase. Episode length: explore_len + L + up to reward_len steps (exactly 30 + L in the reference
// variant). The reference's pycolab chapters also count their action-free first frame, so it actually
// takes 14 + (L-1) + 14 actions; we follow the paper's 15 / L / 15 instead.
//
// Observation: the 5x5 window centred on the agent, uint8 CHW [3,5,5]. The reference's ScrollingCropper
// (5x5, scroll margins (2,2), pad = background) always keeps the agent in the centre cell, so cells
// outside the 7x11 board show the background colour (204,204,204), e.g. the bottom view row in the
// reward phase and the outer row/column when the agent stands next to a border wall.
// Colours: reference palette (0..1000) times 255/1000, truncated to uint8 as numpy's cast does.
//
// Apples: one eaten on distractor step s (1-based) is back on its cell after step s + respawn_every + 1
// (reference: visible once frame > pickup frame + 20); the pick-up check runs before the respawn, so an
// apple that reappears under the agent is eaten only on a later step.
//
// Reward phase, cfg.reward_phase:
//   Paper:     touching a colour ends the episode: the matching one gives cfg.final_reward, another 0.
//   Reference: touching any colour removes all three (matching one pays cfg.final_reward); the phase
//              always runs reward_len steps.
// success = reward-phase reward > 0, set when the episode ends.
//
// Door colours: three equally spaced hues (pure red, green, blue) assigned to the three doors by a random
// permutation; cfg.colours = Episode draws it per episode from the episode seed, Fixed draws it once
// from cfg.colour_seed for every env and episode (the reference shuffles once per env instance with an
// unseeded rng). The target colour is drawn per episode in both.
//
// Determinism: all randomness is drawn at reset from make_rng(seed, kVisualMatchStream, 0), so an
// episode is a pure function of its seed and the actions; env i never depends on the others.
// No auto-reset: once done[i] is set, step() leaves env i unchanged (reward 0, done stays 1) until the
// caller calls reset_one(i, seed) (or reset()).
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "core/image.h"

namespace memlab {

enum class RewardPhaseVariant { Paper, Reference };
enum class ColourShuffle { Episode, Fixed };
enum class Phase : uint8_t { Explore = 0, Distractor = 1, Reward = 2 };

struct VisualMatchConfig {
  int distractor_len = 750;
  int explore_len = 15;
  int reward_len = 15;
  int n_apples = 10;
  float apple_reward = 1.0f;
  int respawn_every = 20;
  float final_reward = 100.0f;
  RewardPhaseVariant reward_phase = RewardPhaseVariant::Paper;
  ColourShuffle colours = ColourShuffle::Episode;
  uint64_t colour_seed = 0;

  // UserError naming the field and the allowed range.
  void validate() const;
  int max_episode_len() const { return explore_len + distractor_len + reward_len; }
};

// "paper" | "reference" and "episode" | "fixed"; UserError listing the allowed names otherwise.
RewardPhaseVariant parse_reward_phase(const std::string& name);
ColourShuffle parse_colour_shuffle(const std::string& name);
const char* phase_name(Phase p);

constexpr int kGridRows = 7, kGridCols = 11, kView = 5, kObsChannels = 3;
constexpr int kObsSize = kObsChannels * kView * kView;  // 75
constexpr int kNumActions = 4;                          // 0 N, 1 S, 2 W, 3 E (the reference's order)
constexpr uint64_t kVisualMatchStream = 0x564d;         // rng stream of episode draws

// What lies on a board cell (the agent is drawn on top of it).
enum class Cell : uint8_t { Background = 0, Wall, Apple, Red, Green, Blue };
Rgb cell_colour(Cell c);
Rgb player_colour();

// One env's full state, readable for tests, rendering and scripted policies.
struct VisualMatchState {
  std::array<Cell, kGridRows * kGridCols> cells{};
  std::array<int32_t, kGridRows * kGridCols> eaten_at{};  // distractor step an apple was eaten, -1 none
  Phase phase = Phase::Explore;
  int phase_step = 0;    // steps taken in the current phase
  int episode_step = 0;  // steps taken in the episode
  int row = 0, col = 0;  // agent position
  Cell target = Cell::Red;
  std::array<Cell, 3> doors{};  // colours of the doors at columns 2, 5, 8
  int ring_cell = 0;            // which of the 8 explore ring cells shows the target (row-major)
  uint32_t apple_slots = 0;     // bit k: apple slot k (row-major over the 22 slots) starts with an apple
  float reward_phase_reward = 0.0f;
  float episode_return = 0.0f;
  bool done = false;
  bool success = false;

  Cell at(int r, int c) const { return cells[r * kGridCols + c]; }
};

class VisualMatch {
 public:
  VisualMatch(int64_t n_envs, VisualMatchConfig cfg);

  int64_t size() const { return static_cast<int64_t>(states_.size()); }
  const VisualMatchConfig& config() const { return cfg_; }

  // Start a new episode in every env: env i gets seeds[i] (or episode_seed(base_seed, i)).
  void reset(const std::vector<uint64_t>& seeds);
  void reset(uint64_t base_seed);
  void reset_one(int64_t i, uint64_t seed);
  // One action per env, each in [0, 4). Envs already done are left as they are.
  void step(const int64_t* actions);
  void step(const std::vector<int64_t>& actions);

  // Outputs of the last reset/step, one row per env.
  const uint8_t* obs() const { return obs_.data(); }  // [n, 3, 5, 5]
  const uint8_t* obs(int64_t i) const { return obs_.data() + i * kObsSize; }
  const float* rewards() const { return rewards_.data(); }
  const uint8_t* done() const { return done_.data(); }
  const uint8_t* success() const { return success_.data(); }
  const VisualMatchState& state(int64_t i) const { return states_[static_cast<size_t>(i)]; }

 private:
  void enter_phase(VisualMatchState& s, Phase p);
  float step_one(VisualMatchState& s, int64_t action);
  void render_obs(int64_t i);

  VisualMatchConfig cfg_;
  std::array<Cell, 3> fixed_doors_{};
  std::vector<VisualMatchState> states_;
  std::vector<uint8_t> obs_, done_, success_;
  std::vector<float> rewards_;
};

// Seed of episode `index` under run seed `base` (what reset(base) gives env `index`).
uint64_t episode_seed(uint64_t base, uint64_t index);
// The 5x5 view of a state as CHW bytes (what obs() holds).
void render_view(const VisualMatchState& s, uint8_t* out_chw);
// Board cells of the 22 apple slots and of the 8 explore ring cells, row-major.
const std::vector<std::array<int, 2>>& apple_slots();
const std::vector<std::array<int, 2>>& ring_cells();
constexpr int kDoorRow = 1, kDoorCols[3] = {2, 5, 8};

}  // namespace memlab
