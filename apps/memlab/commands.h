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

// For path options: an empty value ("--out ''") is an error, not the default.
inline CLI::Validator non_empty(const char* what = "PATH") {
  return CLI::Validator([](std::string& v) -> std::string { return v.empty() ? "must not be empty" : ""; }, what);
}

// Each subcommand registers its options and returns the action to run when it was chosen.
std::function<int()> add_train_command(CLI::App& app);
std::function<int()> add_eval_command(CLI::App& app);
std::function<int()> add_tasks_command(CLI::App& app);
std::function<int()> add_sweep_command(CLI::App& app);
std::function<int()> add_report_command(CLI::App& app);
std::function<int()> add_env_command(CLI::App& app);
std::function<int()> add_bench_command(CLI::App& app);
std::function<int()> add_rl_command(CLI::App& app);

}  // namespace memlab
