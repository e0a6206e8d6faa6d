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
  std::string task, model, config, device, out, resume;
  std::vector<std::string> sets;
  std::string steps, batch, lr, seed;
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
}  // namespace

std::function<int()> add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  auto* cmd = app.add_subcommand("train", "train a model on a task and print the length-generalisation table");
  for (auto& f : args->flags()) cmd->add_option(f.flag, *f.value, f.help);
  cmd->add_option("--config", args->config, "experiment YAML file")->check(non_empty());
  cmd->add_option("--set", args->sets, "override any config key: --set model.hidden=64 (repeatable)");
  cmd->add_option("--out", args->out, "run directory (default runs/<task>_<model>_s<seed>)")->check(non_empty());
  cmd->add_option("--resume", args->resume, "continue the run in this directory from its checkpoint")->check(non_empty());
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
    Config cfg(full_schema());
    TrainRequest req;
    if (!args->resume.empty()) {
      if (!args->config.empty()) throw UserError("--resume takes the run's own config.yaml; drop --config");
      const std::string saved = join_path(args->resume, "config.yaml");
      if (!path_exists(saved)) throw UserError(fmt::format("cannot resume '{}': it holds no config.yaml", args->resume));
      cfg.merge_file(saved);
      req.resume = true;
      req.out_dir = args->resume;
      if (!args->out.empty() && args->out != args->resume) throw UserError("--resume already names the run directory; drop --out");
    } else if (!args->config.empty()) {
      cfg.merge_file(args->config);
    }
    for (const auto& f : args->flags())
      if (!f.value->empty()) cfg.set_value(f.key, *f.value, f.flag);
    for (const auto& s : args->sets) cfg.set(s);
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
