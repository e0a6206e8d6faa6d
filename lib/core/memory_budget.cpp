#include "core/memory_budget.h"

#include <fmt/format.h>
#include <unistd.h>

#include <fstream>

#include "core/errors.h"

namespace memlab {

double host_memory_bytes() {
  double bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  for (const char* limit : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(limit);
    double v = 0;
    if (in >> v && v > 0 && v < bytes) bytes = v;  // "max" fails to parse: no limit
  }
  return bytes;
}

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (b >= 1024 && u < 6) b /= 1024, ++u;
  return fmt::format("{:.{}f} {}", b, u == 0 ? 0 : 1, units[u]);
}

void check_memory_needs(const std::vector<MemoryNeed>& needs, double device_bytes) {
  const double host = host_memory_bytes();
  for (const auto& n : needs) {
    const bool device = n.on_device && device_bytes > 0;
    const double have = device ? device_bytes : host;
    if (n.bytes <= have) continue;
    throw UserError(fmt::format("{} need at least {} of {} memory, more than the {} this machine has: lower {}", n.what,
                                format_bytes(n.bytes), device ? "GPU" : "host", format_bytes(have), n.keys));
  }
}

}  // namespace memlab
