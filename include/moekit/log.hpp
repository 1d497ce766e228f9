#pragma once
// The one logging facility. Level from MOEKIT_LOG (error, warn, info, debug); default warn.

#include <string_view>

#include <fmt/format.h>

namespace moekit {

enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };

LogLevel log_level();
void log_write(LogLevel level, std::string_view message);

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (level <= log_level()) log_write(level, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace moekit
