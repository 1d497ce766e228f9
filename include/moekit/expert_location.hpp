#pragma once
// Logical experts (the model's) to physical expert slots (what ranks hold). With redundant
// replicas one logical expert lives in several physical slots; a static table per source rank
// says which replica serves that rank's tokens.

#include <vector>

#include "moekit/options.hpp"

namespace moekit {

struct ExpertLocation {
  int logical = 0;
  int physical = 0;
  int ep_size = 1;
  std::vector<int> physical_to_logical;      // [physical]
  std::vector<std::vector<int>> rank_table;  // [source rank][logical] -> physical

  // Physical slots [0, logical) hold the logical experts in order; slot logical + j holds a
  // replica of logical expert j % logical. A source rank uses the replica it owns, if any, and
  // otherwise spreads over the replicas by its rank. Throws config_refused when the physical
  // experts do not divide evenly over the ranks.
  static ExpertLocation build(int n_logical, const ExpertParallel& ep);

  int per_rank() const { return physical / ep_size; }
  int owner(int physical_id) const { return physical_id / per_rank(); }
};

}  // namespace moekit
