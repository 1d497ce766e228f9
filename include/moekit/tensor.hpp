#pragma once
// A tensor view (dtype, shape, strides, device) that owns nothing, and owning buffers.
// Every layer above the runner passes views; only the runner core reads their bytes.

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "moekit/dtype.hpp"

// CUDA's stream (cudaStream_t is CUstream_st*), declared so that this header needs no CUDA header.
struct CUstream_st;

namespace moekit {

enum class DeviceKind : uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;

  static Device cpu() { return {DeviceKind::cpu, 0}; }
  static Device cuda(int index) { return {DeviceKind::cuda, index}; }
  // "cpu", "cuda", "cuda:N"; throws invalid_argument otherwise.
  static Device parse(std::string_view text);
  std::string str() const;
  bool operator==(const Device&) const = default;
};

inline constexpr int kMaxRank = 4;

struct Shape {
  std::array<int64_t, kMaxRank> dims{};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> list);
  int64_t operator[](int axis) const { return dims[axis]; }
  int64_t numel() const;
  std::string str() const;  // "[2, 3]"
  bool operator==(const Shape& other) const;
};

// Non-owning. Strides are in elements; the innermost stride of an i4 tensor must be 1.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Shape shape;
  std::array<int64_t, kMaxRank> strides{};
  Device device;

  TensorView() = default;
  static TensorView contiguous(void* data, DType dtype, Shape shape, Device device = Device::cpu());

  int rank() const { return shape.rank; }
  int64_t dim(int axis) const { return shape[axis]; }
  int64_t numel() const { return shape.numel(); }
  int64_t nbytes() const { return dtype_storage_bytes(dtype, numel()); }
  bool is_contiguous() const;
  std::string describe() const;  // "bf16[4, 8] on cpu"

  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
  // Sub-tensor i along axis 0 (a view, no copy).
  TensorView select(int64_t index) const;
  // Elements [first, first + count) along `axis` (a view, no copy).
  TensorView narrow(int axis, int64_t first, int64_t count) const;
};

// Owning, aligned memory on one device (cudaMalloc on cuda:N). Move-only.
class Buffer {
 public:
  Buffer() = default;
  // Throws out_of_memory when the allocation fails, invalid_argument for an unusable device
  // (a GPU that is absent, or any GPU in a build without CUDA).
  static Buffer allocate(Device device, int64_t bytes);
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer();

  void* data() const { return data_; }
  int64_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void release() noexcept;
  void* data_ = nullptr;
  int64_t bytes_ = 0;
  Device device_;
};

// A contiguous tensor with its own buffer.
class Tensor {
 public:
  Tensor() = default;
  static Tensor empty(DType dtype, Shape shape, Device device = Device::cpu());
  const TensorView& view() const { return view_; }
  TensorView& view() { return view_; }
  operator const TensorView&() const { return view_; }
  template <typename T>
  T* data() const {
    return view_.as<T>();
  }
  // Fills every byte (test poisoning, zeroing); on a GPU it returns once the bytes are written.
  void fill_bytes(uint8_t value);

 private:
  Buffer buffer_;
  TensorView view_;
};

// Copies src into dst: the same dtype and shape, both contiguous, each on the CPU or a GPU.
// Returns when the copy is complete. Throws invalid_argument naming the mismatch.
void copy(const TensorView& dst, const TensorView& src);
// Enqueues the same copy on `stream` (nullptr: the default stream) and returns; the caller
// keeps both tensors alive until the stream reaches it. A copy to or from pageable host memory
// may complete before it returns, as cudaMemcpyAsync does; a copy between host tensors is done
// at once.
void copy_async(const TensorView& dst, const TensorView& src, CUstream_st* stream);

}  // namespace moekit
