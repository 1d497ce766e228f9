#pragma once
// The block layer's own device work: the finite checks of the caller's inputs and the Qwen2-MoE
// shared-expert gate. Launchers enqueue on `stream`, allocate nothing and never wait (they can be
// captured in a CUDA graph); every pointer is device memory.

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>

#include "core/cuda_finite.hpp"
#include "moekit/dtype.hpp"

namespace moekit::block::cuda {

// Where the first non-finite element of a checked tensor is, kept on the device. `first` packs
// (row << 32) | column, so atomicMin keeps the lowest row and, within it, the lowest column:
// the same element the CPU check names, whatever order the GPU visited the elements in.
//
// Protocol: the caller resets the status (reset_finite_status) before the forward pass, the
// checks record into it, and the caller reads it back (a 16-byte copy) at the next point where
// it synchronises with the stream anyway (the end of forward for a synchronous API, or a
// documented check call); the value of the element is then read from the tensor itself
// (decode_finite_status gives its place). The kernels after the check still run on such a
// batch: the router gives distinct in-range ids for a bad row, so nothing reads or writes out
// of bounds, and the output is discarded when the status reports a bad element.
struct FiniteStatus {
  unsigned long long first = ~0ull;  // ~0: every element finite
};

inline constexpr unsigned long long kAllFinite = ~0ull;

struct NonFiniteAt {
  bool found = false;
  int64_t row = 0;
  int64_t column = 0;
};

inline NonFiniteAt decode_finite_status(const FiniteStatus& status) {
  if (status.first == kAllFinite) return {};
  return {true, static_cast<int64_t>(status.first >> 32),
          static_cast<int64_t>(status.first & 0xffffffffull)};
}

// Sets `count` statuses to "all finite" (a memset on the stream).
void reset_finite_status(FiniteStatus* status, int count, cudaStream_t stream);

struct FiniteCheckArgs {
  const void* data = nullptr;  // [rows, columns], row-major
  DType dtype = DType::f32;    // f32, bf16 or f16
  int64_t rows = 0;
  int64_t columns = 0;  // below 2^32
  FiniteStatus* status = nullptr;
};

// Records the first NaN or Inf of the tensor into *status (keeping an earlier-recorded element
// if it comes first). Reads the bit patterns: no conversion, no floating-point compare.
void check_finite(const FiniteCheckArgs& args, cudaStream_t stream);

// The same for two tensors (a forward's hidden states and logits), in one launch: at small
// batches the launch, not the reading, is the cost.
void check_finite(const FiniteCheckArgs& first, const FiniteCheckArgs& second, cudaStream_t stream);

// The same two checks as arguments for a kernel that runs them itself (the router kernel, where
// the plan gives it the checks: Plan::fusions.checks_in_router), after the same argument checks.
std::array<cuda_finite::FiniteTensor, 2> finite_check_tensors(const FiniteCheckArgs& first,
                                                              const FiniteCheckArgs& second);

struct SharedGateArgs {
  const void* hidden = nullptr;  // [tokens, hidden_size]
  DType hidden_dtype = DType::f32;
  int64_t tokens = 0;
  int64_t hidden_size = 0;
  const float* gate = nullptr;  // [hidden_size]: shared_expert_gate
  float* out = nullptr;         // [tokens]: sigmoid(hidden[t] . gate), the dot in double
};

void shared_gate(const SharedGateArgs& args, cudaStream_t stream);

}  // namespace moekit::block::cuda
