#pragma once
// Running out of memory in the middle of a run (a training step, an evaluation) as one clear error:
// std::bad_alloc, CUDA's out-of-memory error and the CPU allocator's failure become a UserError that says
// what ran out and what to lower.
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <new>
#include <string>

#include "core/errors.h"

namespace memlab {

template <typename F>
auto with_memory_advice(const std::string& what, const std::string& advice, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const std::bad_alloc&) {
    throw UserError(fmt::format("{} ran out of host memory: {}", what, advice));
  } catch (const c10::OutOfMemoryError&) {
    throw UserError(fmt::format("{} ran out of GPU memory: {}", what, advice));
  } catch (const c10::Error& e) {
    const std::string m = e.what_without_backtrace();
    if (m.find("not enough memory") == std::string::npos && m.find("out of memory") == std::string::npos) throw;
    throw UserError(fmt::format("{} ran out of memory: {}", what, advice));
  }
}

}  // namespace memlab
