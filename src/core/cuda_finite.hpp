#pragma once
// One tensor of a NaN/Inf check on the GPU, as the check's device loop (core/cuda_finite.cuh)
// reads it: the block's check kernel runs that loop, and so does the router kernel where the plan
// gives it the checks (Plan::fusions.checks_in_router). Plain data: host code fills it.

#include <cstdint>

#include "moekit/dtype.hpp"

namespace moekit::cuda_finite {

struct FiniteTensor {
  const void* data = nullptr;  // [elements / columns, columns], row-major: f32, bf16 or f16
  DType dtype = DType::f32;
  int64_t columns = 1;
  int64_t elements = 0;  // 0: nothing to check
  // (row << 32) | column of the first non-finite element, kept by atomicMin.
  unsigned long long* first = nullptr;
};

}  // namespace moekit::cuda_finite
