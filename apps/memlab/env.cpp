// memlab env visual-match: play one Passive Visual Match episode with a random or scripted policy and
// show what the agent sees (PNG frames, terminal pictures) so people can check the environment.
#include <fmt/format.h>

#include <cstdio>
#include <memory>

#include "commands.h"
#include "core/errors.h"
#include "core/image.h"
#include "core/io.h"
#include "core/rng.h"
#include "envs/visual_match.h"
#include "envs/visual_match_oracle.h"
#include "envs/visual_match_render.h"

namespace memlab {

namespace {
struct EnvArgs {
  uint64_t seed = 0;
  int64_t steps = -1;
  std::string policy = "random", render, reward_phase = "paper", colours = "episode";
  bool ascii = false;
  int scale = 16;
  VisualMatchConfig cfg;
};

const char* kFooter = R"(Plays one episode (seed --seed) in one environment for --steps steps (default: until it ends).
Frame k is the state after k steps (frame 0 after reset). --render DIR writes DIR/grid_NNNNN.png (the
7x11 board, the agent's 5x5 window outlined in black) and DIR/view_NNNNN.png (the observation itself);
--ascii prints each frame as a 24-bit-colour terminal picture (board | view) under a caption.
Policies: random (uniform actions, from the seed), oracle (reads the state: eats the nearest apple,
walks to the matching colour). Last line: a JSON summary of the episode.)";

int run_env(const EnvArgs& a) {
  VisualMatchConfig cfg = a.cfg;
  cfg.reward_phase = parse_reward_phase(a.reward_phase);
  cfg.colours = parse_colour_shuffle(a.colours);
  VisualMatch env(1, cfg);
  if (!a.render.empty()) ensure_writable_dir(a.render);
  env.reset(std::vector<uint64_t>{a.seed});
  Rng rng = make_rng(a.seed, kVisualMatchStream + 2, 0);
  const int64_t steps = a.steps < 0 ? cfg.max_episode_len() : a.steps;
  int64_t taken = 0;
  float reward = 0.0f;
  for (int64_t k = 0;; ++k) {
    const VisualMatchState& s = env.state(0);
    if (!a.render.empty()) {
      write_file_atomic(join_path(a.render, fmt::format("grid_{:05d}.png", k)), png_bytes(grid_image(s, a.scale)));
      write_file_atomic(join_path(a.render, fmt::format("view_{:05d}.png", k)), png_bytes(view_image(s, a.scale)));
    }
    if (a.ascii) {
      const std::string pic = frame_caption(s, reward) + "\n" + ansi_blocks(frame_image(s, 1)) + "\n";
      std::fputs(pic.c_str(), stdout);
    }
    if (k == steps || s.done) break;
    const int64_t action = a.policy == "oracle" ? oracle_action(s) : uniform_int(rng, 0, kNumActions - 1);
    env.step(&action);
    reward = env.rewards()[0];
    ++taken;
  }
  const VisualMatchState& s = env.state(0);
  std::printf("{\"seed\":%llu,\"steps\":%lld,\"return\":%g,\"done\":%s,\"success\":%s,\"phase\":\"%s\"}\n",
              static_cast<unsigned long long>(a.seed), static_cast<long long>(taken), double(s.episode_return),
              s.done ? "true" : "false", s.success ? "true" : "false", phase_name(s.phase));
  return 0;
}
}  // namespace

std::function<int()> add_env_command(CLI::App& app) {
  auto a = std::make_shared<EnvArgs>();
  auto* cmd = app.add_subcommand("env", "look at the RL environments");
  cmd->require_subcommand(1);
  auto* vm = cmd->add_subcommand("visual-match", "play a Passive Visual Match episode and render it");
  vm->footer(kFooter);
  vm->add_option("--seed", a->seed, "episode seed")->check(CLI::NonNegativeNumber);
  vm->add_option("--steps", a->steps, "steps to play (default: the whole episode)")
      ->check(CLI::Range(int64_t(0), int64_t(100000000)));
  vm->add_option("--policy", a->policy, "random (default) or oracle")->check(CLI::IsMember({"random", "oracle"}));
  vm->add_option("--render", a->render, "write PNG frames into this folder");
  vm->add_flag("--ascii", a->ascii, "print each frame as a terminal picture");
  vm->add_option("--scale", a->scale, "pixels per cell in PNG frames (default 16)")->check(CLI::Range(1, 128));
  vm->add_option("--distractor", a->cfg.distractor_len, "distractor phase length L (default 750)");
  vm->add_option("--reward-phase", a->reward_phase,
                 "paper (default: touching a colour ends the episode) or reference (always 15 steps)");
  vm->add_option("--colours", a->colours, "episode (default: door colours shuffled per episode) or fixed");
  vm->add_option("--colour-seed", a->cfg.colour_seed, "seed of the door colours with --colours fixed")
      ->check(CLI::NonNegativeNumber);
  vm->add_option("--apples", a->cfg.n_apples, "apples in the distractor phase (default 10, at most 22)");
  vm->add_option("--respawn", a->cfg.respawn_every, "steps before an eaten apple returns (default 20; 0 never)");
  vm->add_option("--final-reward", a->cfg.final_reward, "reward of the matching colour (default 100)");
  return [cmd, a]() -> int {
    if (!cmd->parsed()) return -1;
    return run_env(*a);
  };
}

}  // namespace memlab
