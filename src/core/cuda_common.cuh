#pragma once
// What the device-stage kernels share: element loads and stores for the activation dtypes, warp
// reductions, and the check after a launch. The dtypes are run-time values inside the kernels
// (a uniform branch per element costs nothing next to the memory traffic of these kernels), so
// each kernel is compiled once, not once per dtype combination.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "core/cuda_errors.hpp"
#include "moekit/dtype.hpp"

namespace moekit::cuda_common {

inline constexpr unsigned kFullMask = 0xffffffffu;

__device__ inline float load_float(const void* base, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::bf16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
    case DType::f16:
      return __half2float(static_cast<const __half*>(base)[index]);
    default:
      return static_cast<const float*>(base)[index];
  }
}

// Rounds to nearest even, as convert_from_f32 does on the CPU.
__device__ inline void store_float(void* base, DType dtype, int64_t index, float value) {
  switch (dtype) {
    case DType::bf16:
      static_cast<__nv_bfloat16*>(base)[index] = __float2bfloat16_rn(value);
      return;
    case DType::f16:
      static_cast<__half*>(base)[index] = __float2half_rn(value);
      return;
    default:
      static_cast<float*>(base)[index] = value;
  }
}

__device__ inline float warp_max(float value) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value = fmaxf(value, __shfl_xor_sync(kFullMask, value, offset));
  }
  return value;
}

__device__ inline float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(kFullMask, value, offset);
  }
  return value;
}

__device__ inline double warp_sum(double value) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(kFullMask, value, offset);
  }
  return value;
}

inline bool is_activation_dtype(DType dtype) {
  return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
}

// A launch error (a bad configuration, no device) is reported at once; errors inside a kernel
// surface at the caller's next synchronisation, as with any CUDA work.
inline void check_launch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    cuda_errors::internal(std::string(kernel) +
                          ": the kernel launch failed: " + cudaGetErrorString(status));
  }
}

inline unsigned blocks_for(int64_t items, int64_t per_block) {
  return static_cast<unsigned>((items + per_block - 1) / per_block);
}

}  // namespace moekit::cuda_common
