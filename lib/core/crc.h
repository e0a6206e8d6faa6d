#pragma once
// Table-driven CRC-32 checksums: IEEE 802.3 (zip entries) and Castagnoli (TensorBoard's TFRecord framing).
#include <cstddef>
#include <cstdint>

namespace memlab {

uint32_t crc32_ieee(const void* data, size_t n, uint32_t crc = 0);
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace memlab
