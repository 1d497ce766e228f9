// The cuda core: the routed experts of one batch on the GPU, in the standard dispatch format
// (rows in token order, local slots per entry) in and the weighted sum in token order out,
// everything enqueued on the caller's stream:
//   sort entries by slot (counts, offsets, each row's entry, each entry's row)
//   -> gather the rows grouped by slot, converted to the weights' dtype or quantised to e4m3
//      (the two in one launch for a decode step's few entries, and neither where GEMM1 reads
//      the hidden states itself: Plan::fusions.gather_in_gemm1)
//   -> GEMM1 + activation -> (fp8: re-quantise the activations) -> GEMM2
//   -> combine: each token's rows times their routing weights, summed in column order.
// No host synchronisation, no allocation, no float atomics: capturable in a CUDA graph, and the
// same inputs give the same bits.

#include <fmt/format.h>

#include <cstdint>

#include "core/cuda_device.hpp"
#include "core/scratch.hpp"
#include "moekit/error.hpp"
#include "routing/cuda/route.hpp"
#include "runner/cuda/gemm/expert_gemm.hpp"
#include "runner/cuda/gemm/one_token.hpp"
#include "runner/cuda/kernel_choice.hpp"
#include "runner/cuda/permute.hpp"
#include "runner/registry.hpp"

namespace moekit {
namespace {

using runner::cuda::sort_max_rows;

// Whether the format scales activations per token per group of columns (fp8-block) rather than
// per token (fp8-tensor): the format says, not a comparison of the group with a row's length (a
// row of exactly one group is still scaled per group).
bool per_group(const QuantParams& q) {
  return q.activation == ActivationQuant::fp8_per_token_group;
}

// Columns per activation scale: the format's groups, or the whole row.
int64_t scale_group(const QuantParams& q, int64_t cols) {
  return per_group(q) ? q.activation_group : cols;
}

int64_t groups(int64_t cols, int64_t group) {
  return (cols + group - 1) / group;
}

class CudaCore final : public RunnerCore {
 public:
  CudaCore(const Plan& plan, const ExpertsProblem& problem)
      : p_(problem),
        kernels_(problem.role == ExpertsRole::shared ? plan.cuda_kernels->shared
                                                     : plan.cuda_kernels->routed),
        dtype_(problem.quant.weight_dtype),
        fp8_(dtype_ == DType::f8e4m3),
        static_(problem.quant.activation == ActivationQuant::fp8_static),
        gather_in_gemm1_(plan.fusions.gather_in_gemm1),
        max_rows_(sort_max_rows(problem.max_rows(), problem.slots, 1, 0)),
        split_(split_k_needs()),
        one_token_(runs_one_token()),
        split_counters_(Buffer::allocate(
            problem.device,
            4 * (split_.gemm1.counters + split_.gemm2.counters + (one_token_ ? 2 : 0)))) {
    if (one_token_) {
      // Plan::fusions.route_in_runner: the routed experts' kernel routes its token too.
      const bool routes = problem.role == ExpertsRole::routed && plan.fusions.route_in_runner;
      one_token_grid_ = cuda_gemm::one_token_grid(
          dtype_, p_.hidden, p_.intermediate, p_.columns,
          routes ? routing::cuda::route_warp_bytes(plan.spec.n_experts, plan.spec.routing, true)
                 : 0);
    }
    if (split_counters_.bytes() > 0) {
      cuda_device::fill(problem.device, split_counters_.data(), 0, split_counters_.bytes());
    }
  }

  RunnerFormat format() const override { return RunnerFormat::standard; }
  int64_t scratch_bytes() const override {
    ScratchCarver counter;
    carve(counter);
    return counter.bytes();
  }

  void run(const ExecContext& ctx, RunnerBatch& batch, const CoreWeights& w,
           void* scratch) const override {
    const DispatchOutput& in = *batch.standard;
    cudaStream_t stream = ctx.stream;
    ScratchCarver carver(scratch);
    const Arrays a = carve(carver);
    const CudaGemmChoice& c = CudaKernels::for_tokens(kernels_, in.tokens);
    if (c.kernel == CudaGemmKernel::one_token) {
      if (in.tokens == 1) run_one_token(in, w, a, stream);
      return;
    }
    if (in.route != nullptr) {
      fail(Errc::internal,
           "a batch of {} tokens left to route by a runner whose kernel for it "
           "does not route",
           in.tokens);
    }
    const int64_t H = p_.hidden, I = p_.intermediate;
    const int64_t entries = in.tokens * in.columns;
    // Plan::fusions.map_in_sort: the entries are global ids and the sort maps them to slots.
    const runner::cuda::SortArgs sort{.ids = in.slots,
                                      .global_to_local = in.global_to_local,
                                      .n_global = in.n_global,
                                      .tokens = in.tokens,
                                      .columns = in.columns,
                                      .n_slots = p_.slots,
                                      .tile = 1,
                                      .capacity = 0,
                                      .counts = a.counts,
                                      .offsets = a.offsets,
                                      .row_source = a.row_source,
                                      .entry_row = a.entry_row,
                                      .scratch = a.sort_scratch};
    const int64_t rows = sort_max_rows(entries, p_.slots, 1, 0);
    const int64_t x_group = scale_group(p_.quant, H);
    const runner::cuda::GatherArgs gather{
        .hidden = in.hidden.data,
        .hidden_dtype = in.hidden.dtype,
        .tokens = in.tokens,
        .hidden_size = H,
        .columns = in.columns,
        .row_source = a.row_source,
        .offsets = a.offsets,
        .counts = a.counts,
        .n_slots = p_.slots,
        .capacity = 0,
        .max_rows = rows,
        .rows = a.x,
        .rows_dtype = dtype_,
        .scales = fp8_ && !static_ ? a.x_scales : nullptr,
        .quant_group = static_cast<int>(x_group),
        .static_scale = static_ ? w.device_input_scales : nullptr};
    const cuda_gemm::GemmChoice choice = moekit::cuda::to_gemm(c);
    // Plan::fusions.gather_in_gemm1: the GEMMs take the entries as they are and GEMM1 reads the
    // hidden states, where those are in the weights' dtype on a 16-byte boundary (TMA's).
    const bool rows_from_hidden = gather_in_gemm1_ && choice.rows_from_hidden && in.tokens > 0 &&
                                  in.hidden.dtype == dtype_ &&
                                  reinterpret_cast<uintptr_t>(in.hidden.data) % 16 == 0;
    const cuda_gemm::DecodeEntries decode_entries =
        rows_from_hidden ? cuda_gemm::DecodeEntries{.ids = in.slots,
                                                    .global_to_local = in.global_to_local,
                                                    .n_global = in.n_global,
                                                    .tokens = static_cast<int>(in.tokens),
                                                    .columns = in.columns,
                                                    .entry_row = a.entry_row}
                         : cuda_gemm::DecodeEntries{};
    // One launch for a decode step's few entries, two otherwise (permute.hpp).
    if (!rows_from_hidden) runner::cuda::sort_and_gather(sort, gather, stream);
    const int activation_block_cols =
        per_group(p_.quant) ? static_cast<int>(p_.quant.activation_group) : 0;
    // Static activation scales: GEMM1's is device_input_scales[0], GEMM2's [1].
    const auto weight_scales = [&](const StoredMatrices& m, const float* activation, int stat) {
      return cuda_gemm::Fp8Scales{.weight = static_cast<const float*>(m.scale.data),
                                  .weight_block_rows = static_cast<int>(p_.quant.block_rows),
                                  .weight_block_cols = static_cast<int>(p_.quant.block_cols),
                                  .activation = static_ ? w.device_input_scales + stat : activation,
                                  .activation_block_cols = activation_block_cols,
                                  .activation_static = static_};
    };
    // fp8: GEMM1 quantises GEMM2's input itself where its kernel can (expert_gemm.hpp).
    const bool quantized_by_gemm1 =
        fp8_ && cuda_gemm::gemm1_quantizes(choice, activation_block_cols, static_);
    const float* gemm2_static_scale = static_ ? w.device_input_scales + 1 : nullptr;
    cuda_gemm::launch_gemm1(
        {.dtype = dtype_,
         .x = rows_from_hidden ? in.hidden.data : a.x,
         .w13 = w.w13.weight.data,
         .scales = fp8_ ? weight_scales(w.w13, a.x_scales, 0) : cuda_gemm::Fp8Scales{},
         .offsets = a.offsets,
         .num_experts = p_.slots,
         .rows = rows,
         .hidden = static_cast<int>(H),
         .intermediate = static_cast<int>(I),
         .activation = p_.activation,
         .act = a.act,
         .quantized = quantized_by_gemm1
                          ? cuda_gemm::Gemm1Quantized{.out = a.act_e4m3,
                                                      .scales = a.act_scales,
                                                      .static_scale = gemm2_static_scale}
                          : cuda_gemm::Gemm1Quantized{},
         .choice = choice,
         .split = {.partials = a.gemm1_partials, .counters = split_counter(0)},
         .entries = decode_entries},
        stream);
    if (fp8_ && !quantized_by_gemm1) {
      cuda_gemm::launch_quantize_rows_e4m3({.in = static_cast<const float*>(a.act),
                                            .offsets = a.offsets,
                                            .num_experts = p_.slots,
                                            .rows = rows,
                                            .cols = static_cast<int>(I),
                                            .group = activation_block_cols,
                                            .static_scale = gemm2_static_scale,
                                            .out = a.act_e4m3,
                                            .scales = a.act_scales},
                                           stream);
    }
    cuda_gemm::launch_gemm2(
        {.dtype = dtype_,
         .act = fp8_ ? static_cast<const void*>(a.act_e4m3) : a.act,
         .w2 = w.w2.weight.data,
         .scales = fp8_ ? weight_scales(w.w2, a.act_scales, 1) : cuda_gemm::Fp8Scales{},
         .offsets = a.offsets,
         .num_experts = p_.slots,
         .rows = rows,
         .hidden = static_cast<int>(H),
         .intermediate = static_cast<int>(I),
         .route_weight = nullptr,
         .out = a.out,
         .choice = choice,
         .split = {.partials = a.gemm2_partials, .counters = split_counter(split_.gemm1.counters)},
         .entries = decode_entries},
        stream);
    // Plan::fusions.combine_to_output: the sum goes straight to the layer's output, converted
    // to its dtype as the output stage would have converted it.
    const bool to_output = in.output != nullptr;
    runner::cuda::combine({.rows = a.out,
                           .rows_dtype = DType::f32,
                           .entry_row = a.entry_row,
                           .apply_weights = true,
                           .weights = in.weights,
                           .tokens = in.tokens,
                           .columns = in.columns,
                           .hidden_size = H,
                           .output = to_output ? in.output : in.sum,
                           .output_dtype = to_output ? in.output_dtype : DType::f32},
                          stream);
  }

 private:
  struct Arrays;
  // The plan's one-token kernel: the batch's one token, both GEMMs and the combine.
  void run_one_token(const DispatchOutput& in, const CoreWeights& w, const Arrays& a,
                     cudaStream_t stream) const {
    const bool to_output = in.output != nullptr;
    cuda_gemm::launch_one_token(
        {.dtype = dtype_,
         .hidden = in.hidden.data,
         .hidden_dtype = in.hidden.dtype,
         .hidden_size = static_cast<int>(p_.hidden),
         .intermediate = static_cast<int>(p_.intermediate),
         .ids = in.slots,
         .global_to_local = in.global_to_local,
         .n_global = in.n_global,
         .columns = in.columns,
         .weights = in.weights,
         .w13 = w.w13.weight.data,
         .w2 = w.w2.weight.data,
         .activation = p_.activation,
         .route = in.route,
         .act = a.one_token_act,
         .counters = split_counter(split_.gemm1.counters + split_.gemm2.counters),
         .output = to_output ? in.output : in.sum,
         .output_dtype = to_output ? in.output_dtype : DType::f32,
         .grid = one_token_grid_},
        stream);
  }
  bool runs_one_token() const {
    for (const CudaGemmChoice& run : kernels_) {
      if (run.kernel == CudaGemmKernel::one_token) return true;
    }
    return false;
  }
  struct Arrays {
    int32_t* counts;
    int32_t* offsets;
    int32_t* row_source;
    int32_t* entry_row;
    void* sort_scratch;
    void* x;          // [max_rows, H] in the weights' dtype
    float* x_scales;  // fp8: [max_rows, groups of H]
    void* act;        // [max_rows, I]: the weights' dtype, f32 for fp8
    uint8_t* act_e4m3;
    float* act_scales;
    float* out;             // [max_rows, H]
    float* gemm1_partials;  // split K (SplitNeeds)
    float* gemm2_partials;
    void* one_token_act;  // the one-token kernel's GEMM1 output
  };
  // What split K needs at most over the plan's runs, each at its largest batch: the partial
  // sums are scratch of each forward, the counters this core's own (zeroed once, and left zero
  // by every launch), GEMM1's then GEMM2's.
  struct SplitNeeds {
    cuda_gemm::SplitKSize gemm1, gemm2;
  };
  SplitNeeds split_k_needs() const {
    SplitNeeds needs;
    const auto widen = [](cuda_gemm::SplitKSize& most, const cuda_gemm::SplitKSize& s) {
      most.partials = std::max(most.partials, s.partials);
      most.counters = std::max(most.counters, s.counters);
    };
    for (const CudaGemmChoice& run : kernels_) {
      const cuda_gemm::GemmChoice choice = moekit::cuda::to_gemm(run);
      const int64_t rows = sort_max_rows(run.up_to_tokens * p_.columns, p_.slots, 1, 0);
      widen(needs.gemm1, cuda_gemm::split_k_size(choice, true, rows, p_.slots,
                                                 static_cast<int>(p_.intermediate)));
      widen(needs.gemm2,
            cuda_gemm::split_k_size(choice, false, rows, p_.slots, static_cast<int>(p_.hidden)));
    }
    return needs;
  }
  uint32_t* split_counter(int64_t at) const {
    return static_cast<uint32_t*>(split_counters_.data()) + at;
  }
  Arrays carve(ScratchCarver& carver) const {
    const int64_t H = p_.hidden, I = p_.intermediate, R = max_rows_;
    const DType act_dtype = fp8_ ? DType::f32 : dtype_;
    return {
        carver.take<int32_t>(p_.slots),
        carver.take<int32_t>(p_.slots + 1),
        carver.take<int32_t>(R),
        carver.take<int32_t>(p_.max_rows()),
        carver.take<std::byte>(runner::cuda::sort_scratch_bytes(p_.max_rows(), p_.slots)),
        carver.take<std::byte>(dtype_storage_bytes(dtype_, R * H)),
        carver.take<float>(fp8_ ? R * groups(H, scale_group(p_.quant, H)) : 0),
        carver.take<std::byte>(dtype_storage_bytes(act_dtype, R * I)),
        carver.take<uint8_t>(fp8_ ? R * I : 0),
        carver.take<float>(fp8_ ? R * groups(I, scale_group(p_.quant, I)) : 0),
        carver.take<float>(R * H),
        carver.take<float>(split_.gemm1.partials),
        carver.take<float>(split_.gemm2.partials),
        carver.take<std::byte>(one_token_ ? cuda_gemm::one_token_scratch_bytes(I, p_.columns) : 0)};
  }

  ExpertsProblem p_;
  std::vector<CudaGemmChoice> kernels_;  // this computation's runs of the plan's choice
  DType dtype_;
  bool fp8_;
  bool static_;  // fp8 activations with the checkpoint's static scales
  bool gather_in_gemm1_;
  int64_t max_rows_;
  SplitNeeds split_;
  bool one_token_;  // some run of the plan's choice is the one-token kernel
  cuda_gemm::OneTokenGrid one_token_grid_;
  Buffer split_counters_;  // split K's (GEMM1's, GEMM2's), then the one-token barrier's two
};

}  // namespace

Capability cuda_supports(const Deployment& deployment) {
  const Device device = deployment.options.device;
  if (device.kind != DeviceKind::cuda) {
    return Capability::No("the cuda core computes on a GPU: ask for device=cuda:N");
  }
  const Platform& platform = deployment.platform;
  if (platform.gpus.empty()) {
    return Capability::No(fmt::format("no GPU on this machine ({})", platform.gpu_note.empty()
                                                                         ? "none found"
                                                                         : platform.gpu_note));
  }
  for (const GpuInfo& gpu : platform.gpus) {
    if (gpu.index != device.index) continue;
    if (gpu.compute_major < 8) {
      return Capability::No(
          fmt::format("GPU {} ({}) is sm_{}{}; the cuda core needs sm_80 or newer", gpu.index,
                      gpu.name, gpu.compute_major, gpu.compute_minor));
    }
    return Capability::Yes(fmt::format(
        "GPU {} ({}, sm_{}{}, {} SMs): rows sorted by expert on the device, tensor-core GEMMs, "
        "one combine pass in token order",
        gpu.index, gpu.name, gpu.compute_major, gpu.compute_minor, gpu.sm_count));
  }
  return Capability::No(fmt::format("there is no GPU {} on this machine ({} GPU(s))", device.index,
                                    platform.gpus.size()));
}

Capability cuda_reads(const QuantParams& q) {
  switch (q.format) {
    case WeightFormat::bf16:
    case WeightFormat::f16:
      return Capability::Yes("bf16/f16 rows on the tensor cores, f32 accumulation");
    case WeightFormat::f32:
      return Capability::No(
          "f32 weights have no tensor-core path in the cuda core; store them as bf16 or f16");
    case WeightFormat::fp8_block:
      if (q.block_rows != 128 || q.block_cols != 128) {
        return Capability::No(
            fmt::format("the cuda core reads fp8-block with 128 x 128 weight blocks, not {} x {}",
                        q.block_rows, q.block_cols));
      }
      return Capability::Yes(
          "e4m3 weights with 128 x 128 scales and e4m3 activations per token per 128 columns; "
          "f32 sums promoted per 128-wide K block");
    case WeightFormat::fp8_tensor:
      return Capability::Yes(
          q.activation == ActivationQuant::fp8_static
              ? "e4m3 weights per tensor or channel, e4m3 activations with static scales"
              : "e4m3 weights per tensor or channel, e4m3 activations per token");
    case WeightFormat::int4_group:
      return Capability::No("INT4 weights on the GPU are a later issue, not built yet");
  }
  return Capability::No(fmt::format("the cuda core has no reader for {}", q.name()));
}

void cuda_decide_kernels(Plan& plan) {
  plan.cuda_kernels = cuda::choose_cuda_kernels(plan);
  plan.decisions.push_back({PlanLayer::runner,
                            "kernels",
                            "cuda expert gemms",
                            cuda::describe(*plan.cuda_kernels),
                            {},
                            std::nullopt});
}

std::unique_ptr<RunnerCore> make_cuda_core(const Plan& plan, const ExpertsProblem& problem) {
  if (!plan.cuda_kernels) fail(Errc::internal, "a cuda core built from a plan without kernels");
  return std::make_unique<CudaCore>(plan, problem);
}

}  // namespace moekit
