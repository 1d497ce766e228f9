#pragma once
// The AVX2 path of the cpu runner, shared by its core (contiguous rows in, unweighted rows out)
// and its fused op (dispatch format in, weighted sum out): rows grouped by slot go through
// GEMM1 + activation and GEMM2 + weighted sum over panel16 weights. Each slot's rows take the
// streaming kernel or the GEMM (use_gemm, the one place that chooses).
//
// Work is split by panels, not by expert: in GEMM1 every thread takes the same share of every
// active expert's w13 panels, in GEMM2 the same share of every expert's w2 panels, i.e. a
// disjoint range of output columns of H. So every active expert's weights stream once, evenly
// over the threads, and in GEMM2 each thread adds weight * result straight into its own
// columns of the output rows, with no races and no pass of its own for the weighted sum.

#include <cstdint>

#include "contracts/experts_problem.hpp"
#include "contracts/weights.hpp"
#include "core/scratch.hpp"
#include "core/thread_pool.hpp"
#include "moekit/plan.hpp"
#include "runner/cpu/stream.hpp"

namespace moekit::cpu {

struct CallScratch;

// The streaming kernel serves up to kStreamRows rows per pass over a panel and re-reads the
// panel from cache for more; the GEMM widens a block of panels once into scratch and runs
// register tiles over all rows, which only pays once enough rows share the widened block.
// An expert with more than this many rows takes the GEMM.
inline constexpr int64_t kStreamMaxRows = 8;
inline bool use_gemm(int64_t rows) {
  return rows > kStreamMaxRows;
}

// How streamed rows meet int4 weights (Int4Rows) and whether GEMM rows of bf16 weights take the
// AVX-512 BF16 GEMM are the plan's (CpuKernels, decided by choose_cpu_kernels in
// kernel_choice.cpp); the activations' dtype of each call selects among them. int16 runs at about
// twice the rate of f32, int8 at about twice int16's (docs/PERFORMANCE.md), which is what lets
// decode keep up with the memory.

// One batch of rows grouped by slot. Row r belongs to the slot s with offsets[s] <= r <
// offsets[s + 1]; its result is multiplied by weight[r] and added to row out_row[r] of `out`.
struct GroupedRows {
  float* x = nullptr;  // [n_rows, H], GEMM1's inputs; quantised in place where the format says
  int64_t n_rows = 0;
  const int64_t* offsets = nullptr;  // [slots + 1]
  const int32_t* out_row = nullptr;  // [n_rows]
  const float* weight = nullptr;     // [n_rows]
  float* out = nullptr;              // [out_rows, H]: set to the sum, whatever it held
  int64_t out_rows = 0;
  // The dtype the layer's activations came in as: bf16 or f16 let the kernels compute at a
  // precision that is still finer than that dtype's (int4_stream), f32 keeps f32 throughout.
  DType activations = DType::f32;
  // Where PanelMoe::gemm1_reads_hidden: the layer's bf16 hidden states [out_rows, H], from which
  // GEMM1's bf16 GEMM copies its rows (row r is row out_row[r]); the rows of x of the slots it
  // serves (use_gemm) are then never read and need not be filled. Null: x holds every row.
  const bf16_t* hidden_bf16 = nullptr;
};

class PanelMoe {
 public:
  // int4: how this computation's streamed rows meet int4 weights (routed or shared experts).
  PanelMoe(const ExpertsProblem& problem, const CpuKernels& kernels, Int4RowsByActivations int4);

  int64_t scratch_bytes() const { return shared_bytes_ + worker_bytes_ * problem_.threads; }
  // Whether GEMM1's bf16 GEMM can take its rows straight from bf16 hidden states
  // (GroupedRows::hidden_bf16) for weights of format q: the rows it would round to bf16 are
  // those values exactly, where the format quantises no activations (bf16, int4-group W4A16).
  // A copy of bf16 rows then replaces the gather into f32 rows and their rounding back.
  bool gemm1_reads_hidden(const QuantParams& q, DType activations) const;
  void run(const GroupedRows& rows, const CoreWeights& weights, void* scratch,
           ThreadPool& pool) const;

 private:
  struct Shared;
  struct Worker;
  struct Stage;
  // The rows [begin, end) of a stage's inputs as the format's GEMM reads them: quantised to
  // e4m3 where the format says, with their step sums for int4 panels.
  void prepare_inputs(const Stage& stage, int64_t begin, int64_t end) const;
  void run_parts(const Stage& stage, int64_t begin, int64_t end, int worker) const;
  Shared carve_shared(ScratchCarver& carver) const;
  Worker carve_worker(ScratchCarver& carver) const;
  // GEMM1 -> activation and GEMM2 -> weighted sum over part `part` of loop.parts of the panels,
  // in the one loop that runs both: gate_up counts itself done with each slot in loop.ready, and
  // down waits until every part is (and the slot's rows are prepared) before it reads a slot's
  // activations.
  void gate_up(const GroupedRows& rows, const CoreWeights& weights, const Shared& s,
               const Worker& w, int part, const Stage& loop) const;
  void down(const GroupedRows& rows, const CoreWeights& weights, const Shared& s, const Worker& w,
            int part, const Stage& loop) const;
  // Whether a pass over the rows must run before each GEMM (prepare_inputs).
  bool needs_prepare(const GroupedRows& rows, const QuantParams& q) const;

  // Columns of the GEMM's result tile: the packed rows of the wider of w13 and w2.
  int64_t tile_columns() const;
  Int4Rows stream_kind(const GroupedRows& rows) const;
  bool bf16_inputs(const GroupedRows& rows) const;
  CallScratch call_scratch(const Worker& w) const;

  ExpertsProblem problem_;
  CpuKernels kernels_;
  Int4RowsByActivations int4_;
  int64_t hidden_steps_ = 0;        // int4: scale steps along H (GEMM1's K)
  int64_t intermediate_steps_ = 0;  // and along I (GEMM2's K)
  // fp8 on the bf16 GEMM: the inputs' scale groups along H and I (InputScales); 0 otherwise.
  int64_t input_scale_groups(int64_t k) const;
  int64_t hidden_groups_ = 0;
  int64_t intermediate_groups_ = 0;
  int64_t shared_bytes_ = 0;
  int64_t worker_bytes_ = 0;
};

// Runs body(begin, end, part) over [0, n) in the calling thread when the work is small
// (`elements` of work in all), else over the pool: a pool's wake-up costs more than a few
// thousand elements.
void for_rows(ThreadPool& pool, int64_t n, int64_t elements,
              const std::function<void(int64_t, int64_t)>& body);

}  // namespace moekit::cpu
