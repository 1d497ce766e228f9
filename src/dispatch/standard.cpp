// The standard dispatcher (a2a none): rows stay on this rank in token order. Under expert
// parallelism it maps each global expert id to this rank's slot, or -1 for an expert held
// elsewhere; the ranks' partial outputs are then summed by the caller (all-reduce, or a test).
// The runner writes the weighted sum straight into the combined output, so combine() has
// nothing left to move. On a GPU the map is a kernel (cuda/standard_cuda.cpp).

#include <fmt/format.h>

#include "core/scratch.hpp"
#include "dispatch/dispatcher.hpp"
#include "moekit/error.hpp"

namespace moekit {
namespace {

class StandardDispatcher final : public Dispatcher {
 public:
  explicit StandardDispatcher(const DispatcherProblem& problem) : p_(problem) {}

  int64_t scratch_bytes() const override {
    ScratchCarver counter;
    counter.take<int32_t>(max_entries());
    return counter.bytes();
  }

  DispatchOutput dispatch(const ExecContext&, const TensorView& hidden, const int32_t* global_ids,
                          const float* weights, float* combined, void* scratch) override {
    const int64_t entries = hidden.dim(0) * p_.columns;
    if (entries > max_entries()) {
      fail(Errc::internal, "dispatch of {} entries exceeds the {} planned", entries, max_entries());
    }
    ScratchCarver carver(scratch);
    int32_t* local_ids = carver.take<int32_t>(max_entries());
    const auto n_global = static_cast<int32_t>(p_.global_to_local.size());
    for (int64_t e = 0; e < entries; ++e) {
      const int32_t id = global_ids[e];
      if (id < 0 || id >= n_global) fail(Errc::internal, "routed expert id {} out of range", id);
      local_ids[e] = p_.global_to_local[id];
    }
    return {hidden, local_ids, weights, hidden.dim(0), p_.columns, combined};
  }

  void combine(const ExecContext&, const DispatchOutput&, float*, void*) override {}

 private:
  int64_t max_entries() const { return p_.max_received_tokens * p_.columns; }

  DispatcherProblem p_;
};

}  // namespace

Capability standard_supports(const Deployment& deployment) {
#ifndef MOEKIT_WITH_CUDA
  if (deployment.options.device.kind != DeviceKind::cpu) {
    return Capability::No(
        "this build of moekit has no CUDA: the standard dispatcher maps "
        "expert ids on the CPU only");
  }
#endif
  return Capability::Yes(
      deployment.options.ep.size == 1
          ? "a2a none, one rank: rows stay here and every expert id is local"
          : "a2a none: rows stay here; global expert ids map to this rank's slots or -1, and the "
            "ranks' partial outputs add up to the layer's output");
}

int64_t standard_max_received_tokens(const Options& options) {
  return options.max_tokens;
}

std::unique_ptr<Dispatcher> make_standard_dispatcher(const DispatcherProblem& problem) {
#ifdef MOEKIT_WITH_CUDA
  if (problem.device.kind == DeviceKind::cuda) return make_cuda_standard_dispatcher(problem);
#endif
  return std::make_unique<StandardDispatcher>(problem);
}

}  // namespace moekit
