#pragma once
// The GPU output stage: output = routed + gate * shared, in the output's dtype. The launcher
// enqueues on `stream`, allocates nothing and never waits; every pointer is device memory.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "moekit/dtype.hpp"

namespace moekit::block::cuda {

struct OutputSumArgs {
  const float* routed = nullptr;       // [tokens, hidden]
  const float* shared = nullptr;       // [tokens, hidden], or null
  const float* shared_gate = nullptr;  // [tokens], or null: 1
  int64_t tokens = 0;
  int64_t hidden = 0;
  void* output = nullptr;  // [tokens, hidden]: f32, bf16 or f16, rounded to nearest even
  DType output_dtype = DType::f32;
};
void output_sum(const OutputSumArgs& args, cudaStream_t stream);

}  // namespace moekit::block::cuda
