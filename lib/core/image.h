#pragma once
// Small RGB pictures for people to look at (environment frames): PNG bytes without any library, and
// 24-bit-colour terminal pictures. Torch-free.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace memlab {

using Rgb = std::array<uint8_t, 3>;

struct Image {
  int width = 0, height = 0;
  std::vector<uint8_t> rgb;  // row-major, 3 bytes a pixel

  Image() = default;
  Image(int w, int h, Rgb fill);
  Rgb at(int x, int y) const;
  void set(int x, int y, Rgb c);
  // Fill the rectangle [x0, x0+w) x [y0, y0+h), clipped to the picture.
  void fill(int x0, int y0, int w, int h, Rgb c);
  // A one-pixel outline of that rectangle, clipped.
  void outline(int x0, int y0, int w, int h, Rgb c);
};

// Side by side, top-aligned, `gap` pixels of `bg` between.
Image hstack(const std::vector<Image>& parts, int gap, Rgb bg);

// 8-bit RGB PNG. Rows use the Sub or Up filter and the deflate stream has only runs (distance-1
// matches) in one fixed-Huffman block: big flat colour areas become tiny files.
std::string png_bytes(const Image& img);
// Two spaces per pixel with a 24-bit background colour, each row ending in a reset and a newline.
std::string ansi_blocks(const Image& img);

uint32_t crc32(const uint8_t* data, size_t n, uint32_t crc = 0);
uint32_t adler32(const uint8_t* data, size_t n);

}  // namespace memlab
