#pragma once
// Row index of (b, t, h) in the delta-rule kernels' [B, T, H, ...] layouts (fused_recurrent.h), for the .cu files.
#include <cstddef>

#include "ops/delta_rule/fused_recurrent.h"

namespace memlab::kernels {

__device__ __forceinline__ size_t row_of(const DeltaRuleProblem& p, int b, int t, int h) {
  return (static_cast<size_t>(b) * p.T + t) * p.H + h;
}

}  // namespace memlab::kernels
