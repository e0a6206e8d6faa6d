#include "core/crc.h"

#include <array>

namespace memlab {
namespace {

// Reflected CRC-32 with polynomial `poly` (bit-reversed form), one byte per table step.
template <uint32_t Poly>
struct Crc32 {
  std::array<uint32_t, 256> table{};
  Crc32() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ Poly : c >> 1;
      table[i] = c;
    }
  }
  uint32_t operator()(const void* data, size_t n, uint32_t crc) const {
    const auto* p = static_cast<const unsigned char*>(data);
    crc = ~crc;
    for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
  }
};

}  // namespace

uint32_t crc32_ieee(const void* data, size_t n, uint32_t crc) {
  static const Crc32<0xEDB88320u> f;
  return f(data, n, crc);
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  static const Crc32<0x82F63B78u> f;
  return f(data, n, crc);
}

}  // namespace memlab
