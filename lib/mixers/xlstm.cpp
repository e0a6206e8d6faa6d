#include "mixers/xlstm.h"

#include <cctype>

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

}  // namespace memlab
