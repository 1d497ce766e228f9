#pragma once
// Layer 3: do these rows leave this rank, and how do results come back? dispatch() turns routed
// global expert ids into what this rank's runner reads. The all-to-all dispatchers of a later
// issue add combine(), which returns results to the ranks and token order they came from; rows
// of the standard dispatcher never leave, so the runner's weighted sum is already in place.

#include <cstdint>
#include <vector>

#include "moekit/tensor.hpp"
#include "runner/runner_core.hpp"

namespace moekit {

// The standard dispatcher (a2a none): rows stay on this rank in token order. Under expert
// parallelism it maps each global expert id to this rank's slot, or -1 for an expert held
// elsewhere; the ranks' partial outputs are then summed by the caller (all-reduce, or a test).
class StandardDispatcher {
 public:
  // global_to_local[g] is the local slot of global id g, or -1.
  StandardDispatcher(std::vector<int32_t> global_to_local, int64_t max_entries);

  DispatchOutput dispatch(const TensorView& hidden, const int32_t* global_ids, const float* weights,
                          int columns);

 private:
  std::vector<int32_t> global_to_local_;
  std::vector<int32_t> local_ids_;  // [max_entries], sized once
};

}  // namespace moekit
