// The cpu core: rows grouped by expert (contiguous format), so each expert's weights are read
// once per batch and applied to all of that expert's rows. With AVX2+FMA (the plan's kernels
// choice) the weights are panel16 and the rows go through PanelMoe, which writes each row's
// output with weight 1. Otherwise, the portable path: work is split over (expert, block of
// output rows) across the pool, weights are widened to f32 a row at a time; GEMM inputs are
// quantised in place where the format says so.

#include <algorithm>

#include <fmt/format.h>

#include "core/scratch.hpp"
#include "core/thread_pool.hpp"
#include "moekit/error.hpp"
#include "quant/activation_quant.hpp"
#include "quant/dequantize.hpp"
#include "runner/cpu/kernel_choice.hpp"
#include "runner/cpu/panel_moe.hpp"
#include "runner/kernels.hpp"
#include "runner/registry.hpp"

namespace moekit {
namespace {

constexpr int64_t kGateUpBlock = 32;  // intermediate rows per work item in GEMM1
constexpr int64_t kDownBlock = 64;    // hidden rows per work item in GEMM2

class CpuCore final : public RunnerCore {
 public:
  explicit CpuCore(const ExpertsProblem& problem) : p_(problem) {
    ScratchCarver shared;
    shared.take<float>(p_.max_rows() * p_.intermediate);
    shared_bytes_ = shared.bytes();
    ScratchCarver worker;
    carve_worker(worker);
    worker_bytes_ = worker.bytes();
  }

  RunnerFormat format() const override { return RunnerFormat::contiguous; }
  int64_t scratch_bytes() const override { return shared_bytes_ + worker_bytes_ * p_.threads; }

  void run(const ExecContext& ctx, RunnerBatch& batch, const CoreWeights& weights,
           void* scratch) const override {
    ThreadPool& pool = ctx.threads();
    const ContiguousRows& rows = batch.contiguous;
    auto* act = static_cast<float*>(scratch);
    void* workers = static_cast<char*>(scratch) + shared_bytes_;
    const int64_t H = p_.hidden;
    const int64_t I = p_.intermediate;
    const QuantParams& q = weights.quant;

    if (q.quantizes_activations()) {
      quantize_rows(pool, q, weights.w13_input_scale, rows.rows.f32(), rows.rows.rows, H);
    }
    for_each_block(pool, rows, I, kGateUpBlock, workers,
                   [&](const WorkerRows& w, int64_t slot, int64_t first, int64_t last,
                       int64_t i_first, int64_t i_end) {
                     for (int64_t i = i_first; i < i_end; ++i) {
                       dequantize_row(q, weights.w13, slot, i, w.a);
                       dequantize_row(q, weights.w13, slot, I + i, w.b);
                       for (int64_t r = first; r < last; ++r) {
                         const float* x = rows.rows.f32() + r * H;
                         act[r * I + i] = kernels::activate(p_.activation, kernels::dot(w.a, x, H),
                                                            kernels::dot(w.b, x, H));
                       }
                     }
                   });
    if (q.quantizes_activations()) {
      quantize_rows(pool, q, weights.w2_input_scale, act, rows.rows.rows, I);
    }
    for_each_block(pool, rows, H, kDownBlock, workers,
                   [&](const WorkerRows& w, int64_t slot, int64_t first, int64_t last,
                       int64_t h_first, int64_t h_end) {
                     for (int64_t h = h_first; h < h_end; ++h) {
                       dequantize_row(q, weights.w2, slot, h, w.a);
                       for (int64_t r = first; r < last; ++r) {
                         rows.row_out[r * H + h] = kernels::dot(w.a, act + r * I, I);
                       }
                     }
                   });
  }

 private:
  struct WorkerRows {
    float* a;  // a weight row widened to f32
    float* b;
  };
  // Splits the work into (slot, block of `block` output rows out of `extent`) items over the
  // pool, and calls body(worker rows, slot, its input rows [first, last), its output rows
  // [out_first, out_end)) for each slot that received rows.
  template <typename Body>
  void for_each_block(ThreadPool& pool, const ContiguousRows& rows, int64_t extent, int64_t block,
                      void* workers, Body body) const {
    const int64_t blocks = (extent + block - 1) / block;
    pool.parallel_chunks(p_.slots * blocks, [&](int64_t begin, int64_t end, int worker) {
      ScratchCarver carver(worker_scratch(workers, worker_bytes_, worker));
      const WorkerRows w = carve_worker(carver);
      for (int64_t item = begin; item < end; ++item) {
        const int64_t slot = item / blocks;
        const int64_t first = rows.offsets[slot];
        const int64_t last = rows.offsets[slot + 1];
        if (first == last) continue;
        const int64_t out_first = item % blocks * block;
        body(w, slot, first, last, out_first, std::min(extent, out_first + block));
      }
    });
  }

  // Each of n rows of width `width` becomes the values the format's GEMM input has.
  static void quantize_rows(ThreadPool& pool, const QuantParams& q, float static_scale, float* rows,
                            int64_t n, int64_t width) {
    pool.parallel_for(n, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        quantize_activation_row(q, static_scale, rows + r * width, width, rows + r * width);
      }
    });
  }

  WorkerRows carve_worker(ScratchCarver& carver) const {
    const int64_t width = std::max(p_.hidden, p_.intermediate);
    return {carver.take<float>(width), carver.take<float>(width)};
  }

  ExpertsProblem p_;
  int64_t shared_bytes_ = 0;
  int64_t worker_bytes_ = 0;
};

class PanelCore final : public RunnerCore {
 public:
  PanelCore(const ExpertsProblem& problem, const CpuKernels& kernels)
      : p_(problem), moe_(problem, kernels, cpu::int4_rows(problem, kernels)) {
    ScratchCarver carver;
    carve(carver);
    own_bytes_ = carver.bytes();
  }

  RunnerFormat format() const override { return RunnerFormat::contiguous; }
  int64_t scratch_bytes() const override { return own_bytes_ + moe_.scratch_bytes(); }

  void run(const ExecContext& ctx, RunnerBatch& batch, const CoreWeights& weights,
           void* scratch) const override {
    const ContiguousRows& rows = batch.contiguous;
    ScratchCarver carver(scratch);
    const Own own = carve(carver);
    for (int64_t r = 0; r < rows.rows.rows; ++r) {
      own.out_row[r] = static_cast<int32_t>(r);
      own.weight[r] = 1.0f;
    }
    const cpu::GroupedRows grouped{rows.rows.f32(), rows.rows.rows,  rows.offsets,
                                   own.out_row,     own.weight,      rows.row_out,
                                   rows.rows.rows,  rows.activations};
    moe_.run(grouped, weights, static_cast<char*>(scratch) + own_bytes_, ctx.threads());
  }

 private:
  struct Own {
    int32_t* out_row;  // row r's output is row r
    float* weight;     // of weight 1: the post-permute weights the sum
  };
  Own carve(ScratchCarver& carver) const {
    return {carver.take<int32_t>(p_.max_rows()), carver.take<float>(p_.max_rows())};
  }

  ExpertsProblem p_;
  cpu::PanelMoe moe_;
  int64_t own_bytes_ = 0;
};

}  // namespace

Capability cpu_reads(const QuantParams& quant) {
  switch (quant.format) {
    case WeightFormat::f32:
    case WeightFormat::f16:
    case WeightFormat::bf16:
      return Capability::Yes("reads f32/f16/bf16 rows, widened to f32");
    case WeightFormat::fp8_tensor:
      return Capability::Yes(
          "reads e4m3 rows times their scale, widened to f32; activations quantised per token or "
          "statically before each GEMM");
    case WeightFormat::fp8_block:
      return Capability::Yes(
          "reads e4m3 rows times their block scales, widened to f32; activations quantised per "
          "token per block of columns before each GEMM");
    case WeightFormat::int4_group:
      return Capability::Yes("unpacks int4 rows, subtracts the zero point, times the group scale");
  }
  return Capability::No(fmt::format("the cpu core has no reader for {}", quant.name()));
}

Capability cpu_supports(const Deployment& deployment) {
  if (deployment.options.device.kind != DeviceKind::cpu) {
    return Capability::No("the cpu core computes on the CPU; tensors on a GPU need a GPU runner");
  }
  return Capability::Yes("rows grouped by expert, each expert's weights read once, all threads");
}

std::unique_ptr<RunnerCore> make_cpu_core(const Plan& plan, const ExpertsProblem& problem) {
  const CpuKernels& kernels = cpu::planned_kernels(plan);
  if (kernels.set == CpuKernelSet::avx2_panels) {
    return std::make_unique<PanelCore>(problem, kernels);
  }
  return std::make_unique<CpuCore>(problem);
}

void cpu_decide_kernels(Plan& plan) {
  plan.cpu_kernels = cpu::choose_cpu_kernels(plan.platform, plan.spec, plan.quant);
  plan.decisions.push_back({PlanLayer::runner,
                            "kernels",
                            plan.cpu_kernels->name,
                            cpu::describe(*plan.cpu_kernels),
                            {},
                            std::nullopt});
}

std::unique_ptr<WeightPacker> make_cpu_packer(const Plan& plan, const ExpertsProblem& problem) {
  if (cpu::planned_kernels(plan).set != CpuKernelSet::avx2_panels) return nullptr;
  return std::make_unique<cpu::PanelPacker>(problem.quant, problem.slots, problem.hidden,
                                            problem.intermediate);
}

}  // namespace moekit
