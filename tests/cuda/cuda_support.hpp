#pragma once
// What the GPU tests share: the skip when no GPU is usable (with the runtime's reason), and
// device tensors filled from and read back into host vectors through moekit's own copy().

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "contracts/exec.hpp"
#include "moekit/dtype.hpp"
#include "moekit/tensor.hpp"

namespace moekit::cuda_testing {

// Empty when cuda:0 is usable; otherwise why not, as the skip message says it.
inline const std::string& no_gpu_reason() {
  static const std::string reason = [] {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
      cudaGetLastError();
      return "no CUDA device: " + std::string(cudaGetErrorString(status));
    }
    return count == 0 ? std::string("no CUDA device: the runtime sees none") : std::string();
  }();
  return reason;
}

#define MOEKIT_REQUIRE_GPU()                                   \
  do {                                                         \
    if (!::moekit::cuda_testing::no_gpu_reason().empty())      \
      GTEST_SKIP() << ::moekit::cuda_testing::no_gpu_reason(); \
  } while (0)

// A stream of its own on cuda:0, for a test that runs stages or exchanges on one.
struct Stream {
  cudaStream_t stream = nullptr;
  Stream() { cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking); }
  ~Stream() { cudaStreamDestroy(stream); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ExecContext context() const { return {.device = Device::cuda(0), .stream = stream}; }
};

inline constexpr uint8_t kPoison = 0xD5;

// A device tensor with every byte kPoison, so that an element the kernel failed to write shows.
inline Tensor poisoned(DType dtype, Shape shape) {
  Tensor t = Tensor::empty(dtype, shape, Device::cuda(0));
  t.fill_bytes(kPoison);
  return t;
}

template <typename T>
Tensor upload(const std::vector<T>& host, DType dtype, Shape shape) {
  Tensor t = Tensor::empty(dtype, shape, Device::cuda(0));
  copy(t, TensorView::contiguous(const_cast<T*>(host.data()), dtype, shape));
  return t;
}

template <typename T>
std::vector<T> download(const TensorView& device) {
  std::vector<T> host(static_cast<size_t>(device.nbytes() / static_cast<int64_t>(sizeof(T))));
  copy(TensorView::contiguous(host.data(), device.dtype, device.shape), device);
  return host;
}

// f32 values as `dtype` (f32, bf16 or f16) bytes, and the values those bytes hold.
struct Activations {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

inline Activations as_dtype(const std::vector<float>& x, DType dtype) {
  Activations a;
  a.bytes.resize(static_cast<size_t>(dtype_storage_bytes(dtype, static_cast<int64_t>(x.size()))));
  convert_from_f32(x.data(), static_cast<int64_t>(x.size()), a.bytes.data(), dtype);
  a.values.resize(x.size());
  convert_to_f32(a.bytes.data(), dtype, static_cast<int64_t>(x.size()), a.values.data());
  return a;
}

inline std::vector<float> normal(int64_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = dist(rng);
  return x;
}

// ||got - want|| / ||want|| (the absolute error where want is all zeros); infinite where got has
// a value that is not finite.
template <typename T>
double relative_l2(const std::vector<T>& got, const std::vector<double>& want) {
  double err = 0.0, ref = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(static_cast<double>(got[i]))) return INFINITY;
    const double d = static_cast<double>(got[i]) - want[i];
    err += d * d;
    ref += want[i] * want[i];
  }
  return ref == 0.0 ? std::sqrt(err) : std::sqrt(err / ref);
}

}  // namespace moekit::cuda_testing
