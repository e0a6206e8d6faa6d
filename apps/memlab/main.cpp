// memlab: sequence-model memory experiments from one binary.
#include <c10/util/Exception.h>

#include <cstdio>
#include <iostream>

#include "commands.h"
#include "core/config.h"
#include "core/errors.h"
#include "train/trainer.h"


int main(int argc, char** argv) {
  CLI::App app{"memlab: train and evaluate sequence mixers on memory and state-tracking tasks"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every subcommand");
  std::vector<std::function<int()>> actions;
  actions.push_back(memlab::add_train_command(app));
  actions.push_back(memlab::add_tasks_command(app));
  actions.push_back(memlab::add_sweep_command(app));
  actions.push_back(memlab::add_report_command(app));
  actions.push_back(memlab::add_env_command(app));
  actions.push_back(memlab::add_rl_command(app));
  actions.push_back(memlab::add_bench_command(app));
  bool known = false;
  std::string names;
  for (auto* sc : app.get_subcommands({})) {
    names += (names.empty() ? "" : ", ") + sc->get_name();
    known = known || (argc >= 2 && sc->get_name() == argv[1]);
  }
  if (argc >= 2 && argv[1][0] != '-' && !known) {
    std::fprintf(stderr, "error: unknown command '%s' (commands: %s)\n", argv[1], names.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    std::fprintf(stderr, "error: %s (see memlab --help)\n", msg.c_str());
    return 2;
  }
  try {
    for (auto& a : actions)
      if (a) {
        int rc = a();
        if (rc >= 0) return rc;
      }
    return 0;
  } catch (const memlab::UserError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const memlab::NumericError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 3;
  } catch (const c10::Error& e) {
    std::string msg = e.what_without_backtrace();
    std::fprintf(stderr, "error: internal (torch): %s\n", msg.substr(0, msg.find('\n')).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
