#pragma once
// xLSTM[m:s] stacks (Beck et al. 2024): m mLSTM blocks to s sLSTM blocks. Block l is an mLSTM when
// (l mod (m + s)) < m, else an sLSTM: "1:1" alternates starting with mLSTM (xlstm's slstm_at [1] for 2 blocks),
// "1:0" is all mLSTM, "0:1" all sLSTM, "7:1" puts an sLSTM at every 8th block.
#include <cstdint>
#include <optional>
#include <string>

#include "mixers/mixer.h"

namespace memlab {

struct XLstmRatio {
  int64_t m = 1, s = 1;
};

// "m:s" with non-negative integers and m + s > 0; nullopt for anything else.
std::optional<XLstmRatio> parse_xlstm_ratio(const std::string& text);
bool xlstm_block_is_mlstm(const XLstmRatio& r, int64_t layer);

// model.xlstm.ratio, and the block at shape.layer of the stack: an mLSTM or an sLSTM (their own keys).
void register_xlstm_keys(Schema& s);
std::shared_ptr<MixerImpl> make_xlstm(const Config& cfg, const MixerShape& shape);

}  // namespace memlab
