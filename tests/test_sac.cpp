// Discrete SAC: the critic target, critic loss and actor loss on hand-computed cases; one learner update
// (target critics move by tau, freeze_critic keeps the actor's gradient off the encoder and critics); the
// episode replay; the agent's step() against its training form; rollouts against the env.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <set>
#include <sstream>

#include "core/config.h"
#include "core/errors.h"
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

torch::Tensor t(std::vector<double> v) { return torch::tensor(v, torch::kDouble); }

// pi = softmax([0, ln 3]) = [1/4, 3/4]
const double kLn3 = std::log(3.0);

Config agent_config(const std::string& mixer) {
  Config c = small_rl_config(mixer, 16, 32, 8);
  c.set_value("model.hqlt.chunk", "8", "test");
  c.set_value("model.deltanet.chunk", "8", "test");
  c.set_value("model.init_std", "0.2", "test");
  return c;
}

Agent agent(const std::string& mixer) {
  torch::manual_seed(5);
  return Agent(agent_config(mixer));
}

torch::Tensor random_obs(int64_t B, int64_t T) {
  return torch::randint(0, 256, {B, T, kObsSize}, torch::kLong).to(torch::kUInt8);
}

// B whole episodes of T transitions with random observations, actions and rewards.
SacBatch random_batch(int64_t B, int64_t T) {
  SacBatch b;
  b.obs = random_obs(B, T + 1);
  b.actions = torch::randint(0, kNumActions, {B, T}, torch::kLong);
  b.rewards = torch::randn({B, T});
  b.mask = torch::ones({B, T});
  b.done = torch::zeros({B, T});
  b.done.select(1, T - 1).fill_(1);
  return b;
}

}  // namespace

TEST(Sac, CriticTargetHandComputed) {
  // V = 1/4 (min(1, 1.5) - 0.1 ln 1/4) + 3/4 (min(2, 1) - 0.1 ln 3/4) = 1.0562335...
  const auto logits = t({0, kLn3}), q1 = t({1, 2}), q2 = t({1.5, 1});
  EXPECT_NEAR(soft_value(logits, q1, q2, 0.1).item<double>(), 1.0562335, 1e-7);
  EXPECT_NEAR(critic_target(logits, q1, q2, t({0.5}), t({0}), 0.9, 0.1).item<double>(), 0.5 + 0.9 * 1.0562335, 1e-7);
  // done: no bootstrap
  EXPECT_NEAR(critic_target(logits, q1, q2, t({0.5}), t({1}), 0.9, 0.1).item<double>(), 0.5, 1e-12);
  // log pi is clamped at log 1e-8 (a one-hot policy's entropy term stays finite)
  const auto lp = policy_log_probs(t({0, 100}));
  EXPECT_NEAR(lp[0].item<double>(), std::log(1e-8), 1e-9);
}

TEST(Sac, CriticLossHandComputed) {
  // Q1(a=1) = 2, Q2(a=1) = 3, y = 1.5: 1/2 (0.5^2 + 1.5^2) = 1.25; the masked step (error 100) is left out
  const auto q1 = torch::tensor({{1.0, 2.0}, {0.0, 100.0}}, torch::kDouble).unsqueeze(0);
  const auto q2 = torch::tensor({{0.0, 3.0}, {0.0, 100.0}}, torch::kDouble).unsqueeze(0);
  const auto a = torch::tensor({{1, 1}}, torch::kLong);
  const auto y = torch::tensor({{1.5, 0.0}}, torch::kDouble);
  EXPECT_NEAR(critic_loss(q1, q2, a, y, torch::tensor({{1.0, 0.0}}, torch::kDouble)).item<double>(), 1.25, 1e-12);
  // both steps: (1.25 + 1/2 (100^2 + 100^2)) / 2
  EXPECT_NEAR(critic_loss(q1, q2, a, y, torch::tensor({{1.0, 1.0}}, torch::kDouble)).item<double>(),
              (1.25 + 10000.0) / 2, 1e-9);
}

TEST(Sac, ActorLossHandComputed) {
  // min(Q1, Q2) = [2, 0]: 1/4 (0.1 ln 1/4 - 2) + 3/4 (0.1 ln 3/4 - 0) = -0.5562335...
  const auto logits = t({0, kLn3}).unsqueeze(0).requires_grad_(true);
  const auto q1 = t({3, 0}).unsqueeze(0), q2 = t({2, 4}).unsqueeze(0);
  const auto loss = actor_loss(logits, q1, q2, 0.1, torch::ones({1}, torch::kDouble));
  EXPECT_NEAR(loss.item<double>(), -0.5562335, 1e-7);
  // d/dz_j sum_a pi_a c_a with c_a = alpha log pi_a - m_a is pi_j (c_j + alpha - sum_a pi_a (c_a + alpha)):
  // c = [-2.1386294, -0.0287682]; sum pi (c + 0.1) = -0.4562335; grad = [-0.3955990, 0.3955990]
  loss.backward();
  EXPECT_NEAR(logits.grad()[0][0].item<double>(), 0.25 * (-2.1386294 + 0.1 + 0.4562335), 1e-7);
  EXPECT_NEAR(logits.grad()[0][1].item<double>(), 0.75 * (-0.0287682 + 0.1 + 0.4562335), 1e-7);
}

TEST(Sac, UpdateMovesTargetsByTauAndFreezeCriticKeepsActorOffEncoder) {
  torch::manual_seed(1);
  const int64_t T = 6;
  SacBatch b = random_batch(3, T);
  SacOptions so;
  so.tau = 0.25;
  Sac sac(agent("deltanet"), torch::kCPU, so);
  {  // make the target differ from the online critics
    torch::NoGradGuard ng;
    for (auto& p : sac.target->parameters()) p.add_(0.1);
  }
  std::vector<torch::Tensor> before;
  for (auto& p : sac.target->parameters()) before.push_back(p.clone());
  sac.update(b);
  auto online = sac.agent->critic->parameters(), target = sac.target->parameters();
  for (size_t i = 0; i < online.size(); ++i)
    EXPECT_LT(rel_err(target[i], 0.75 * before[i] + 0.25 * online[i]), 1e-6);
  EXPECT_EQ(sac.bad_updates.item<int64_t>(), 0);

  // freeze_critic: the actor loss reaches the actor only; otherwise it reaches the encoder too
  for (bool freeze : {true, false}) {
    auto a = agent("deltanet");
    auto h = a->forward(b.obs.to(torch::kUInt8));
    const auto h_t = h.narrow(1, 0, T);
    auto [q1, q2] = a->critic(freeze ? h_t.detach() : h_t);
    const auto loss = actor_loss(a->actor(freeze ? h_t.detach() : h_t), freeze ? q1.detach() : q1,
                                 freeze ? q2.detach() : q2, 0.1, b.mask);
    a->zero_grad();
    loss.backward();
    auto has_grad = [](torch::nn::Module& m) {
      double s = 0;
      for (auto& p : m.parameters())
        if (p.grad().defined()) s += p.grad().abs().sum().item<double>();
      return s > 0;
    };
    EXPECT_TRUE(has_grad(*a->actor));
    EXPECT_EQ(has_grad(*a->embed), !freeze);
    EXPECT_EQ(has_grad(*a->critic), !freeze);
  }
}

// The update's losses are the losses of its parts computed one by one: the critics on h_t, the target from the
// target critics and the actor on h_{t+1}, the actor loss on h_t (the update runs the actor once over h).
TEST(Sac, UpdateLossesEqualTheirPartsComputedApart) {
  for (bool freeze : {true, false}) {
    torch::manual_seed(3);
    const int64_t T = 5;
    SacBatch b = random_batch(2, T);
    b.mask[1][T - 1] = 0;
    SacOptions so;
    so.freeze_critic = freeze;
    auto a = agent("deltanet");  // fp32, as the learner runs it
    Sac sac(a, torch::kCPU, so);
    {
      torch::NoGradGuard ng;
      for (auto& p : sac.target->parameters()) p.add_(0.05);
    }
    double lc, la;
    {
      torch::NoGradGuard ng;
      a->train();
      torch::manual_seed(4);  // the same dropout draws as the update's
      const auto h = a->forward(b.obs);
      const auto h_t = h.narrow(1, 0, T), h_n = h.narrow(1, 1, T);
      auto [q1, q2] = a->critic(h_t);
      auto [t1, t2] = sac.target(h_n);
      const auto y = critic_target(a->actor(h_n), t1, t2, b.rewards, b.done, so.gamma, so.alpha);
      lc = critic_loss(q1, q2, b.actions, y, b.mask).item<double>();
      la = actor_loss(a->actor(h_t), q1, q2, so.alpha, b.mask).item<double>();
    }
    const auto embed0 = a->embed->weight.clone(), actor0 = a->actor->out->weight.clone();
    torch::manual_seed(4);
    sac.update(b);
    // The critic loss trains the encoder (through the heads' own leaf of h), the actor loss the actor.
    EXPECT_GT((a->embed->weight - embed0).abs().max().item<double>(), 0.0) << freeze;
    EXPECT_GT((a->actor->out->weight - actor0).abs().max().item<double>(), 0.0) << freeze;
    EXPECT_NEAR(sac.critic_sum.item<double>(), lc, 1e-5 * std::abs(lc)) << freeze;  // fp32 sums
    EXPECT_NEAR(sac.actor_sum.item<double>(), la, 1e-5 * (1 + std::abs(la))) << freeze;
    EXPECT_GT(std::abs(lc), 1e-3);
  }
}

// The encoder's convolutions, run as dense matrices, against torch's conv2d with the same weights: values
// and weight gradients.
TEST(Sac, EncoderEqualsItsConvolutions) {
  auto a = agent("deltanet");
  a->to(torch::kDouble);
  torch::manual_seed(5);
  const auto obs = random_obs(3, 4);
  const auto x = obs.reshape({-1, kObsChannels, kView, kView}).to(torch::kDouble).div(255.0);
  const auto ref = a->embed(torch::relu(a->conv2(torch::relu(a->conv1(x)))).flatten(1)).reshape({3, 4, -1});
  const auto got = a->encode(obs);
  EXPECT_LT(rel_err(got, ref), 1e-13);
  const auto w = torch::randn_like(ref);
  std::vector<torch::Tensor> params = {a->conv1->weight, a->conv1->bias, a->conv2->weight, a->conv2->bias};
  const auto g_ref = torch::autograd::grad({(ref * w).sum()}, params);
  const auto g = torch::autograd::grad({(got * w).sum()}, params);
  for (size_t i = 0; i < params.size(); ++i) EXPECT_LT(rel_err(g[i], g_ref[i]), 1e-13) << i;
}

TEST(Sac, ReplayKeepsEpisodesPadsAndEvicts) {
  // capacity 20 transitions of episodes up to 6 long: 3 slots
  EpisodeReplay r(20, 6, kObsSize, torch::kCPU);
  EXPECT_EQ(r.slots(), 3);
  auto episode = [](int64_t T, int64_t tag) {
    auto obs = torch::full({T + 1, kObsSize}, tag, torch::kUInt8);
    return std::make_tuple(obs, torch::full({T}, tag % 4, torch::kLong), torch::full({T}, double(tag), torch::kFloat));
  };
  for (auto [T, tag] : std::vector<std::pair<int64_t, int64_t>>{{4, 1}, {6, 2}, {2, 3}, {5, 4}}) {
    auto [o, a, w] = episode(T, tag);
    r.add(o, a, w, static_cast<uint64_t>(tag));
  }
  EXPECT_EQ(r.episodes(), 3);
  EXPECT_EQ(r.transitions(), 6 + 2 + 5);  // episode 1 was evicted
  Rng rng = make_rng(1, 2, 3);
  const auto b = r.sample(64, rng);
  ASSERT_EQ(b.obs.sizes(), (std::vector<int64_t>{64, 7, kObsSize}));
  std::set<int64_t> seen;
  for (int64_t i = 0; i < 64; ++i) {
    const int64_t tag = b.obs[i][0][0].item<int64_t>();
    seen.insert(tag);
    const int64_t T = tag == 2 ? 6 : tag == 3 ? 2 : 5;
    EXPECT_EQ(b.mask[i].sum().item<double>(), double(T));
    EXPECT_EQ(b.done[i].sum().item<double>(), 1.0);
    EXPECT_EQ(b.done[i][T - 1].item<double>(), 1.0);
    EXPECT_EQ(b.obs[i][T][5].item<int64_t>(), tag);  // o_T is kept
    if (T < 6) EXPECT_EQ(b.obs[i][T + 1][5].item<int64_t>(), 0);  // padding
    EXPECT_EQ(b.rewards[i].sum().item<double>(), double(T * tag));
  }
  EXPECT_EQ(seen, (std::set<int64_t>{2, 3, 4}));
}

namespace {

// Random episodes of a short env with scaled rewards, and the replay that RlRun hands a checkpoint's buffer.
struct ReplayCase {
  VisualMatchConfig env;
  double scale = 0.5;
  EpisodeReplay::Replay replay() const { return replay_in(env, scale); }
  // n random episodes from seeds first, first + 1, ...
  void fill(EpisodeReplay& r, uint64_t first, int64_t n) const {
    VisualMatch e(n, env);
    std::vector<uint64_t> seeds;
    for (int64_t i = 0; i < n; ++i) seeds.push_back(first + static_cast<uint64_t>(i));
    Rng rng = make_rng(first, 9, 9);
    RolloutOptions ro;
    ro.mode = ActMode::Random;
    const Episodes eps = play_episodes(e, seeds, nullptr, torch::kCPU, ro, rng);
    for (int64_t i = 0; i < n; ++i) r.add(eps.obs[i], eps.actions[i], eps.rewards[i] * scale, eps.seeds[i]);
  }
};

std::string saved(const EpisodeReplay& r) {
  torch::serialize::OutputArchive ar;
  r.save(ar);
  std::ostringstream os;
  ar.save_to(os);
  return os.str();
}

void load(EpisodeReplay& r, const std::string& bytes, const EpisodeReplay::Replay& replay) {
  std::istringstream is(bytes);
  torch::serialize::InputArchive ar;
  ar.load_from(is);
  r.load(ar, replay);
}

bool has_obs(const std::string& bytes) {
  std::istringstream is(bytes);
  torch::serialize::InputArchive ar;
  ar.load_from(is);
  torch::Tensor o;
  return ar.try_read("replay.obs", o);
}

// Two replays sample the same batches from the same draws.
void expect_same_samples(const EpisodeReplay& a, const EpisodeReplay& b, const std::string& what) {
  EXPECT_EQ(a.episodes(), b.episodes()) << what;
  EXPECT_EQ(a.transitions(), b.transitions()) << what;
  Rng ra = make_rng(4, 4, 4), rb = make_rng(4, 4, 4);
  const SacBatch x = a.sample(32, ra), y = b.sample(32, rb);
  EXPECT_TRUE(torch::equal(x.obs, y.obs)) << what;
  EXPECT_TRUE(torch::equal(x.actions, y.actions)) << what;
  EXPECT_TRUE(torch::equal(x.rewards, y.rewards)) << what;
  EXPECT_TRUE(torch::equal(x.mask, y.mask)) << what;
}

}  // namespace

TEST(Sac, ReplayCheckpointPlaysTheEpisodesAgain) {
  ReplayCase rc;
  rc.env.distractor_len = 5;
  const int64_t L = rc.env.max_episode_len();
  EpisodeReplay a(4 * L, L, kObsSize, torch::kCPU);  // 4 slots
  rc.fill(a, 100, 6);                                // the ring wraps: slots hold episodes 4, 5, 2, 3; next is slot 2
  const std::string bytes = saved(a);
  EXPECT_FALSE(has_obs(bytes));
  EpisodeReplay b(4 * L, L, kObsSize, torch::kCPU);
  load(b, bytes, rc.replay());
  expect_same_samples(a, b, "loaded");
  rc.fill(a, 200, 1);  // both put the next episode in the same slot
  rc.fill(b, 200, 1);
  expect_same_samples(a, b, "after one more episode");

  // An env or reward scale other than the run's is refused, naming what to look at.
  for (const std::string what : {"apples", "distractor", "scale"}) {
    ReplayCase other = rc;
    if (what == "apples") other.env.n_apples = 3;
    if (what == "distractor") other.env.distractor_len = 6;
    if (what == "scale") other.scale = 0.25;
    EpisodeReplay c(4 * L, L, kObsSize, torch::kCPU);
    try {
      load(c, bytes, other.replay());
      ADD_FAILURE() << what << ": loaded";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("env."), std::string::npos) << what << ": " << e.what();
    }
  }
  // A buffer of another size is refused before anything is played.
  EpisodeReplay d(5 * L, L, kObsSize, torch::kCPU);
  EXPECT_THROW(load(d, bytes, rc.replay()), UserError);
  // So is one whose parts disagree: 2 episodes counted, 1 seed stored.
  torch::serialize::OutputArchive bad;
  bad.write("replay.seeds", torch::tensor({int64_t{1}}, torch::kLong));
  bad.write("replay.episode_actions", torch::zeros({2, L}, torch::kUInt8));
  bad.write("replay.checksums", torch::zeros({2}, torch::kLong));
  bad.write("replay.lengths", torch::full({4}, 3, torch::kLong));
  bad.write("replay.cursor", torch::tensor({int64_t{2}, int64_t{2}, int64_t{4}, L}, torch::kLong));
  std::ostringstream os;
  bad.save_to(os);
  EpisodeReplay e(4 * L, L, kObsSize, torch::kCPU);
  EXPECT_THROW(load(e, os.str(), rc.replay()), UserError);
}

TEST(Sac, ReplayOfAnOlderCheckpointLoadsWholeAndSavesWholeUntilReplaced) {
  ReplayCase rc;
  rc.env.distractor_len = 5;
  const int64_t L = rc.env.max_episode_len();
  EpisodeReplay a(3 * L, L, kObsSize, torch::kCPU);
  rc.fill(a, 1, 2);
  // The older form, written out here: the observations and rewards themselves, in slots 0 and 1 of 3.
  torch::Tensor obs = torch::zeros({3, L + 1, kObsSize}, torch::kUInt8), act = torch::zeros({3, L}, torch::kLong);
  torch::Tensor rew = torch::zeros({3, L}), len = torch::zeros({3}, torch::kLong);
  {
    VisualMatch e(2, rc.env);
    Rng rng = make_rng(1, 9, 9);  // fill()'s draws for seeds 1, 2
    RolloutOptions ro;
    ro.mode = ActMode::Random;
    const Episodes eps = play_episodes(e, {1, 2}, nullptr, torch::kCPU, ro, rng);
    for (int64_t i = 0; i < 2; ++i) {
      const int64_t T = eps.lengths[i];
      obs[i].narrow(0, 0, T + 1).copy_(eps.obs[i]);
      act[i].narrow(0, 0, T).copy_(eps.actions[i]);
      rew[i].narrow(0, 0, T).copy_(eps.rewards[i] * rc.scale);
      len[i] = T;
    }
  }
  torch::serialize::OutputArchive old;
  old.write("replay.obs", obs);
  old.write("replay.actions", act);
  old.write("replay.rewards", rew);
  old.write("replay.lengths", len);
  old.write("replay.cursor", torch::tensor({2, 2}, torch::kLong));
  std::ostringstream os;
  old.save_to(os);
  EpisodeReplay b(3 * L, L, kObsSize, torch::kCPU);
  const EpisodeReplay::Replay never = [](const std::vector<uint64_t>&, const std::vector<torch::Tensor>&,
                                         std::vector<torch::Tensor>&, std::vector<torch::Tensor>&) {
    ADD_FAILURE() << "an older checkpoint's episodes were played again";
  };
  load(b, os.str(), never);
  expect_same_samples(a, b, "older checkpoint");
  EXPECT_TRUE(has_obs(saved(b)));  // seeds unknown: saved whole
  rc.fill(a, 10, 2);
  rc.fill(b, 10, 2);
  const std::string whole = saved(b);
  EXPECT_TRUE(has_obs(whole));  // slot 1 still holds an older episode
  // The next session starts from that whole checkpoint: it keeps the seeds of slots 0 and 2, so replacing slot 1
  // is enough to go compact.
  EpisodeReplay b2(3 * L, L, kObsSize, torch::kCPU);
  load(b2, whole, never);
  expect_same_samples(a, b2, "whole checkpoint with some seeds");
  rc.fill(a, 20, 1);
  rc.fill(b2, 20, 1);
  const std::string compact = saved(b2);
  EXPECT_FALSE(has_obs(compact));  // all three replaced
  EpisodeReplay c(3 * L, L, kObsSize, torch::kCPU);
  load(c, compact, rc.replay());
  expect_same_samples(a, c, "replaced and played again");
}

TEST(Sac, AgentStepMatchesForward) {
  for (const std::string mixer : {"transformer", "deltanet", "hqlt"}) {
    auto a = agent(mixer);
    a->eval();
    a->to(torch::kDouble);
    torch::manual_seed(2);
    const auto obs = random_obs(2, 11);
    torch::NoGradGuard ng;
    const auto h = a->forward(obs), h_ref = a->forward_reference(obs);
    auto st = a->init_state(2, torch::TensorOptions().dtype(torch::kDouble));
    std::vector<torch::Tensor> hs;
    for (int64_t k = 0; k < 11; ++k) hs.push_back(a->step(obs.select(1, k), st));
    EXPECT_LT(rel_err(h, h_ref), 1e-9) << mixer;
    EXPECT_LT(rel_err(torch::stack(hs, 1), h_ref), 1e-9) << mixer;
    // the fixed-shape step (rollouts' CUDA graph), with room for more steps than it takes
    auto fixed = a->init_fixed_state(2, torch::TensorOptions().dtype(torch::kDouble), 16);
    hs.clear();
    for (int64_t k = 0; k < 11; ++k) hs.push_back(a->step(obs.select(1, k), fixed));
    EXPECT_LT(rel_err(torch::stack(hs, 1), h_ref), 1e-9) << mixer << " fixed-shape step";
    // dropout is on in training mode only
    a->train();
    EXPECT_GT(rel_err(a->forward(obs), h_ref), 1e-3) << mixer;
  }
}

TEST(Sac, RolloutsFollowTheEnvAndTheirSeeds) {
  VisualMatchConfig vc;
  vc.distractor_len = 5;
  VisualMatch env(3, vc);
  auto a = agent("deltanet");
  const std::vector<uint64_t> seeds{7, 8, 9};
  Rng rng1 = make_rng(1, 1, 1), rng2 = make_rng(1, 1, 1);
  RolloutOptions ro;
  ro.mode = ActMode::Random;
  const auto e1 = play_episodes(env, seeds, &a, torch::kCPU, ro, rng1);
  const auto e2 = play_episodes(env, seeds, &a, torch::kCPU, ro, rng2);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(torch::equal(e1.obs[i], e2.obs[i]));
    EXPECT_TRUE(torch::equal(e1.actions[i], e2.actions[i]));
    // replaying the recorded actions in a fresh env gives the same observations, rewards and return
    VisualMatch solo(1, vc);
    solo.reset(std::vector<uint64_t>{seeds[i]});
    const int64_t T = e1.lengths[i];
    EXPECT_EQ(e1.obs[i].size(0), T + 1);
    for (int64_t k = 0; k < T; ++k) {
      EXPECT_EQ(std::memcmp(solo.obs(0), e1.obs[i][k].data_ptr<uint8_t>(), kObsSize), 0);
      const int64_t act = e1.actions[i][k].item<int64_t>();
      solo.step(&act);
      EXPECT_FLOAT_EQ(solo.rewards()[0], e1.rewards[i][k].item<float>());
    }
    EXPECT_TRUE(solo.done()[0]);
    EXPECT_EQ(std::memcmp(solo.obs(0), e1.obs[i][T].data_ptr<uint8_t>(), kObsSize), 0);
    EXPECT_DOUBLE_EQ(e1.returns[i], solo.state(0).episode_return);
    EXPECT_EQ(e1.success[i], solo.state(0).success);
  }
  EXPECT_EQ(e1.steps, e1.lengths[0] + e1.lengths[1] + e1.lengths[2]);
  // greedy with dropout off is a function of the weights and the seeds
  ro.mode = ActMode::Greedy;
  ro.dropout = false;
  const auto g1 = play_episodes(env, seeds, &a, torch::kCPU, ro, rng1);
  const auto g2 = play_episodes(env, seeds, &a, torch::kCPU, ro, rng2);
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(torch::equal(g1.actions[i], g2.actions[i]));
  EXPECT_TRUE(a->is_training());  // the mode is restored
}

TEST(Sac, ChooseActionsDrawsFromThePolicy) {
  // softmax(log [1, 2, 3, 4]) = [0.1, 0.2, 0.3, 0.4]; 40,000 draws: each action's frequency within 5 standard
  // deviations (argmax(p e), a plausible slip, gives about 0.05, 0.18, 0.32, 0.45)
  torch::manual_seed(3);
  const auto p = torch::tensor({0.1, 0.2, 0.3, 0.4}, torch::kDouble);
  const auto logits = p.log().to(torch::kFloat).unsqueeze(0).expand({40000, 4});
  const auto a = choose_actions(logits, ActMode::Sample);
  for (int64_t i = 0; i < 4; ++i) {
    const double f = a.eq(i).to(torch::kDouble).mean().item<double>(), pi = p[i].item<double>();
    EXPECT_NEAR(f, pi, 5 * std::sqrt(pi * (1 - pi) / 40000)) << "action " << i;
  }
  EXPECT_EQ(choose_actions(t({0.3, -1, 2, 0}).unsqueeze(0), ActMode::Greedy).item<int64_t>(), 2);
}

TEST(Sac, FixedShapeRolloutActsAsTheDynamicOne) {
  // The rollout through the mixers' fixed-shape step (what CUDA captures as a graph) against the dynamic step:
  // for the same seeds, the same actions, observations and rewards, in training episodes (sampled actions,
  // dropout on) and greedy ones, twice through the same PolicySteps (its states reset between episodes).
  VisualMatchConfig vc;
  vc.distractor_len = 9;
  VisualMatch env(3, vc);
  const std::vector<uint64_t> seeds{4, 5, 6};
  for (const std::string mixer : {"transformer", "deltanet", "hqlt"}) {
    auto a = agent(mixer);
    PolicySteps fixed(a, /*bf16=*/false, torch::kCPU, /*graph=*/true);
    for (ActMode mode : {ActMode::Sample, ActMode::Greedy, ActMode::Sample}) {
      RolloutOptions ro;
      ro.mode = mode;
      ro.dropout = mode == ActMode::Sample;
      auto play = [&](PolicySteps* steps) {
        ro.fixed = steps;
        torch::manual_seed(11);
        Rng rng = make_rng(1, 2, 3);
        return play_episodes(env, seeds, &a, torch::kCPU, ro, rng);
      };
      expect_same_episodes(play(nullptr), play(&fixed), mixer);
      EXPECT_FALSE(fixed.get(3, vc.max_episode_len(), mode, ro.dropout).captured()) << "CPU: no graph";
    }
    EXPECT_TRUE(a->is_training());
  }
}

TEST(Sac, HeadEqualsItsLinears) {
  // The heads' layers (a custom bias gradient) against torch::linear: values and every gradient, [2, 5, 6] inputs.
  torch::manual_seed(4);
  MlpHead head(6, 7, 3);
  head->to(torch::kDouble);
  const auto x = torch::randn({2, 5, 6}, torch::kDouble).requires_grad_(true);
  const auto w = torch::randn({2, 5, 3}, torch::kDouble);
  auto ref = [&](const torch::Tensor& in) {
    auto h = torch::relu(torch::linear(in, head->fc1->weight, head->fc1->bias));
    h = torch::relu(torch::linear(h, head->fc2->weight, head->fc2->bias));
    return torch::linear(h, head->out->weight, head->out->bias);
  };
  const auto y = head(x), y_ref = ref(x);
  EXPECT_LT(rel_err(y, y_ref), 1e-14);
  std::vector<torch::Tensor> leaves{x};
  for (auto& p : head->parameters()) leaves.push_back(p);
  const auto g = torch::autograd::grad({(y * w).sum()}, leaves);
  const auto g_ref = torch::autograd::grad({(y_ref * w).sum()}, leaves);
  for (size_t i = 0; i < g.size(); ++i) EXPECT_LT(rel_err(g[i], g_ref[i]), 1e-12) << "gradient " << i;
}
