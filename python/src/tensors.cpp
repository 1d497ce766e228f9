#include "tensors.hpp"

#include <fmt/format.h>

#include <memory>
#include <vector>

namespace moekit::python {
namespace {

namespace dl = nb::dlpack;

constexpr uint8_t kDLFloat8E4M3Fn = static_cast<uint8_t>(dl::dtype_code::Float8_E4M3FN);
constexpr int32_t kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3;

std::string dtype_label(dl::dtype t) {
  constexpr std::pair<dl::dtype_code, const char*> kCodes[] = {
      {dl::dtype_code::Int, "int"},
      {dl::dtype_code::UInt, "uint"},
      {dl::dtype_code::Float, "float"},
      {dl::dtype_code::Bfloat, "bfloat"},
      {dl::dtype_code::Complex, "complex"},
      {dl::dtype_code::Bool, "bool"},
      {dl::dtype_code::Float8_E4M3FN, "float8_e4m3fn"},
      {dl::dtype_code::Float8_E5M2, "float8_e5m2"}};
  for (const auto& [code, label] : kCodes) {
    if (t.code == static_cast<uint8_t>(code)) return fmt::format("{}{}", label, t.bits);
  }
  return fmt::format("(DLPack type code {}, {} bits)", t.code, t.bits);
}

bool is(dl::dtype t, dl::dtype_code code, int bits) {
  return t.code == static_cast<uint8_t>(code) && t.bits == bits && t.lanes == 1;
}

DType moekit_dtype(dl::dtype t, const std::string& name, Reinterpret as) {
  const bool bytes = is(t, dl::dtype_code::UInt, 8) || is(t, dl::dtype_code::Int, 8);
  const bool halves = is(t, dl::dtype_code::UInt, 16) || is(t, dl::dtype_code::Int, 16);
  if (as == DType::f8e4m3 && (bytes || (t.code == kDLFloat8E4M3Fn && t.bits == 8))) return *as;
  if (as == DType::i4 && bytes) return DType::i4;
  if (as == DType::i8 && bytes) return DType::i8;
  if ((as == DType::bf16 || as == DType::f16) && halves) return *as;
  if (is(t, dl::dtype_code::Float, 32)) return DType::f32;
  if (is(t, dl::dtype_code::Float, 16)) return DType::f16;
  if (is(t, dl::dtype_code::Bfloat, 16)) return DType::bf16;
  if (is(t, dl::dtype_code::Int, 32)) return DType::i32;
  if (is(t, dl::dtype_code::Int, 8)) return DType::i8;
  if (t.code == kDLFloat8E4M3Fn && t.bits == 8 && t.lanes == 1) return DType::f8e4m3;
  throw nb::type_error(
      fmt::format("{}: dtype {} is not one moekit reads (float32, bfloat16 or float16 "
                  "activations; weights also as e4m3 or packed int4 bytes)",
                  name, dtype_label(t))
          .c_str());
}

template <typename Array>
TensorView view_of(const Array& array, void* data, const std::string& name, Reinterpret as) {
  const size_t ndim = array.ndim();
  if (ndim > static_cast<size_t>(kMaxRank)) {
    throw nb::value_error(
        fmt::format("{}: {} dimensions, moekit takes at most {}", name, ndim, kMaxRank).c_str());
  }
  TensorView view;
  view.data = data;
  view.dtype = moekit_dtype(array.dtype(), name, as);
  view.shape.rank = static_cast<int>(ndim);
  for (size_t axis = 0; axis < ndim; ++axis) {
    view.shape.dims[axis] = static_cast<int64_t>(array.shape(axis));
    view.strides[axis] = array.stride(axis);
  }
  if (view.numel() == 0) {
    // An empty tensor's strides mean nothing, and exporters write zeros: it is contiguous.
    view = TensorView::contiguous(data, view.dtype, view.shape);
  }
  if (view.dtype == DType::i4 && ndim > 0) {
    // Bytes of two nibbles each: the last axis counts nibbles, the strides count nibbles too.
    const size_t last = ndim - 1;
    if (view.strides[last] != 1 && view.shape.dims[last] > 1) {
      throw nb::value_error(
          fmt::format("{}: packed int4 bytes must be contiguous along the last axis", name)
              .c_str());
    }
    view.shape.dims[last] *= 2;
    view.strides[last] = 1;
    for (size_t axis = 0; axis < last; ++axis) view.strides[axis] *= 2;
  }
  const int32_t device = array.device_type();
  if (device == kDLCPU || device == kDLCUDAHost) {
    view.device = Device::cpu();
  } else if (device == kDLCUDA) {
    view.device = Device::cuda(array.device_id());
  } else {
    throw nb::value_error(
        fmt::format("{}: on DLPack device type {}, neither the CPU nor a CUDA GPU", name, device)
            .c_str());
  }
  return view;
}

std::string python_type(nb::handle object) {
  return nb::cast<std::string>(nb::type_name(object.type()));
}

}  // namespace

Borrowed borrow(nb::handle object, const std::string& name, Reinterpret as) {
  Borrowed out;
  if (!nb::try_cast(object, out.array, /*convert=*/false)) {
    throw nb::type_error(fmt::format("{}: expected a tensor with __dlpack__ (torch, numpy, "
                                     "cupy), got {}",
                                     name, python_type(object))
                             .c_str());
  }
  out.view = view_of(out.array, const_cast<void*>(out.array.data()), name, as);
  return out;
}

Borrowed borrow_writable(nb::handle object, const std::string& name) {
  Borrowed out;
  if (!nb::try_cast(object, out.writable, /*convert=*/false)) {
    Borrowed readable = borrow(object, name);
    throw nb::value_error(
        fmt::format("{}: read-only ({}); moekit writes into it", name, readable.view.describe())
            .c_str());
  }
  out.view = view_of(out.writable, out.writable.data(), name, std::nullopt);
  return out;
}

nb::object to_numpy(Tensor&& tensor) {
  auto owned = std::make_unique<Tensor>(std::move(tensor));
  const TensorView& v = owned->view();
  std::vector<size_t> shape(static_cast<size_t>(v.rank()));
  for (int axis = 0; axis < v.rank(); ++axis)
    shape[static_cast<size_t>(axis)] = static_cast<size_t>(v.dim(axis));
  dl::dtype type = nb::dtype<float>();
  switch (v.dtype) {
    case DType::f32:
      type = nb::dtype<float>();
      break;
    case DType::f16:
      type = {static_cast<uint8_t>(dl::dtype_code::Float), 16, 1};
      break;
    case DType::bf16:
      type = nb::dtype<uint16_t>();
      break;
    case DType::f8e4m3:
      type = nb::dtype<uint8_t>();
      break;
    case DType::i32:
      type = nb::dtype<int32_t>();
      break;
    case DType::i8:
      type = nb::dtype<int8_t>();
      break;
    case DType::i4:
      type = nb::dtype<uint8_t>();
      if (!shape.empty() && shape.back() % 2 == 0) {
        shape.back() /= 2;
      } else {
        shape = {static_cast<size_t>(v.nbytes())};
      }
      break;
  }
  void* data = v.data;
  nb::capsule owner(owned.release(), [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  return nb::cast(nb::ndarray<nb::numpy>(data, shape.size(), shape.data(), owner, nullptr, type),
                  nb::rv_policy::reference);
}

}  // namespace moekit::python
