// The block stages on a GPU: the finite checks (recorded on the device, reported at
// synchronize()), the router (top-k, the shared gate, logical -> physical with fused shared
// slots), and the output sum. Each enqueues on the ExecContext's stream and never waits; the
// router's weights (correction bias, shared gate, rank tables) are copied to the device once, at
// load.

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <array>

#include "block/cuda/block_kernels.hpp"
#include "block/cuda/output_kernels.hpp"
#include "block/router_weights.hpp"
#include "block/stages.hpp"
#include "core/scratch.hpp"
#include "moekit/error.hpp"
#include "routing/cuda/route.hpp"

namespace moekit {
namespace {

// A host array's values in a new tensor on `device`.
template <typename T>
Tensor to_device(const std::vector<T>& values, DType dtype, Device device) {
  const Shape shape{static_cast<int64_t>(values.size())};
  Tensor t = Tensor::empty(dtype, shape, device);
  copy(t, TensorView::contiguous(const_cast<T*>(values.data()), dtype, shape));
  return t;
}

// The check of a [rows, columns] tensor into `status`.
block::cuda::FiniteCheckArgs finite_args(const TensorView& t, block::cuda::FiniteStatus* status) {
  return {
      .data = t.data, .dtype = t.dtype, .rows = t.dim(0), .columns = t.dim(1), .status = status};
}

class CudaFiniteChecks final : public FiniteChecks {
 public:
  explicit CudaFiniteChecks(const Plan& plan)
      : status_(Tensor::empty(DType::i8,
                              {static_cast<int64_t>(2 * sizeof(block::cuda::FiniteStatus))},
                              plan.options.device)),
        in_router_(plan.fusions.checks_in_router) {
    reset();
  }

  int64_t scratch_bytes() const override { return 0; }

  void run(const ExecContext& ctx, const TensorView& hidden, const TensorView& logits,
           void*) const override {
    if (in_router_) return;  // Plan::fusions.checks_in_router: the router kernel checks
    block::cuda::check_finite(finite_args(hidden, statuses()), finite_args(logits, statuses() + 1),
                              ctx.stream);
  }

  void* statuses_for_router() override { return in_router_ ? statuses() : nullptr; }

  void report() override {
    block::cuda::FiniteStatus found[2];
    copy(TensorView::contiguous(found, DType::i8, {static_cast<int64_t>(sizeof(found))}), status_);
    reset();
    const char* names[2] = {"hidden_states", "router_logits"};
    for (int i = 0; i < 2; ++i) {
      const block::cuda::NonFiniteAt at = block::cuda::decode_finite_status(found[i]);
      if (at.found) {
        fail(Errc::invalid_argument, "{}: row {} has a non-finite value at column {}", names[i],
             at.row, at.column);
      }
    }
  }

 private:
  block::cuda::FiniteStatus* statuses() const {
    return static_cast<block::cuda::FiniteStatus*>(status_.view().data);
  }
  void reset() {
    block::cuda::reset_finite_status(statuses(), 2, nullptr);
    synchronize_stream(nullptr);
  }

  Tensor status_;  // two FiniteStatus: hidden_states, router_logits
  bool in_router_;
};

class CudaRouterStage final : public RouterStage {
 public:
  explicit CudaRouterStage(const Plan& plan)
      : plan_(plan),
        top_k_(plan.spec.routing.top_k),
        columns_(top_k_ + plan.shared_slots),
        fused_(plan.fusions.route_to_physical),
        in_runner_(plan.fusions.route_in_runner) {
    if (fused_ && plan.spec.shared_gate && plan.shared_slots > 0) {
      fail(Errc::internal,
           "a plan fuses logical -> physical into the router, but a shared gate "
           "weights its fused shared slots");
    }
    // Under an all-to-all every token is this rank's own: its row of the table serves them all.
    const std::vector<std::vector<int>>& ranks = plan.location.rank_table;
    const bool own_tokens = owns_its_tokens(plan.options);
    const auto first = own_tokens ? ranks.begin() + plan.options.ep.rank : ranks.begin();
    const auto last = own_tokens ? first + 1 : ranks.end();
    table_ranks_ = static_cast<int>(last - first);
    std::vector<int32_t> table;
    for (auto rank = first; rank != last; ++rank)
      table.insert(table.end(), rank->begin(), rank->end());
    rank_table_ = to_device(table, DType::i32, plan.options.device);
  }

  int64_t scratch_bytes() const override {
    ScratchCarver counter;
    carve(counter);
    return counter.bytes();
  }

  void load(const TensorView& correction_bias, const TensorView& shared_gate) override {
    const ModelSpec& spec = plan_.spec;
    const Device device = plan_.options.device;
    if (spec.routing.correction_bias) {
      bias_ = to_device(router_weight_values(correction_bias, "weights.correction_bias",
                                             Shape{spec.n_experts}, /*f32_only=*/true),
                        DType::f32, device);
    }
    if (spec.shared_gate) {
      gate_ = to_device(router_weight_values(shared_gate, "weights.shared_gate",
                                             Shape{1, spec.hidden}, /*f32_only=*/false),
                        DType::f32, device);
    }
  }

  bool take_finite_checks(void* statuses) override {
    checks_ = static_cast<block::cuda::FiniteStatus*>(statuses);
    return checks_ != nullptr;
  }

  Routing run(const ExecContext& ctx, const TensorView& hidden, const TensorView& logits,
              void* scratch) override {
    ScratchCarver carver(scratch);
    const Arrays a = carve(carver);
    const int64_t T = hidden.dim(0);
    const ModelSpec& spec = plan_.spec;
    // Plan::fusions.checks_in_router: the router kernel checks both inputs beside the routing.
    std::array<cuda_finite::FiniteTensor, 2> checks{};
    if (checks_ != nullptr) {
      checks = block::cuda::finite_check_tensors(finite_args(hidden, checks_),
                                                 finite_args(logits, checks_ + 1));
    }
    const routing::cuda::ToPhysicalArgs physical{
        .logical_ids = a.logical_ids,
        .logical_weights = a.logical_weights,
        .tokens = T,
        .top_k = top_k_,
        .rank_table = rank_table_.data<int32_t>(),
        .n_logical = spec.n_experts,
        .ep_size = table_ranks_,
        .shared_slots = plan_.shared_slots,
        .first_shared_id = plan_.location.physical,
        .shared_slot_weight = plan_.shared_slot_weight,
        .shared_gate = spec.shared_gate && !fused_ ? a.shared_gate : nullptr,
        .ids = a.physical_ids,
        .weights = a.physical_weights};
    // Plan::fusions.route_to_physical: one kernel picks the experts and writes their physical
    // ids (resolve allows it only where no shared gate weights fused shared slots).
    physical_ = physical;
    route_ = {.logits = logits.data,
              .logits_dtype = logits.dtype,
              .tokens = T,
              .n_experts = spec.n_experts,
              .spec = spec.routing,
              .correction_bias = spec.routing.correction_bias ? bias_.data<float>() : nullptr,
              .ids = a.logical_ids,
              .weights = a.logical_weights,
              .physical = fused_ ? &physical_ : nullptr,
              .check_first = checks[0],
              .check_second = checks[1]};
    const Routing routing{a.logical_ids, a.logical_weights, a.physical_ids, a.physical_weights,
                          spec.shared_gate ? a.shared_gate : nullptr};
    // The shared experts' gate reads the hidden states alone.
    if (spec.shared_gate) {
      block::cuda::shared_gate({.hidden = hidden.data,
                                .hidden_dtype = hidden.dtype,
                                .tokens = T,
                                .hidden_size = spec.hidden,
                                .gate = gate_.data<float>(),
                                .out = a.shared_gate},
                               ctx.stream);
    }
    // Plan::fusions.route_in_runner: a batch of one token is routed by the one-token kernel
    // (resolve allows it only with the physical columns and the checks in these arguments).
    if (in_runner_ && T == 1) {
      Routing deferred = routing;
      deferred.deferred = &route_;
      return deferred;
    }
    routing::cuda::route(route_, ctx.stream);
    if (!fused_) routing::cuda::to_physical(physical, ctx.stream);
    return routing;
  }

 private:
  struct Arrays {
    int32_t* logical_ids;
    float* logical_weights;
    int32_t* physical_ids;
    float* physical_weights;
    float* shared_gate;
  };
  Arrays carve(ScratchCarver& carver) const {
    const int64_t T = plan_.options.max_tokens;
    return {carver.take<int32_t>(T * top_k_), carver.take<float>(T * top_k_),
            carver.take<int32_t>(T * columns_), carver.take<float>(T * columns_),
            carver.take<float>(plan_.spec.shared_gate ? T : 0)};
  }

  const Plan& plan_;
  int top_k_;
  int columns_;
  bool fused_;      // Plan::fusions.route_to_physical
  bool in_runner_;  // Plan::fusions.route_in_runner
  // The last run's arguments: a deferred routing points at them until the next run.
  routing::cuda::ToPhysicalArgs physical_;
  routing::cuda::RouteArgs route_;
  // Plan::fusions.checks_in_router: hidden_states' and router_logits' statuses; null: none.
  block::cuda::FiniteStatus* checks_ = nullptr;
  int table_ranks_ = 1;  // the rows of rank_table_: the source ranks whose tokens come here
  Tensor rank_table_;    // [table_ranks_, E] int32
  Tensor bias_;          // [E] f32
  Tensor gate_;          // [H] f32
};

class CudaOutputSum final : public OutputSum {
 public:
  explicit CudaOutputSum(const Plan& plan) : hidden_(plan.spec.hidden) {}

  void run(const ExecContext& ctx, float* routed, const float* shared, const float* shared_gate,
           const TensorView& output) const override {
    block::cuda::output_sum({.routed = routed,
                             .shared = shared,
                             .shared_gate = shared_gate,
                             .tokens = output.dim(0),
                             .hidden = hidden_,
                             .output = output.data,
                             .output_dtype = output.dtype},
                            ctx.stream);
  }

 private:
  int64_t hidden_;
};

}  // namespace

std::unique_ptr<FiniteChecks> make_cuda_finite_checks(const Plan& plan) {
  return std::make_unique<CudaFiniteChecks>(plan);
}
std::unique_ptr<RouterStage> make_cuda_router(const Plan& plan) {
  return std::make_unique<CudaRouterStage>(plan);
}
std::unique_ptr<OutputSum> make_cuda_output_sum(const Plan& plan) {
  return std::make_unique<CudaOutputSum>(plan);
}

}  // namespace moekit
