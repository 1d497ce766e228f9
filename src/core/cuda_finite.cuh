#pragma once
// The NaN/Inf check's device loop (core/cuda_finite.hpp): the block's check kernel and the router
// kernel that takes the checks in (Plan::fusions.checks_in_router) run the same code.

#include <cstdint>

#include "core/cuda_finite.hpp"

namespace moekit::cuda_finite {

// An element is NaN or Inf exactly when its exponent bits are all ones.
__device__ inline bool non_finite(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::f32:
      return (static_cast<const uint32_t*>(data)[i] & 0x7f800000u) == 0x7f800000u;
    case DType::bf16:
      return (static_cast<const uint16_t*>(data)[i] & 0x7f80u) == 0x7f80u;
    default:
      return (static_cast<const uint16_t*>(data)[i] & 0x7c00u) == 0x7c00u;
  }
}

// Tensor a's elements, then b's, from `first` in steps of `stride` (a grid-stride loop): each
// non-finite one is kept in its tensor's `first` if it comes before what is there (atomicMin
// of (row << 32) | column: the lowest row, then the lowest column, in any visiting order).
__device__ inline void check_elements(const FiniteTensor& a, const FiniteTensor& b, int64_t first,
                                      int64_t stride) {
  const int64_t n = a.elements + b.elements;
  for (int64_t i = first; i < n; i += stride) {
    const bool in_a = i < a.elements;
    const FiniteTensor& t = in_a ? a : b;
    const int64_t at = in_a ? i : i - a.elements;
    if (non_finite(t.data, t.dtype, at)) {
      const auto row = static_cast<unsigned long long>(at / t.columns);
      const auto column = static_cast<unsigned long long>(at % t.columns);
      atomicMin(t.first, (row << 32) | column);
    }
  }
}

}  // namespace moekit::cuda_finite
