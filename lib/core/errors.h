#pragma once
// Errors the user can fix (bad config, bad CLI value, unwritable path): reported as one line, exit code 2.
#include <stdexcept>
#include <string>

namespace memlab {

struct UserError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Training stopped for a numerical reason (NaN/Inf): exit code 3.
struct NumericError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace memlab
