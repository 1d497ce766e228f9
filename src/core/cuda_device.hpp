#pragma once
// The few CUDA runtime calls the core layer makes (device memory, copies, the GPU probe), in one
// place, so that tensor.cpp and platform.cpp read the same in a build with or without CUDA. In a
// build without CUDA every call that needs a GPU throws invalid_argument saying so.

#include <cstdint>
#include <string>
#include <vector>

#include "moekit/platform.hpp"
#include "moekit/tensor.hpp"

namespace moekit::cuda_device {

// True in a build that links the CUDA runtime.
bool built_with_cuda();

// The GPUs the runtime sees; on none, `note` says why (the runtime's own words).
std::vector<GpuInfo> probe(std::string& note);

// cudaMalloc on `device`; throws out_of_memory naming the bytes and the device, invalid_argument
// when the device is absent.
void* allocate(Device device, int64_t bytes);
// cudaFree; errors are ignored (it runs in destructors, and a failed free leaks nothing more).
void release(Device device, void* data) noexcept;
// Synchronous memset of device memory.
void fill(Device device, void* data, uint8_t value, int64_t bytes);
// Copies `bytes` between any two of host and device memory; `stream` null and `async` false:
// returns when done.
void copy(void* dst, Device dst_device, const void* src, Device src_device, int64_t bytes,
          CUstream_st* stream, bool async);

}  // namespace moekit::cuda_device
