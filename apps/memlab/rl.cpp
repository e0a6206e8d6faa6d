// memlab rl visual-match: train a SAC agent on Passive Visual Match and write its learning curves;
// memlab rl plot: draw the curves of several runs on one chart.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "commands.h"
#include "core/config.h"
#include "core/errors.h"
#include "core/io.h"
#include "report/plot.h"
#include "report/rl_curves.h"
#include "rl/rl_trainer.h"

namespace memlab {

namespace {
struct RlArgs {
  std::string model, config, device, out, resume, episodes, distractor, seed;
  std::vector<std::string> sets;
  bool print_config = false, no_plot = false;
  std::vector<KeyFlag> flags() {
    return {{"--model", "model.name", &model, "sequence model of the agent (transformer, deltanet, hqlt, ...)"},
            {"--episodes", "rl.train_episodes", &episodes, "= rl.train_episodes"},
            {"--distractor", "env.distractor_len", &distractor, "distractor length L; = env.distractor_len"},
            {"--seed", "rl.seed", &seed, "= rl.seed"},
            {"--device", "rl.device", &device, "cpu, cuda or auto; = rl.device"}};
  }
};

struct PlotArgs {
  std::vector<std::string> runs;
  std::string out, title = "Passive Visual Match", interval = "bootstrap";
  int points = 0, smooth = 1;
  bool each = false;
};

// memlab rl plot: the seeds of each label as their mean and interval (or each run alone), the seeds table and
// the curves' CSV.
int plot_runs(const PlotArgs& a) {
  std::vector<RlCurve> runs;
  for (const auto& d : a.runs) runs.push_back(read_rl_curve(d));
  RlGroupOptions opt;
  opt.interval = parse_rl_interval(a.interval);
  opt.points = a.points;
  opt.smooth = a.smooth;
  opt.each = a.each;
  const auto groups = group_rl_curves(runs, opt);
  const auto [md, csv] = rl_seed_tables(runs, groups, opt.interval);
  ensure_writable_dir(a.out);
  write_file_atomic(join_path(a.out, "seeds.md"), md);
  write_file_atomic(join_path(a.out, "seeds.csv"), csv);
  write_file_atomic(join_path(a.out, "curves.csv"), rl_group_csv(groups));
  std::fputs(md.c_str(), stdout);
  std::printf("wrote %s, seeds.csv and curves.csv\n", join_path(a.out, "seeds.md").c_str());
  if (!plotting_available()) {
    std::printf("(no plot: this memlab was built without cairo; curves.csv holds the curves)\n");
    return 0;
  }
  const auto charts = a.each ? rl_charts(runs, a.title) : rl_group_charts(groups, a.title);
  for (const auto& f : write_rl_plots(charts, a.out)) std::printf("wrote %s\n", f.c_str());
  return 0;
}

void plot_run(const std::string& dir, const Config& cfg) {
  if (!plotting_available()) {
    std::printf("(no plot: this memlab was built without cairo; curve.csv holds the curves)\n");
    return;
  }
  const auto files = write_rl_plots(rl_charts({read_rl_curve(dir)}, fmt::format("Visual Match L={} · {}",
                                                                               cfg.get_int("env.distractor_len"),
                                                                               cfg.get_string("model.name"))),
                                    dir);
  for (const auto& f : files) std::printf("wrote %s\n", f.c_str());
}
}  // namespace

std::function<int()> add_rl_command(CLI::App& app) {
  auto args = std::make_shared<RlArgs>();
  auto pargs = std::make_shared<PlotArgs>();
  auto* rl = app.add_subcommand("rl", "reinforcement learning: discrete SAC with sequence-model agents");
  rl->require_subcommand(1);
  auto* vm = rl->add_subcommand("visual-match", "train and evaluate an agent on Passive Visual Match");
  for (auto& f : args->flags()) vm->add_option(f.flag, *f.value, f.help);
  vm->add_option("--config", args->config, "experiment YAML file (model.*, rl.*, env.* keys)")->check(non_empty());
  vm->add_option("--set", args->sets, "override any config key: --set rl.batch_episodes=32 (repeatable)");
  vm->add_option("--out", args->out, "run directory (default runs/rl_visual_match_L<L>_<model>_s<seed>)")->check(non_empty());
  vm->add_option("--resume", args->resume, "continue the run in this directory from its checkpoint")->check(non_empty());
  vm->add_flag("--print-config", args->print_config, "check the config, print the effective YAML and exit");
  vm->add_flag("--no-plot", args->no_plot, "do not draw curve_return.png and curve_success.png");
  vm->footer(
      "Without --config the agent is the paper's for --model (HQLT App. A.3): width 100, 2 heads; Transformer\n"
      "2 layers, full context; DeltaNet and HQLT 3 layers; HQLT window 64. The run directory gets config.yaml,\n"
      "curve.csv (one row per evaluation: env steps, greedy return and success, the training episodes' return\n"
      "and success, steps/s), train.csv, summary.md, log.txt, checkpoint.pt and the two plots.\n\n"
      "Config keys (--set KEY=VALUE):\n" +
      [] {
        std::string s;
        for (const auto& k : rl_schema().keys()) {
          if (k.key.rfind("model.", 0) == 0 && k.key.find('.', 6) != std::string::npos) continue;
          YAML::Emitter e;
          e << YAML::Flow << k.def;
          s += fmt::format("  {:<26} {} (default {})\n", k.key, k.help, e.c_str());
        }
        return s + "  model.<mixer>.*            see memlab train --help\n";
      }());
  auto* plot = rl->add_subcommand("plot", "draw the learning curves of several memlab rl runs on one chart");
  plot->add_option("runs", pargs->runs, "run directories")->required();
  plot->add_option("--out", pargs->out, "directory for the charts, seeds.md, seeds.csv and curves.csv")
      ->check(non_empty())
      ->required();
  plot->add_option("--title", pargs->title, "chart title");
  plot->add_option("--interval", pargs->interval, "95% interval over seeds: bootstrap (as seaborn) or t (Student's t)")
      ->check(CLI::IsMember({"bootstrap", "t"}));
  plot->add_option("--points", pargs->points, "points of each label's grid of env steps; 0 = its longest run's evaluations")
      ->check(CLI::Range(0, 100000));
  plot->add_option("--smooth", pargs->smooth, "moving average over this many evaluations, per run (1 = none)")
      ->check(CLI::Range(1, 100000));
  plot->add_flag("--each", pargs->each,
                 "one line per run, its evaluations as they are, training episodes dashed, instead of each label's "
                 "mean; runs may then repeat");
  plot->footer(
      "Runs with the same label (the label key, else model.name) are seeds of one setting: each is interpolated\n"
      "onto one grid of environment steps over the span all of them cover (never extrapolated), and the chart\n"
      "shows their mean with a shaded 95% interval, as the HQLT paper's Figure 2. seeds.md and seeds.csv give\n"
      "every run's final and best greedy success and each label's mean; curves.csv the plotted curves.");

  return [rl, plot, args, pargs]() -> int {
    if (!rl->parsed()) return -1;
    if (plot->parsed()) return plot_runs(*pargs);
    RlRequest req;
    std::string saved;
    if (!args->resume.empty()) {
      if (!args->config.empty()) throw UserError("--resume takes the run's own config.yaml; drop --config");
      if (!args->out.empty() && args->out != args->resume)
        throw UserError("--resume already names the run directory; drop --out");
      saved = join_path(args->resume, "config.yaml");
      if (!path_exists(saved)) throw UserError(fmt::format("cannot resume '{}': it holds no config.yaml", args->resume));
      req.resume = true;
      req.out_dir = args->resume;
    }
    std::vector<FlagValue> flags{{"model.name", args->model, "--model"}};
    for (const auto& f : args->flags())
      if (f.key != "model.name") flags.push_back({f.key, *f.value, f.flag});
    Config cfg = rl_config(req.resume ? saved : args->config, flags, args->sets, req.resume);
    if (!req.resume)
      req.out_dir = !args->out.empty() ? args->out
                                       : fmt::format("runs/rl_visual_match_L{}_{}_s{}", cfg.get_int("env.distractor_len"),
                                                     cfg.get_string("model.name"), cfg.get_int("rl.seed"));
    if (args->print_config) {
      check_rl_config(cfg);
      std::fputs(cfg.dump().c_str(), stdout);
      return 0;
    }
    const int rc = run_rl(cfg, req);
    if (rc == 0) std::fputs(("\n" + read_file(join_path(req.out_dir, "summary.md"))).c_str(), stdout);
    if ((rc == 0 || rc == 130) && !args->no_plot) plot_run(req.out_dir, cfg);
    return rc;
  };
}

}  // namespace memlab
