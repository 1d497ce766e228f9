// The shared experts' strategies, one per block form that computes them apart: after the routed
// experts (standard), or beside them on a second thread (overlapped: the seed's second stream;
// on a GPU a second CUDA stream, block/cuda/shared_overlapped.cpp). The fused-slot form has none
// (they are routed slots), so make_shared_experts returns null.

#include "block/shared_layer.hpp"
#include "block/stages.hpp"
#include "core/background_worker.hpp"
#include "core/thread_pool.hpp"
#include "moekit/error.hpp"

namespace moekit {
namespace {

ExpertsProblem shared_problem(const Plan& plan, int threads) {
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

std::vector<int32_t> identity(int n) {
  std::vector<int32_t> table(static_cast<size_t>(n));
  for (int s = 0; s < n; ++s) table[s] = s;
  return table;
}

// A host tensor's values in a new tensor on `device`.
Tensor on_device(const Tensor& host, Device device) {
  Tensor t = Tensor::empty(host.view().dtype, host.view().shape, device);
  copy(t, host);
  return t;
}

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
  void start(const ExecContext&, const TensorView& hidden) override { hidden_ = hidden; }
  const float* finish(const ExecContext& ctx) override {
    layer_.run(ctx, hidden_);
    return layer_.output();
  }

 private:
  SharedLayer layer_;
  TensorView hidden_;
};

// On a second thread with a pool of its own, so that it never waits for the routed experts'
// pool; the routed experts keep every other thread.
class SharedOverlapped final : public SharedExperts {
 public:
  explicit SharedOverlapped(const Plan& plan)
      : layer_(plan, 1), pool_(1), worker_([this] { layer_.run(ctx_, hidden_); }) {}

  void load(int index, const MatrixSource& gate, const MatrixSource& up,
            const MatrixSource& down) override {
    layer_.experts().load(index, gate, up, down);
  }
  void set_input_scales(float w13, float w2) override {
    layer_.experts().set_input_scales(w13, w2);
  }
  void start(const ExecContext& ctx, const TensorView& hidden) override {
    ctx_ = {.device = ctx.device, .pool = &pool_, .stream = ctx.stream};
    hidden_ = hidden;
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
  BackgroundWorker worker_;
};

}  // namespace

SharedLayer::SharedLayer(const Plan& plan, int threads)
    : experts_(plan, shared_problem(plan, threads), identity(plan.spec.n_shared)) {
  const int n = plan.spec.n_shared;
  const int64_t T = plan.options.max_tokens;
  Tensor ids = Tensor::empty(DType::i32, {T, n});
  Tensor weights = Tensor::empty(DType::f32, {T, n});
  for (int64_t e = 0; e < T * n; ++e) {
    ids.data<int32_t>()[e] = static_cast<int32_t>(e % n);
    weights.data<float>()[e] = 1.0f;
  }
  const Device device = plan.options.device;
  ids_ = device.kind == DeviceKind::cpu ? std::move(ids) : on_device(ids, device);
  weights_ = device.kind == DeviceKind::cpu ? std::move(weights) : on_device(weights, device);
  out_ = Tensor::empty(DType::f32, {T, plan.spec.hidden}, device);
}

void SharedLayer::run(const ExecContext& ctx, const TensorView& hidden) {
  experts_.forward(ctx, hidden, ids_.data<int32_t>(), weights_.data<float>(), out_.data<float>());
}

std::unique_ptr<SharedExperts> make_shared_experts(const Plan& plan) {
  switch (plan.shared_strategy) {
    case SharedStrategy::none:
      return nullptr;
    case SharedStrategy::after:
      return std::make_unique<SharedAfter>(plan);
    case SharedStrategy::overlapped:
#ifdef MOEKIT_WITH_CUDA
      if (plan.options.device.kind == DeviceKind::cuda) return make_cuda_shared_overlapped(plan);
#endif
      return std::make_unique<SharedOverlapped>(plan);
  }
  fail(Errc::internal, "unknown shared experts strategy");
}

}  // namespace moekit
