// Layer 1, the block: routing, the routed experts, the shared experts in the plan's form, and
// the sum. Everything is built in the constructor; forward() runs the plan's pipeline.

#include <cmath>
#include <optional>
#include <vector>

#include "core/background_worker.hpp"
#include "core/thread_pool.hpp"
#include "experts/experts_layer.hpp"
#include "moekit/error.hpp"
#include "moekit/layer.hpp"
#include "moekit/log.hpp"
#include "quant/check.hpp"
#include "routing/topk.hpp"

namespace moekit {
namespace {

bool is_activation_dtype(DType dtype) {
  return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
}

// Checks a caller's tensor: on the plan's device, contiguous, one of f32/bf16/f16, and the
// expected shape (a dimension of -1 matches any size).
void check_input(const TensorView& t, const char* name, std::initializer_list<int64_t> expected,
                 Device device) {
  std::string want = "[";
  bool shape_ok = t.rank() == static_cast<int>(expected.size());
  int axis = 0;
  for (int64_t d : expected) {
    want += fmt::format("{}{}", axis ? ", " : "", d < 0 ? std::string("T") : std::to_string(d));
    shape_ok = shape_ok && (d < 0 || t.dim(axis) == d);
    ++axis;
  }
  want += "]";
  if (t.data == nullptr && t.numel() > 0) fail(Errc::invalid_argument, "{}: no data", name);
  if (!shape_ok)
    fail(Errc::invalid_argument, "{}: expected shape {}, got {}", name, want, t.describe());
  if (!is_activation_dtype(t.dtype)) {
    fail(Errc::invalid_argument, "{}: dtype must be f32, bf16 or f16, got {}", name, t.describe());
  }
  if (t.device != device) {
    fail(Errc::invalid_argument, "{}: the plan runs on {}, got {}", name, device.str(),
         t.describe());
  }
  if (!t.is_contiguous())
    fail(Errc::invalid_argument, "{}: must be contiguous, got {}", name, t.describe());
}

void check_finite_rows(const TensorView& t, const char* name, std::vector<float>& row) {
  const int64_t cols = t.dim(1);
  for (int64_t r = 0; r < t.dim(0); ++r) {
    convert_to_f32(static_cast<const char*>(t.data) + dtype_storage_bytes(t.dtype, r * cols),
                   t.dtype, cols, row.data());
    for (int64_t c = 0; c < cols; ++c) {
      if (!std::isfinite(row[c])) {
        fail(Errc::invalid_argument, "{}: row {} has a non-finite value ({}) at column {}", name, r,
             row[c], c);
      }
    }
  }
}

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

  // Everything but the weights: the experts layers, the router's scratch, the batch buffers.
  explicit Impl(const Plan& plan)
      : plan_(plan),
        pool_(ThreadPool::shared(plan.threads)),
        top_k_(plan.spec.routing.top_k),
        columns_(top_k_ + plan.shared_slots),
        routed_(plan, routed_problem(), routed_global_to_local()) {
    const ModelSpec& spec = plan.spec;
    const int64_t H = spec.hidden, E = spec.n_experts;
    for (const Decision* d : plan.fallbacks()) {
      log(LogLevel::warn, "layer {} runs with a fallback: {} {} ({})", spec.name, d->topic,
          *d->fallback, d->reason);
    }

    const int64_t T = plan.options.max_tokens;
    logical_ids_.resize(static_cast<size_t>(T * top_k_));
    logical_weights_.resize(static_cast<size_t>(T * top_k_));
    physical_ids_.resize(static_cast<size_t>(T * columns_));
    physical_weights_.resize(static_cast<size_t>(T * columns_));
    routed_out_.resize(static_cast<size_t>(T * H));
    shared_gate_values_.resize(static_cast<size_t>(spec.shared_gate ? T : 0));
    gate_rows_.resize(static_cast<size_t>(spec.shared_gate ? pool_.size() * H : 0));
    finite_row_.resize(static_cast<size_t>(std::max<int64_t>(H, E)));
  }

  void forward(const TensorView& hidden, const TensorView& logits, const TensorView& output,
               const RoutingResult* routing) {
    const ModelSpec& spec = plan_.spec;
    check_input(hidden, "hidden_states", {-1, spec.hidden}, plan_.options.device);
    const int64_t T = hidden.dim(0);
    check_input(logits, "router_logits", {T, spec.n_experts}, plan_.options.device);
    check_input(output, "output", {T, spec.hidden}, plan_.options.device);
    if (output.dtype != hidden.dtype) {
      fail(Errc::invalid_argument, "output: dtype must match hidden_states ({}), got {}",
           dtype_name(hidden.dtype), output.describe());
    }
    if (T > plan_.options.max_tokens) {
      fail(Errc::invalid_argument, "hidden_states: {} tokens exceed the plan's max_tokens {}", T,
           plan_.options.max_tokens);
    }
    if (routing != nullptr) check_routing_result(*routing, T);
    if (T == 0) return;
    pool_.wake();  // the workers wake up while this thread checks and routes
    if (plan_.options.check_finite) check_finite_rows(hidden, "hidden_states", finite_row_);

    router_->select(logits, plan_.options.check_finite, logical_ids_.data(),
                    logical_weights_.data(), &pool_);
    if (plan_.spec.shared_gate) compute_shared_gate(hidden);
    to_physical(T);

    if (plan_.form == BlockForm::overlapped && shared_) {
      shared_input_ = hidden;
      shared_worker_->start();
      routed_.forward(hidden, physical_ids_.data(), physical_weights_.data(), routed_out_.data(),
                      pool_);
      shared_worker_->wait();
    } else {
      routed_.forward(hidden, physical_ids_.data(), physical_weights_.data(), routed_out_.data(),
                      pool_);
      if (shared_) run_shared(hidden);
    }
    write_output(T, output);
    if (routing != nullptr) {
      std::copy_n(logical_ids_.data(), T * top_k_, routing->ids.as<int32_t>());
      std::copy_n(logical_weights_.data(), T * top_k_, routing->weights.as<float>());
    }
  }

  const Plan& plan() const { return plan_; }

 private:
  ExpertsProblem routed_problem() const {
    return {plan_.spec.hidden,
            plan_.spec.intermediate,
            plan_.spec.activation,
            plan_.local_routed + plan_.shared_slots,
            columns_,
            plan_.options.max_tokens,
            pool_.size()};
  }

  // Global physical ids of this rank's experts map to slots 0..local-1; fused shared slots have
  // global ids after the physical experts and live on every rank.
  std::vector<int32_t> routed_global_to_local() const {
    std::vector<int32_t> table(static_cast<size_t>(plan_.location.physical + plan_.shared_slots),
                               -1);
    for (int slot = 0; slot < plan_.local_routed; ++slot) table[plan_.first_local + slot] = slot;
    for (int s = 0; s < plan_.shared_slots; ++s)
      table[plan_.location.physical + s] = plan_.local_routed + s;
    return table;
  }

  void load(LayerWeightSource& source, bool checked) {
    const ModelSpec& spec = plan_.spec;
    const int64_t H = spec.hidden, I = spec.intermediate, Is = spec.shared_intermediate;
    const QuantParams& q = plan_.quant;
    if (spec.routing.correction_bias) load_correction_bias(source.correction_bias());
    router_.emplace(spec.routing, spec.n_experts,
                    correction_bias_.empty() ? nullptr : correction_bias_.data(), pool_.size());
    if (spec.shared_gate) load_shared_gate(source.shared_gate());
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
      const ExpertPieces expert = whole_expert(w.w13, w.w2, q, 0, H, I);
      routed_.load(slot, expert.gate, expert.up, expert.down);
    }
    if (plan_.shared_slots > 0) {
      for (int s = 0; s < spec.n_shared; ++s) load_shared_slots(s, fetch(source.shared(s), Is));
    }
    if (plan_.adds_shared_output) {
      build_shared();
      for (int s = 0; s < spec.n_shared; ++s) {
        const ExpertWeights w = fetch(source.shared(s), Is);
        const ExpertPieces expert = whole_expert(w.w13, w.w2, q, 0, H, Is);
        shared_->load(s, expert.gate, expert.up, expert.down);
      }
    }
  }

  void load_correction_bias(const TensorView& bias) {
    const int64_t E = plan_.spec.n_experts;
    if (bias.data == nullptr || !(bias.shape == Shape{E}) || bias.dtype != DType::f32 ||
        bias.device.kind != DeviceKind::cpu || !bias.is_contiguous()) {
      fail(Errc::invalid_argument,
           "weights.correction_bias: expected contiguous f32[{}] on the CPU, got {}", E,
           bias.data == nullptr ? std::string("nothing") : bias.describe());
    }
    const auto* values = bias.as<const float>();
    correction_bias_.assign(values, values + E);
  }

  // A shared expert of intermediate m*I is the sum of m experts of intermediate I: gated
  // activations act element-wise along I, so its gate/up rows and down columns split cleanly.
  // Float weights of a quantised format are quantised whole first, as the other forms quantise
  // them, so that the split changes no number.
  void load_shared_slots(int s, const ExpertWeights& weights) {
    const ModelSpec& spec = plan_.spec;
    const QuantParams& q = plan_.quant;
    const int64_t I = spec.intermediate, Is = spec.shared_intermediate, H = spec.hidden;
    ExpertMatrices w13 = weights.w13, w2 = weights.w2;
    QuantizedMatrices quantized13, quantized2;
    if (q.quantized() && is_float_weight(w13.weight.dtype)) {
      quantized13 = quantize_matrices(w13.weight, 2, q);
      w13 = quantized13.view();
    }
    if (q.quantized() && is_float_weight(w2.weight.dtype)) {
      quantized2 = quantize_matrices(w2.weight, 1, q);
      w2 = quantized2.view();
    }
    const int pieces = plan_.shared_slots / spec.n_shared;
    for (int p = 0; p < pieces; ++p) {
      routed_.load(plan_.local_routed + s * pieces + p, piece(w13, q, 0, Is, p * I, I, 0, H),
                   piece(w13, q, 0, Is, Is + p * I, I, 0, H), piece(w2, q, 0, H, 0, H, p * I, I));
    }
  }

  void build_shared() {
    const ModelSpec& spec = plan_.spec;
    const int n = spec.n_shared;
    const int64_t Is = spec.shared_intermediate;
    // The shared MLPs on the second thread must not wait for the pool the routed experts use.
    const int threads = plan_.form == BlockForm::overlapped ? 1 : pool_.size();
    if (plan_.form == BlockForm::overlapped) shared_pool_.emplace(1);
    const ExpertsProblem problem{spec.hidden, Is, spec.activation, n, n, plan_.options.max_tokens,
                                 threads};
    std::vector<int32_t> identity(static_cast<size_t>(n));
    for (int s = 0; s < n; ++s) identity[s] = s;
    shared_.emplace(plan_, problem, identity);
    const int64_t entries = plan_.options.max_tokens * n;
    shared_ids_.resize(static_cast<size_t>(entries));
    shared_weights_.assign(static_cast<size_t>(entries), 1.0f);
    for (int64_t e = 0; e < entries; ++e) shared_ids_[e] = static_cast<int32_t>(e % n);
    shared_out_.resize(static_cast<size_t>(plan_.options.max_tokens * spec.hidden));
    if (plan_.form == BlockForm::overlapped) {
      shared_worker_.emplace([this] { run_shared(shared_input_); });
    }
  }

  void load_shared_gate(const TensorView& gate) {
    const int64_t H = plan_.spec.hidden;
    if (gate.data == nullptr || !(gate.shape == Shape{1, H}) || !is_activation_dtype(gate.dtype) ||
        gate.device.kind != DeviceKind::cpu || !gate.is_contiguous()) {
      fail(Errc::invalid_argument,
           "weights.shared_gate: expected contiguous f32/bf16/f16 [1, {}] on the CPU, got {}", H,
           gate.data == nullptr ? std::string("nothing") : gate.describe());
    }
    shared_gate_.resize(static_cast<size_t>(H));
    convert_to_f32(gate.data, gate.dtype, H, shared_gate_.data());
    for (int64_t h = 0; h < H; ++h) {
      if (!std::isfinite(shared_gate_[h])) {
        fail(Errc::invalid_argument, "weights.shared_gate: element [0, {}] is {}", h,
             shared_gate_[h]);
      }
    }
  }

  // Qwen2-MoE scales the shared experts' output per token by sigmoid(hidden . gate). The
  // factor becomes the shared entries' weight, in whichever form the plan runs them.
  void compute_shared_gate(const TensorView& hidden) {
    const int64_t T = hidden.dim(0), H = plan_.spec.hidden;
    const auto* base = static_cast<const char*>(hidden.data);
    pool_.parallel_chunks(T, [&](int64_t begin, int64_t end, int worker) {
      float* row = gate_rows_.data() + static_cast<size_t>(worker * H);
      for (int64_t t = begin; t < end; ++t) {
        convert_to_f32(base + dtype_storage_bytes(hidden.dtype, t * H), hidden.dtype, H, row);
        double dot = 0.0;
        for (int64_t h = 0; h < H; ++h) dot += double{row[h]} * shared_gate_[h];
        shared_gate_values_[t] = static_cast<float>(1.0 / (1.0 + std::exp(-dot)));
      }
    });
    if (!shared_) return;
    const int n = plan_.spec.n_shared;
    for (int64_t t = 0; t < T; ++t) {
      for (int s = 0; s < n; ++s) shared_weights_[t * n + s] = shared_gate_values_[t];
    }
  }

  void run_shared(const TensorView& hidden) {
    ThreadPool& pool = shared_pool_ ? *shared_pool_ : pool_;
    shared_->forward(hidden, shared_ids_.data(), shared_weights_.data(), shared_out_.data(), pool);
  }

  // Token t belongs to source rank t * ep / T (the ranks' equal shares of the batch, as with
  // data-parallel attention); the source rank's static table picks the replica that serves it.
  void to_physical(int64_t T) {
    const ExpertLocation& location = plan_.location;
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<int>& table = location.rank_table[t * location.ep_size / T];
      for (int j = 0; j < top_k_; ++j) {
        physical_ids_[t * columns_ + j] = table[logical_ids_[t * top_k_ + j]];
        physical_weights_[t * columns_ + j] = logical_weights_[t * top_k_ + j];
      }
      for (int s = 0; s < plan_.shared_slots; ++s) {
        physical_ids_[t * columns_ + top_k_ + s] = location.physical + s;
        physical_weights_[t * columns_ + top_k_ + s] =
            plan_.shared_slot_weight * (plan_.spec.shared_gate ? shared_gate_values_[t] : 1.0f);
      }
    }
  }

  void write_output(int64_t T, const TensorView& output) {
    const int64_t H = plan_.spec.hidden;
    if (shared_) {
      for (int64_t i = 0; i < T * H; ++i) routed_out_[i] += shared_out_[i];
    }
    convert_from_f32(routed_out_.data(), T * H, output.data, output.dtype);
  }

  void check_routing_result(const RoutingResult& routing, int64_t T) const {
    const bool ids_ok = routing.ids.dtype == DType::i32 && routing.ids.shape == Shape{T, top_k_} &&
                        routing.ids.is_contiguous() && routing.ids.device == plan_.options.device;
    const bool weights_ok =
        routing.weights.dtype == DType::f32 && routing.weights.shape == Shape{T, top_k_} &&
        routing.weights.is_contiguous() && routing.weights.device == plan_.options.device;
    if (!ids_ok) {
      fail(Errc::invalid_argument, "topk_ids: expected contiguous i32[{}, {}] on {}, got {}", T,
           top_k_, plan_.options.device.str(), routing.ids.describe());
    }
    if (!weights_ok) {
      fail(Errc::invalid_argument, "topk_weights: expected contiguous f32[{}, {}] on {}, got {}", T,
           top_k_, plan_.options.device.str(), routing.weights.describe());
    }
  }

  Plan plan_;
  ThreadPool& pool_;  // ThreadPool::shared
  int top_k_;
  int columns_;
  ExpertsLayer routed_;
  std::optional<ExpertsLayer> shared_;
  std::optional<ThreadPool> shared_pool_;
  std::optional<BackgroundWorker> shared_worker_;
  TensorView shared_input_;
  std::vector<float> correction_bias_;
  std::optional<routing::Router> router_;
  std::vector<int32_t> logical_ids_;
  std::vector<float> logical_weights_;
  std::vector<int32_t> physical_ids_;
  std::vector<float> physical_weights_;
  std::vector<int32_t> shared_ids_;
  std::vector<float> shared_weights_;
  std::vector<float> routed_out_;
  std::vector<float> shared_out_;
  std::vector<float> finite_row_;
  std::vector<float> shared_gate_;         // [H]
  std::vector<float> shared_gate_values_;  // [max_tokens]
  std::vector<float> gate_rows_;           // [threads, H]
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
  impl_->forward(hidden, router_logits, output, routing);
}

const Plan& MoeLayer::plan() const {
  return impl_->plan();
}

}  // namespace moekit
