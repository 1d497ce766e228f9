#pragma once
// What the MPI tests share: the world as mpirun started it, and the sizes every test plans with.

#include <string>

#include "support/layer_fixture.hpp"

namespace moekit::test {

inline constexpr int64_t kTimeoutMs = 5000;

inline Platform world() {
  Platform platform = Platform::probe();
  platform.cpu_threads = 1;
  return platform;
}

// Physical experts must divide over the ranks: replicas make up the difference (16 experts over
// 3 ranks take 2), and `extra` more replicas per rank test replicas themselves.
inline int redundant_for(const ModelSpec& spec, int size, int extra) {
  return (size - spec.n_experts % size) % size + extra * size;
}

// Uneven batches, one rank with none.
inline int64_t tokens_of(int rank) {
  constexpr int64_t kTokens[] = {5, 0, 9, 3};
  return kTokens[rank % 4];
}

inline double tolerance(WeightFormat format, DType output) {
  if (output == DType::bf16) return 1e-2;
  // The single-process layer computes the same rows, quantised alike; only the order of the
  // ranks' partial sums differs, and where a row's kernel does (fewer rows per expert), an
  // activation can round to the neighbouring fp8/int step.
  return format == WeightFormat::f32 ? 1e-5 : 2e-2;
}

inline std::string identifier(std::string name) {
  for (char& ch : name) {
    if (ch == '-') ch = '_';
  }
  return name;
}

}  // namespace moekit::test
