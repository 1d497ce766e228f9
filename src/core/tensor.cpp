#include "moekit/tensor.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include <sys/mman.h>

#include "core/cuda_device.hpp"
#include "moekit/error.hpp"

namespace moekit {

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.starts_with("cuda:")) {
    std::string_view digits = text.substr(5);
    int index = 0;
    bool ok = !digits.empty() && digits.size() <= 3;
    for (char c : digits) {
      ok = ok && c >= '0' && c <= '9';
      index = index * 10 + (c - '0');
    }
    if (ok) return cuda(index);
  }
  fail(Errc::invalid_argument, "device '{}' is not one of cpu, cuda, cuda:N", text);
}

std::string Device::str() const {
  return kind == DeviceKind::cpu ? std::string("cpu") : fmt::format("cuda:{}", index);
}

Shape::Shape(std::initializer_list<int64_t> list) {
  if (list.size() > static_cast<size_t>(kMaxRank)) {
    fail(Errc::invalid_argument, "a shape has at most {} dimensions, got {}", kMaxRank,
         list.size());
  }
  for (int64_t d : list) dims[rank++] = d;
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int axis = 0; axis < rank; ++axis) n *= dims[axis];
  return n;
}

std::string Shape::str() const {
  std::string text = "[";
  for (int axis = 0; axis < rank; ++axis) {
    text += fmt::format("{}{}", axis ? ", " : "", dims[axis]);
  }
  return text + "]";
}

bool Shape::operator==(const Shape& other) const {
  if (rank != other.rank) return false;
  for (int axis = 0; axis < rank; ++axis) {
    if (dims[axis] != other.dims[axis]) return false;
  }
  return true;
}

TensorView TensorView::contiguous(void* data, DType dtype, Shape shape, Device device) {
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.shape = shape;
  view.device = device;
  int64_t stride = 1;
  for (int axis = shape.rank - 1; axis >= 0; --axis) {
    view.strides[axis] = stride;
    stride *= shape[axis];
  }
  return view;
}

bool TensorView::is_contiguous() const {
  int64_t stride = 1;
  for (int axis = shape.rank - 1; axis >= 0; --axis) {
    if (shape[axis] != 1 && strides[axis] != stride) return false;
    stride *= shape[axis];
  }
  return true;
}

std::string TensorView::describe() const {
  return fmt::format("{}{} on {}", dtype_name(dtype), shape.str(), device.str());
}

TensorView TensorView::select(int64_t index) const {
  if (rank() == 0 || index < 0 || index >= shape[0]) {
    fail(Errc::internal, "select({}) out of range for {}", index, describe());
  }
  TensorView sub;
  sub.dtype = dtype;
  sub.device = device;
  sub.shape.rank = rank() - 1;
  for (int axis = 1; axis < rank(); ++axis) {
    sub.shape.dims[axis - 1] = shape[axis];
    sub.strides[axis - 1] = strides[axis];
  }
  const int64_t offset = dtype_storage_bytes(dtype, index * strides[0]);
  sub.data = static_cast<char*>(data) + offset;
  return sub;
}

TensorView TensorView::narrow(int axis, int64_t first, int64_t count) const {
  if (axis < 0 || axis >= rank() || first < 0 || count < 0 || first + count > shape[axis]) {
    fail(Errc::internal, "narrow(axis {}, {}, {}) out of range for {}", axis, first, count,
         describe());
  }
  const int64_t offset = first * strides[axis];
  if (dtype_bits(dtype) < 8 && offset % 2 != 0) {
    fail(Errc::internal, "narrow of {} would start inside a byte", describe());
  }
  TensorView view = *this;
  view.shape.dims[axis] = count;
  view.data = static_cast<char*>(data) + dtype_storage_bytes(dtype, offset);
  return view;
}

Buffer Buffer::allocate(Device device, int64_t bytes) {
  if (bytes < 0) fail(Errc::internal, "negative allocation of {} bytes", bytes);
  Buffer buffer;
  buffer.device_ = device;
  buffer.bytes_ = bytes;
  if (device.kind == DeviceKind::cuda) {
    // A build without CUDA refuses even an empty buffer on a GPU: the device is unusable.
    buffer.data_ = bytes == 0 && cuda_device::built_with_cuda()
                       ? nullptr
                       : cuda_device::allocate(device, bytes);
    return buffer;
  }
  if (bytes == 0) return buffer;
  // A cache line, and any SIMD load width; large buffers (expert weights, mostly) start on a
  // huge page and ask for huge pages: streaming them with 4 KiB pages costs a TLB miss per
  // page, measured at about a quarter of this machine's read bandwidth.
  constexpr size_t kAlignment = 64;
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t alignment = static_cast<size_t>(bytes) >= kHugePage ? kHugePage : kAlignment;
  const size_t rounded = (static_cast<size_t>(bytes) + alignment - 1) / alignment * alignment;
  buffer.data_ = std::aligned_alloc(alignment, rounded);
  if (buffer.data_ == nullptr) {
    fail(Errc::out_of_memory, "could not allocate {} bytes on {}", bytes, device.str());
  }
  if (alignment == kHugePage) madvise(buffer.data_, rounded, MADV_HUGEPAGE);
  return buffer;
}

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      device_(other.device_) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = other.device_;
  }
  return *this;
}

Buffer::~Buffer() {
  release();
}

void Buffer::release() noexcept {
  if (data_ == nullptr) return;
  if (device_.kind == DeviceKind::cuda) {
    cuda_device::release(device_, data_);
  } else {
    std::free(data_);
  }
  data_ = nullptr;
}

Tensor Tensor::empty(DType dtype, Shape shape, Device device) {
  for (int axis = 0; axis < shape.rank; ++axis) {
    if (shape[axis] < 0)
      fail(Errc::invalid_argument, "negative dimension in shape {}", shape.str());
  }
  Tensor tensor;
  tensor.buffer_ = Buffer::allocate(device, dtype_storage_bytes(dtype, shape.numel()));
  tensor.view_ = TensorView::contiguous(tensor.buffer_.data(), dtype, shape, device);
  return tensor;
}

void Tensor::fill_bytes(uint8_t value) {
  if (buffer_.bytes() == 0) return;
  if (buffer_.device().kind == DeviceKind::cuda) {
    cuda_device::fill(buffer_.device(), buffer_.data(), value, buffer_.bytes());
  } else {
    std::memset(buffer_.data(), value, static_cast<size_t>(buffer_.bytes()));
  }
}

namespace {

void copy_tensor(const TensorView& dst, const TensorView& src, CUstream_st* stream, bool async) {
  if (dst.dtype != src.dtype || !(dst.shape == src.shape)) {
    fail(Errc::invalid_argument, "copy: destination {} and source {} differ in dtype or shape",
         dst.describe(), src.describe());
  }
  if (!dst.is_contiguous() || !src.is_contiguous()) {
    fail(Errc::invalid_argument,
         "copy: both tensors must be contiguous, got destination {}{} and "
         "source {}{}",
         dst.describe(), dst.is_contiguous() ? "" : " (strided)", src.describe(),
         src.is_contiguous() ? "" : " (strided)");
  }
  const int64_t bytes = src.nbytes();
  if (bytes == 0) return;
  if (dst.data == nullptr || src.data == nullptr) {
    fail(Errc::invalid_argument, "copy: {} has no data",
         dst.data == nullptr ? "destination" : "source");
  }
  if (dst.device.kind == DeviceKind::cpu && src.device.kind == DeviceKind::cpu) {
    std::memmove(dst.data, src.data, static_cast<size_t>(bytes));
    return;
  }
  cuda_device::copy(dst.data, dst.device, src.data, src.device, bytes, stream, async);
}

}  // namespace

void copy(const TensorView& dst, const TensorView& src) {
  copy_tensor(dst, src, nullptr, false);
}

void copy_async(const TensorView& dst, const TensorView& src, CUstream_st* stream) {
  copy_tensor(dst, src, stream, true);
}

}  // namespace moekit
