#include "mixers/xlstm.h"

#include <cctype>

#include "core/config.h"
#include "mixers/mlstm.h"
#include "mixers/slstm.h"

namespace memlab {

std::optional<XLstmRatio> parse_xlstm_ratio(const std::string& text) {
  const auto colon = text.find(':');
  if (colon == std::string::npos) return std::nullopt;
  auto number = [](const std::string& part) -> std::optional<int64_t> {
    if (part.empty() || part.size() > 6) return std::nullopt;
    for (char ch : part)
      if (!std::isdigit(static_cast<unsigned char>(ch))) return std::nullopt;
    return std::stoll(part);
  };
  auto m = number(text.substr(0, colon)), s = number(text.substr(colon + 1));
  if (!m || !s || *m + *s == 0) return std::nullopt;
  return XLstmRatio{*m, *s};
}

bool xlstm_block_is_mlstm(const XLstmRatio& r, int64_t layer) { return layer % (r.m + r.s) < r.m; }

void register_xlstm_keys(Schema& s) {
  s.add_string("model.xlstm.ratio", "1:1", "xLSTM[m:s]: block l is mLSTM if l mod (m+s) < m, else sLSTM");
}

std::shared_ptr<MixerImpl> make_xlstm(const Config& cfg, const MixerShape& shape) {
  const auto r = parse_xlstm_ratio(cfg.get_string("model.xlstm.ratio"));
  if (!r) cfg.fail("model.xlstm.ratio", "must be \"m:s\" with non-negative integers m, s and m + s > 0, e.g. 1:1");
  return xlstm_block_is_mlstm(*r, shape.layer) ? make_mlstm(cfg, shape) : make_slstm(cfg, shape);
}

}  // namespace memlab
