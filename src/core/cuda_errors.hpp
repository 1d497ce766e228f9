#pragma once
// moekit's errors for code that nvcc compiles: fmt's compile-time format strings do not build
// under nvcc's C++20, so .cu files build their messages as strings and throw through these.

#include <string>

namespace moekit::cuda_errors {

[[noreturn]] void invalid_argument(const std::string& message);
[[noreturn]] void internal(const std::string& message);

}  // namespace moekit::cuda_errors
