// The overlapped block form on a GPU: the shared experts run on a second stream of their own,
// forked from the caller's stream by an event when the routed experts start and joined back by
// another before the output sum, as the seed's dual-stream form does. Both events are recorded
// and waited on the streams, so a forward in this form can be captured in a CUDA graph.

#include <cuda_runtime_api.h>

#include "block/shared_layer.hpp"
#include "block/stages.hpp"
#include "moekit/error.hpp"

namespace moekit {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(Errc::internal, "{}: {}", what, cudaGetErrorString(e));
}

class CudaSharedOverlapped final : public SharedExperts {
 public:
  explicit CudaSharedOverlapped(const Plan& plan) : layer_(plan, 1) {
    check(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventCreateWithFlags(&join_, cudaEventDisableTiming), "cudaEventCreate");
  }
  ~CudaSharedOverlapped() override {
    cudaEventDestroy(join_);
    cudaEventDestroy(fork_);
    cudaStreamDestroy(side_);
  }
  CudaSharedOverlapped(const CudaSharedOverlapped&) = delete;
  CudaSharedOverlapped& operator=(const CudaSharedOverlapped&) = delete;

  void load(int index, const MatrixSource& gate, const MatrixSource& up,
            const MatrixSource& down) override {
    layer_.experts().load(index, gate, up, down);
  }
  void set_input_scales(float w13, float w2) override {
    layer_.experts().set_input_scales(w13, w2);
  }
  void start(const ExecContext& ctx, const TensorView& hidden) override {
    check(cudaEventRecord(fork_, ctx.stream), "cudaEventRecord");
    check(cudaStreamWaitEvent(side_, fork_, 0), "cudaStreamWaitEvent");
    layer_.run({.device = ctx.device, .pool = ctx.pool, .stream = side_}, hidden);
    check(cudaEventRecord(join_, side_), "cudaEventRecord");
  }
  const float* finish(const ExecContext& ctx) override {
    check(cudaStreamWaitEvent(ctx.stream, join_, 0), "cudaStreamWaitEvent");
    return layer_.output();
  }

 private:
  SharedLayer layer_;
  cudaStream_t side_ = nullptr;
  cudaEvent_t fork_ = nullptr;
  cudaEvent_t join_ = nullptr;
};

}  // namespace

std::unique_ptr<SharedExperts> make_cuda_shared_overlapped(const Plan& plan) {
  return std::make_unique<CudaSharedOverlapped>(plan);
}

}  // namespace moekit
