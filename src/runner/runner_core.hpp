#pragma once
// Layer 4's data: what a dispatcher hands the runner, the formats a core consumes, and the core
// interface. A core computes GEMM1 (gate+up) -> activation -> GEMM2 (down) per routed row.

#include <cstdint>
#include <memory>

#include "moekit/plan.hpp"
#include "moekit/quant.hpp"
#include "moekit/spec.hpp"
#include "moekit/tensor.hpp"
#include "runner/cpu/panels.hpp"

namespace moekit {

class ThreadPool;

// The kernels of the cpu runner (its core and fused op), from the plan's platform: the portable
// row-at-a-time code on the canonical weight layout, or the AVX2+FMA kernels, which read the
// weights packed in panel16 (runner/cpu/panels.hpp) instead.
enum class CpuKernels { portable, avx2_panels };

// The shape of one experts computation, fixed when the layer is built.
struct ExpertsProblem {
  int64_t hidden = 0;
  int64_t intermediate = 0;
  Activation activation;
  int slots = 0;           // local expert slots (routed, plus fused shared slots)
  int columns = 0;         // routed entries per token (top-k, plus fused shared slots)
  int64_t max_tokens = 0;  // largest batch
  int threads = 1;
  CpuKernels kernels = CpuKernels::portable;
  // Extensions of the plan's platform the avx2 panel kernels may also use.
  bool avx512_vnni = false;
  bool avx512_bf16 = false;
  QuantParams quant{};  // the weight format, for the scratch its kernels need

  int64_t max_rows() const { return max_tokens * columns; }
};

// One stack of expert matrices as a core reads it, in the plan's format: the weights and, when
// quantised, their scale grid and zero points (see QuantParams and docs/QUANTIZATION.md).
struct StoredMatrices {
  TensorView weight;  // [slots, parts * N, K]
  TensorView scale;   // [slots, parts * scale_rows(N), scale_cols(K)]
  TensorView zero;    // the scale's shape, i8; only int4-group with zero points
  int parts = 1;      // separately scaled matrices stacked along the rows (w13: gate, up)
};

// What the quant method hands a core: the weight tensors and how to read them. The weights are
// either canonical (w13, w2) or packed in panel16 (w13_panels gate/up interleaved, w2_panels),
// never both: the layout the runner's kernels read.
struct CoreWeights {
  StoredMatrices w13;  // [slots, 2I, H], gate rows then up rows
  StoredMatrices w2;   // [slots, H, I]
  cpu::PanelStack w13_panels;
  cpu::PanelStack w2_panels;
  QuantParams quant;
  float w13_input_scale = 0.0f;  // fp8_static: the scale of GEMM1's input
  float w2_input_scale = 0.0f;   // fp8_static: the scale of GEMM2's input
};

// The standard dispatch format: rows in token order, each with `columns` (slot, weight) pairs;
// slot -1 means the expert is not held here and the pair contributes nothing.
struct DispatchOutput {
  TensorView hidden;  // [T, H], f32/bf16/f16
  const int32_t* slots = nullptr;
  const float* weights = nullptr;
  int64_t tokens = 0;
  int columns = 0;
};

// The contiguous format: rows grouped by slot, slot s owning rows [offsets[s], offsets[s+1]).
struct ContiguousRows {
  float* rows = nullptr;     // [n_rows, H] inputs
  float* row_out = nullptr;  // [n_rows, H] expert outputs, unweighted
  int64_t n_rows = 0;
  const int64_t* offsets = nullptr;       // [slots + 1]
  const int32_t* row_of_entry = nullptr;  // [T * columns]: the row of entry (t, j), or -1
  DType activations = DType::f32;         // the dtype the rows came in as (see cpu::GroupedRows)
};

// A batch in a core's format. Standard: the core reads `standard` and writes the weighted sum
// over columns to `combined` [T, H]. Contiguous: the core reads and writes `contiguous`.
struct RunnerBatch {
  const DispatchOutput* standard = nullptr;
  float* combined = nullptr;
  ContiguousRows contiguous;
};

class RunnerCore {
 public:
  virtual ~RunnerCore() = default;
  virtual RunnerFormat format() const = 0;
  virtual int64_t scratch_bytes() const = 0;
  virtual void run(RunnerBatch& batch, const CoreWeights& weights, void* scratch,
                   ThreadPool& pool) const = 0;
};

}  // namespace moekit
