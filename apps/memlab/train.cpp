// memlab train: one supervised run; the config is the defaults, then --config, then flags, then --set.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "commands.h"
#include "core/config.h"
#include "core/errors.h"
#include "core/io.h"
#include "tasks/task.h"
#include "train/trainer.h"

namespace memlab {

namespace {
struct TrainArgs {
  std::string task, model, config, device, out;
  std::vector<std::string> sets, resume;
  std::string steps, batch, lr, seed, seeds, lrs;
  bool print_config = false;

  std::vector<KeyFlag> flags() {
    static const std::string task_help = [] {
      std::string names;
      for (const auto& t : task_names()) names += (names.empty() ? "" : ", ") + t;
      return "task: " + names + "; = task.name";
    }();
    return {{"--task", "task.name", &task, task_help.c_str()},
            {"--model", "model.name", &model, "sequence mixer (see model.name below); = model.name"},
            {"--steps", "train.steps", &steps, "= train.steps"},
            {"--batch-size", "train.batch_size", &batch, "= train.batch_size"},
            {"--lr", "train.lr", &lr, "= train.lr"},
            {"--seed", "train.seed", &seed, "= train.seed"},
            {"--device", "train.device", &device, "cpu, cuda or auto; = train.device"}};
  }
};
// "1,2,3" -> {"1", "2", "3"}; UserError on an empty item.
std::vector<std::string> comma_list(const std::string& s, const char* flag) {
  std::vector<std::string> out;
  size_t at = 0;
  while (true) {
    const size_t end = s.find(',', at);
    out.push_back(s.substr(at, end == std::string::npos ? std::string::npos : end - at));
    if (out.back().empty()) throw UserError(fmt::format("{} '{}': an empty item (give values separated by commas)", flag, s));
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return out;
}

// A member directory's name part for a learning rate: 0.001 -> "0.001", 5e-04 -> "5e-04".
std::string lr_name(double lr) { return fmt::format("{:g}", lr); }
}  // namespace

std::function<int()> add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  auto* cmd = app.add_subcommand("train", "train a model on a task and print the length-generalisation table");
  for (auto& f : args->flags()) cmd->add_option(f.flag, *f.value, f.help);
  cmd->add_option("--config", args->config, "experiment YAML file")->check(non_empty());
  cmd->add_option("--set", args->sets, "override any config key: --set model.hidden=64 (repeatable)");
  cmd->add_option("--out", args->out, "run directory (default runs/<task>_<model>_s<seed>)")->check(non_empty());
  cmd->add_option("--resume", args->resume,
                  "continue the run in this directory from its checkpoint (several: resume them packed together)")
      ->check(non_empty());
  cmd->add_option("--seeds", args->seeds,
                  "train one run per seed (comma-separated), packed together in this process")
      ->check(non_empty("LIST"));
  cmd->add_option("--lrs", args->lrs,
                  "train one run per learning rate (comma-separated; with --seeds, every pair), packed together")
      ->check(non_empty("LIST"));
  cmd->add_flag("--print-config", args->print_config, "check the config, print the effective YAML and exit");
  cmd->footer("Config keys (memlab train --set KEY=VALUE):\n" + [] {
    std::string s;
    for (const auto& k : full_schema().keys()) {
      YAML::Emitter e;
      e << YAML::Flow << k.def;
      s += fmt::format("  {:<28} {} (default {})\n", k.key, k.help, e.c_str());
    }
    return s;
  }());
  return [cmd, args]() -> int {
    if (!cmd->parsed()) return -1;
    const bool grid = !args->seeds.empty() || !args->lrs.empty();
    // the flags, then --set, over what cfg holds
    auto apply_overrides = [&](Config& cfg) {
      for (const auto& f : args->flags())
        if (!f.value->empty()) cfg.set_value(f.key, *f.value, f.flag);
      for (const auto& s : args->sets) cfg.set(s);
    };
    auto merge_saved = [](Config& cfg, const std::string& dir) {
      const std::string saved = join_path(dir, "config.yaml");
      if (!path_exists(saved)) throw UserError(fmt::format("cannot resume '{}': it holds no config.yaml", dir));
      cfg.merge_file(saved);
    };
    if (args->resume.size() > 1 || (!args->resume.empty() && grid)) {
      if (grid) throw UserError("--resume takes the runs' own configs; drop --seeds and --lrs");
      if (!args->config.empty()) throw UserError("--resume takes the run's own config.yaml; drop --config");
      if (!args->out.empty()) throw UserError("--resume already names the run directories; drop --out");
      if (args->print_config) throw UserError("--print-config prints one run's config; give one --resume");
      std::vector<std::unique_ptr<Config>> cfgs;
      std::vector<const Config*> ptrs;
      for (const auto& dir : args->resume) {
        cfgs.push_back(std::make_unique<Config>(full_schema()));
        merge_saved(*cfgs.back(), dir);
        apply_overrides(*cfgs.back());
        ptrs.push_back(cfgs.back().get());
      }
      return run_packed_training(ptrs, args->resume, /*resume=*/true);
    }
    Config cfg(full_schema());
    TrainRequest req;
    if (!args->resume.empty()) {
      const std::string& dir = args->resume[0];
      if (!args->config.empty()) throw UserError("--resume takes the run's own config.yaml; drop --config");
      merge_saved(cfg, dir);
      req.resume = true;
      req.out_dir = dir;
      if (!args->out.empty() && args->out != dir) throw UserError("--resume already names the run directory; drop --out");
    } else if (!args->config.empty()) {
      cfg.merge_file(args->config);
    }
    apply_overrides(cfg);
    if (grid) {
      if (!args->seed.empty() && !args->seeds.empty()) throw UserError("give --seed or --seeds, not both");
      if (!args->lr.empty() && !args->lrs.empty()) throw UserError("give --lr or --lrs, not both");
      if (args->print_config) throw UserError("--print-config prints one run's config; drop --seeds and --lrs");
      const auto seeds = args->seeds.empty() ? std::vector<std::string>{std::to_string(cfg.get_int("train.seed"))}
                                             : comma_list(args->seeds, "--seeds");
      const auto lrs = args->lrs.empty() ? std::vector<std::string>{} : comma_list(args->lrs, "--lrs");
      std::vector<std::unique_ptr<Config>> cfgs;
      std::vector<const Config*> ptrs;
      std::vector<std::string> dirs;
      for (const auto& seed : seeds)
        for (size_t i = 0; i < std::max<size_t>(1, lrs.size()); ++i) {
          cfgs.push_back(std::make_unique<Config>(cfg));
          cfgs.back()->set_value("train.seed", seed, "--seeds");
          if (!lrs.empty()) cfgs.back()->set_value("train.lr", lrs[i], "--lrs");
          const Config& c = *cfgs.back();
          const std::string name = fmt::format("s{}{}", c.get_int("train.seed"),
                                               lrs.empty() ? "" : "_lr" + lr_name(c.get_float("train.lr")));
          dirs.push_back(!args->out.empty() ? join_path(args->out, name)
                                            : fmt::format("runs/{}_{}_{}", c.get_string("task.name"),
                                                          c.get_string("model.name"), name));
          ptrs.push_back(cfgs.back().get());
        }
      return run_packed_training(ptrs, dirs, /*resume=*/false);
    }
    if (!req.resume)
      req.out_dir = !args->out.empty() ? args->out
                                       : fmt::format("runs/{}_{}_s{}", cfg.get_string("task.name"),
                                                     cfg.get_string("model.name"), cfg.get_int("train.seed"));
    if (args->print_config) {
      check_training_config(cfg);
      std::fputs(cfg.dump().c_str(), stdout);
      return 0;
    }
    return run_training(cfg, req);
  };
}

}  // namespace memlab
