#pragma once
// The formats rows take between stages: what a dispatcher hands a runner (DispatchOutput), what
// a core reads (ContiguousRows), and the activation rows of either (ActivationRows), in any of
// the activation dtypes. Layers 3 (dispatch), 4 (runner) and 5 (quant) include this header and
// none of each other's.

#include <cstdint>

#include "moekit/dtype.hpp"
#include "moekit/tensor.hpp"

namespace moekit {
namespace routing::cuda {
struct RouteArgs;
}

// Rows of activations [rows, cols] on one device: f32, bf16 or f16 values, or e4m3 codes with
// one f32 scale per row per `scale_group` columns (the fp8 formats' GEMM inputs).
struct ActivationRows {
  void* data = nullptr;
  DType dtype = DType::f32;
  int64_t rows = 0;
  int64_t cols = 0;
  const float* scales = nullptr;  // e4m3 only: [rows, ceil(cols / scale_group)]
  int64_t scale_group = 0;

  static ActivationRows Float(void* data, DType dtype, int64_t rows, int64_t cols) {
    return {data, dtype, rows, cols, nullptr, 0};
  }
  // The rows as f32 values, for a stage that reads only those (an internal error otherwise).
  float* f32() const;
};

// The standard dispatch format: rows in token order, each with `columns` (slot, weight) pairs;
// slot -1 means the expert is not held here and the pair contributes nothing. The runner writes
// the weighted sum over a token's pairs to `sum` [tokens, H] f32, which the dispatcher's
// combine() returns to the token's rank and order.
//
// Two fusions the plan may decide (Plan::fusions), read only by the runner it decided them for
// (the cuda core):
// - map_in_sort: global_to_local is set; `slots` then holds global physical ids, which the
//   runner maps through that table ([n_global] on the rows' device, -1 = not here; an id
//   outside [0, n_global) is not here either) as it groups the entries;
// - combine_to_output: output is set; the runner writes the weighted sum there, converted to
//   output_dtype (the layer's output), instead of to `sum`;
// - route_in_runner: route is set (a batch of one token); the router kernel did not run, and
//   the runner's one-token kernel routes the token with these arguments itself, writing the
//   router's outputs (`slots` and `weights` among them, which it does not read).
struct DispatchOutput {
  TensorView hidden;  // [tokens, H], f32/bf16/f16
  const int32_t* slots = nullptr;
  const float* weights = nullptr;
  int64_t tokens = 0;
  int columns = 0;
  float* sum = nullptr;
  const int32_t* global_to_local = nullptr;
  int n_global = 0;
  void* output = nullptr;  // [tokens, H]
  DType output_dtype = DType::f32;
  const routing::cuda::RouteArgs* route = nullptr;
};

// The contiguous format: rows grouped by slot, slot s owning rows [offsets[s], offsets[s+1]).
struct ContiguousRows {
  ActivationRows rows;                    // [n_rows, H] inputs (f32 for the cpu core)
  float* row_out = nullptr;               // [n_rows, H] expert outputs, unweighted
  const int64_t* offsets = nullptr;       // [slots + 1]
  const int32_t* row_of_entry = nullptr;  // [T * columns]: the row of entry (t, j), or -1
  DType activations = DType::f32;         // the dtype the rows came in as
};

}  // namespace moekit
