#include "core/cuda_device.hpp"

#include "moekit/error.hpp"

#ifdef MOEKIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace moekit::cuda_device {

#ifdef MOEKIT_WITH_CUDA
namespace {

// Makes `device` current for the scope and restores the caller's device after, so that moekit
// never changes which GPU the calling thread works on.
class DeviceScope {
 public:
  explicit DeviceScope(Device device, const char* action) {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      cudaGetLastError();
      fail(Errc::invalid_argument, "cannot {} on {}: no CUDA device ({})", action, device.str(),
           cudaGetErrorString(status));
    }
    if (device.index < 0 || device.index >= count) {
      fail(Errc::invalid_argument, "cannot {} on {}: this machine has {} CUDA device{}", action,
           device.str(), count, count == 1 ? "" : "s");
    }
    cudaGetDevice(&previous_);
    if (previous_ != device.index) check(cudaSetDevice(device.index), action, device);
  }
  ~DeviceScope() {
    int current = previous_;
    cudaGetDevice(&current);
    if (current != previous_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

  static void check(cudaError_t status, const char* action, Device device) {
    if (status == cudaSuccess) return;
    cudaGetLastError();  // clears the error, so that later calls do not report it again
    fail(Errc::invalid_argument, "cannot {} on {}: {}", action, device.str(),
         cudaGetErrorString(status));
  }

 private:
  int previous_ = 0;
};

}  // namespace

bool built_with_cuda() {
  return true;
}

std::vector<GpuInfo> probe(std::string& note) {
  std::vector<GpuInfo> gpus;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    note = cudaGetErrorString(status);
    return gpus;
  }
  if (count == 0) note = "the CUDA runtime sees no device";
  for (int index = 0; index < count; ++index) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) {
      cudaGetLastError();
      continue;
    }
    GpuInfo gpu;
    gpu.index = index;
    gpu.name = prop.name;
    gpu.compute_major = prop.major;
    gpu.compute_minor = prop.minor;
    gpu.sm_count = prop.multiProcessorCount;
    gpu.memory_bytes = static_cast<int64_t>(prop.totalGlobalMem);
    gpu.l2_bytes = prop.l2CacheSize;
    gpus.push_back(gpu);
  }
  return gpus;
}

void* allocate(Device device, int64_t bytes) {
  DeviceScope scope(device, "allocate");
  void* data = nullptr;
  const cudaError_t status = cudaMalloc(&data, static_cast<size_t>(bytes));
  if (status != cudaSuccess) {
    cudaGetLastError();
    fail(Errc::out_of_memory, "could not allocate {} bytes on {}: {}", bytes, device.str(),
         cudaGetErrorString(status));
  }
  return data;
}

void release(Device device, void* data) noexcept {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return;
  if (previous != device.index) cudaSetDevice(device.index);
  cudaFree(data);
  if (previous != device.index) cudaSetDevice(previous);
  cudaGetLastError();
}

void fill(Device device, void* data, uint8_t value, int64_t bytes) {
  DeviceScope scope(device, "fill memory");
  DeviceScope::check(cudaMemset(data, value, static_cast<size_t>(bytes)), "fill memory", device);
}

void copy(void* dst, Device dst_device, const void* src, Device src_device, int64_t bytes,
          CUstream_st* stream, bool async) {
  // Unified addressing tells the runtime where each pointer lives; the scope picks the GPU whose
  // context runs the copy.
  const Device device = dst_device.kind == DeviceKind::cuda ? dst_device : src_device;
  DeviceScope scope(device, "copy");
  const size_t n = static_cast<size_t>(bytes);
  const cudaError_t status = async ? cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream)
                                   : cudaMemcpy(dst, src, n, cudaMemcpyDefault);
  DeviceScope::check(status, "copy", device);
}

#else

namespace {
[[noreturn]] void no_cuda(Device device) {
  fail(Errc::invalid_argument, "cannot use {}: this build of moekit has no CUDA", device.str());
}
}  // namespace

bool built_with_cuda() {
  return false;
}

std::vector<GpuInfo> probe(std::string&) {
  return {};
}

void* allocate(Device device, int64_t) {
  no_cuda(device);
}

void release(Device, void*) noexcept {}

void fill(Device device, void*, uint8_t, int64_t) {
  no_cuda(device);
}

void copy(void*, Device dst_device, const void*, Device src_device, int64_t, CUstream_st*, bool) {
  no_cuda(dst_device.kind == DeviceKind::cuda ? dst_device : src_device);
}

#endif

}  // namespace moekit::cuda_device
