#pragma once
// Helpers shared by the safetensors and checkpoint-directory tests.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "moekit/error.hpp"

namespace moekit::io_test {

// A fresh directory under the test temp dir, removed with everything in it at the end.
class ScratchDir {
 public:
  ScratchDir() {
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    std::random_device seed;
    path_ = std::filesystem::path(::testing::TempDir()) /
            (std::string("moekit_io_") + test->test_suite_name() + "_" + test->name() + "_" +
             std::to_string(seed()));
    std::filesystem::create_directories(path_);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }

  const std::filesystem::path& path() const { return path_; }
  std::string file(std::string_view name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::string& path, std::string_view contents) {
  std::ofstream out(path, std::ios::binary);
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A safetensors file from header text and data bytes: the 8-byte little-endian length, the
// header as given (no padding added), then the data.
inline std::vector<uint8_t> raw_file(std::string_view header, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> bytes;
  for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(header.size() >> (8 * i)));
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.insert(bytes.end(), data.begin(), data.end());
  return bytes;
}

inline std::vector<uint8_t> zeros(size_t count) {
  return std::vector<uint8_t>(count, 0);
}

// Runs `action`, expects a moekit::Error of `code`, and returns its message.
inline std::string error_message(const std::function<void()>& action, Errc code) {
  try {
    action();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << "message: " << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-moekit exception: " << e.what();
    return e.what();
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

}  // namespace moekit::io_test
