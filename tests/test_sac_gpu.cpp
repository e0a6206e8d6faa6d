// RL on the GPU: the episode replay on the device samples what the CPU one samples, the SAC update captured
// as a CUDA graph (heads under TF32 or not, the sequence model's backward after theirs) moves the weights as the
// eager update does, and the rollouts' graphed acting step acts as the eager one.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "core/config.h"
#include "core/rng.h"
#include "envs/visual_match.h"
#include "models/agent.h"
#include "rl/replay_buffer.h"
#include "rl/rl_trainer.h"
#include "rl/rollout.h"
#include "rl/sac.h"
#include "tests/mixer_check.h"
#include "tests/rl_check.h"

using namespace memlab;
using namespace memlab::testing;

namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device"

Agent small_agent(const std::string& mixer) {
  Config c = small_rl_config(mixer, 32, 64, 32);
  c.set_value("rl.obs_dropout", "0", "test");  // eager and graphed updates draw dropout differently
  c.set_value("rl.dropout", "0", "test");
  torch::manual_seed(7);
  return Agent(c);
}

}  // namespace

TEST(SacGpu, ReplayOnCudaSamplesAsOnCpu) {
  SKIP_WITHOUT_CUDA();
  EpisodeReplay cpu(40, 9, kObsSize, torch::kCPU), gpu(40, 9, kObsSize, torch::kCUDA);
  torch::manual_seed(1);
  for (int64_t T : {3, 9, 5, 7, 2, 8}) {  // six episodes in four slots: two evicted
    const auto obs = torch::randint(0, 256, {T + 1, kObsSize}, torch::kLong).to(torch::kUInt8);
    const auto actions = torch::randint(0, kNumActions, {T}, torch::kLong);
    const auto rewards = torch::randn({T});
    cpu.add(obs, actions, rewards, 0);
    gpu.add(obs, actions, rewards, 0);
  }
  Rng r1 = make_rng(3, 4, 5), r2 = make_rng(3, 4, 5);
  for (int k = 0; k < 5; ++k) {
    const auto a = cpu.sample(16, r1), b = gpu.sample(16, r2);
    EXPECT_TRUE(torch::equal(a.obs, b.obs.cpu()));
    EXPECT_TRUE(torch::equal(a.actions, b.actions.cpu()));
    EXPECT_TRUE(torch::equal(a.rewards, b.rewards.cpu()));
    EXPECT_TRUE(torch::equal(a.mask, b.mask.cpu()));
    EXPECT_TRUE(torch::equal(a.done, b.done.cpu()));
  }
}

TEST(SacGpu, GraphedUpdateMatchesEager) {
  SKIP_WITHOUT_CUDA();
  for (const std::string mixer : {"transformer", "deltanet"})
    for (bool tf32 : {false, true}) {
      torch::manual_seed(2);
      const int64_t B = 4, T = 11;
      std::vector<SacBatch> batches;
      for (int i = 0; i < 4; ++i) {
        SacBatch b;
        b.obs = torch::randint(0, 256, {B, T + 1, kObsSize}, torch::kLong).to(torch::kUInt8).cuda();
        b.actions = torch::randint(0, kNumActions, {B, T}, torch::kLong).cuda();
        b.rewards = torch::randn({B, T}).cuda();
        b.mask = torch::ones({B, T}).cuda();
        b.done = torch::zeros({B, T}).cuda();
        b.done.select(1, T - 1).fill_(1);
        batches.push_back(b);
      }
      SacOptions so;
      so.tf32 = tf32;
      so.cuda_graph = false;
      Sac eager(small_agent(mixer), torch::kCUDA, so);
      so.cuda_graph = true;
      Sac graphed(small_agent(mixer), torch::kCUDA, so);
      for (int step = 0; step < 8; ++step) {  // past the graph's eager warm-up steps and its capture
        eager.update(batches[step % 4]);
        graphed.update(batches[step % 4]);
      }
      torch::cuda::synchronize();
      EXPECT_EQ(graphed.mode(), "cuda graph") << mixer;
      const auto pe = eager.agent->parameters(), pg = graphed.agent->parameters();
      double worst = 0;
      for (size_t i = 0; i < pe.size(); ++i) worst = std::max(worst, rel_err(pg[i], pe[i]));
      // fp32 throughout (no autocast). Under TF32, cuBLAS may pick other kernels when capturing: the losses agree
      // to TF32 rounding (H200: under 1e-4 on one call, 8.1e-4 for the actor's on another; its sum cancels), and
      // Adam's normalised step turns that rounding in near-zero gradients into weight differences of up to 2 lr
      // per step (8 steps at 3e-4; H200: 5e-4 relative).
      EXPECT_LT(worst, tf32 ? 2e-3 : 1e-5) << mixer << " tf32 " << tf32;
      EXPECT_LT(rel_err(graphed.critic_sum, eager.critic_sum), tf32 ? 2e-3 : 1e-5) << mixer;
      EXPECT_LT(rel_err(graphed.actor_sum, eager.actor_sum), tf32 ? 2e-3 : 1e-5) << mixer;
    }
}

TEST(SacGpu, GraphedRolloutMatchesEager) {
  // Greedy episodes through the fixed-shape step captured as a CUDA graph against the dynamic step run eagerly:
  // the same actions, observations and rewards, fp32 without TF32 (greedy actions are a function of the weights). Then
  // sampled episodes with dropout through the same graphs: complete, valid episodes.
  SKIP_WITHOUT_CUDA();
  NoTf32 no_tf32;
  VisualMatchConfig vc;
  vc.distractor_len = 30;
  VisualMatch env(3, vc);
  const std::vector<uint64_t> seeds{4, 5, 6};
  for (const std::string mixer : {"transformer", "deltanet", "hqlt"}) {
    Agent a = small_agent(mixer);
    a->to(torch::kCUDA);
    PolicySteps fixed(a, /*bf16=*/false, torch::kCUDA, /*graph=*/true);
    for (int round = 0; round < 2; ++round) {  // the first round captures the graph, the second replays it only
      RolloutOptions ro;
      ro.mode = ActMode::Greedy;
      ro.dropout = false;
      Rng rng = make_rng(1, 2, 3);
      const auto dyn = play_episodes(env, seeds, &a, torch::kCUDA, ro, rng);
      ro.fixed = &fixed;
      expect_same_episodes(dyn, play_episodes(env, seeds, &a, torch::kCUDA, ro, rng), mixer);
      EXPECT_TRUE(fixed.get(3, vc.max_episode_len(), ActMode::Greedy, false).captured()) << mixer;
    }
    RolloutOptions ro;
    ro.fixed = &fixed;
    Rng rng = make_rng(1, 2, 4);
    for (int round = 0; round < 2; ++round) {
      const auto e = play_episodes(env, seeds, &a, torch::kCUDA, ro, rng);
      for (size_t i = 0; i < seeds.size(); ++i) {
        EXPECT_TRUE(e.lengths[i] > 0 && e.lengths[i] <= vc.max_episode_len()) << mixer;
        EXPECT_TRUE(e.actions[i].ge(0).logical_and(e.actions[i].lt(kNumActions)).all().item<bool>()) << mixer;
      }
    }
    EXPECT_TRUE(fixed.get(3, vc.max_episode_len(), ActMode::Sample, true).captured()) << mixer;
  }
}
