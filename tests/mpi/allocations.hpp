#pragma once
// Every C++ allocation of the MPI test binary, counted (allocations.cpp replaces operator new),
// so that a test can see that a call allocates nothing. MPI's own buffers come from malloc and
// are not counted.

#include <cstdint>

namespace moekit::test {

int64_t allocations_so_far();

}  // namespace moekit::test
