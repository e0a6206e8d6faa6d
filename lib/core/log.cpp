#include "core/log.h"

#include <cstdio>
#include <fstream>
#include <mutex>

namespace memlab {
namespace {
std::mutex g_mu;
std::ofstream g_file;
bool g_quiet = false;
}  // namespace

void log_open(const std::string& path) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_file.is_open()) g_file.close();
  g_file.open(path, std::ios::app);
}

void log_close() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_file.is_open()) g_file.close();
}

void set_quiet(bool quiet) { g_quiet = quiet; }

void log_line(const std::string& line) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (!g_quiet) {
    std::fputs(line.c_str(), stderr);
    std::fputc('\n', stderr);
    std::fflush(stderr);
  }
  if (g_file.is_open()) {
    g_file << line << '\n';
    g_file.flush();
  }
}

std::string format_duration(double s) {
  if (s < 60) return fmt::format("{:.1f}s", s);
  const long t = static_cast<long>(s + 0.5);
  if (t < 3600) return fmt::format("{}m{:02d}s", t / 60, static_cast<int>(t % 60));
  return fmt::format("{}h{:02d}m", t / 3600, static_cast<int>((t % 3600) / 60));
}

}  // namespace memlab
