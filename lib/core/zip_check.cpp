#include "core/zip_check.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>

#include "core/crc.h"

namespace memlab {
namespace {

// Little-endian reads inside the buffer; `ok` turns false on the first read past its end.
struct Reader {
  const std::string& b;
  bool ok = true;
  uint64_t get(uint64_t at, int n) {
    if (at + static_cast<uint64_t>(n) > b.size()) {
      ok = false;
      return 0;
    }
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + static_cast<uint64_t>(i)]);
    return v;
  }
};

constexpr uint32_t kEnd = 0x06054b50, kEnd64 = 0x06064b50, kLocator64 = 0x07064b50, kCentral = 0x02014b50,
                   kLocal = 0x04034b50;

}  // namespace

std::string zip_problem(const std::string& b) {
  Reader r{b};
  if (b.size() < 22) return fmt::format("it is truncated or not an archive ({} bytes)", b.size());
  // The end record sits in the last 22 + up to 65535 comment bytes.
  int64_t end = -1;
  const int64_t lowest = std::max<int64_t>(0, static_cast<int64_t>(b.size()) - 22 - 65535);
  for (int64_t at = static_cast<int64_t>(b.size()) - 22; at >= lowest; --at)
    if (r.get(static_cast<uint64_t>(at), 4) == kEnd) {
      end = at;
      break;
    }
  if (end < 0) return "it is truncated or not an archive (no zip end record)";
  uint64_t entries = r.get(end + 10, 2), cd_size = r.get(end + 12, 4), cd_at = r.get(end + 16, 4);
  if (entries == 0xffff || cd_size == 0xffffffff || cd_at == 0xffffffff) {
    if (end < 20 || r.get(end - 20, 4) != kLocator64) return "its zip64 end record is missing";
    const uint64_t e64 = r.get(end - 20 + 8, 8);
    if (r.get(e64, 4) != kEnd64) return "its zip64 end record is damaged";
    entries = r.get(e64 + 32, 8);
    cd_size = r.get(e64 + 40, 8);
    cd_at = r.get(e64 + 48, 8);
  }
  if (!r.ok || cd_at + cd_size > b.size())
    return fmt::format("it is truncated ({} bytes; its directory ends at byte {})", b.size(), cd_at + cd_size);
  uint64_t at = cd_at;
  for (uint64_t i = 0; i < entries; ++i) {
    if (r.get(at, 4) != kCentral) return fmt::format("its directory is damaged at entry {}", i);
    const uint64_t method = r.get(at + 10, 2), crc = r.get(at + 16, 4), name_len = r.get(at + 28, 2),
                   extra_len = r.get(at + 30, 2), comment_len = r.get(at + 32, 2);
    uint64_t comp = r.get(at + 20, 4), uncomp = r.get(at + 24, 4), local = r.get(at + 42, 4);
    const std::string name = r.ok ? b.substr(at + 46, name_len) : "";
    // zip64 sizes and offset, in this order, for the fields that are saturated
    for (uint64_t x = at + 46 + name_len; x + 4 <= at + 46 + name_len + extra_len;) {
      const uint64_t id = r.get(x, 2), len = r.get(x + 2, 2);
      if (id == 1) {
        uint64_t y = x + 4;
        if (uncomp == 0xffffffff) uncomp = r.get(y, 8), y += 8;
        if (comp == 0xffffffff) comp = r.get(y, 8), y += 8;
        if (local == 0xffffffff) local = r.get(y, 8);
      }
      x += 4 + len;
    }
    if (!r.ok) return fmt::format("its directory is damaged at entry {}", i);
    if (r.get(local, 4) != kLocal) return fmt::format("entry '{}' is damaged (no local header)", name);
    const uint64_t data = local + 30 + r.get(local + 26, 2) + r.get(local + 28, 2);
    if (!r.ok || data + comp > b.size()) return fmt::format("it is truncated (entry '{}' runs past the end)", name);
    if (method == 0 && (comp != uncomp || crc32_ieee(b.data() + data, comp) != crc))
      return fmt::format("entry '{}' fails its CRC-32 check", name);
    at += 46 + name_len + extra_len + comment_len;
  }
  return "";
}

}  // namespace memlab
