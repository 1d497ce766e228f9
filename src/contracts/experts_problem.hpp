#pragma once
// The shape of one experts computation, fixed when the layer is built: what layers 3, 4 and 5
// size their memory and kernels by. How a runner computes it (its kernels) is the plan's, read
// by that runner alone.

#include <cstdint>

#include "moekit/quant.hpp"
#include "moekit/spec.hpp"
#include "moekit/tensor.hpp"

namespace moekit {

// Whose experts: the routed ones (with any fused shared slots), or the shared experts computed
// apart. Runners may plan them differently (their intermediate sizes may differ).
enum class ExpertsRole : uint8_t { routed, shared };

struct ExpertsProblem {
  int64_t hidden = 0;
  int64_t intermediate = 0;
  Activation activation;
  int slots = 0;           // local expert slots (routed, plus fused shared slots)
  int columns = 0;         // routed entries per token (top-k, plus fused shared slots)
  int64_t max_tokens = 0;  // largest batch of tokens a runner is handed (arrivals included)
  int threads = 1;         // CPU stages: the pool's size, for per-worker scratch
  Device device = Device::cpu();
  ExpertsRole role = ExpertsRole::routed;
  QuantParams quant{};

  int64_t max_rows() const { return max_tokens * columns; }
};

}  // namespace moekit
