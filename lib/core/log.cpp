#include "core/log.h"

#include <cstdio>
#include <fstream>
#include <memory>
#include <mutex>
#include <vector>

namespace memlab {
namespace {
std::mutex g_mu;
std::vector<std::unique_ptr<std::ofstream>> g_files;
bool g_quiet = false;
}  // namespace

void log_open(const std::string& path) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_files.clear();
  g_files.push_back(std::make_unique<std::ofstream>(path, std::ios::app));
}

void log_add(const std::string& path) {
  std::lock_guard<std::mutex> lk(g_mu);
  g_files.push_back(std::make_unique<std::ofstream>(path, std::ios::app));
}

void log_close() {
  std::lock_guard<std::mutex> lk(g_mu);
  g_files.clear();
}

namespace {
void write_line(std::ofstream& f, const std::string& line) {
  if (!f.is_open()) return;
  f << line << '\n';
  f.flush();
}
}  // namespace

void set_quiet(bool quiet) { g_quiet = quiet; }

namespace {
// stderr (unless quiet), then the open log files: every one, or only the file-th.
void emit(const std::string& line, const size_t* file) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (!g_quiet) {
    std::fputs(line.c_str(), stderr);
    std::fputc('\n', stderr);
    std::fflush(stderr);
  }
  for (size_t i = 0; i < g_files.size(); ++i)
    if (!file || *file == i) write_line(*g_files[i], line);
}
}  // namespace

void log_line(const std::string& line) { emit(line, nullptr); }

void log_line_to(size_t file, const std::string& line) { emit(line, &file); }

std::string format_duration(double s) {
  if (s < 60) return fmt::format("{:.1f}s", s);
  const long t = static_cast<long>(s + 0.5);
  if (t < 3600) return fmt::format("{}m{:02d}s", t / 60, static_cast<int>(t % 60));
  return fmt::format("{}h{:02d}m", t / 3600, static_cast<int>((t % 3600) / 60));
}

}  // namespace memlab
