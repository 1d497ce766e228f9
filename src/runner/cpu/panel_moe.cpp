#include "runner/cpu/panel_moe.hpp"

#include <algorithm>
#include <atomic>
#include <thread>

#include "moekit/error.hpp"
#include "quant/activation_quant.hpp"
#include "runner/cpu/e4m3_rows.hpp"
#include "runner/cpu/gemm.hpp"
#include "runner/cpu/gemm_bf16.hpp"
#include "runner/cpu/gemm_int8.hpp"
#include "runner/cpu/silu_panels.hpp"
#include "runner/cpu/stream.hpp"
#include "runner/kernels.hpp"

namespace moekit::cpu {
namespace {

// Panels per streaming call: the results stay in L1 while the activation or the weighted sum
// reads them, and the chunk's bf16 panels (4 x 16 x 2048 x 2 bytes) stay in L2 while the next
// rows of the same expert pass over them.
constexpr int64_t kStreamChunk = 4;
// Panels per GEMM call at least (gemm_chunk): each call packs its rows of A once, so wider calls
// share that more; the part of the result tile it writes (at most kGemmRows x 128 floats, or
// kGemmTileFloats for the f32-row GEMM) still sits in L2 for the activation.
constexpr int64_t kGemmChunk = 8;
// The result tile a call of the f32-row GEMM may leave for the activation or the weighted sum
// (128 KB: within L2 beside the panels' K-block and the packed rows).
constexpr int64_t kGemmTileFloats = int64_t{1} << 15;
constexpr int64_t kChunkColumns = kStreamChunk * kPanelRows;
// Rows per GEMM call, so the result tile is bounded whatever an expert receives.
constexpr int64_t kGemmRows = 256;
// Below this many elements a pass over rows runs in the calling thread.
constexpr int64_t kSerialElements = int64_t{1} << 16;

// int4 panels: the scale steps along a K of k, for the inputs' step sums; 0 for other formats.
int64_t int4_steps(const QuantParams& q, int64_t k) {
  if (q.weight_dtype != DType::i4) return 0;
  const int64_t group = q.block_cols == 0 ? k : q.block_cols;
  return (k + group - 1) / group;
}

}  // namespace

// A worker's int16 or int8 copies of the rows it streams (Int4Rows): kStreamMaxRows rows of
// codes, and of their per-step scales and sums.
struct RowCodes {
  void* q = nullptr;
  float* scale = nullptr;
  float* sums = nullptr;
};

// A worker's rows expanded for the AVX2 e4m3 kernel (E4m3Rows): kStreamMaxRows rows and their
// units.
struct ExpandedRows {
  float* x = nullptr;
  float* unit = nullptr;
};

// Where one kernel call of a worker writes and what scratch it has.
struct CallScratch {
  float* y;
  int64_t tile_columns;
  float* work;
  RowCodes codes;
  ExpandedRows e4m3;
  void* bf16_work;
  bf16_t* bf16_rows;  // a block of GEMM rows rounded to bf16 (round_rows_bf16)
  void* int8_work;
};

void for_rows(ThreadPool& pool, int64_t n, int64_t elements,
              const std::function<void(int64_t, int64_t)>& body) {
  if (elements < kSerialElements) {
    body(0, n);
  } else {
    pool.parallel_for(n, body);
  }
}

// Rows quantised to int8 for the int8 GEMM: row r's codes at q + r * ld, its per-group scales
// and sums of codes at scale + r * steps and sums + r * steps.
struct Int8Codes {
  int8_t* q = nullptr;
  int64_t ld = 0;
  float* scale = nullptr;
  float* sums = nullptr;
  int64_t steps = 0;

  Int8Matrix matrix() const { return {q, ld, scale, sums, steps}; }
};

struct PanelMoe::Shared {
  float* act;         // [max_rows, I]: GEMM2's inputs
  float* x_sums;      // int4: [max_rows, hidden_steps_]
  float* act_sums;    // int4: [max_rows, intermediate_steps_]
  int32_t* ready;     // [slots]: the parts done with the slot's GEMM1, when one loop runs both
  float* x_scales;    // fp8 on the bf16 GEMM: [max_rows, hidden_groups_], the inputs' scales
  float* act_scales;  // and [max_rows, intermediate_groups_]
  // int4-group-a8 on the int8 GEMM: its rows quantised (quantize_int8), GEMM1's and GEMM2's.
  Int8Codes x_int8;
  Int8Codes act_int8;
};

struct PanelMoe::Worker {
  // One kernel call's results: the streaming kernel's [kStreamRows, kChunkColumns], or the
  // GEMM's [kGemmRows, tile_columns()], which it fills at the columns of the panels it computes.
  float* y;
  float* work;  // the GEMM's scratch
  RowCodes codes;
  ExpandedRows e4m3;
  void* bf16_work = nullptr;    // gemm_panels_bf16's scratch
  bf16_t* bf16_rows = nullptr;  // kGemmRows rows rounded for it
  void* int8_work = nullptr;    // gemm_panels_int8's
};

PanelMoe::PanelMoe(const ExpertsProblem& problem, const CpuKernels& kernels,
                   Int4RowsByActivations int4)
    : problem_(problem),
      kernels_(kernels),
      int4_(int4),
      hidden_steps_(int4_steps(problem.quant, problem.hidden)),
      intermediate_steps_(int4_steps(problem.quant, problem.intermediate)),
      hidden_groups_(input_scale_groups(problem.hidden)),
      intermediate_groups_(input_scale_groups(problem.intermediate)) {
  ScratchCarver shared;
  carve_shared(shared);
  shared_bytes_ = shared.bytes();
  ScratchCarver worker;
  carve_worker(worker);
  worker_bytes_ = worker.bytes();
}

int64_t PanelMoe::input_scale_groups(int64_t k) const {
  const QuantParams& q = problem_.quant;
  // The bf16 GEMM takes fp8 GEMM inputs as e4m3 codes and their scales (InputScales).
  if (!kernels_.bf16_gemm || q.weight_dtype != DType::f8e4m3 || !q.quantizes_activations()) {
    return 0;
  }
  const int64_t group = activation_group(q, k);
  return (k + group - 1) / group;
}

PanelMoe::Shared PanelMoe::carve_shared(ScratchCarver& carver) const {
  const int64_t rows = problem_.max_rows();
  Shared s{carver.take<float>(rows * problem_.intermediate),
           carver.take<float>(rows * hidden_steps_),
           carver.take<float>(rows * intermediate_steps_),
           carver.take<int32_t>(problem_.slots),
           nullptr,
           nullptr,
           {},
           {}};
  if (hidden_groups_ > 0) {
    s.x_scales = carver.take<float>(rows * hidden_groups_);
    s.act_scales = carver.take<float>(rows * intermediate_groups_);
  }
  if (kernels_.int8_gemm) {
    const auto take = [&](int64_t k, int64_t steps) {
      return Int8Codes{carver.take<int8_t>(rows * k), k, carver.take<float>(rows * steps),
                       carver.take<float>(rows * steps), steps};
    };
    s.x_int8 = take(problem_.hidden, hidden_steps_);
    s.act_int8 = take(problem_.intermediate, intermediate_steps_);
  }
  return s;
}

int64_t PanelMoe::tile_columns() const {
  const int64_t gate_up = (problem_.intermediate + kHalfPanel - 1) / kHalfPanel * kPanelRows;
  const int64_t down = (problem_.hidden + kPanelRows - 1) / kPanelRows * kPanelRows;
  return std::max({gate_up, down, kChunkColumns});
}

PanelMoe::Worker PanelMoe::carve_worker(ScratchCarver& carver) const {
  const int64_t widest = std::max(problem_.hidden, problem_.intermediate);
  Worker w{
      carver.take<float>(std::max<int64_t>(kStreamRows, std::min(kGemmRows, problem_.max_rows())) *
                         tile_columns()),
      carver.take<float>(gemm_scratch_floats(widest)),
      {},
      {}};
  // Scratch for integer rows wherever some activations' dtype could take them.
  const Int4Rows stream = int4_.half;
  if (stream != Int4Rows::f32) {
    const int64_t steps = std::max(hidden_steps_, intermediate_steps_);
    const int64_t values = kStreamMaxRows * widest;
    void* q = stream == Int4Rows::int8 ? static_cast<void*>(carver.take<int8_t>(values))
                                       : static_cast<void*>(carver.take<int16_t>(values));
    w.codes = {q, carver.take<float>(kStreamMaxRows * steps),
               carver.take<float>(kStreamMaxRows * steps)};
  }
  if (problem_.quant.weight_dtype == DType::f8e4m3 && !kernels_.e4m3_stream_avx512) {
    w.e4m3 = {carver.take<float>(kStreamMaxRows * e4m3_expanded_floats(widest)),
              carver.take<float>(kStreamMaxRows)};
  }
  if (kernels_.bf16_rows(DType::bf16)) {
    w.bf16_work = carver.take<std::byte>(gemm_bf16_scratch_bytes(widest));
    w.bf16_rows =
        carver.take<bf16_t>(std::min(kGemmRows, problem_.max_rows()) * bf16_rows_ld(widest));
  }
  if (kernels_.int8_gemm) w.int8_work = carver.take<std::byte>(gemm_int8_scratch_bytes());
  return w;
}

Int4Rows PanelMoe::stream_kind(const GroupedRows& rows) const {
  return int4_.of(rows.activations);
}

bool PanelMoe::gemm1_reads_hidden(const QuantParams& q, DType activations) const {
  // int4 rows streamed in f32 take step sums over every row of x (needs_prepare).
  const bool f32_step_sums = q.weight_dtype == DType::i4 && int4_.of(activations) == Int4Rows::f32;
  return kernels_.bf16_rows(activations) && !q.quantizes_activations() && !f32_step_sums;
}

bool PanelMoe::bf16_inputs(const GroupedRows& rows) const {
  return kernels_.bf16_rows(rows.activations);
}

CallScratch PanelMoe::call_scratch(const Worker& w) const {
  return {w.y, tile_columns(), w.work, w.codes, w.e4m3, w.bf16_work, w.bf16_rows, w.int8_work};
}

// One stage of one call, everything its loops need behind one pointer, so that the pool's
// std::function holds it without allocating.
struct PanelMoe::Stage {
  const PanelMoe* moe;
  const GroupedRows& rows;
  const CoreWeights& weights;
  const Shared& shared;
  void* workers;
  int parts;
  bool down;       // prepare_inputs: GEMM2's rows (the activations), else GEMM1's (rows.x)
  int32_t* ready;  // the parts done with each slot's GEMM1 (null: a stage that prepares rows)
  // In that loop, where GEMM2's rows need prepare_inputs: this stage of GEMM2, for the last part
  // done with a slot's GEMM1 to prepare the slot's rows, and count itself once more.
  const Stage* act_inputs = nullptr;
  int32_t ready_at() const { return parts + (act_inputs != nullptr ? 1 : 0); }
};

void PanelMoe::run(const GroupedRows& rows, const CoreWeights& weights, void* scratch,
                   ThreadPool& pool) const {
  ScratchCarver carver(scratch);
  const Shared shared = carve_shared(carver);
  void* workers = static_cast<char*>(scratch) + shared_bytes_;
  // Each part (a share of the panels) runs on its own worker with that worker's scratch.
  const int parts = std::min(pool.size(), problem_.threads);
  // One loop runs both GEMMs: a part moves on to its share of GEMM2 as soon as it is done with
  // its share of GEMM1, waiting only on a slot whose activations another part has not finished
  // (by then, rarely), so it never waits at a barrier for the slowest part. At decode the parts'
  // speeds differ with the memory's: on the 2-core VM of docs/PERFORMANCE.md they finished GEMM1
  // 0.07 ms apart, of 0.6 ms. Where GEMM2's rows need a pass first (quantised activations, int4
  // step sums), the last part done with a slot's GEMM1 makes it over the slot's rows; GEMM1's
  // rows get theirs in a loop before. parallel_chunks gives each part its own thread (parts <=
  // pool.size()), so no part waits on one queued behind it.
  const bool prepare = needs_prepare(rows, weights.quant);
  const Stage act_inputs{this, rows, weights, shared, workers, parts, true, nullptr};
  if (prepare) {
    const Stage x_inputs{this, rows, weights, shared, workers, parts, false, nullptr};
    for_rows(pool, rows.n_rows, rows.n_rows * problem_.hidden,
             [&x_inputs](int64_t b, int64_t e) { x_inputs.moe->prepare_inputs(x_inputs, b, e); });
  }
  std::fill_n(shared.ready, problem_.slots, 0);
  const Stage stage{this,   rows,         weights,
                    shared, workers,      parts,
                    false,  shared.ready, prepare ? &act_inputs : nullptr};
  pool.parallel_chunks(parts, [&stage](int64_t begin, int64_t end, int worker) {
    stage.moe->run_parts(stage, begin, end, worker);
  });
}

void PanelMoe::prepare_inputs(const Stage& stage, int64_t begin, int64_t end) const {
  const QuantParams& q = stage.weights.quant;
  const int64_t width = stage.down ? problem_.intermediate : problem_.hidden;
  float* x = stage.down ? stage.shared.act : stage.rows.x;
  float* sums = stage.down ? stage.shared.act_sums : stage.shared.x_sums;
  const int64_t steps = stage.down ? intermediate_steps_ : hidden_steps_;
  const float static_scale =
      stage.down ? stage.weights.w2_input_scale : stage.weights.w13_input_scale;
  float* scales = stage.down ? stage.shared.act_scales : stage.shared.x_scales;
  const int64_t groups = stage.down ? intermediate_groups_ : hidden_groups_;
  const PanelWeights& packed = panel_weights(stage.weights);
  const PanelStack& panels = stage.down ? packed.w2 : packed.w13;
  // The int8 kernel quantises the rows it streams itself, from the values as they are, to the
  // same codes (quantize_int8), so only the GEMM's rows are rounded here.
  const bool int8 = stream_kind(stage.rows) == Int4Rows::int8;
  const int64_t* offsets = stage.rows.offsets;
  const int64_t* slot_end = offsets + 1;
  for (int64_t r = begin; r < end; ++r) {
    if (int8) {
      slot_end = std::upper_bound(slot_end, offsets + problem_.slots + 1, r);
      if (!use_gemm(*slot_end - slot_end[-1])) continue;
    }
    float* row = x + r * width;
    if (int8 && kernels_.int8_gemm) {
      const Int8Codes& codes = stage.down ? stage.shared.act_int8 : stage.shared.x_int8;
      quantize_int8(row, width, panels.first.group_k, codes.q + r * codes.ld,
                    codes.scale + r * codes.steps, codes.sums + r * codes.steps);
      continue;
    }
    if (int8) {
      round_to_int8(row, width, q.activation_group);
    } else if (q.quantizes_activations() && q.activation != ActivationQuant::int8_per_token_group) {
      quantize_e4m3_row(kernels_.e4m3, q, static_scale, row, width, row,
                        scales == nullptr ? nullptr : scales + r * groups);
    } else {
      quantize_activation_row(q, static_scale, row, width, row);
    }
    if (steps > 0) step_sums(row, width, panels.first.group_k, sums + r * steps);
  }
}

void PanelMoe::run_parts(const Stage& stage, int64_t begin, int64_t end, int worker) const {
  ScratchCarver carver(worker_scratch(stage.workers, worker_bytes_, worker));
  const Worker w = carve_worker(carver);
  for (int64_t part = begin; part < end; ++part) {
    const int p = static_cast<int>(part);
    try {
      gate_up(stage.rows, stage.weights, stage.shared, w, p, stage);
    } catch (...) {
      // The other parts must not wait for activations that will never come.
      for (int slot = 0; slot < problem_.slots; ++slot) {
        std::atomic_ref<int32_t>(stage.ready[slot])
            .store(stage.ready_at(), std::memory_order_release);
      }
      throw;
    }
    down(stage.rows, stage.weights, stage.shared, w, p, stage);
  }
}

namespace {

// The inputs of one multiply: rows of x (row stride ldx), with their int4 step sums (`steps`
// per row, 0 for other formats), and how streamed rows meet int4 weights (Int4Rows).
struct Inputs {
  const float* x;
  int64_t ldx;
  const float* sums;
  int64_t steps;
  Int4Rows stream;
  bool vnni;                      // the integer kernels take AVX-512 VNNI's dot products
  E4m3Stream e4m3;                // the streamed e4m3 kernel (CpuKernels::e4m3_stream_avx512)
  bool bf16;                      // GEMM rows take gemm_panels_bf16 (CpuKernels::bf16_gemm)
  StreamPrefetch panel_prefetch;  // CpuKernels::panel_prefetch
  StreamPrefetch int8_prefetch;   // CpuKernels::int8_prefetch
  // fp8 on the bf16 GEMM: row r's scales at scales + r * groups (InputScales), else null.
  const float* scales;
  int64_t groups;
  // int4-group-a8 on the int8 GEMM: the GEMM rows quantised; q null otherwise.
  Int8Matrix int8;
  // GEMM1 where gemm1_reads_hidden: the bf16 GEMM copies row r from hidden + out_row[r] * K.
  const bf16_t* hidden = nullptr;
  const int32_t* out_row = nullptr;
};

E4m3Stream e4m3_stream(const CpuKernels& kernels) {
  return kernels.e4m3_stream_avx512 ? E4m3Stream::avx512 : E4m3Stream::avx2;
}

// Panels per GEMM call of the rows of one expert (the one place that sizes them). The f32-row
// GEMM (gemm_panels) packs every K-block of its rows in each call, so it takes as many panels as
// keep the result tile within kGemmTileFloats: with 8 panels a call its scalar packing was 15%
// of its time at Qwen3-30B-A3B T = 512, 32 rows an expert (docs/PERFORMANCE.md, session 17). The
// int8 GEMM keeps kGemmChunk (its rows come quantised; not measured wider).
int64_t gemm_chunk(const Inputs& in, int64_t rows) {
  if (in.int8.q != nullptr) return kGemmChunk;
  return std::max(kGemmChunk, kGemmTileFloats / (std::min(rows, kGemmRows) * kPanelRows));
}

// Quantises rows [r0, r1) of the inputs into scratch, as stream kind `in.stream` reads them.
void quantize_rows(const PanelMatrix& m, const Inputs& in, int64_t r0, int64_t r1,
                   const RowCodes& codes) {
  const int64_t steps = m.scale_steps();
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t i = r - r0;
    const float* x = in.x + r * in.ldx;
    if (in.stream == Int4Rows::int8) {
      quantize_int8(x, m.k, m.group_k, static_cast<int8_t*>(codes.q) + i * m.k,
                    codes.scale + i * steps, codes.sums + i * steps);
    } else {
      quantize_int16(x, m.k, m.group_k, static_cast<int16_t*>(codes.q) + i * m.k,
                     codes.scale + i * steps, codes.sums + i * steps);
    }
  }
}

// Streams rows [rc, rc + rows) (their codes from row rc - r0 of scratch) over panels [pc, pe).
void stream_codes(const PanelMatrix& m, int64_t pc, int64_t pe, const Inputs& in, int64_t r0,
                  int64_t rc, int rows, const CallScratch& scratch, int64_t ldy) {
  const int64_t steps = m.scale_steps();
  const auto fill = [&](auto& q, auto* codes) {
    q.m = rows;
    for (int i = 0; i < rows; ++i) {
      const int64_t at = rc - r0 + i;
      q.q[i] = codes + at * m.k;
      q.scale[i] = scratch.codes.scale + at * steps;
      q.sums[i] = scratch.codes.sums + at * steps;
    }
  };
  if (in.stream == Int4Rows::int8) {
    Int8Rows q;
    fill(q, static_cast<const int8_t*>(scratch.codes.q));
    q.prefetch = in.int8_prefetch;
    stream_panels_int8(m, pc, pe, q, scratch.y, ldy, in.vnni ? Int8Dot::vnni : Int8Dot::maddubs);
  } else {
    Int16Rows q;
    fill(q, static_cast<const int16_t*>(scratch.codes.q));
    stream_panels_int16(m, pc, pe, q, scratch.y, ldy, in.vnni ? Int16Dot::vnni : Int16Dot::pmaddwd);
  }
}

// Calls done(first row, rows, first panel, end panel, y, ldy) after each kernel call that
// computed rows [r0, r1) of the inputs times panels [p0, p1) of m: the result of row r and
// column 16 * first panel + c is at y[(r - first row) * ldy + c].
template <typename Done>
void multiply(const PanelMatrix& m, int64_t p0, int64_t p1, const Inputs& in, int64_t r0,
              int64_t r1, const CallScratch& scratch, Done done) {
  const bool gemm = use_gemm(r1 - r0);
  if (gemm && in.bf16 && in.int8.q == nullptr) {
    // Each block of rows is rounded to bf16 once and meets every chunk of panels as it is, where
    // rounding it in every call cost once per chunk (6 to 8 times per expert at Qwen3-30B-A3B's
    // shapes). Rows past one block re-read the panels, from L2 or L3: the block holds kGemmRows.
    const int64_t ld = bf16_rows_ld(m.k);
    for (int64_t rc = r0; rc < r1; rc += kGemmRows) {
      const int64_t mr = std::min(kGemmRows, r1 - rc);
      const InputScales scales{in.scales == nullptr ? nullptr : in.scales + rc * in.groups,
                               in.groups, m.group_k};
      if (in.hidden != nullptr) {
        for (int64_t i = 0; i < mr; ++i) {
          bf16_t* row = scratch.bf16_rows + i * ld;
          std::copy_n(in.hidden + int64_t{in.out_row[rc + i]} * m.k, m.k, row);
          if (m.k % 2 != 0) row[m.k] = bf16_t{0};
        }
      } else {
        round_rows_bf16(in.x + rc * in.ldx, in.ldx, mr, m.k, scratch.bf16_rows, ld, scales);
      }
      for (int64_t pc = p0; pc < p1; pc += kGemmChunk) {
        const int64_t pe = std::min(p1, pc + kGemmChunk);
        gemm_panels_bf16(Bf16Rows{scratch.bf16_rows, ld}, mr, m, pc, pe, scratch.y,
                         scratch.tile_columns, scratch.bf16_work, scales);
        done(rc, mr, pc, pe, scratch.y + pc * kPanelRows, scratch.tile_columns);
      }
    }
    return;
  }
  const int64_t chunk = gemm ? gemm_chunk(in, r1 - r0) : kStreamChunk;
  const bool codes = !gemm && in.stream != Int4Rows::f32;
  const bool expanded = !gemm && m.dtype == DType::f8e4m3 && in.e4m3 == E4m3Stream::avx2;
  // Once per worker and slot: the rows then meet every panel of the worker's share.
  if (codes) quantize_rows(m, in, r0, r1, scratch.codes);
  const int64_t expanded_ld = e4m3_expanded_floats(m.k);
  for (int64_t r = r0; expanded && r < r1; ++r) {
    scratch.e4m3.unit[r - r0] =
        expand_e4m3_row(in.x + r * in.ldx, m.k, scratch.e4m3.x + (r - r0) * expanded_ld);
  }
  for (int64_t pc = p0; pc < p1; pc += chunk) {
    const int64_t pe = std::min(p1, pc + chunk);
    if (gemm) {
      for (int64_t rc = r0; rc < r1; rc += kGemmRows) {
        const int64_t mr = std::min(kGemmRows, r1 - rc);
        if (in.int8.q != nullptr) {
          const Int8Matrix& a = in.int8;
          gemm_panels_int8(
              {a.q + rc * a.ldq, a.ldq, a.scale + rc * a.steps, a.sums + rc * a.steps, a.steps}, mr,
              m, pc, pe, scratch.y, scratch.tile_columns, scratch.int8_work,
              in.vnni ? Int8Dot::vnni : Int8Dot::maddubs);
        } else {
          gemm_panels(in.x + rc * in.ldx, in.ldx, mr, m, pc, pe, scratch.y, scratch.tile_columns,
                      scratch.work);
        }
        done(rc, mr, pc, pe, scratch.y + pc * kPanelRows, scratch.tile_columns);
      }
      continue;
    }
    for (int64_t rc = r0; rc < r1; rc += kStreamRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kStreamRows, r1 - rc));
      if (codes) {
        stream_codes(m, pc, pe, in, r0, rc, rows, scratch, kChunkColumns);
      } else if (expanded) {
        E4m3Rows x;
        x.m = rows;
        for (int i = 0; i < rows; ++i) {
          x.x[i] = scratch.e4m3.x + (rc - r0 + i) * expanded_ld;
          x.unit[i] = scratch.e4m3.unit[rc - r0 + i];
        }
        stream_panels_e4m3(m, pc, pe, x, scratch.y, kChunkColumns);
      } else {
        StreamRows x;
        x.m = rows;
        x.prefetch = in.panel_prefetch;
        for (int i = 0; i < rows; ++i) {
          x.x[i] = in.x + (rc + i) * in.ldx;
          if (in.steps > 0) x.x_sums[i] = in.sums + (rc + i) * in.steps;
        }
        stream_panels(m, pc, pe, x, scratch.y, kChunkColumns);
      }
      done(rc, rows, pc, pe, scratch.y, kChunkColumns);
    }
  }
}

}  // namespace

bool PanelMoe::needs_prepare(const GroupedRows& rows, const QuantParams& q) const {
  const Int4Rows stream = stream_kind(rows);
  // int4 step sums serve only the f32 streaming kernel: integer rows carry their own.
  if (q.weight_dtype == DType::i4 && stream == Int4Rows::f32) return true;
  if (!q.quantizes_activations()) return false;
  if (stream != Int4Rows::int8) return true;
  // The int8 kernel quantises the rows it streams itself; only the GEMM's rows need the pass.
  for (int slot = 0; slot < problem_.slots; ++slot) {
    if (use_gemm(rows.offsets[slot + 1] - rows.offsets[slot])) return true;
  }
  return false;
}

void PanelMoe::gate_up(const GroupedRows& rows, const CoreWeights& weights, const Shared& s,
                       const Worker& w, int part, const Stage& loop) const {
  const int64_t H = problem_.hidden;
  const int64_t I = problem_.intermediate;
  const int parts = loop.parts;
  const PanelStack& w13 = panel_weights(weights).w13;
  const int64_t panels = w13.first.panels();
  const int64_t p0 = panels * part / parts;
  const int64_t p1 = panels * (part + 1) / parts;
  const bool from_hidden =
      rows.hidden_bf16 != nullptr && gemm1_reads_hidden(weights.quant, rows.activations);
  for (int slot = 0; slot < problem_.slots; ++slot) {
    const int64_t r0 = rows.offsets[slot];
    const int64_t r1 = rows.offsets[slot + 1];
    if (r0 == r1) continue;
    multiply(w13.slot(slot), p0, p1,
             {rows.x, H, s.x_sums, hidden_steps_, stream_kind(rows), kernels_.avx512_vnni,
              e4m3_stream(kernels_), bf16_inputs(rows), kernels_.panel_prefetch,
              kernels_.int8_prefetch, s.x_scales, hidden_groups_, s.x_int8.matrix(),
              from_hidden ? rows.hidden_bf16 : nullptr, rows.out_row},
             r0, r1, call_scratch(w),
             [&](int64_t rc, int64_t mr, int64_t pc, int64_t pe, const float* tile, int64_t ldy) {
               // Panel p's rows 0-7 are gate rows 8p.., its rows 8-15 the up rows of the same i.
               const bool silu = problem_.activation.kind == ActivationKind::silu_gated;
               for (int64_t r = 0; r < mr; ++r) {
                 float* act = s.act + (rc + r) * I;
                 const float* y = tile + r * ldy;
                 if (silu) {
                   const int64_t i0 = pc * kHalfPanel;
                   silu_gated_panels(y, std::min(pe * kHalfPanel, I) - i0, act + i0);
                   continue;
                 }
                 for (int64_t p = pc; p < pe; ++p, y += kPanelRows) {
                   const int64_t i0 = p * kHalfPanel;
                   const int64_t n = std::min<int64_t>(kHalfPanel, I - i0);
                   for (int64_t j = 0; j < n; ++j) {
                     act[i0 + j] = kernels::activate(problem_.activation, y[j], y[kHalfPanel + j]);
                   }
                 }
               }
             });
    const std::atomic_ref<int32_t> done(loop.ready[slot]);
    // The last part done sees every part's activations (acquire) and prepares them for GEMM2.
    if (done.fetch_add(1, std::memory_order_acq_rel) == parts - 1 && loop.act_inputs != nullptr) {
      prepare_inputs(*loop.act_inputs, r0, r1);
      done.fetch_add(1, std::memory_order_release);
    }
  }
}

void PanelMoe::down(const GroupedRows& rows, const CoreWeights& weights, const Shared& s,
                    const Worker& w, int part, const Stage& loop) const {
  const int64_t H = problem_.hidden;
  const int64_t I = problem_.intermediate;
  const int parts = loop.parts;
  const PanelStack& w2 = panel_weights(weights).w2;
  const int64_t panels = w2.first.panels();
  const int64_t p0 = panels * part / parts;
  const int64_t p1 = panels * (part + 1) / parts;
  const int64_t c0 = p0 * kPanelRows;
  const int64_t c1 = std::min(H, p1 * kPanelRows);
  if (c0 >= c1) return;
  for (int64_t o = 0; o < rows.out_rows; ++o) {
    std::fill(rows.out + o * H + c0, rows.out + o * H + c1, 0.0f);
  }
  for (int slot = 0; slot < problem_.slots; ++slot) {
    const int64_t r0 = rows.offsets[slot];
    const int64_t r1 = rows.offsets[slot + 1];
    if (r0 == r1) continue;
    const std::atomic_ref<int32_t> done(loop.ready[slot]);
    while (done.load(std::memory_order_acquire) < loop.ready_at()) std::this_thread::yield();
    multiply(w2.slot(slot), p0, p1,
             {s.act, I, s.act_sums, intermediate_steps_, stream_kind(rows), kernels_.avx512_vnni,
              e4m3_stream(kernels_), bf16_inputs(rows), kernels_.panel_prefetch,
              kernels_.int8_prefetch, s.act_scales, intermediate_groups_, s.act_int8.matrix()},
             r0, r1, call_scratch(w),
             [&](int64_t rc, int64_t mr, int64_t pc, int64_t pe, const float* tile, int64_t ldy) {
               const int64_t n0 = pc * kPanelRows;
               const int64_t n = std::min(H, pe * kPanelRows) - n0;
               for (int64_t r = 0; r < mr; ++r) {
                 float* out = rows.out + rows.out_row[rc + r] * H + n0;
                 const float weight = rows.weight[rc + r];
                 const float* y = tile + r * ldy;
                 for (int64_t j = 0; j < n; ++j) out[j] += weight * y[j];
               }
             });
  }
}

}  // namespace moekit::cpu
