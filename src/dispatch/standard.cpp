// The standard dispatcher (a2a none): rows stay on this rank in token order. Under expert
// parallelism it maps each global expert id to this rank's slot, or -1 for an expert held
// elsewhere. Within one process the ranks' partial outputs are then summed by the caller (a
// test); across processes (the reduce form: a communicator in the problem) dispatch() first
// checks that every rank is ready with the same tokens, and combine() sums the partial outputs
// over the ranks in rank order, so every rank returns the layer's output. The runner writes the
// weighted sum straight into the combined output, so combine() otherwise has nothing to move.
// On a GPU the map is a kernel and the reduce form's exchanges go over NCCL
// (cuda/standard_cuda.cpp).

#include <cstring>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "core/scratch.hpp"
#include "dispatch/dispatcher.hpp"
#include "moekit/error.hpp"

namespace moekit {
namespace {

class StandardDispatcher final : public Dispatcher {
 public:
  explicit StandardDispatcher(const DispatcherProblem& problem) : p_(problem) {
    if (p_.comm != nullptr) arrays_.emplace(p_.comm->size());
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
    int32_t* local_ids = a.local_ids;
    const auto n_global = static_cast<int32_t>(p_.global_to_local.size());
    for (int64_t e = 0; e < entries; ++e) {
      const int32_t id = global_ids[e];
      if (id < 0 || id >= n_global) fail(Errc::internal, "routed expert id {} out of range", id);
      local_ids[e] = p_.global_to_local[id];
    }
    return {hidden, local_ids, weights, hidden.dim(0), p_.columns, combined};
  }

  void combine(const ExecContext& ctx, const DispatchOutput& dispatched, float* combined,
               void* scratch) override {
    if (p_.comm == nullptr) return;
    const StandardScratch a = carve_at(scratch);
    p_.comm->all_reduce_sum(ctx, combined, dispatched.tokens * p_.hidden, a.reduce,
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

  void agree(const ExecContext& ctx, const StandardScratch& a, int64_t status, int64_t tokens) {
    const CommStep step{kAgreementStep, p_.timeout_ms};
    prepare_agreement(*arrays_, a.pairs_out, status, tokens);
    p_.comm->all_to_all(ctx, arrays_->view(a.pairs_out, a.pairs_in), step);
    if (status == kRankReady) check_agreement(*p_.comm, a.pairs_in, tokens, step);
  }

  int64_t max_entries() const { return p_.max_received_tokens * p_.columns; }

  DispatcherProblem p_;
  std::optional<ExchangeArrays> arrays_;
};

}  // namespace

StandardScratch StandardScratch::carve(ScratchCarver& c, const DispatcherProblem& p) {
  const int size = p.comm != nullptr ? p.comm->size() : 0;
  const int64_t reduce =
      p.comm != nullptr ? p.comm->all_reduce_scratch(p.max_received_tokens * p.hidden) : 0;
  return {c.take<int32_t>(p.max_received_tokens * p.columns), c.take<int64_t>(2 * size),
          c.take<int64_t>(2 * size), c.take<float>(reduce),
          c.take<float>(enqueued_reduce(p) ? p.max_received_tokens * p.hidden : 0)};
}

bool enqueued_reduce(const DispatcherProblem& problem) {
  return problem.comm != nullptr && problem.comm->enqueues() &&
         problem.mode == A2AMode::low_latency;
}

// Enqueued only where asked: unlike the all-to-all's low-latency mode it has not run on a GPU
// yet (its tests, CudaReduce and CudaRanks, wait for the next device session).
void standard_decide(Plan& plan) {
  if (plan.comm != CommKind::nccl) return;
  const bool enqueued = plan.options.a2a_mode == A2AMode::low_latency;
  plan.a2a_mode = enqueued ? A2AMode::low_latency : A2AMode::normal;
  const std::string asked = plan.options.a2a_mode == A2AMode::auto_
                                ? "auto: waited for (--a2a-mode low-latency enqueues them)"
                                : "asked";
  plan.decisions.push_back(
      {PlanLayer::dispatcher,
       "reduce exchanges",
       enqueued ? "enqueued (low-latency): a CUDA graph captures them" : "waited for (normal)",
       asked + (enqueued
                    ? fmt::format("; the agreement is checked on the GPU and reported by "
                                  "synchronize(), and every rank sums all {} rows of its buffer "
                                  "whatever its batch, so no exchange's size depends on one",
                                  plan.options.max_tokens)
                    : std::string("; each exchange waits on the host against its deadline, and "
                                  "the sum covers the batch's rows")),
       {{enqueued ? "waited for" : "enqueued",
         enqueued ? "a host synchronisation in every forward, and no CUDA graph"
                  : "max_tokens rows summed whatever the batch"}},
       std::nullopt});
}

int64_t StandardScratch::bytes(const DispatcherProblem& p) {
  ScratchCarver counter;
  carve(counter, p);
  return counter.bytes();
}

void prepare_agreement(ExchangeArrays& arrays, int64_t* pairs_out, int64_t status, int64_t tokens) {
  constexpr auto kPair = static_cast<int64_t>(2 * sizeof(int64_t));
  for (size_t r = 0; r < arrays.send_bytes.size(); ++r) {
    pairs_out[2 * r] = status;
    pairs_out[2 * r + 1] = tokens;
    arrays.send_offsets[r] = static_cast<int64_t>(r) * kPair;
    arrays.send_bytes[r] = kPair;
    arrays.recv_offsets[r] = static_cast<int64_t>(r) * kPair;
    arrays.recv_capacity[r] = kPair;
  }
}

void check_agreement(const Communicator& comm, const int64_t* pairs_in, int64_t tokens,
                     const CommStep& step) {
  const int size = comm.size(), me = comm.rank();
  std::string failed;
  for (int r = 0; r < size; ++r) {
    if (pairs_in[2 * r] != kRankReady) failed += (failed.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!failed.empty()) {
    fail(Errc::comm, "rank {}: rank(s) {} refused their input (see their message) in step '{}'", me,
         failed, step.name);
  }
  for (int r = 0; r < size; ++r) {
    if (pairs_in[2 * r + 1] != tokens) {
      fail(Errc::invalid_argument,
           "rank {}: a2a none across processes needs every rank to pass the same tokens, but "
           "this rank has {} and rank {} has {}",
           me, tokens, r, pairs_in[2 * r + 1]);
    }
  }
}

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
