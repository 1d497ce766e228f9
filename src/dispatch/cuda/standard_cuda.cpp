// The standard dispatcher on a GPU: the same map as standard.cpp, as a kernel on the caller's
// stream over a device copy of the table.

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
  }

  int64_t scratch_bytes() const override {
    ScratchCarver counter;
    counter.take<int32_t>(max_entries());
    return counter.bytes();
  }

  DispatchOutput dispatch(const ExecContext& ctx, const TensorView& hidden,
                          const int32_t* global_ids, const float* weights, float* combined,
                          void* scratch) override {
    const int64_t entries = hidden.dim(0) * p_.columns;
    if (entries > max_entries()) {
      fail(Errc::internal, "dispatch of {} entries exceeds the {} planned", entries, max_entries());
    }
    ScratchCarver carver(scratch);
    int32_t* local_ids = carver.take<int32_t>(max_entries());
    dispatch::cuda::map_to_local({.global_ids = global_ids,
                                  .global_to_local = table_.data<int32_t>(),
                                  .n_global = static_cast<int>(p_.global_to_local.size()),
                                  .entries = entries,
                                  .local_ids = local_ids},
                                 ctx.stream);
    return {hidden, local_ids, weights, hidden.dim(0), p_.columns, combined};
  }

  void combine(const ExecContext&, const DispatchOutput&, float*, void*) override {}

 private:
  int64_t max_entries() const { return p_.max_received_tokens * p_.columns; }

  DispatcherProblem p_;
  Tensor table_;
};

}  // namespace

std::unique_ptr<Dispatcher> make_cuda_standard_dispatcher(const DispatcherProblem& problem) {
  return std::make_unique<CudaStandardDispatcher>(problem);
}

}  // namespace moekit
