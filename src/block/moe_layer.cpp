// Layer 1, the block: forward() is the plan's straight pipeline of stages (block/stages.hpp),
//   argument checks -> finite checks -> router -> shared experts start -> routed experts
//   (dispatch, runner, combine) -> shared experts finish -> output sum,
// each built once from the plan, with all scratch memory allocated once on the plan's device.
// The constructor also loads the weights this rank holds, one expert at a time.

#include <optional>
#include <vector>

#include "block/forward_args.hpp"
#include "block/stages.hpp"
#include "core/scratch.hpp"
#include "core/thread_pool.hpp"
#include "experts/experts_layer.hpp"
#include "moekit/error.hpp"
#include "moekit/layer.hpp"
#include "moekit/log.hpp"
#include "quant/check.hpp"

namespace moekit {
namespace {

// Rows [r0, r0 + n) and columns [c0, c0 + k) of expert e of a checked stack, with the part of
// the scale grid that covers them. The piece lies inside one part (of part_rows rows) and
// starts on scale-block boundaries (resolve() makes sure of that for split shared experts).
MatrixSource piece(const ExpertMatrices& m, const QuantParams& q, int64_t e, int64_t part_rows,
                   int64_t r0, int64_t n, int64_t c0, int64_t k) {
  MatrixSource s;
  s.weight = m.weight.select(e).narrow(0, r0, n).narrow(1, c0, k);
  if (m.scale.data == nullptr) return s;
  const int64_t part = r0 / part_rows;
  const int64_t row = part * q.scale_rows(part_rows) +
                      (q.block_rows == 0 ? 0 : (r0 - part * part_rows) / q.block_rows);
  const int64_t col = q.block_cols == 0 ? 0 : c0 / q.block_cols;
  const auto grid = [&](const TensorView& t) {
    return t.select(e).narrow(0, row, q.scale_rows(n)).narrow(1, col, q.scale_cols(k));
  };
  s.scale = grid(m.scale);
  if (m.zero.data != nullptr) s.zero = grid(m.zero);
  return s;
}

// Expert e's whole gate [I, H], up [I, H] and down [H, I].
struct ExpertPieces {
  MatrixSource gate, up, down;
};
ExpertPieces whole_expert(const ExpertMatrices& w13, const ExpertMatrices& w2, const QuantParams& q,
                          int64_t e, int64_t H, int64_t I) {
  return {piece(w13, q, e, I, 0, I, 0, H), piece(w13, q, e, I, I, I, 0, H),
          piece(w2, q, e, H, 0, H, 0, I)};
}

// An expert's matrices with float weights of a quantised format quantised whole, so that a
// slice of them holds the numbers the whole expert would; other weights as given.
struct QuantizedWhole {
  QuantizedMatrices w13_storage, w2_storage;
  ExpertMatrices w13, w2;
};

QuantizedWhole quantized_whole(const ExpertWeights& weights, const QuantParams& q) {
  QuantizedWhole out{{}, {}, weights.w13, weights.w2};
  if (q.quantized() && is_float_weight(out.w13.weight.dtype)) {
    out.w13_storage = quantize_matrices(out.w13.weight, 2, q);
    out.w13 = out.w13_storage.view();
  }
  if (q.quantized() && is_float_weight(out.w2.weight.dtype)) {
    out.w2_storage = quantize_matrices(out.w2.weight, 1, q);
    out.w2 = out.w2_storage.view();
  }
  return out;
}

}  // namespace

// LayerWeights as a source: views of one expert of each stack. The stacks are checked whole
// before anything loads, so a bad element is named by its place in the caller's tensor.
class StackedWeights final : public LayerWeightSource {
 public:
  StackedWeights(const Plan& plan, const LayerWeights& weights) : w_(weights) {
    const ModelSpec& spec = plan.spec;
    const int64_t H = spec.hidden, I = spec.intermediate, Is = spec.shared_intermediate;
    check_matrices(w_.w13, "weights.w13", spec.n_experts, I, H, 2, plan.quant);
    check_matrices(w_.w2, "weights.w2", spec.n_experts, H, I, 1, plan.quant);
    if (spec.n_shared > 0) {
      check_matrices(w_.shared_w13, "weights.shared_w13", spec.n_shared, Is, H, 2, plan.quant);
      check_matrices(w_.shared_w2, "weights.shared_w2", spec.n_shared, H, Is, 1, plan.quant);
    }
  }
  ExpertWeights routed(int expert) override {
    return {one(w_.w13, expert), one(w_.w2, expert), fmt::format("expert {}", expert)};
  }
  ExpertWeights shared(int index) override {
    return {one(w_.shared_w13, index), one(w_.shared_w2, index),
            fmt::format("shared expert {}", index)};
  }
  TensorView correction_bias() override { return w_.correction_bias; }
  TensorView shared_gate() override { return w_.shared_gate; }

 private:
  static ExpertMatrices one(const ExpertMatrices& m, int64_t e) {
    ExpertMatrices out;
    out.weight = m.weight.narrow(0, e, 1);
    if (m.scale.data != nullptr) out.scale = m.scale.narrow(0, e, 1);
    if (m.zero.data != nullptr) out.zero = m.zero.narrow(0, e, 1);
    return out;
  }
  const LayerWeights& w_;
};

class MoeLayer::Impl {
 public:
  Impl(const Plan& plan, const LayerWeights& weights) : Impl(plan) {
    StackedWeights source(plan, weights);
    load(source, /*checked=*/true);
    if (plan.quant.activation == ActivationQuant::fp8_static) {
      const bool shared = plan.spec.n_shared > 0;
      const float a13 = std::max(largest_input_scale(weights.w13),
                                 shared ? largest_input_scale(weights.shared_w13) : 0.0f);
      const float a2 = std::max(largest_input_scale(weights.w2),
                                shared ? largest_input_scale(weights.shared_w2) : 0.0f);
      routed_.set_input_scales(a13, a2);
      if (shared_) shared_->set_input_scales(a13, a2);
    }
  }

  Impl(const Plan& plan, LayerWeightSource& source) : Impl(plan) {
    if (plan.quant.activation == ActivationQuant::fp8_static) {
      fail(Errc::invalid_argument,
           "fp8 static activation scales are the largest over all experts and come with "
           "LayerWeights only, not from a per-expert source");
    }
    load(source, /*checked=*/false);
  }

  // Everything but the weights: the stages and their scratch.
  explicit Impl(const Plan& plan)
      : plan_(checked_for_this_machine(plan)),
        stages_(find_planned_stages(plan_)),
        ctx_{.device = plan_.options.device, .pool = &ThreadPool::shared(plan_.threads)},
        checks_(plan_.options.check_finite ? stages_.checks(plan_) : nullptr),
        router_(stages_.router(plan_)),
        routed_(plan_, routed_problem(plan_), routed_global_to_local(plan_)),
        shared_(make_shared_experts(plan_)),
        output_(stages_.output(plan_)) {
    if (plan_.fusions.checks_in_router && checks_ &&
        !router_->take_finite_checks(checks_->statuses_for_router())) {
      fail(Errc::internal, "the plan gives the router the finite checks, which it cannot take");
    }
    for (const Decision* d : plan_.fallbacks()) {
      log(LogLevel::warn, "layer {} runs with a fallback: {} {} ({})", plan_.spec.name, d->topic,
          *d->fallback, d->reason);
    }
    ScratchCarver counter;
    carve(counter);
    scratch_ = Buffer::allocate(plan_.options.device, counter.bytes());
    ScratchCarver carver(scratch_.data());
    arrays_ = carve(carver);
  }

  void forward(const TensorView& hidden, const TensorView& logits, const TensorView& output,
               const RoutingResult* routing, GpuStream stream) {
    ctx_.stream = stream;
    // Across processes the other ranks wait in this rank's first exchange: a failure before it
    // is sent to them there (abandon) before it is thrown here.
    const auto or_abandon = [&](const auto& step) {
      if (!routed_.collective()) return step();
      try {
        return step();
      } catch (const Error&) {
        routed_.abandon(ctx_);
        throw;
      }
    };
    or_abandon([&] { check_forward_arguments(plan_, hidden, logits, output, routing); });
    // A rank with no tokens still takes part in its exchanges with the others.
    if (hidden.dim(0) == 0 && !routed_.collective()) return;
    // The workers wake up while this thread checks and routes; GPU stages use none of them.
    if (plan_.options.device.kind == DeviceKind::cpu) ctx_.pool->wake();
    const Routing routed = or_abandon([&] {
      if (checks_) checks_->run(ctx_, hidden, logits, arrays_.checks);
      return router_->run(ctx_, hidden, logits, arrays_.router);
    });
    if (shared_) shared_->start(ctx_, hidden);
    try {
      // Plan::fusions.combine_to_output: the routed experts write the output, and no output
      // stage runs (resolve fuses them only where nothing is added to the routed sum).
      routed_.forward(ctx_, hidden, routed.physical_ids, routed.physical_weights, arrays_.routed,
                      plan_.fusions.combine_to_output ? &output : nullptr, routed.deferred);
    } catch (const Error&) {
      if (shared_) shared_->finish(ctx_);  // joins the overlapped form's thread
      throw;
    }
    const float* shared_out = shared_ ? shared_->finish(ctx_) : nullptr;
    if (!plan_.fusions.combine_to_output) {
      output_->run(ctx_, arrays_.routed, shared_out, routed.shared_gate, output);
    }
    if (routing != nullptr) report_routing(routed, hidden.dim(0), *routing);
  }

  void synchronize() {
    routed_.synchronize(ctx_);
    if (plan_.options.device.kind == DeviceKind::cuda) synchronize_stream(ctx_.stream);
    if (checks_) checks_->report();
  }

  const Plan& plan() const { return plan_; }

 private:
  struct Arrays {
    void* checks;
    void* router;
    float* routed;  // [max_tokens, H]: the routed experts' weighted sum, in token order
  };
  Arrays carve(ScratchCarver& carver) const {
    return {carver.take<std::byte>(checks_ ? checks_->scratch_bytes() : 0),
            carver.take<std::byte>(router_->scratch_bytes()),
            carver.take<float>(plan_.options.max_tokens * plan_.spec.hidden)};
  }

  // The kernels a plan chose must exist on the machine that runs it: a plan made for another
  // machine is refused here, not by an illegal instruction inside a kernel.
  static const Plan& checked_for_this_machine(const Plan& plan) {
    if (std::optional<std::string> missing = plan.platform.missing_on(Platform::probe())) {
      fail(Errc::invalid_argument, "the plan was made for a machine with {}, which this one lacks",
           *missing);
    }
    return plan;
  }

  static const StageEntry& find_planned_stages(const Plan& plan) {
    const StageEntry* entry = find_stages(plan.options.device.kind);
    if (entry == nullptr || entry->name != plan.stages) {
      fail(Errc::internal, "plan names block stages '{}' that are not registered", plan.stages);
    }
    return *entry;
  }

  static ExpertsProblem routed_problem(const Plan& plan) {
    const int columns = plan.spec.routing.top_k + plan.shared_slots;
    return {.hidden = plan.spec.hidden,
            .intermediate = plan.routed_intermediate,
            .activation = plan.spec.activation,
            .slots = plan.local_routed + plan.shared_slots,
            .columns = columns,
            .max_tokens = plan.max_received_tokens,
            .threads = plan.threads,
            .device = plan.options.device,
            .role = ExpertsRole::routed,
            .quant = plan.quant};
  }

  // Global physical ids of this rank's experts map to slots 0..local-1; fused shared slots have
  // global ids after the physical experts and live on every rank.
  static std::vector<int32_t> routed_global_to_local(const Plan& plan) {
    std::vector<int32_t> table(static_cast<size_t>(plan.location.physical + plan.shared_slots), -1);
    for (int slot = 0; slot < plan.local_routed; ++slot) table[plan.first_local + slot] = slot;
    for (int s = 0; s < plan.shared_slots; ++s)
      table[plan.location.physical + s] = plan.local_routed + s;
    return table;
  }

  void load(LayerWeightSource& source, bool checked) {
    const ModelSpec& spec = plan_.spec;
    const int64_t H = spec.hidden, I = spec.intermediate, Is = spec.shared_intermediate;
    const QuantParams& q = plan_.quant;
    router_->load(spec.routing.correction_bias ? source.correction_bias() : TensorView{},
                  spec.shared_gate ? source.shared_gate() : TensorView{});
    const auto fetch = [&](ExpertWeights w, int64_t inner) {
      if (!checked) {
        check_matrices(w.w13, w.origin + " gate/up", 1, inner, H, 2, q);
        check_matrices(w.w2, w.origin + " down", 1, H, inner, 1, q);
      }
      return w;
    };
    for (int slot = 0; slot < plan_.local_routed; ++slot) {
      const int e = plan_.location.physical_to_logical[plan_.first_local + slot];
      const ExpertWeights w = fetch(source.routed(e), I);
      if (plan_.routed_intermediate != I) {
        load_slice(slot, w);
        continue;
      }
      const ExpertPieces expert = whole_expert(w.w13, w.w2, q, 0, H, I);
      routed_.load(slot, expert.gate, expert.up, expert.down);
    }
    if (plan_.shared_slots > 0) {
      for (int s = 0; s < spec.n_shared; ++s) load_shared_slots(s, fetch(source.shared(s), Is));
    }
    if (shared_) {
      for (int s = 0; s < spec.n_shared; ++s) {
        const ExpertWeights w = fetch(source.shared(s), Is);
        const ExpertPieces expert = whole_expert(w.w13, w.w2, q, 0, H, Is);
        shared_->load(s, expert.gate, expert.up, expert.down);
      }
    }
  }

  // Tensor parallelism: this rank's columns of the expert's I, its gate and up rows and down
  // columns. Float weights of a quantised format are quantised whole first, so the slice holds
  // the numbers the whole expert would (resolve() makes the slice whole scale blocks).
  void load_slice(int slot, const ExpertWeights& weights) {
    const QuantParams& q = plan_.quant;
    const int64_t I = plan_.spec.intermediate, H = plan_.spec.hidden;
    const int64_t first = plan_.routed_first, n = plan_.routed_intermediate;
    const QuantizedWhole whole = quantized_whole(weights, q);
    const ExpertMatrices &w13 = whole.w13, &w2 = whole.w2;
    routed_.load(slot, piece(w13, q, 0, I, first, n, 0, H), piece(w13, q, 0, I, I + first, n, 0, H),
                 piece(w2, q, 0, H, 0, H, first, n));
  }

  // A shared expert of intermediate m*I is the sum of m experts of intermediate I: gated
  // activations act element-wise along I, so its gate/up rows and down columns split cleanly.
  // Float weights of a quantised format are quantised whole first, as the other forms quantise
  // them, so that the split changes no number.
  void load_shared_slots(int s, const ExpertWeights& weights) {
    const ModelSpec& spec = plan_.spec;
    const QuantParams& q = plan_.quant;
    const int64_t I = spec.intermediate, Is = spec.shared_intermediate, H = spec.hidden;
    const QuantizedWhole whole = quantized_whole(weights, q);
    const ExpertMatrices &w13 = whole.w13, &w2 = whole.w2;
    const int pieces = plan_.shared_slots / spec.n_shared;
    for (int p = 0; p < pieces; ++p) {
      routed_.load(plan_.local_routed + s * pieces + p, piece(w13, q, 0, Is, p * I, I, 0, H),
                   piece(w13, q, 0, Is, Is + p * I, I, 0, H), piece(w2, q, 0, H, 0, H, p * I, I));
    }
  }

  void report_routing(const Routing& routed, int64_t T, const RoutingResult& routing) const {
    const Shape shape{T, plan_.spec.routing.top_k};
    const Device device = plan_.options.device;
    copy_async(
        routing.ids,
        TensorView::contiguous(const_cast<int32_t*>(routed.logical_ids), DType::i32, shape, device),
        ctx_.stream);
    copy_async(routing.weights,
               TensorView::contiguous(const_cast<float*>(routed.logical_weights), DType::f32, shape,
                                      device),
               ctx_.stream);
  }

  Plan plan_;
  const StageEntry& stages_;
  ExecContext ctx_;
  std::unique_ptr<FiniteChecks> checks_;
  std::unique_ptr<RouterStage> router_;
  ExpertsLayer routed_;
  std::unique_ptr<SharedExperts> shared_;
  std::unique_ptr<OutputSum> output_;
  Buffer scratch_;
  Arrays arrays_{};
};

MoeLayer::MoeLayer(const Plan& plan, const LayerWeights& weights)
    : impl_(std::make_unique<Impl>(plan, weights)) {}
MoeLayer::MoeLayer(const Plan& plan, LayerWeightSource& source)
    : impl_(std::make_unique<Impl>(plan, source)) {}
MoeLayer::~MoeLayer() = default;
MoeLayer::MoeLayer(MoeLayer&&) noexcept = default;
MoeLayer& MoeLayer::operator=(MoeLayer&&) noexcept = default;

void MoeLayer::forward(const TensorView& hidden, const TensorView& router_logits,
                       const TensorView& output, const RoutingResult* routing) {
  impl_->forward(hidden, router_logits, output, routing, nullptr);
  if (impl_->plan().options.device.kind == DeviceKind::cuda) impl_->synchronize();
}

void MoeLayer::forward(const TensorView& hidden, const TensorView& router_logits,
                       const TensorView& output, const RoutingResult* routing,
                       CUstream_st* stream) {
  impl_->forward(hidden, router_logits, output, routing, stream);
}

void MoeLayer::synchronize() {
  impl_->synchronize();
}

const Plan& MoeLayer::plan() const {
  return impl_->plan();
}

}  // namespace moekit
