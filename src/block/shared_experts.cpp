// The shared experts' strategies, one per block form that computes them apart: after the routed
// experts (standard), or beside them on a second thread (overlapped: the seed's second stream).
// The fused-slot form has none (they are routed slots), so make_shared_experts returns null.

#include <optional>

#include "block/stages.hpp"
#include "core/background_worker.hpp"
#include "core/thread_pool.hpp"
#include "moekit/error.hpp"

namespace moekit {
namespace {

// The shared experts as an experts layer of their own: every token goes to each of them with
// weight 1, or its gate.
class SharedLayer {
 public:
  SharedLayer(const Plan& plan, int threads)
      : n_(plan.spec.n_shared),
        experts_(plan, problem(plan, threads), identity(plan.spec.n_shared)),
        ids_(static_cast<size_t>(plan.options.max_tokens * n_)),
        weights_(static_cast<size_t>(plan.options.max_tokens * n_), 1.0f),
        out_(static_cast<size_t>(plan.options.max_tokens * plan.spec.hidden)) {
    for (size_t e = 0; e < ids_.size(); ++e) ids_[e] = static_cast<int32_t>(e % n_);
  }

  ExpertsLayer& experts() { return experts_; }

  void run(const ExecContext& ctx, const TensorView& hidden, const float* gate) {
    const int64_t T = hidden.dim(0);
    if (gate != nullptr) {
      for (int64_t t = 0; t < T; ++t) {
        for (int s = 0; s < n_; ++s) weights_[t * n_ + s] = gate[t];
      }
    }
    experts_.forward(ctx, hidden, ids_.data(), weights_.data(), out_.data());
  }
  const float* output() const { return out_.data(); }

 private:
  static ExpertsProblem problem(const Plan& plan, int threads) {
    const int n = plan.spec.n_shared;
    return {.hidden = plan.spec.hidden,
            .intermediate = plan.spec.shared_intermediate,
            .activation = plan.spec.activation,
            .slots = n,
            .columns = n,
            .max_tokens = plan.options.max_tokens,
            .threads = threads,
            .device = plan.options.device,
            .role = ExpertsRole::shared,
            .quant = plan.quant};
  }
  static std::vector<int32_t> identity(int n) {
    std::vector<int32_t> table(static_cast<size_t>(n));
    for (int s = 0; s < n; ++s) table[s] = s;
    return table;
  }

  int n_;
  ExpertsLayer experts_;
  std::vector<int32_t> ids_;
  std::vector<float> weights_;
  std::vector<float> out_;
};

class SharedAfter final : public SharedExperts {
 public:
  explicit SharedAfter(const Plan& plan) : layer_(plan, plan.threads) {}

  void load(int index, const MatrixSource& gate, const MatrixSource& up,
            const MatrixSource& down) override {
    layer_.experts().load(index, gate, up, down);
  }
  void set_input_scales(float w13, float w2) override {
    layer_.experts().set_input_scales(w13, w2);
  }
  void start(const ExecContext&, const TensorView& hidden, const Routing& routing) override {
    hidden_ = hidden;
    gate_ = routing.shared_gate;
  }
  const float* finish(const ExecContext& ctx) override {
    layer_.run(ctx, hidden_, gate_);
    return layer_.output();
  }

 private:
  SharedLayer layer_;
  TensorView hidden_;
  const float* gate_ = nullptr;
};

// On a second thread with a pool of its own, so that it never waits for the routed experts'
// pool; the routed experts keep every other thread.
class SharedOverlapped final : public SharedExperts {
 public:
  explicit SharedOverlapped(const Plan& plan)
      : layer_(plan, 1), pool_(1), worker_([this] { layer_.run(ctx_, hidden_, gate_); }) {}

  void load(int index, const MatrixSource& gate, const MatrixSource& up,
            const MatrixSource& down) override {
    layer_.experts().load(index, gate, up, down);
  }
  void set_input_scales(float w13, float w2) override {
    layer_.experts().set_input_scales(w13, w2);
  }
  void start(const ExecContext& ctx, const TensorView& hidden, const Routing& routing) override {
    ctx_ = {.device = ctx.device, .pool = &pool_, .stream = ctx.stream};
    hidden_ = hidden;
    gate_ = routing.shared_gate;
    worker_.start();
  }
  const float* finish(const ExecContext&) override {
    worker_.wait();
    return layer_.output();
  }

 private:
  SharedLayer layer_;
  ThreadPool pool_;
  ExecContext ctx_;
  TensorView hidden_;
  const float* gate_ = nullptr;
  BackgroundWorker worker_;
};

}  // namespace

std::unique_ptr<SharedExperts> make_shared_experts(const Plan& plan) {
  switch (plan.shared_strategy) {
    case SharedStrategy::none:
      return nullptr;
    case SharedStrategy::after:
      return std::make_unique<SharedAfter>(plan);
    case SharedStrategy::overlapped:
      return std::make_unique<SharedOverlapped>(plan);
  }
  fail(Errc::internal, "unknown shared experts strategy");
}

}  // namespace moekit
