#pragma once
// Carving one scratch block into typed arrays. A component describes its arrays once, in a
// function taking a ScratchCarver: run on a counting carver it declares the bytes needed (at
// build time), run on a carver over the allocated block it hands out the same arrays.

#include <cstdint>

namespace moekit {

inline constexpr int64_t kScratchAlignment = 64;

inline int64_t scratch_align(int64_t bytes) {
  return (bytes + kScratchAlignment - 1) / kScratchAlignment * kScratchAlignment;
}

class ScratchCarver {
 public:
  ScratchCarver() = default;  // counts only; take() returns nullptr
  explicit ScratchCarver(void* base) : base_(static_cast<char*>(base)) {}

  template <typename T>
  T* take(int64_t count) {
    char* p = base_ == nullptr ? nullptr : base_ + bytes_;
    bytes_ += scratch_align(count * static_cast<int64_t>(sizeof(T)));
    return reinterpret_cast<T*>(p);
  }
  int64_t bytes() const { return bytes_; }

 private:
  char* base_ = nullptr;
  int64_t bytes_ = 0;
};

// Per-worker scratch: `threads` equal blocks of `worker_bytes`.
inline void* worker_scratch(void* scratch, int64_t worker_bytes, int worker) {
  return static_cast<char*>(scratch) + worker_bytes * worker;
}

}  // namespace moekit
