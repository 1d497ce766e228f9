#pragma once
// One token's expert computation in one kernel (GemmKernel::one_token): GEMM1 with the gated
// activation, GEMM2 and the weighted sum of the token's entries, as dot products on the CUDA
// cores. A decode step of one token reads each routed expert's weights once and does two
// FLOPs per weight: the tensor cores have nothing to do, and the chain of four kernels the
// grouped path runs (sort, GEMM1, GEMM2, combine) costs more in launches and ramps than in
// bytes at Qwen3-30B-A3B's size (bench/cuda/NOTES.md v13, v17). Here every CTA streams its
// share of both GEMMs' weight rows, and one grid-wide barrier (a cooperative launch, so every
// CTA is resident) separates GEMM1 from GEMM2.
//
// Numerics are the grouped path's: the hidden state rounded to the weights' dtype, f32 sums,
// the activation rounded to the weights' dtype before GEMM2, and each column of the output
// summed in entry order as weight * (row . act), so the same inputs give the same bits on every
// run (no float atomics). The sums run in another order than the tensor-core kernels', so the
// bits differ from theirs within the dtype's rounding.

#include <cuda_runtime.h>

#include <cstdint>
#include <optional>
#include <string>

#include "moekit/dtype.hpp"
#include "moekit/spec.hpp"
#include "routing/cuda/route.hpp"

namespace moekit::cuda_gemm {

// Entries of the token at most (top-k plus fused shared slots).
constexpr int kOneTokenMaxColumns = 32;
// The heuristic's bound on the weights one token reads (choose_gemm, bench/cuda/NOTES.md v18,
// v19): below it the four launches the grouped path chains cost more than this kernel's slower
// stream (Qwen3-30B-A3B, 75 MB: 46.1 us on an H100 since v19's staging, against the grouped
// path's 52.3 two sessions before, not alternated in one run); above it the grouped path's
// stream wins (Mixtral-8x7B, 705 MB: 78.6% of the floor here against about 84% there).
constexpr int64_t kOneTokenMaxWeightBytes = 128 << 20;
// Shared memory for the token's activations ([columns, I], 16-bit) or its hidden state at most.
constexpr int64_t kOneTokenMaxStagedBytes = 96 * 1024;

// Why the kernel cannot take a layer of weights `dtype`, hidden size H and intermediate size I
// whose token brings `columns` entries; nullopt where it can.
std::optional<std::string> one_token_unsupported(DType dtype, int64_t hidden, int64_t intermediate,
                                                 int64_t columns);

// The grid of the kernel for a layer on the current device: every CTA resident at once (the
// barrier waits for them all). Asks the runtime for the kernel's occupancy: call it once, when
// the core is built, not inside a forward.
struct OneTokenGrid {
  int blocks = 0;
  size_t shared_bytes = 0;
};
// route_bytes: the router's shared memory (routing::cuda::route_warp_bytes) where the kernel
// routes its token itself (OneTokenArgs::route), else 0.
OneTokenGrid one_token_grid(DType dtype, int64_t hidden, int64_t intermediate, int64_t columns,
                            int route_bytes);

// The activation GEMM1 leaves for GEMM2 ([columns, I] in the weights' dtype), in bytes.
int64_t one_token_scratch_bytes(int64_t intermediate, int64_t columns);

struct OneTokenArgs {
  DType dtype = DType::bf16;     // of w13 and w2: bf16 or f16
  const void* hidden = nullptr;  // [H], f32, bf16 or f16
  DType hidden_dtype = DType::bf16;
  int hidden_size = 0;
  int intermediate = 0;
  const int32_t* ids = nullptr;              // [columns]: local slots, or global ids with the table
  const int32_t* global_to_local = nullptr;  // [n_global], -1 = not here; null: ids are slots
  int n_global = 0;
  int columns = 0;
  const float* weights = nullptr;  // [columns] routing weights
  const void* w13 = nullptr;       // [slots, 2I, H]
  const void* w2 = nullptr;        // [slots, H, I]
  Activation activation;
  // Plan::fusions.route_in_runner: the token's routing (one token, the physical columns given,
  // as many as `columns`). Every CTA routes it with the router kernel's warp code, one writes
  // the router's outputs, and `ids` and `weights` are not read. Null: ids and weights are read.
  const routing::cuda::RouteArgs* route = nullptr;
  void* act = nullptr;           // [columns, I] scratch (one_token_scratch_bytes)
  uint32_t* counters = nullptr;  // 2, zero before the first launch; every launch leaves them zero
  void* output = nullptr;        // [H]: the weighted sum over the entries on this rank
  DType output_dtype = DType::f32;
  OneTokenGrid grid;
};

// Enqueues the kernel on `stream` and returns. Bad arguments throw std::invalid_argument naming
// the argument; a failed launch throws std::runtime_error.
void launch_one_token(const OneTokenArgs& args, cudaStream_t stream);

}  // namespace moekit::cuda_gemm
