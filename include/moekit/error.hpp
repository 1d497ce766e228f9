#pragma once
// Errors are exceptions that carry a category and a message naming the input at fault.

#include <stdexcept>
#include <string>

#include <fmt/format.h>

namespace moekit {

enum class Errc {
  invalid_argument,  // an input (tensor, spec, option, file) is malformed or inconsistent
  config_refused,    // resolve() refused a combination of axes: the CLI exits with 2
  out_of_memory,     // an allocation failed
  io,                // a file could not be read or written
  internal,          // a broken invariant inside moekit: a bug
  comm,              // another rank failed, died or did not answer in time
};

const char* errc_name(Errc code);

class Error : public std::runtime_error {
 public:
  Error(Errc code, const std::string& message) : std::runtime_error(message), code_(code) {}
  Errc code() const noexcept { return code_; }

 private:
  Errc code_;
};

template <typename... Args>
[[noreturn]] void fail(Errc code, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(code, fmt::format(format, std::forward<Args>(args)...));
}

template <typename... Args>
void require(bool condition, fmt::format_string<Args...> format, Args&&... args) {
  if (!condition)
    throw Error(Errc::invalid_argument, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace moekit
