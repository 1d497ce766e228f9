#include "moekit/log.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace moekit {
namespace {

LogLevel level_from_environment() {
  const char* text = std::getenv("MOEKIT_LOG");
  if (text == nullptr) return LogLevel::warn;
  if (std::strcmp(text, "error") == 0) return LogLevel::error;
  if (std::strcmp(text, "info") == 0) return LogLevel::info;
  if (std::strcmp(text, "debug") == 0) return LogLevel::debug;
  return LogLevel::warn;
}

std::atomic<LogLevel>& current_level() {
  static std::atomic<LogLevel> level{level_from_environment()};
  return level;
}

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::error:
      return "error";
    case LogLevel::warn:
      return "warn";
    case LogLevel::info:
      return "info";
    case LogLevel::debug:
      return "debug";
  }
  return "?";
}

}  // namespace

LogLevel log_level() {
  return current_level().load(std::memory_order_relaxed);
}

void log_write(LogLevel level, std::string_view message) {
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  std::fprintf(stderr, "moekit %s: %.*s\n", level_name(level), static_cast<int>(message.size()),
               message.data());
}

}  // namespace moekit
