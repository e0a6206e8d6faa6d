// Pictures: checksums, PNG framing, terminal blocks. (The PNG pixels are decoded with Python's zlib in
// tests/check_env.py.)
#include <gtest/gtest.h>

#include <cstring>

#include "core/image.h"

using namespace memlab;

TEST(Image, Checksums) {
  const char* s = "123456789";
  EXPECT_EQ(crc32(reinterpret_cast<const uint8_t*>(s), 9), 0xCBF43926u);
  const char* w = "Wikipedia";
  EXPECT_EQ(adler32(reinterpret_cast<const uint8_t*>(w), 9), 0x11E60398u);
}

TEST(Image, PngFramingAndHeader) {
  Image img(7, 3, {1, 2, 3});
  img.set(6, 2, {200, 100, 0});
  const std::string png = png_bytes(img);
  ASSERT_GT(png.size(), 8u + 25u + 12u + 12u);
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n"));
  EXPECT_EQ(png.substr(12, 4), "IHDR");
  auto be32 = [&](size_t k) {
    return uint32_t(uint8_t(png[k])) << 24 | uint32_t(uint8_t(png[k + 1])) << 16 | uint32_t(uint8_t(png[k + 2])) << 8 |
           uint32_t(uint8_t(png[k + 3]));
  };
  EXPECT_EQ(be32(16), 7u);
  EXPECT_EQ(be32(20), 3u);
  EXPECT_EQ(be32(29), crc32(reinterpret_cast<const uint8_t*>(png.data() + 12), 17));
  EXPECT_EQ(png.substr(png.size() - 8, 4), "IEND");
  // Flat areas compress: a 320x320 single-colour picture stays far below its 300 KiB of pixels.
  EXPECT_LT(png_bytes(Image(320, 320, {9, 9, 9})).size(), 4000u);
}

TEST(Image, FillOutlineStackAndAnsi) {
  Image a(4, 4, {0, 0, 0});
  a.fill(1, 1, 10, 10, {5, 5, 5});
  EXPECT_EQ(a.at(0, 0), (Rgb{0, 0, 0}));
  EXPECT_EQ(a.at(3, 3), (Rgb{5, 5, 5}));
  a.outline(-1, -1, 3, 3, {7, 7, 7});
  EXPECT_EQ(a.at(1, 0), (Rgb{7, 7, 7}));
  EXPECT_EQ(a.at(0, 0), (Rgb{0, 0, 0}));  // the clipped corner
  const Image h = hstack({a, Image(2, 6, {1, 1, 1})}, 1, {9, 9, 9});
  EXPECT_EQ(h.width, 7);
  EXPECT_EQ(h.height, 6);
  EXPECT_EQ(h.at(4, 0), (Rgb{9, 9, 9}));
  EXPECT_EQ(h.at(0, 5), (Rgb{9, 9, 9}));
  EXPECT_EQ(h.at(6, 5), (Rgb{1, 1, 1}));
  EXPECT_EQ(ansi_blocks(Image(2, 1, {255, 0, 7})), "\x1b[48;2;255;0;7m  \x1b[48;2;255;0;7m  \x1b[0m\n");
}
