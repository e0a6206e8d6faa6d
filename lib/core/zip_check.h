#pragma once
// Integrity of a zip archive held in memory, such as a torch checkpoint: LibTorch reads its archives without
// checking the CRC-32 that every entry records, so flipped bytes would load silently. This walks the central
// directory (zip64 too) and checks each stored entry's bytes against its CRC-32.
#include <string>

namespace memlab {

// "" when every entry is whole and matches its CRC-32; otherwise what is wrong, e.g. "it is truncated (...)"
// or "entry 'archive/data/3' fails its CRC-32 check". Compressed entries are checked for presence only.
std::string zip_problem(const std::string& bytes);

}  // namespace memlab
