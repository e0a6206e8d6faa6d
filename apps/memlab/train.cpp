// memlab train: one supervised run; the config is the defaults, then --config, then flags, then --set.
#include <fmt/format.h>

#include <cstdio>
#include <memory>

#include "commands.h"
#include "core/config.h"
#include "core/errors.h"
#include "core/io.h"
#include "train/trainer.h"

namespace memlab {

namespace {
struct TrainArgs {
  std::string task, model, config, device, out, resume;
  std::vector<std::string> sets;
  std::string steps, batch, lr, seed;
  bool print_config = false;
};
}  // namespace

std::function<int()> add_train_command(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  auto* cmd = app.add_subcommand("train", "train a model on a task and print the length-generalisation table");
  cmd->add_option("--task", args->task, "task (parity, mod_arith); = task.name");
  cmd->add_option("--model", args->model, "model (transformer, deltanet); = model.name");
  cmd->add_option("--config", args->config, "experiment YAML file");
  cmd->add_option("--set", args->sets, "override any config key: --set model.hidden=64 (repeatable)");
  cmd->add_option("--steps", args->steps, "= train.steps");
  cmd->add_option("--batch-size", args->batch, "= train.batch_size");
  cmd->add_option("--lr", args->lr, "= train.lr");
  cmd->add_option("--seed", args->seed, "= train.seed");
  cmd->add_option("--device", args->device, "cpu, cuda or auto; = train.device");
  cmd->add_option("--out", args->out, "run directory (default runs/<task>_<model>_s<seed>)");
  cmd->add_option("--resume", args->resume, "continue the run in this directory from its checkpoint");
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
    if (!args->task.empty()) cfg.set_value("task.name", args->task, "--task");
    if (!args->model.empty()) cfg.set_value("model.name", args->model, "--model");
    if (!args->steps.empty()) cfg.set_value("train.steps", args->steps, "--steps");
    if (!args->batch.empty()) cfg.set_value("train.batch_size", args->batch, "--batch-size");
    if (!args->lr.empty()) cfg.set_value("train.lr", args->lr, "--lr");
    if (!args->seed.empty()) cfg.set_value("train.seed", args->seed, "--seed");
    if (!args->device.empty()) cfg.set_value("train.device", args->device, "--device");
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
