#pragma once
// Shared pieces of the RL tests (test_sac.cpp on the CPU, test_sac_gpu.cpp on the GPU): a small agent's config and
// the comparison of two rollouts of the same seeds.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "core/config.h"
#include "rl/rl_trainer.h"
#include "rl/rollout.h"

namespace memlab::testing {

// The mixer's RL defaults, 2 blocks of width `hidden` with SwiGLU width `mlp_inner`, HQLT windows of 4, heads of
// width `head_hidden`; each test sets what else it needs.
inline Config small_rl_config(const std::string& mixer, int hidden, int mlp_inner, int head_hidden) {
  Config c(rl_schema());
  c.merge_text(rl_model_defaults(mixer), "test");
  c.set_value("model.name", mixer, "test");
  c.set_value("model.hidden", std::to_string(hidden), "test");
  c.set_value("model.layers", "2", "test");
  c.set_value("model.mlp_inner", std::to_string(mlp_inner), "test");
  c.set_value("model.hqlt.window", "4", "test");
  c.set_value("rl.head_hidden", std::to_string(head_hidden), "test");
  return c;
}

// Two rollouts of the same seeds took the same actions and saw the same observations and rewards.
inline void expect_same_episodes(const Episodes& a, const Episodes& b, const std::string& what) {
  ASSERT_EQ(a.actions.size(), b.actions.size()) << what;
  for (size_t i = 0; i < a.actions.size(); ++i) {
    EXPECT_TRUE(torch::equal(a.actions[i], b.actions[i])) << what << " episode " << i;
    EXPECT_TRUE(torch::equal(a.obs[i], b.obs[i])) << what << " episode " << i;
    EXPECT_TRUE(torch::equal(a.rewards[i], b.rewards[i])) << what << " episode " << i;
  }
}

}  // namespace memlab::testing
