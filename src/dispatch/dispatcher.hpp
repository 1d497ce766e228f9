#pragma once
// Layer 3: do these rows leave this rank, and how do results come back? dispatch() turns routed
// global expert ids (and, for an all-to-all, the rows themselves) into what this rank's runner
// reads; combine() returns the runner's weighted sums to the ranks and token order they came
// from. The dispatcher table maps each a2a kind to a dispatcher, its dispatch format and its
// capability check, in the style of the runner's tables.

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "contracts/exec.hpp"
#include "contracts/rows.hpp"
#include "moekit/plan.hpp"
#include "plan/capability.hpp"

namespace moekit {

// What a dispatcher is sized for, fixed when the layer is built.
struct DispatcherProblem {
  int64_t hidden = 0;
  int columns = 0;                       // entries per token (top-k, plus fused shared slots)
  int64_t max_tokens = 0;                // this rank's largest batch
  int64_t max_received_tokens = 0;       // the most tokens whose rows this rank computes per batch
  std::vector<int32_t> global_to_local;  // local slot of each global physical id, or -1
  Device device = Device::cpu();
};

class Dispatcher {
 public:
  virtual ~Dispatcher() = default;
  virtual int64_t scratch_bytes() const = 0;
  // hidden [T, H] with global ids and weights [T, columns]. `combined` [T, H] f32 is where
  // combine() leaves the weighted sum in token order; a dispatcher whose rows stay here lets the
  // runner write it there directly.
  virtual DispatchOutput dispatch(const ExecContext& ctx, const TensorView& hidden,
                                  const int32_t* global_ids, const float* weights, float* combined,
                                  void* scratch) = 0;
  virtual void combine(const ExecContext& ctx, const DispatchOutput& dispatched, float* combined,
                       void* scratch) = 0;
};

struct DispatcherEntry {
  A2AKind a2a;
  DispatcherKind kind;
  DispatchFormat format;
  Capability (*supports)(const Deployment&);
  // The most tokens whose rows a rank's experts compute per batch (its own, plus arrivals).
  int64_t (*max_received_tokens)(const Options&);
  std::unique_ptr<Dispatcher> (*create)(const DispatcherProblem&);
};

const std::vector<DispatcherEntry>& dispatcher_table();
const DispatcherEntry* find_dispatcher(A2AKind a2a);

// The dispatchers' own declarations, one group per file in this folder.
Capability standard_supports(const Deployment& deployment);
int64_t standard_max_received_tokens(const Options& options);
std::unique_ptr<Dispatcher> make_standard_dispatcher(const DispatcherProblem& problem);
#ifdef MOEKIT_WITH_CUDA
std::unique_ptr<Dispatcher> make_cuda_standard_dispatcher(const DispatcherProblem& problem);
#endif

}  // namespace moekit
