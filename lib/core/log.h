#pragma once
// Progress and log lines: to stderr, and to the run's log file once one is open.
#include <fmt/format.h>

#include <string>

namespace memlab {

void log_open(const std::string& path);  // append to this file from now on (and to no other)
void log_add(const std::string& path);   // append to this file too (a packed run's members' log.txt)
void log_close();
void log_line(const std::string& line);  // stderr and every open file
void log_line_to(size_t file, const std::string& line);  // stderr and the file-th opened only
void set_quiet(bool quiet);  // stderr off (the log file still gets everything)

template <typename... Args>
void logf(fmt::format_string<Args...> f, Args&&... args) {
  log_line(fmt::format(f, std::forward<Args>(args)...));
}

// "1h02m", "3m05s", "12.3s"
std::string format_duration(double seconds);

}  // namespace memlab
