// The fused op for (a2a none, cpu): dispatch format in, weighted sum in token order out.
// With AVX2+FMA (the plan's kernels choice) it serves every batch size: it groups the entries
// by slot itself (a list of rows, nothing sorted) and PanelMoe adds each expert's weighted
// output straight into the token rows, so there is no permute and no pass for the sum.
// Portable, it serves decode batches only: each (token, expert) pair computes its MLP straight
// from the token's hidden row and scales it by the routing weight; a second pass adds each
// token's pairs. No gather into expert order, no row index.

#include <algorithm>

#include <fmt/format.h>

#include "core/scratch.hpp"
#include "core/thread_pool.hpp"
#include "quant/activation_quant.hpp"
#include "quant/dequantize.hpp"
#include "runner/cpu/kernel_choice.hpp"
#include "runner/cpu/panel_moe.hpp"
#include "runner/kernels.hpp"
#include "runner/registry.hpp"

namespace moekit {
namespace {

class CpuDecodeOp final : public FusedOp {
 public:
  explicit CpuDecodeOp(const ExpertsProblem& problem) : p_(problem) {
    ScratchCarver worker;
    carve_worker(worker);
    worker_bytes_ = worker.bytes();
    pairs_bytes_ = scratch_align(p_.max_rows() * p_.hidden * static_cast<int64_t>(sizeof(float)));
  }

  int64_t scratch_bytes() const override { return pairs_bytes_ + worker_bytes_ * p_.threads; }

  void run(const ExecContext& ctx, const DispatchOutput& input, const CoreWeights& weights,
           void* scratch) const override {
    ThreadPool& pool = ctx.threads();
    const int64_t H = p_.hidden;
    const int64_t I = p_.intermediate;
    const QuantParams& q = weights.quant;
    auto* pairs = static_cast<float*>(scratch);
    void* workers = static_cast<char*>(scratch) + pairs_bytes_;
    pool.parallel_chunks(input.tokens * input.columns, [&](int64_t begin, int64_t end, int worker) {
      ScratchCarver carver(worker_scratch(workers, worker_bytes_, worker));
      const Worker w = carve_worker(carver);
      for (int64_t e = begin; e < end; ++e) {
        const int32_t slot = input.slots[e];
        if (slot < 0) continue;
        kernels::activation_row(input.hidden, e / input.columns, w.x);
        quantize_activation_row(q, weights.w13_input_scale, w.x, H, w.x);
        for (int64_t i = 0; i < I; ++i) {
          dequantize_row(q, weights.w13, slot, i, w.row);
          const float gate = kernels::dot(w.row, w.x, H);
          dequantize_row(q, weights.w13, slot, I + i, w.row);
          w.act[i] = kernels::activate(p_.activation, gate, kernels::dot(w.row, w.x, H));
        }
        quantize_activation_row(q, weights.w2_input_scale, w.act, I, w.act);
        for (int64_t h = 0; h < H; ++h) {
          dequantize_row(q, weights.w2, slot, h, w.row);
          pairs[e * H + h] = input.weights[e] * kernels::dot(w.row, w.act, I);
        }
      }
    });
    pool.parallel_for(input.tokens, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float* out = input.sum + t * H;
        std::fill(out, out + H, 0.0f);
        for (int j = 0; j < input.columns; ++j) {
          const int64_t e = t * input.columns + j;
          if (input.slots[e] < 0) continue;
          for (int64_t h = 0; h < H; ++h) out[h] += pairs[e * H + h];
        }
      }
    });
  }

 private:
  struct Worker {
    float* x;    // the token's hidden row
    float* act;  // [I]
    float* row;  // one weight row
  };
  Worker carve_worker(ScratchCarver& carver) const {
    return {carver.take<float>(p_.hidden), carver.take<float>(p_.intermediate),
            carver.take<float>(std::max(p_.hidden, p_.intermediate))};
  }

  ExpertsProblem p_;
  int64_t worker_bytes_ = 0;
  int64_t pairs_bytes_ = 0;
};

class PanelFusedOp final : public FusedOp {
 public:
  PanelFusedOp(const ExpertsProblem& problem, const CpuKernels& kernels)
      : p_(problem), moe_(problem, kernels, cpu::int4_rows(problem, kernels)) {
    ScratchCarver carver;
    carve(carver);
    own_bytes_ = carver.bytes();
  }

  int64_t scratch_bytes() const override { return own_bytes_ + moe_.scratch_bytes(); }

  void run(const ExecContext& ctx, const DispatchOutput& input, const CoreWeights& weights,
           void* scratch) const override {
    ThreadPool& pool = ctx.threads();
    const int64_t H = p_.hidden;
    ScratchCarver carver(scratch);
    const Own own = carve(carver);
    // Entries grouped by slot, in token order within a slot.
    const int64_t entries = input.tokens * input.columns;
    std::fill(own.offsets, own.offsets + p_.slots + 1, int64_t{0});
    for (int64_t e = 0; e < entries; ++e) {
      if (input.slots[e] >= 0) ++own.offsets[input.slots[e] + 1];
    }
    for (int s = 0; s < p_.slots; ++s) {
      own.offsets[s + 1] += own.offsets[s];
      own.next[s] = own.offsets[s];
    }
    const int64_t n_rows = own.offsets[p_.slots];
    for (int64_t e = 0; e < entries; ++e) {
      if (input.slots[e] < 0) continue;
      const int64_t r = own.next[input.slots[e]]++;
      own.out_row[r] = static_cast<int32_t>(e / input.columns);
      own.weight[r] = input.weights[e];
    }
    // GEMM1's bf16 GEMM copies the rows of the slots it serves from the hidden states itself
    // (PanelMoe::gemm1_reads_hidden), so only the streamed slots' rows are gathered to f32.
    const bool from_hidden = input.hidden.dtype == DType::bf16 &&
                             moe_.gemm1_reads_hidden(weights.quant, input.hidden.dtype);
    const Gather gather{input, own, p_.slots, from_hidden};
    // One reference: small enough for std::function to hold without allocating.
    cpu::for_rows(pool, n_rows, n_rows * H, [&gather](int64_t begin, int64_t end) {
      const int64_t width = gather.input.hidden.dim(1);
      const int64_t* offsets = gather.own.offsets;
      const int64_t* slot_end = offsets + 1;
      for (int64_t r = begin; r < end; ++r) {
        if (gather.skip_gemm_rows) {
          slot_end = std::upper_bound(slot_end, offsets + gather.slots + 1, r);
          if (cpu::use_gemm(*slot_end - slot_end[-1])) continue;
        }
        kernels::activation_row(gather.input.hidden, gather.own.out_row[r],
                                gather.own.x + r * width);
      }
    });
    cpu::GroupedRows grouped{own.x,      n_rows,    own.offsets,  own.out_row,
                             own.weight, input.sum, input.tokens, input.hidden.dtype};
    if (from_hidden) grouped.hidden_bf16 = static_cast<const bf16_t*>(input.hidden.data);
    moe_.run(grouped, weights, static_cast<char*>(scratch) + own_bytes_, pool);
  }

 private:
  struct Own {
    int64_t* offsets;  // [slots + 1]
    int64_t* next;     // [slots]: where the slot's next row goes
    int32_t* out_row;  // [max_rows]: the token of each grouped row
    float* weight;     // [max_rows]
    float* x;          // [max_rows, H]
  };
  Own carve(ScratchCarver& carver) const {
    const int64_t rows = p_.max_rows();
    return {carver.take<int64_t>(p_.slots + 1), carver.take<int64_t>(p_.slots),
            carver.take<int32_t>(rows), carver.take<float>(rows),
            carver.take<float>(rows * p_.hidden)};
  }

  // What the gather into f32 rows reads.
  struct Gather {
    const DispatchOutput& input;
    const Own& own;
    int slots;
    bool skip_gemm_rows;  // rows of slots on the GEMM are read from the hidden states instead
  };

  ExpertsProblem p_;
  cpu::PanelMoe moe_;
  int64_t own_bytes_ = 0;
};

}  // namespace

// Grouping rows by expert pays when tokens share experts. At or below this many tokens per
// batch two tokens rarely share one of the many experts of the models we serve, so the group
// step costs a gather and buys nothing.
constexpr int64_t kDecodeMaxTokens = 4;

Capability cpu_decode_supports(const Plan& plan) {
  if (plan.options.device.kind != DeviceKind::cpu) {
    return Capability::No("computes on the CPU only");
  }
  if (cpu::planned_kernels(plan).set == CpuKernelSet::avx2_panels) {
    return Capability::Yes(
        "AVX2 panel16 kernels: entries grouped by expert in place, each expert's weighted "
        "output added straight into the token rows, so no permutes at any batch size");
  }
  if (plan.options.max_tokens > kDecodeMaxTokens) {
    return Capability::No(fmt::format(
        "a decode op: max_tokens {} > {}, where grouping rows by expert reads each expert once",
        plan.options.max_tokens, kDecodeMaxTokens));
  }
  return Capability::Yes(fmt::format(
      "max_tokens {} <= {}: tokens rarely share experts, so no gather into expert order",
      plan.options.max_tokens, kDecodeMaxTokens));
}

std::unique_ptr<FusedOp> make_cpu_decode_op(const Plan& plan, const ExpertsProblem& problem) {
  const CpuKernels& kernels = cpu::planned_kernels(plan);
  if (kernels.set == CpuKernelSet::avx2_panels) {
    return std::make_unique<PanelFusedOp>(problem, kernels);
  }
  return std::make_unique<CpuDecodeOp>(problem);
}

}  // namespace moekit
