// The replaced operator new of the MPI test binary: malloc, counted. In a file of its own, so
// that no caller sees the malloc/free pair inlined.

#include "mpi/allocations.hpp"

#include <atomic>
#include <cstdlib>
#include <new>

namespace moekit::test {
namespace {

std::atomic<int64_t> g_allocations{0};

}  // namespace

int64_t allocations_so_far() {
  return g_allocations.load(std::memory_order_relaxed);
}

}  // namespace moekit::test

void* operator new(std::size_t bytes) {
  moekit::test::g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(bytes == 0 ? 1 : bytes)) return p;
  throw std::bad_alloc();
}

void operator delete(void* p) noexcept {
  std::free(p);
}

void operator delete(void* p, std::size_t) noexcept {
  std::free(p);
}
