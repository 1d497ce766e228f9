// The standard dispatcher on a GPU: the same map as standard.cpp, as a kernel on the caller's
// stream over a device copy of the table, or, where the plan fuses the map into the runner's
// sort (Plan::fusions.map_in_sort), the table handed on with the global ids. In the reduce form (a
// communicator of device buffers, NCCL) it agrees with the other ranks first, through device copies
// of the (status, tokens) pairs, and combine() sums the partial outputs over the ranks on the
// layer's stream.

#include <cuda_runtime_api.h>

#include <optional>
#include <vector>

#include "core/scratch.hpp"
#include "dispatch/cuda/map_kernels.hpp"
#include "dispatch/dispatcher.hpp"
#include "moekit/error.hpp"

namespace moekit {
namespace {

class CudaStandardDispatcher final : public Dispatcher {
 public:
  explicit CudaStandardDispatcher(const DispatcherProblem& problem)
      : p_(problem),
        table_(Tensor::empty(DType::i32, {static_cast<int64_t>(problem.global_to_local.size())},
                             problem.device)) {
    copy(table_, TensorView::contiguous(p_.global_to_local.data(), DType::i32,
                                        {static_cast<int64_t>(p_.global_to_local.size())}));
    if (p_.comm == nullptr) return;
    if (p_.comm->buffers() != DeviceKind::cuda) {
      fail(Errc::internal, "the GPU's reduce form needs a communicator of device buffers, not {}",
           p_.comm->name());
    }
    arrays_.emplace(p_.comm->size());
    pairs_out_.resize(static_cast<size_t>(2 * p_.comm->size()));
    pairs_in_.resize(pairs_out_.size());
  }

  bool collective() const override { return p_.comm != nullptr; }

  int64_t scratch_bytes() const override { return StandardScratch::bytes(p_); }

  DispatchOutput dispatch(const ExecContext& ctx, const TensorView& hidden,
                          const int32_t* global_ids, const float* weights, float* combined,
                          void* scratch) override {
    const int64_t entries = hidden.dim(0) * p_.columns;
    if (entries > max_entries()) {
      fail(Errc::internal, "dispatch of {} entries exceeds the {} planned", entries, max_entries());
    }
    const StandardScratch a = carve_at(scratch);
    if (p_.comm != nullptr) agree(ctx, a, kRankReady, hidden.dim(0));
    const int n_global = static_cast<int>(p_.global_to_local.size());
    if (p_.map_in_runner) {
      // Plan::fusions.map_in_sort: the runner's sort reads the table.
      return {.hidden = hidden,
              .slots = global_ids,
              .weights = weights,
              .tokens = hidden.dim(0),
              .columns = p_.columns,
              .sum = combined,
              .global_to_local = table_.data<int32_t>(),
              .n_global = n_global};
    }
    dispatch::cuda::map_to_local({.global_ids = global_ids,
                                  .global_to_local = table_.data<int32_t>(),
                                  .n_global = n_global,
                                  .entries = entries,
                                  .local_ids = a.local_ids},
                                 ctx.stream);
    return {hidden, a.local_ids, weights, hidden.dim(0), p_.columns, combined};
  }

  void combine(const ExecContext& ctx, const DispatchOutput& dispatched, float* combined,
               void* scratch) override {
    if (p_.comm == nullptr) return;
    p_.comm->all_reduce_sum(ctx, combined, dispatched.tokens * p_.hidden, carve_at(scratch).reduce,
                            {kReduceStep, p_.timeout_ms});
  }

  void abandon(const ExecContext& ctx, void* scratch) override {
    if (p_.comm != nullptr) agree(ctx, carve_at(scratch), kRankFailed, 0);
  }

 private:
  StandardScratch carve_at(void* scratch) const {
    ScratchCarver carver(scratch);
    return StandardScratch::carve(carver, p_);
  }

  // The pairs go up to the device on the layer's stream before the exchange and come back after
  // it (the exchange has waited for the stream, so the copy back is all that is left on it).
  void agree(const ExecContext& ctx, const StandardScratch& a, int64_t status, int64_t tokens) {
    const CommStep step{kAgreementStep, p_.timeout_ms};
    const auto bytes = pairs_out_.size() * sizeof(int64_t);
    prepare_agreement(*arrays_, pairs_out_.data(), status, tokens);
    check(
        cudaMemcpyAsync(a.pairs_out, pairs_out_.data(), bytes, cudaMemcpyHostToDevice, ctx.stream));
    p_.comm->all_to_all(ctx, arrays_->view(a.pairs_out, a.pairs_in), step);
    if (status != kRankReady) return;
    check(cudaMemcpyAsync(pairs_in_.data(), a.pairs_in, bytes, cudaMemcpyDeviceToHost, ctx.stream));
    check(cudaStreamSynchronize(ctx.stream));
    check_agreement(*p_.comm, pairs_in_.data(), tokens, step);
  }

  static void check(cudaError_t status) {
    if (status == cudaSuccess) return;
    cudaGetLastError();
    fail(Errc::internal, "{}: copying the ranks' (status, tokens) pairs failed: {}", kAgreementStep,
         cudaGetErrorString(status));
  }

  int64_t max_entries() const { return p_.max_received_tokens * p_.columns; }

  DispatcherProblem p_;
  Tensor table_;
  std::optional<ExchangeArrays> arrays_;
  std::vector<int64_t> pairs_out_, pairs_in_;  // host copies of the pairs
};

}  // namespace

std::unique_ptr<Dispatcher> make_cuda_standard_dispatcher(const DispatcherProblem& problem) {
  return std::make_unique<CudaStandardDispatcher>(problem);
}

}  // namespace moekit
