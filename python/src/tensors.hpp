#pragma once
// Python objects with __dlpack__ (torch, numpy, cupy, jax) read as moekit TensorViews without a
// copy, and moekit's own tensors handed to Python as numpy arrays that own them.

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <optional>
#include <string>

#include "moekit/tensor.hpp"

namespace moekit::python {

namespace nb = nanobind;

// A borrowed tensor: the view moekit reads, and the DLPack import that keeps its memory alive for
// as long as this object lives.
struct Borrowed {
  nb::ndarray<nb::ro> array;
  nb::ndarray<> writable;
  TensorView view;
};

// What the caller's integer arrays stand for where moekit expects a dtype that numpy lacks:
// uint8/int8 bytes as e4m3 (DLPack's float8_e4m3fn is taken as it is too), uint8/int8 bytes as
// packed int4 (two per byte along the last axis, element 2j in the low nibble of byte j),
// 16-bit integers as bf16/f16 bits. nullopt: every array is taken with its own dtype.
using Reinterpret = std::optional<DType>;

// Reads `object` as a tensor named `name` in errors. TypeError when it has no usable __dlpack__
// or a dtype moekit has no name for; ValueError for more than four dimensions or a device that is
// neither the CPU nor a CUDA GPU. Strides are kept as they are: moekit's own checks refuse the
// layouts a callee cannot read, naming the tensor.
Borrowed borrow(nb::handle object, const std::string& name, Reinterpret as = std::nullopt);

// The same, for a tensor that moekit writes: a read-only array raises ValueError.
Borrowed borrow_writable(nb::handle object, const std::string& name);

// A numpy array that owns `tensor` (a CPU tensor). e4m3 comes out as uint8, i4 as uint8 with
// two values per byte along the last axis, bf16 as uint16 bits: numpy has none of these.
nb::object to_numpy(Tensor&& tensor);

}  // namespace moekit::python
