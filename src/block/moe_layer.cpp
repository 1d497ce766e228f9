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

void check_weight(const TensorView& t, const char* name, Shape expected) {
  if (t.data == nullptr)
    fail(Errc::invalid_argument, "weights.{}: missing, expected {}", name, expected.str());
  if (!(t.shape == expected)) {
    fail(Errc::invalid_argument, "weights.{}: expected shape {}, got {}", name, expected.str(),
         t.describe());
  }
  if (!is_activation_dtype(t.dtype)) {
    fail(Errc::invalid_argument, "weights.{}: dtype must be f32, bf16 or f16, got {}", name,
         t.describe());
  }
  if (t.device.kind != DeviceKind::cpu || !t.is_contiguous()) {
    fail(Errc::invalid_argument, "weights.{}: must be contiguous on the CPU, got {}", name,
         t.describe());
  }
}

}  // namespace

class MoeLayer::Impl {
 public:
  Impl(const Plan& plan, const LayerWeights& weights)
      : plan_(plan),
        pool_(plan.threads),
        top_k_(plan.spec.routing.top_k),
        columns_(top_k_ + plan.shared_slots),
        routed_(plan, routed_problem(), routed_global_to_local()) {
    const ModelSpec& spec = plan.spec;
    const int64_t H = spec.hidden, I = spec.intermediate, E = spec.n_experts;
    check_weight(weights.w13, "w13", {E, 2 * I, H});
    check_weight(weights.w2, "w2", {E, H, I});
    if (spec.routing.correction_bias) {
      check_weight(weights.correction_bias, "correction_bias", {E});
      if (weights.correction_bias.dtype != DType::f32) {
        fail(Errc::invalid_argument, "weights.correction_bias: dtype must be f32, got {}",
             weights.correction_bias.describe());
      }
      const auto* bias = weights.correction_bias.as<const float>();
      correction_bias_.assign(bias, bias + E);
    }
    router_.emplace(plan_.spec.routing, spec.n_experts,
                    correction_bias_.empty() ? nullptr : correction_bias_.data(), pool_.size());
    const int64_t Is = spec.shared_intermediate;
    if (spec.n_shared > 0) {
      check_weight(weights.shared_w13, "shared_w13", {spec.n_shared, 2 * Is, H});
      check_weight(weights.shared_w2, "shared_w2", {spec.n_shared, H, Is});
    }

    for (int slot = 0; slot < plan.local_routed; ++slot) {
      const int logical = plan.location.physical_to_logical[plan.first_local + slot];
      const TensorView w13 = weights.w13.select(logical);
      routed_.load(slot, w13.narrow(0, 0, I), w13.narrow(0, I, I), weights.w2.select(logical));
    }
    // A shared expert of intermediate m*I is the sum of m experts of intermediate I: gated
    // activations act element-wise along I, so its gate/up rows and down columns split cleanly.
    const int pieces = plan.shared_slots / std::max(1, spec.n_shared);
    for (int s = 0; s < spec.n_shared && plan.shared_slots > 0; ++s) {
      const TensorView w13 = weights.shared_w13.select(s);
      const TensorView w2 = weights.shared_w2.select(s);
      for (int q = 0; q < pieces; ++q) {
        routed_.load(plan.local_routed + s * pieces + q, w13.narrow(0, q * I, I),
                     w13.narrow(0, Is + q * I, I), w2.narrow(1, q * I, I));
      }
    }
    if (plan.adds_shared_output) build_shared(weights);
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
    if (plan_.options.check_finite) check_finite_rows(hidden, "hidden_states", finite_row_);

    routing::select_experts(spec.routing, spec.n_experts, logits,
                            correction_bias_.empty() ? nullptr : correction_bias_.data(),
                            plan_.options.check_finite, logical_ids_.data(),
                            logical_weights_.data(), &pool_);
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

  void build_shared(const LayerWeights& weights) {
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
    for (int s = 0; s < n; ++s) {
      const TensorView w13 = weights.shared_w13.select(s);
      shared_->load(s, w13.narrow(0, 0, Is), w13.narrow(0, Is, Is), weights.shared_w2.select(s));
    }
    const int64_t entries = plan_.options.max_tokens * n;
    shared_ids_.resize(static_cast<size_t>(entries));
    shared_weights_.assign(static_cast<size_t>(entries), 1.0f);
    for (int64_t e = 0; e < entries; ++e) shared_ids_[e] = static_cast<int32_t>(e % n);
    shared_out_.resize(static_cast<size_t>(plan_.options.max_tokens * spec.hidden));
    if (plan_.form == BlockForm::overlapped) {
      shared_worker_.emplace([this] { run_shared(shared_input_); });
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
        physical_weights_[t * columns_ + top_k_ + s] = plan_.shared_slot_weight;
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
  ThreadPool pool_;
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
};

MoeLayer::MoeLayer(const Plan& plan, const LayerWeights& weights)
    : impl_(std::make_unique<Impl>(plan, weights)) {}
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
