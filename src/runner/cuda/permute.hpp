#pragma once
// The GPU runner's permutes: the sort/align of (token, column) entries by local expert slot,
// the gather of hidden rows into the grouped layout (bf16/f16, or e4m3 with per-token-group
// scales), and the combine back to token order. No host-side sort and no host synchronisation:
// every count and offset stays on the device, and the layouts are deterministic (rows within a
// slot in entry order, whatever the scheduling). Launchers enqueue on `stream` and allocate
// nothing (capturable in a CUDA graph); scratch comes from the caller; every pointer is device
// memory.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "moekit/dtype.hpp"

namespace moekit::runner::cuda {

// Two layouts of the grouped rows:
// - contiguous (capacity == 0, prefill): slot s owns rows [offsets[s], offsets[s + 1]); the first
//   counts[s] are its entries, the rest padding up to a multiple of `tile` rows, with
//   row_source -1. offsets[n_slots] is the number of rows in use.
// - masked (capacity > 0, decode): slot s owns rows [s * capacity, (s + 1) * capacity), the first
//   counts[s] in use; offsets[s] = s * capacity likewise. Rows past counts[s] are not written.
struct SortArgs {
  // [tokens, columns]: the local slot of each entry, -1 (or any id outside [0, n_slots)) = not
  // on this rank. With global_to_local, the entries are global ids mapped through that table
  // ([n_global], -1 = not here) first.
  const int32_t* ids = nullptr;
  const int32_t* global_to_local = nullptr;
  int n_global = 0;
  int64_t tokens = 0;
  int columns = 0;
  int n_slots = 0;
  int tile = 1;                   // contiguous layout: rows per slot padded to a multiple of this
  int capacity = 0;               // masked layout: rows per slot, at least `tokens`; 0: contiguous
  int32_t* counts = nullptr;      // [n_slots] out
  int32_t* offsets = nullptr;     // [n_slots + 1] out
  int32_t* row_source = nullptr;  // [sort_max_rows(...)] out: the entry t * columns + j of a row
  int32_t* entry_row = nullptr;   // [tokens * columns] out: the row of an entry, -1 = not here
  void* scratch = nullptr;        // sort_scratch_bytes(tokens * columns, n_slots) bytes
};

// Rows the grouped layout can need: what row_source, the gathered rows and their scales hold.
int64_t sort_max_rows(int64_t entries, int n_slots, int tile, int capacity);
int64_t sort_scratch_bytes(int64_t entries, int n_slots);
void sort_by_slot(const SortArgs& args, cudaStream_t stream);

struct GatherArgs {
  const void* hidden = nullptr;  // [tokens, hidden_size]: f32, bf16 or f16
  DType hidden_dtype = DType::bf16;
  int64_t tokens = 0;
  int64_t hidden_size = 0;
  int columns = 0;
  // sort_by_slot's outputs, and the layout it was asked for.
  const int32_t* row_source = nullptr;
  const int32_t* offsets = nullptr;
  const int32_t* counts = nullptr;
  int n_slots = 0;
  int capacity = 0;
  int64_t max_rows = 0;  // sort_max_rows(...)
  // [max_rows, hidden_size] out: bf16 or f16 (converted, rounded to nearest even), or f8e4m3
  // quantised per row per quant_group columns as quantize_activation_row does (scale =
  // max(amax, 1e-10) / 448, value = e4m3(x / scale), saturated). Padding rows are zeros (with
  // the scale of a zero row).
  void* rows = nullptr;
  DType rows_dtype = DType::bf16;
  float* scales = nullptr;  // f8e4m3: [max_rows, ceil(hidden_size / quant_group)] out
  int quant_group = 128;
  // f8e4m3 with a static scale (one f32 on the device): every value is e4m3(x / scale), and no
  // scales are written (scales may be null).
  const float* static_scale = nullptr;
};

void gather_rows(const GatherArgs& args, cudaStream_t stream);

// sort_by_slot(sort) then gather_rows(gather), the gather reading the sort's outputs (the same
// row_source, offsets and counts, batch and layout): one launch where the batch is tiny (1 to 32
// entries in the contiguous layout with tile 1, as a decode step's top-k is), where every block
// sorts the few entries with one warp and gathers its own row; the two launches otherwise. The
// same outputs either way.
void sort_and_gather(const SortArgs& sort, const GatherArgs& gather, cudaStream_t stream);

struct CombineArgs {
  // [rows, hidden_size]: GEMM2's output in the grouped layout, f32, bf16 or f16.
  const void* rows = nullptr;
  DType rows_dtype = DType::f32;
  const int32_t* entry_row = nullptr;  // [tokens, columns], sort_by_slot's
  // Multiply each row by its entry's routing weight ([tokens, columns]) here; false when GEMM2
  // applied it already.
  bool apply_weights = true;
  const float* weights = nullptr;
  const void* shared = nullptr;  // [tokens, hidden_size] added last, or null
  DType shared_dtype = DType::f32;
  int64_t tokens = 0;
  int columns = 0;
  int64_t hidden_size = 0;
  void* output = nullptr;  // [tokens, hidden_size]: f32, bf16 or f16
  DType output_dtype = DType::f32;
};

// output[t] = sum over j in column order of weight[t, j] * rows[entry_row[t, j]] (entries not
// here skipped), plus shared[t]; f32 accumulation in that fixed order, so the result is the same
// bit for bit on every run.
void combine(const CombineArgs& args, cudaStream_t stream);

}  // namespace moekit::runner::cuda
