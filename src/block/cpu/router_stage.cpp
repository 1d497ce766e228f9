// The cpu router stage: top-k over the logits (routing::Router), the shared experts' gate, and
// the map of each token's logical experts to physical ones (the source rank's replica), with
// the fused shared slots appended.

#include <cmath>

#include <fmt/format.h>

#include "block/router_weights.hpp"
#include "block/stages.hpp"
#include "core/scratch.hpp"
#include "core/thread_pool.hpp"
#include "moekit/error.hpp"
#include "routing/topk.hpp"

namespace moekit {
namespace {

class CpuRouterStage final : public RouterStage {
 public:
  explicit CpuRouterStage(const Plan& plan)
      : plan_(plan),
        top_k_(plan.spec.routing.top_k),
        columns_(top_k_ + plan.shared_slots),
        threads_(plan.threads) {}

  int64_t scratch_bytes() const override {
    ScratchCarver counter;
    carve(counter);
    return counter.bytes();
  }

  void load(const TensorView& correction_bias, const TensorView& shared_gate) override {
    const ModelSpec& spec = plan_.spec;
    if (spec.routing.correction_bias) {
      correction_bias_ = router_weight_values(correction_bias, "weights.correction_bias",
                                              Shape{spec.n_experts}, /*f32_only=*/true);
    }
    if (spec.shared_gate) {
      shared_gate_ = router_weight_values(shared_gate, "weights.shared_gate", Shape{1, spec.hidden},
                                          /*f32_only=*/false);
    }
    router_.emplace(spec.routing, spec.n_experts,
                    correction_bias_.empty() ? nullptr : correction_bias_.data(), threads_);
  }

  Routing run(const ExecContext& ctx, const TensorView& hidden, const TensorView& logits,
              void* scratch) override {
    ScratchCarver carver(scratch);
    const Arrays a = carve(carver);
    const int64_t T = hidden.dim(0);
    // Finite inputs were checked by the checks stage, when the plan asks for it.
    router_->select(logits, false, a.logical_ids, a.logical_weights, &ctx.threads());
    if (plan_.spec.shared_gate) compute_shared_gate(ctx, hidden, a);
    to_physical(T, a);
    return {a.logical_ids, a.logical_weights, a.physical_ids, a.physical_weights,
            plan_.spec.shared_gate ? a.shared_gate : nullptr};
  }

 private:
  struct Arrays {
    int32_t* logical_ids;
    float* logical_weights;
    int32_t* physical_ids;
    float* physical_weights;
    float* shared_gate;  // [T]
    float* gate_rows;    // [threads, H]: each worker's hidden row in f32
  };
  Arrays carve(ScratchCarver& carver) const {
    const int64_t T = plan_.options.max_tokens, H = plan_.spec.hidden;
    const bool gate = plan_.spec.shared_gate;
    return {carver.take<int32_t>(T * top_k_),   carver.take<float>(T * top_k_),
            carver.take<int32_t>(T * columns_), carver.take<float>(T * columns_),
            carver.take<float>(gate ? T : 0),   carver.take<float>(gate ? threads_ * H : 0)};
  }

  // Qwen2-MoE scales the shared experts' output per token by sigmoid(hidden . gate). The
  // factor becomes the shared entries' weight, in whichever form the plan runs them.
  void compute_shared_gate(const ExecContext& ctx, const TensorView& hidden,
                           const Arrays& a) const {
    const int64_t T = hidden.dim(0), H = plan_.spec.hidden;
    const auto* base = static_cast<const char*>(hidden.data);
    ctx.threads().parallel_chunks(T, [&](int64_t begin, int64_t end, int worker) {
      float* row = a.gate_rows + static_cast<size_t>(worker * H);
      for (int64_t t = begin; t < end; ++t) {
        convert_to_f32(base + dtype_storage_bytes(hidden.dtype, t * H), hidden.dtype, H, row);
        double dot = 0.0;
        for (int64_t h = 0; h < H; ++h) dot += double{row[h]} * shared_gate_[h];
        a.shared_gate[t] = static_cast<float>(1.0 / (1.0 + std::exp(-dot)));
      }
    });
  }

  // The source rank's static table picks the replica that serves a token. Under an all-to-all every
  // token is this rank's own; otherwise every rank sees the whole batch, and token t belongs to
  // source rank t * ep / T (the ranks' equal shares of it, as with data-parallel attention).
  void to_physical(int64_t T, const Arrays& a) const {
    const ExpertLocation& location = plan_.location;
    const bool own_tokens = owns_its_tokens(plan_.options);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t source = own_tokens ? plan_.options.ep.rank : t * location.ep_size / T;
      const std::vector<int>& table = location.rank_table[static_cast<size_t>(source)];
      for (int j = 0; j < top_k_; ++j) {
        a.physical_ids[t * columns_ + j] = table[a.logical_ids[t * top_k_ + j]];
        a.physical_weights[t * columns_ + j] = a.logical_weights[t * top_k_ + j];
      }
      for (int s = 0; s < plan_.shared_slots; ++s) {
        a.physical_ids[t * columns_ + top_k_ + s] = location.physical + s;
        a.physical_weights[t * columns_ + top_k_ + s] =
            plan_.shared_slot_weight * (plan_.spec.shared_gate ? a.shared_gate[t] : 1.0f);
      }
    }
  }

  const Plan& plan_;
  int top_k_;
  int columns_;
  int threads_;
  std::vector<float> correction_bias_;  // [E], read by the router
  std::vector<float> shared_gate_;      // [H]
  std::optional<routing::Router> router_;
};

}  // namespace

std::unique_ptr<RouterStage> make_cpu_router(const Plan& plan) {
  return std::make_unique<CpuRouterStage>(plan);
}

}  // namespace moekit
