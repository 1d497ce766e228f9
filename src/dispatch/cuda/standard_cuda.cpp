// The standard dispatcher on a GPU: the same map as standard.cpp, as a kernel on the caller's
// stream over a device copy of the table, or, where the plan fuses the map into the runner's
// sort (Plan::fusions.map_in_sort), the table handed on with the global ids. In the reduce form (a
// communicator of device buffers, NCCL) it agrees with the other ranks first, through device copies
// of the (status, tokens) pairs, and combine() sums the partial outputs over the ranks on the
// layer's stream: each exchange waited for on the host (normal), or, for decode batches
// (enqueued_reduce), enqueued with the agreement checked by a kernel and reported by
// synchronize(), so that a CUDA graph captures the layer.

#include <cuda_runtime_api.h>

#include <optional>
#include <string>
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
                             problem.device)),
        enqueued_(enqueued_reduce(problem)) {
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
    if (enqueued_) {
      reports_ = Tensor::empty(DType::i8, {p_.comm->size() * kReportBytes}, p_.device);
      reports_.fill_bytes(0);
    }
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
    if (enqueued_) {
      tokens_ = hidden.dim(0);
      enqueue_agreement(ctx, a, kRankReady, hidden.dim(0));
      dispatch::cuda::check_agreement(a.pairs_in, p_.comm->size(), kRankReady, hidden.dim(0),
                                      reports(), ctx.stream);
    } else if (p_.comm != nullptr) {
      agree(ctx, a, kRankReady, hidden.dim(0));
    }
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
    const CommStep step{kReduceStep, p_.timeout_ms};
    if (enqueued_) {
      // combined has room for max_tokens rows (the layer's routed sum): the rows past this batch
      // are summed too, and never read.
      p_.comm->enqueue_all_reduce_sum(ctx, combined, p_.max_received_tokens * p_.hidden,
                                      carve_at(scratch).reduce, step);
      return;
    }
    p_.comm->all_reduce_sum(ctx, combined, dispatched.tokens * p_.hidden, carve_at(scratch).reduce,
                            step);
  }

  // Enqueued: the failed pair, then the sum the others wait in (over idle rows), then a wait.
  void abandon(const ExecContext& ctx, void* scratch) override {
    if (p_.comm == nullptr) return;
    const StandardScratch a = carve_at(scratch);
    if (!enqueued_) {
      agree(ctx, a, kRankFailed, 0);
      return;
    }
    enqueue_agreement(ctx, a, kRankFailed, 0);
    p_.comm->enqueue_all_reduce_sum(ctx, a.idle_rows, p_.max_received_tokens * p_.hidden, a.reduce,
                                    {kReduceStep, p_.timeout_ms});
    p_.comm->wait(ctx, {kReduceStep, p_.timeout_ms});
  }

  void synchronize(const ExecContext& ctx, void*) override {
    if (!enqueued_) return;
    p_.comm->wait(ctx, {kReduceStep, p_.timeout_ms});
    const int size = p_.comm->size();
    std::vector<dispatch::cuda::AgreementReport> found(static_cast<size_t>(size));
    const auto bytes = static_cast<size_t>(size * kReportBytes);
    check(cudaMemcpyAsync(found.data(), reports(), bytes, cudaMemcpyDeviceToHost, ctx.stream));
    check(cudaMemsetAsync(reports(), 0, bytes, ctx.stream));
    check(cudaStreamSynchronize(ctx.stream));
    std::string refused;
    for (int r = 0; r < size; ++r) {
      if (found[r].kind == dispatch::cuda::kAgreementRefused) {
        refused += (refused.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    if (!refused.empty()) {
      fail(Errc::comm, "rank {}: rank(s) {} refused their input (see their message) in step '{}'",
           p_.comm->rank(), refused, kAgreementStep);
    }
    for (int r = 0; r < size; ++r) {
      if (found[r].kind == dispatch::cuda::kAgreementTokens) {
        fail(Errc::invalid_argument,
             "rank {}: a2a none across processes needs every rank to pass the same tokens, but "
             "this rank has {} and rank {} has {}",
             p_.comm->rank(), tokens_, r, found[r].detail);
      }
    }
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

  // This rank's (status, tokens) pair to every rank, written and exchanged on the stream.
  void enqueue_agreement(const ExecContext& ctx, const StandardScratch& a, int64_t status,
                         int64_t tokens) {
    prepare_agreement(*arrays_, pairs_out_.data(), status, tokens);
    dispatch::cuda::write_agreement(a.pairs_out, p_.comm->size(), status, tokens, ctx.stream);
    p_.comm->enqueue_all_to_all(ctx, arrays_->view(a.pairs_out, a.pairs_in),
                                {kAgreementStep, p_.timeout_ms});
  }

  dispatch::cuda::AgreementReport* reports() const {
    return static_cast<dispatch::cuda::AgreementReport*>(reports_.view().data);
  }

  static constexpr auto kReportBytes =
      static_cast<int64_t>(sizeof(dispatch::cuda::AgreementReport));

  int64_t max_entries() const { return p_.max_received_tokens * p_.columns; }

  DispatcherProblem p_;
  Tensor table_;
  std::optional<ExchangeArrays> arrays_;
  std::vector<int64_t> pairs_out_, pairs_in_;  // host copies of the pairs
  bool enqueued_;                              // enqueued_reduce(p_)
  int64_t tokens_ = 0;                         // enqueued: the last batch's, for its report
  Tensor reports_;  // enqueued: [size] AgreementReport, kept until synchronize() reads them
};

}  // namespace

std::unique_ptr<Dispatcher> make_cuda_standard_dispatcher(const DispatcherProblem& problem) {
  return std::make_unique<CudaStandardDispatcher>(problem);
}

}  // namespace moekit
