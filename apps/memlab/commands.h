#pragma once
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace memlab {

// Each subcommand registers its options and returns the action to run when it was chosen.
std::function<int()> add_train_command(CLI::App& app);
std::function<int()> add_tasks_command(CLI::App& app);
std::function<int()> add_sweep_command(CLI::App& app);
std::function<int()> add_report_command(CLI::App& app);
std::function<int()> add_env_command(CLI::App& app);
std::function<int()> add_bench_command(CLI::App& app);
std::function<int()> add_rl_command(CLI::App& app);

}  // namespace memlab
