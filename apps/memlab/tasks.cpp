// memlab tasks sample|vocab: inspect the data a task generates.
#include <fmt/format.h>

#include <cstdio>
#include <memory>

#include "commands.h"
#include "core/config.h"
#include "core/errors.h"
#include "tasks/task.h"
#include "train/trainer.h"

namespace memlab {

namespace {
struct TasksArgs {
  std::string task, split = "train", config, seed;
  std::vector<std::string> sets;
  int64_t n = 10, start = 0;
};

template <class T>
std::string json_ids(const std::vector<T>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

std::string json_string(const std::string& x) {
  std::string s = "\"";
  for (char c : x) {
    if (c == '"' || c == '\\') s += '\\';
    s += c;
  }
  return s + "\"";
}

Config task_config(const TasksArgs& a) {
  Config cfg(full_schema());
  if (!a.config.empty()) cfg.merge_file(a.config);
  if (!a.task.empty()) cfg.set_value("task.name", a.task, "--task");
  if (!a.seed.empty()) cfg.set_value("train.seed", a.seed, "--seed");
  for (const auto& s : a.sets) cfg.set(s);
  return cfg;
}
}  // namespace

std::function<int()> add_tasks_command(CLI::App& app) {
  auto a = std::make_shared<TasksArgs>();
  auto* cmd = app.add_subcommand("tasks", "inspect task data");
  cmd->require_subcommand(1);
  auto* sample = cmd->add_subcommand(
      "sample",
      "print examples as JSON lines {\"input\":[...],\"target\":[...]}, with \"accept\":[...] (per position, the "
      "bit mask over token ids of the predictions counted right) for tasks that have accept sets; examples are as "
      "training and evaluation see them (training targets per task.<name>.target, a finite training set "
      "task.train_examples wrapping around)");
  sample->add_option("--task", a->task, "task name")->required();
  sample->add_option("--split", a->split, "train, val or test")->check(CLI::IsMember({"train", "val", "test"}));
  sample->add_option("--n", a->n, "number of examples")->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  sample->add_option("--start", a->start, "index of the first example")->check(CLI::NonNegativeNumber);
  sample->add_option("--seed", a->seed, "data seed (= train.seed)");
  sample->add_option("--config", a->config, "experiment YAML (task.* keys are used)")->check(non_empty());
  sample->add_option("--set", a->sets, "override a config key, e.g. task.train_len=[3,10]");
  auto* vocab = cmd->add_subcommand("vocab", "print the token names as a JSON array (index = token id)");
  vocab->add_option("--task", a->task, "task name")->required();
  vocab->add_option("--config", a->config, "experiment YAML (task.* keys are used)")->check(non_empty());
  vocab->add_option("--set", a->sets, "override a config key, e.g. task.majority.symbols=3");
  return [cmd, sample, vocab, a]() -> int {
    if (!cmd->parsed()) return -1;
    Config cfg = task_config(*a);
    auto task = make_task(cfg);
    if (vocab->parsed()) {
      std::string s = "[";
      auto v = task->vocab();
      for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + json_string(v[i]);
      std::printf("%s]\n", s.c_str());
      return 0;
    }
    const Split split = parse_split(a->split);
    const LengthRange r = task->default_range(split);
    std::string out;
    for (int64_t i = 0; i < a->n; ++i) {
      Example ex = task->example(split, static_cast<uint64_t>(a->start + i), r);  // as training/evaluation see it
      out += fmt::format("{{\"input\":{},\"target\":{}", json_ids(ex.input), json_ids(ex.target));
      if (!ex.accept.empty()) out += fmt::format(",\"accept\":{}", json_ids(ex.accept));
      out += "}\n";
      if (out.size() > (1 << 16)) {
        std::fputs(out.c_str(), stdout);
        out.clear();
      }
    }
    std::fputs(out.c_str(), stdout);
    (void)sample;
    return 0;
  };
}

}  // namespace memlab
