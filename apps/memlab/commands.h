#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace memlab {

// A flag that is a shorthand for one config key (--seed for train.seed, ...).
struct KeyFlag {
  const char* flag;
  const char* key;
  std::string* value;
  const char* help;
};

// Each subcommand registers its options and returns the action to run when it was chosen.
std::function<int()> add_train_command(CLI::App& app);
std::function<int()> add_tasks_command(CLI::App& app);
std::function<int()> add_sweep_command(CLI::App& app);
std::function<int()> add_report_command(CLI::App& app);
std::function<int()> add_env_command(CLI::App& app);
std::function<int()> add_bench_command(CLI::App& app);
std::function<int()> add_rl_command(CLI::App& app);

}  // namespace memlab
