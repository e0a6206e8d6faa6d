// memlab: sequence-model memory experiments from one binary.
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <cstdio>
#include <iostream>
#include <new>

#include "commands.h"
#include "core/config.h"
#include "core/errors.h"
#include "train/trainer.h"


namespace {
// An error line as printable UTF-8: control bytes and broken UTF-8 (from a garbage file, say) become \xNN.
std::string printable(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    for (size_t k = 1; n > 1 && k < n; ++k)
      if (i + k >= s.size() || (static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) n = 0;
    if (n == 0 || (n == 1 && (c < 0x20 || c == 0x7f))) {
      out += fmt::format("\\x{:02x}", c);
      ++i;
      continue;
    }
    out.append(s, i, n);
    i += n;
  }
  return out;
}

void print_error(const std::string& what) { std::fprintf(stderr, "error: %s\n", printable(what).c_str()); }
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"memlab: train and evaluate sequence mixers on memory and state-tracking tasks"};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "help for every subcommand");
  std::vector<std::function<int()>> actions;
  actions.push_back(memlab::add_train_command(app));
  actions.push_back(memlab::add_eval_command(app));
  actions.push_back(memlab::add_tasks_command(app));
  actions.push_back(memlab::add_sweep_command(app));
  actions.push_back(memlab::add_report_command(app));
  actions.push_back(memlab::add_env_command(app));
  actions.push_back(memlab::add_rl_command(app));
  actions.push_back(memlab::add_bench_command(app));
  // Unknown commands are named with the ones allowed, at the top level and below it (memlab tasks smaple).
  CLI::App* parent = &app;
  std::string path = "memlab";
  int i = 1;
  for (; i < argc && argv[i][0] != '-' && parent->get_require_subcommand_min() > 0; ++i) {
    CLI::App* found = nullptr;
    std::string names;
    for (auto* sc : parent->get_subcommands({})) {
      names += (names.empty() ? "" : ", ") + sc->get_name();
      if (sc->get_name() == argv[i]) found = sc;
    }
    if (!found) {
      std::fprintf(stderr, "error: unknown command '%s %s' (commands: %s)\n", path.c_str(), argv[i], names.c_str());
      return 2;
    }
    parent = found;
    path += std::string(" ") + argv[i];
  }
  if (i == argc && parent != &app && parent->get_require_subcommand_min() > 0) {
    std::string names;
    for (auto* sc : parent->get_subcommands({})) names += (names.empty() ? "" : ", ") + sc->get_name();
    std::fprintf(stderr, "error: '%s' needs a command (%s)\n", path.c_str(), names.c_str());
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
    print_error(e.what());
    return 2;
  } catch (const memlab::NumericError& e) {
    print_error(e.what());
    return 3;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: out of host memory (lower the batch size, lengths or model size)\n");
    return 2;
  } catch (const c10::Error& e) {
    std::string msg = e.what_without_backtrace();
    std::fprintf(stderr, "error: internal (torch): %s\n", msg.substr(0, msg.find('\n')).c_str());
    return 1;
  } catch (const std::exception& e) {
    print_error(e.what());
    return 1;
  }
}
