#include "core/image.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace memlab {

Image::Image(int w, int h, Rgb fill) : width(w), height(h) {
  if (w < 1 || h < 1) throw std::invalid_argument(fmt::format("image size {}x{} must be positive", w, h));
  rgb.resize(static_cast<size_t>(w) * static_cast<size_t>(h) * 3);
  for (size_t k = 0; k < rgb.size(); k += 3) std::copy(fill.begin(), fill.end(), rgb.begin() + static_cast<long>(k));
}

Rgb Image::at(int x, int y) const {
  const size_t k = (static_cast<size_t>(y) * static_cast<size_t>(width) + static_cast<size_t>(x)) * 3;
  return {rgb[k], rgb[k + 1], rgb[k + 2]};
}

void Image::set(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= width || y >= height) return;
  const size_t k = (static_cast<size_t>(y) * static_cast<size_t>(width) + static_cast<size_t>(x)) * 3;
  rgb[k] = c[0];
  rgb[k + 1] = c[1];
  rgb[k + 2] = c[2];
}

void Image::fill(int x0, int y0, int w, int h, Rgb c) {
  for (int y = std::max(0, y0); y < std::min(height, y0 + h); ++y)
    for (int x = std::max(0, x0); x < std::min(width, x0 + w); ++x) set(x, y, c);
}

void Image::outline(int x0, int y0, int w, int h, Rgb c) {
  for (int x = x0; x < x0 + w; ++x) {
    set(x, y0, c);
    set(x, y0 + h - 1, c);
  }
  for (int y = y0; y < y0 + h; ++y) {
    set(x0, y, c);
    set(x0 + w - 1, y, c);
  }
}

Image hstack(const std::vector<Image>& parts, int gap, Rgb bg) {
  int w = 0, h = 0;
  for (const auto& p : parts) {
    w += p.width + (w ? gap : 0);
    h = std::max(h, p.height);
  }
  Image out(w, h, bg);
  int x0 = 0;
  for (const auto& p : parts) {
    for (int y = 0; y < p.height; ++y)
      for (int x = 0; x < p.width; ++x) out.set(x0 + x, y, p.at(x, y));
    x0 += p.width + gap;
  }
  return out;
}

uint32_t crc32(const uint8_t* data, size_t n, uint32_t crc) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ data[i]) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

uint32_t adler32(const uint8_t* data, size_t n) {
  uint32_t a = 1, b = 0;
  for (size_t i = 0; i < n; ++i) {
    a = (a + data[i]) % 65521u;
    b = (b + a) % 65521u;
  }
  return (b << 16) | a;
}

namespace {

// Deflate bits go out least significant first; Huffman codes most significant bit first.
struct BitWriter {
  std::string out;
  uint32_t acc = 0;
  int n = 0;
  void bits(uint32_t v, int count) {
    for (int k = 0; k < count; ++k) {
      acc |= ((v >> k) & 1u) << n;
      if (++n == 8) flush_byte();
    }
  }
  void code(uint32_t c, int len) {
    for (int k = len - 1; k >= 0; --k) bits((c >> k) & 1u, 1);
  }
  void flush_byte() {
    out.push_back(static_cast<char>(acc));
    acc = 0;
    n = 0;
  }
  void finish() {
    if (n) flush_byte();
  }
};

// The fixed literal/length code of RFC 1951 section 3.2.6.
void fixed_symbol(BitWriter& w, int sym) {
  if (sym < 144)
    w.code(0x30u + static_cast<uint32_t>(sym), 8);
  else if (sym < 256)
    w.code(0x190u + static_cast<uint32_t>(sym - 144), 9);
  else if (sym < 280)
    w.code(static_cast<uint32_t>(sym - 256), 7);
  else
    w.code(0xC0u + static_cast<uint32_t>(sym - 280), 8);
}

void match_length(BitWriter& w, int len) {
  static constexpr int kBase[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                    31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
  static constexpr int kExtra[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                     2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
  int k = 28;
  while (kBase[k] > len) --k;
  fixed_symbol(w, 257 + k);
  w.bits(static_cast<uint32_t>(len - kBase[k]), kExtra[k]);
  w.code(0, 5);  // distance code 0: distance 1
}

std::string deflate_runs(const std::vector<uint8_t>& data) {
  BitWriter w;
  w.bits(1, 1);  // final block
  w.bits(1, 2);  // fixed Huffman codes
  size_t i = 0;
  while (i < data.size()) {
    size_t run = 0;
    if (i > 0)
      while (i + run < data.size() && run < 258 && data[i + run] == data[i - 1]) ++run;
    if (run >= 3) {
      match_length(w, static_cast<int>(run));
      i += run;
    } else {
      fixed_symbol(w, data[i]);
      ++i;
    }
  }
  fixed_symbol(w, 256);
  w.finish();
  return w.out;
}

void put32(std::string& s, uint32_t v) {
  for (int k = 3; k >= 0; --k) s.push_back(static_cast<char>((v >> (8 * k)) & 0xFFu));
}

void chunk(std::string& png, const char* type, const std::string& data) {
  put32(png, static_cast<uint32_t>(data.size()));
  std::string body = std::string(type, 4) + data;
  png += body;
  put32(png, crc32(reinterpret_cast<const uint8_t*>(body.data()), body.size()));
}

}  // namespace

std::string png_bytes(const Image& img) {
  const size_t stride = static_cast<size_t>(img.width) * 3;
  std::vector<uint8_t> raw;
  raw.reserve((stride + 1) * static_cast<size_t>(img.height));
  for (int y = 0; y < img.height; ++y) {
    const uint8_t* row = img.rgb.data() + static_cast<size_t>(y) * stride;
    const bool same_as_above = y > 0 && std::equal(row, row + stride, row - stride);
    raw.push_back(same_as_above ? 2 : 1);  // Up turns a repeated row into zeros; Sub flat runs
    for (size_t x = 0; x < stride; ++x)
      raw.push_back(same_as_above ? 0 : static_cast<uint8_t>(row[x] - (x >= 3 ? row[x - 3] : 0)));
  }
  std::string z = "\x78\x01";
  z += deflate_runs(raw);
  put32(z, adler32(raw.data(), raw.size()));

  std::string png = "\x89PNG\r\n\x1a\n";
  std::string ihdr;
  put32(ihdr, static_cast<uint32_t>(img.width));
  put32(ihdr, static_cast<uint32_t>(img.height));
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);  // 8-bit RGB, no interlace
  chunk(png, "IHDR", ihdr);
  chunk(png, "IDAT", z);
  chunk(png, "IEND", "");
  return png;
}

std::string ansi_blocks(const Image& img) {
  std::string s;
  for (int y = 0; y < img.height; ++y) {
    for (int x = 0; x < img.width; ++x) {
      const Rgb c = img.at(x, y);
      s += fmt::format("\x1b[48;2;{};{};{}m  ", c[0], c[1], c[2]);
    }
    s += "\x1b[0m\n";
  }
  return s;
}

}  // namespace memlab
