// Passive Visual Match: phases, views, apples, the reward phase of both variants, determinism.
#include <gtest/gtest.h>

#include <set>

#include "core/errors.h"
#include "core/rng.h"
#include "envs/visual_match.h"
#include "envs/visual_match_oracle.h"
#include "envs/visual_match_render.h"

using namespace memlab;

namespace {
constexpr int64_t N = 0, S = 1, W = 2, E = 3;

VisualMatchConfig small(int L = 30, RewardPhaseVariant v = RewardPhaseVariant::Paper) {
  VisualMatchConfig cfg;
  cfg.distractor_len = L;
  cfg.reward_phase = v;
  return cfg;
}

Rgb view_at(const VisualMatch& env, int64_t i, int r, int c) {
  const uint8_t* o = env.obs(i);
  const int k = r * kView + c;
  return {o[k], o[25 + k], o[50 + k]};
}

void step1(VisualMatch& env, int64_t a) { env.step(std::vector<int64_t>{a}); }

// Through explore and distractor without moving (S bumps into the wall below (5,5)); returns the
// reward collected on the way.
float to_reward_phase(VisualMatch& env) {
  float sum = 0;
  const int n = env.config().explore_len + env.config().distractor_len;
  for (int k = 0; k < n; ++k) {
    step1(env, S);
    sum += env.rewards()[0];
  }
  EXPECT_EQ(env.state(0).phase, Phase::Reward);
  return sum;
}

// Actions from (5,5) to the door at column `col`: up the corridor to row 3, across, up.
std::vector<int64_t> path_to(int col) {
  std::vector<int64_t> p = {N, N};
  for (int c = 5; c != col; c += col < 5 ? -1 : 1) p.push_back(col < 5 ? W : E);
  p.push_back(N);
  p.push_back(N);
  return p;
}

int door_col(const VisualMatchState& s, bool target) {
  for (int k = 0; k < 3; ++k)
    if ((s.doors[static_cast<size_t>(k)] == s.target) == target) return kDoorCols[k];
  return -1;
}
}  // namespace

TEST(VisualMatch, PaletteIsTheReferenceScaledAndTruncated) {
  EXPECT_EQ(cell_colour(Cell::Background), (Rgb{204, 204, 204}));
  EXPECT_EQ(cell_colour(Cell::Wall), (Rgb{25, 25, 25}));
  EXPECT_EQ(cell_colour(Cell::Apple), (Rgb{140, 178, 0}));
  EXPECT_EQ(player_colour(), (Rgb{228, 148, 109}));
  EXPECT_EQ(cell_colour(Cell::Red), (Rgb{255, 0, 0}));
  EXPECT_EQ(cell_colour(Cell::Green), (Rgb{0, 255, 0}));
  EXPECT_EQ(cell_colour(Cell::Blue), (Rgb{0, 0, 255}));
  EXPECT_EQ(apple_slots().size(), 22u);
  EXPECT_EQ(ring_cells().size(), 8u);
}

TEST(VisualMatch, PhaseLengthsReferenceVariantIs30PlusL) {
  for (int L : {0, 1, 30}) {
    VisualMatch env(1, small(L, RewardPhaseVariant::Reference));
    env.reset(std::vector<uint64_t>{7});
    EXPECT_EQ(env.state(0).phase, Phase::Explore);
    for (int k = 1; k <= 30 + L; ++k) {
      ASSERT_FALSE(env.done()[0]) << "L=" << L << " step " << k;
      step1(env, S);
      const auto& s = env.state(0);
      EXPECT_EQ(s.episode_step, k);
      const Phase want = k < 15 ? Phase::Explore : k < 15 + L ? Phase::Distractor : Phase::Reward;
      EXPECT_EQ(s.phase, want) << "L=" << L << " step " << k;
      if (k < 30 + L) EXPECT_EQ(s.phase_step, k < 15 ? k : k < 15 + L ? k - 15 : k - 15 - L);
    }
    EXPECT_TRUE(env.done()[0]);
    EXPECT_FALSE(env.success()[0]);
    EXPECT_EQ(env.state(0).episode_step, 30 + L);
  }
}

TEST(VisualMatch, PaperVariantRunsOutAfter15RewardSteps) {
  VisualMatch env(1, small(20));
  env.reset(std::vector<uint64_t>{3});
  EXPECT_EQ(to_reward_phase(env), 0.0f);
  for (int k = 0; k < 14; ++k) {
    step1(env, S);
    ASSERT_FALSE(env.done()[0]);
  }
  step1(env, S);
  EXPECT_TRUE(env.done()[0]);
  EXPECT_FALSE(env.success()[0]);
  EXPECT_EQ(env.state(0).episode_return, 0.0f);
}

TEST(VisualMatch, ExploreAgentCannotMoveAndSeesTheTarget) {
  std::set<int> rings;
  std::set<Cell> targets;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    VisualMatch env(kNumActions, small());
    env.reset(std::vector<uint64_t>(kNumActions, seed));  // same episode, one action each
    for (int k = 0; k < 15; ++k) {
      for (int64_t a = 0; a < kNumActions; ++a) {
        const auto& s = env.state(a);
        ASSERT_EQ(s.phase, Phase::Explore);
        ASSERT_EQ(s.row, 2);
        ASSERT_EQ(s.col, 5);
        // The view: agent in the centre; the ring around it: one target cell, seven walls.
        EXPECT_EQ(view_at(env, a, 2, 2), player_colour());
        int n_target = 0, n_wall = 0;
        for (const auto& rc : ring_cells()) {
          const Rgb c = view_at(env, a, rc[0] - 2 + 2, rc[1] - 5 + 2);
          n_target += c == cell_colour(s.target);
          n_wall += c == cell_colour(Cell::Wall);
        }
        EXPECT_EQ(n_target, 1);
        EXPECT_EQ(n_wall, 7);
        const auto& t = ring_cells()[static_cast<size_t>(s.ring_cell)];
        EXPECT_EQ(view_at(env, a, t[0], t[1] - 3), cell_colour(s.target));
        // Outside the ring: background.
        for (int c = 0; c < kView; ++c) EXPECT_EQ(view_at(env, a, 4, c), cell_colour(Cell::Background));
        for (int r = 0; r < kView; ++r) EXPECT_EQ(view_at(env, a, r, 0), cell_colour(Cell::Background));
      }
      env.step(std::vector<int64_t>{N, S, W, E});
    }
    EXPECT_EQ(env.state(0).phase, Phase::Distractor);
    rings.insert(env.state(0).ring_cell);
    targets.insert(env.state(0).target);
  }
  EXPECT_EQ(rings.size(), 8u);
  EXPECT_EQ(targets.size(), 3u);
}

TEST(VisualMatch, CropAtTheWallsPadsWithBackground) {
  VisualMatch env(1, small(40));
  env.reset(std::vector<uint64_t>{11});
  for (int k = 0; k < 15; ++k) step1(env, N);
  for (int64_t a : {N, N, N, N, W, W, W, W}) step1(env, a);
  const auto& s = env.state(0);
  ASSERT_EQ(s.row, 1);
  ASSERT_EQ(s.col, 1);
  const Rgb bg = cell_colour(Cell::Background), wall = cell_colour(Cell::Wall);
  for (int c = 0; c < kView; ++c) EXPECT_EQ(view_at(env, 0, 0, c), bg) << "pad row above the board";
  for (int r = 0; r < kView; ++r) EXPECT_EQ(view_at(env, 0, r, 0), bg) << "pad column left of the board";
  for (int c = 1; c < kView; ++c) EXPECT_EQ(view_at(env, 0, 1, c), wall) << "top wall";
  for (int r = 1; r < kView; ++r) EXPECT_EQ(view_at(env, 0, r, 1), wall) << "left wall";
  EXPECT_EQ(view_at(env, 0, 2, 2), player_colour());
  // Inner cells show the board.
  for (int r = 2; r < kView; ++r)
    for (int c = 2; c < kView; ++c)
      if (r != 2 || c != 2) EXPECT_EQ(view_at(env, 0, r, c), cell_colour(s.at(r - 1, c - 1)));

  // Reward phase start (5,5): the corridor, the board's last row of walls, then a pad row.
  VisualMatch env2(1, small(5));
  env2.reset(std::vector<uint64_t>{11});
  to_reward_phase(env2);
  const std::vector<std::vector<Rgb>> want = {
      {bg, bg, bg, bg, bg},  // row 3 of the room
      {wall, bg, bg, bg, wall},
      {wall, bg, player_colour(), bg, wall},
      {wall, wall, wall, wall, wall},
      {bg, bg, bg, bg, bg},  // below the board
  };
  for (int r = 0; r < kView; ++r)
    for (int c = 0; c < kView; ++c) EXPECT_EQ(view_at(env2, 0, r, c), want[r][c]) << r << "," << c;
}

TEST(VisualMatch, AppleRewardAndRespawnAfter20Steps) {
  VisualMatchConfig cfg = small(60);
  cfg.n_apples = 22;  // every slot, so the layout is known
  VisualMatch env(1, cfg);
  env.reset(std::vector<uint64_t>{5});
  for (int k = 0; k < 15; ++k) step1(env, N);
  ASSERT_EQ(env.state(0).at(5, 3), Cell::Apple);
  step1(env, W);  // distractor step 1: (5,4), no slot
  EXPECT_EQ(env.rewards()[0], 0.0f);
  step1(env, W);  // step 2: eat (5,3)
  EXPECT_EQ(env.rewards()[0], 1.0f);
  EXPECT_EQ(env.state(0).at(5, 3), Cell::Background);
  // Alternate E/W: on (5,3) at even steps. Gone through step 22, back after step 23, eaten at 24.
  for (int t = 3; t <= 24; ++t) {
    step1(env, t % 2 ? E : W);
    const auto& s = env.state(0);
    ASSERT_EQ(s.phase_step, t);
    EXPECT_EQ(env.rewards()[0], t == 24 ? 1.0f : 0.0f) << "step " << t;
    if (t <= 22) EXPECT_EQ(s.at(5, 3), Cell::Background) << "step " << t;
    if (t == 23) {
      EXPECT_EQ(s.at(5, 3), Cell::Apple);
      EXPECT_EQ(view_at(env, 0, 2, 1), cell_colour(Cell::Apple));  // shown to the agent
    }
  }
  EXPECT_EQ(env.state(0).episode_return, 2.0f);

  // Pick-up before respawn: waiting on a slot (bumping into the wall), the apple reappears under the
  // agent at step eaten+21 without paying, and pays on the next step.
  VisualMatch env2(1, cfg);
  env2.reset(std::vector<uint64_t>{5});
  for (int k = 0; k < 15; ++k) step1(env2, N);
  for (int k = 0; k < 4; ++k) step1(env2, W);  // eats (5,3) at step 2 and (5,1) at step 4
  ASSERT_EQ(env2.state(0).col, 1);
  for (int t = 5; t <= 26; ++t) {
    step1(env2, W);
    EXPECT_EQ(env2.rewards()[0], t == 26 ? 1.0f : 0.0f) << "step " << t;
  }
}

TEST(VisualMatch, ApplePlacementIsRandomAmongSlots) {
  std::set<uint32_t> layouts;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    VisualMatch env(1, small());
    env.reset(std::vector<uint64_t>{seed});
    for (int k = 0; k < 15; ++k) step1(env, S);
    int apples = 0;
    for (int r = 0; r < kGridRows; ++r)
      for (int c = 0; c < kGridCols; ++c) apples += env.state(0).at(r, c) == Cell::Apple;
    EXPECT_EQ(apples, 10);
    layouts.insert(env.state(0).apple_slots);
  }
  EXPECT_GT(layouts.size(), 15u);
}

TEST(VisualMatch, PaperVariantMatchingColourPays100AndEnds) {
  for (uint64_t seed = 0; seed < 6; ++seed) {
    VisualMatch env(1, small(10));
    env.reset(std::vector<uint64_t>{seed});
    to_reward_phase(env);
    const auto path = path_to(door_col(env.state(0), true));
    for (size_t k = 0; k < path.size(); ++k) {
      step1(env, path[k]);
      const bool last = k + 1 == path.size();
      EXPECT_EQ(env.rewards()[0], last ? 100.0f : 0.0f);
      EXPECT_EQ(bool(env.done()[0]), last);
    }
    EXPECT_TRUE(env.success()[0]);
    EXPECT_EQ(env.state(0).episode_step, 25 + int(path.size()));
    // A done env ignores further steps.
    const VisualMatchState before = env.state(0);
    step1(env, S);
    EXPECT_EQ(env.rewards()[0], 0.0f);
    EXPECT_TRUE(env.done()[0]);
    EXPECT_EQ(env.state(0).episode_step, before.episode_step);
    EXPECT_EQ(env.state(0).row, before.row);
  }
}

TEST(VisualMatch, PaperVariantWrongColourEndsWithNothing) {
  VisualMatch env(1, small(10));
  env.reset(std::vector<uint64_t>{4});
  to_reward_phase(env);
  for (int64_t a : path_to(door_col(env.state(0), false))) step1(env, a);
  EXPECT_TRUE(env.done()[0]);
  EXPECT_EQ(env.rewards()[0], 0.0f);
  EXPECT_FALSE(env.success()[0]);
}

TEST(VisualMatch, ReferenceVariantRemovesDoorsAndRuns15Steps) {
  for (bool right : {true, false}) {
    VisualMatch env(1, small(10, RewardPhaseVariant::Reference));
    env.reset(std::vector<uint64_t>{9});
    to_reward_phase(env);
    const int target_col = door_col(env.state(0), true);
    const auto path = path_to(door_col(env.state(0), right));
    for (int64_t a : path) step1(env, a);
    EXPECT_EQ(env.rewards()[0], right ? 100.0f : 0.0f);
    EXPECT_FALSE(env.done()[0]);
    for (int c : kDoorCols) EXPECT_EQ(env.state(0).at(kDoorRow, c), Cell::Background);
    // Walk to where the target was (nothing left to take), bumping the top wall to fill the 15 steps.
    int steps = static_cast<int>(path.size());
    for (int c = env.state(0).col; c != target_col && steps < 15; ++steps) {
      step1(env, target_col < c ? W : E);
      c = env.state(0).col;
      EXPECT_EQ(env.rewards()[0], 0.0f);
    }
    for (; steps < 15; ++steps) {
      EXPECT_FALSE(env.done()[0]);
      step1(env, N);
      EXPECT_EQ(env.rewards()[0], 0.0f);
    }
    EXPECT_TRUE(env.done()[0]);
    EXPECT_EQ(bool(env.success()[0]), right);
    EXPECT_EQ(env.state(0).episode_step, 40);
    EXPECT_EQ(env.state(0).episode_return, right ? 100.0f : 0.0f);
  }
}

TEST(VisualMatch, OracleSolvesFullLengthEpisodes) {
  VisualMatch env(4, VisualMatchConfig{});
  env.reset(uint64_t(1));
  std::vector<int64_t> a(4);
  for (int k = 0; k < 780 && !(env.done()[0] && env.done()[1] && env.done()[2] && env.done()[3]); ++k) {
    for (int i = 0; i < 4; ++i) a[static_cast<size_t>(i)] = oracle_action(env.state(i));
    env.step(a);
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(env.done()[i]);
    EXPECT_TRUE(env.success()[i]);
    // 750 distractor steps eat far more than the 10 initial apples thanks to respawns.
    EXPECT_GT(env.state(i).episode_return, 100.0f + 30.0f);
  }
}

TEST(VisualMatch, DeterministicPerSeedAndActions) {
  auto run = [](uint64_t base, uint64_t action_seed) {
    VisualMatch env(6, small(50));
    env.reset(base);
    Rng rng = make_rng(action_seed, 1, 0);
    std::vector<uint8_t> trace;
    std::vector<int64_t> a(6);
    for (int k = 0; k < 95; ++k) {
      for (auto& x : a) x = uniform_int(rng, 0, 3);
      env.step(a);
      trace.insert(trace.end(), env.obs(), env.obs() + 6 * kObsSize);
      for (int i = 0; i < 6; ++i) trace.push_back(static_cast<uint8_t>(env.rewards()[i] * 2 + env.done()[i]));
    }
    return trace;
  };
  EXPECT_EQ(run(1, 2), run(1, 2));
  EXPECT_NE(run(1, 2), run(3, 2));
  EXPECT_NE(run(1, 2), run(1, 4));

  VisualMatch a(3, small()), b(3, small());
  a.reset(uint64_t(77));
  b.reset(std::vector<uint64_t>{episode_seed(77, 0), episode_seed(77, 1), episode_seed(77, 2)});
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a.state(i).apple_slots, b.state(i).apple_slots);
}

TEST(VisualMatch, EnvsOfABatchAreIndependent) {
  VisualMatch one(1, small(40));
  VisualMatch many(5, small(40));
  one.reset(std::vector<uint64_t>{123});
  many.reset(std::vector<uint64_t>{1, 2, 3, 123, 5});
  Rng rng = make_rng(9, 9, 9);
  std::vector<int64_t> a(5);
  for (int k = 0; k < 70; ++k) {
    for (auto& x : a) x = uniform_int(rng, 0, 3);
    one.step(std::vector<int64_t>{a[3]});
    many.step(a);
    ASSERT_TRUE(std::equal(one.obs(), one.obs() + kObsSize, many.obs(3))) << "step " << k;
    ASSERT_EQ(one.rewards()[0], many.rewards()[3]);
    ASSERT_EQ(one.done()[0], many.done()[3]);
    if (k == 30) many.reset_one(1, 99);  // resetting a neighbour changes nothing for env 3
  }
}

TEST(VisualMatch, DoorColoursPerEpisodeOrFixed) {
  std::set<std::array<Cell, 3>> episode_perms, fixed_perms;
  VisualMatchConfig fixed = small();
  fixed.colours = ColourShuffle::Fixed;
  fixed.colour_seed = 5;
  for (uint64_t seed = 0; seed < 60; ++seed) {
    VisualMatch e(1, small()), f(1, fixed);
    e.reset(std::vector<uint64_t>{seed});
    f.reset(std::vector<uint64_t>{seed});
    episode_perms.insert(e.state(0).doors);
    fixed_perms.insert(f.state(0).doors);
  }
  EXPECT_EQ(episode_perms.size(), 6u);
  EXPECT_EQ(fixed_perms.size(), 1u);
}

TEST(VisualMatch, BadConfigAndActionsAreUserErrors) {
  VisualMatchConfig cfg;
  cfg.n_apples = 23;
  EXPECT_THROW(VisualMatch(1, cfg), UserError);
  cfg = VisualMatchConfig{};
  cfg.reward_len = 0;
  EXPECT_THROW(VisualMatch(1, cfg), UserError);
  EXPECT_THROW(VisualMatch(0, VisualMatchConfig{}), UserError);
  EXPECT_THROW(parse_reward_phase("papers"), UserError);
  EXPECT_EQ(parse_reward_phase("reference"), RewardPhaseVariant::Reference);
  EXPECT_EQ(parse_colour_shuffle("fixed"), ColourShuffle::Fixed);
  VisualMatch env(2, small());
  EXPECT_THROW(env.step(std::vector<int64_t>{0, 4}), UserError);
  EXPECT_THROW(env.step(std::vector<int64_t>{0}), UserError);
  EXPECT_EQ(env.state(0).episode_step, 0);  // nothing applied
}

TEST(VisualMatch, RenderedPicturesMatchTheState) {
  VisualMatch env(1, small());
  env.reset(std::vector<uint64_t>{2});
  const auto& s = env.state(0);
  const Image v = view_image(s, 3);
  ASSERT_EQ(v.width, 15);
  for (int r = 0; r < kView; ++r)
    for (int c = 0; c < kView; ++c) EXPECT_EQ(v.at(c * 3 + 1, r * 3 + 1), view_at(env, 0, r, c));
  const Image g = grid_image(s, 4);
  ASSERT_EQ(g.width, 44);
  ASSERT_EQ(g.height, 28);
  EXPECT_EQ(g.at(5 * 4 + 2, 2 * 4 + 2), player_colour());
  EXPECT_EQ(g.at(0 * 4 + 2, 6 * 4 + 2), cell_colour(Cell::Background));
  EXPECT_EQ(g.at(3 * 4, 2 * 4 + 2), (Rgb{0, 0, 0}));  // left edge of the view window (column 3)
  EXPECT_NE(frame_caption(s, 0).find("explore"), std::string::npos);
}
