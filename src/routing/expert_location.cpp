#include "moekit/expert_location.hpp"

#include "moekit/error.hpp"

namespace moekit {

ExpertLocation ExpertLocation::build(int n_logical, const ExpertParallel& ep) {
  if (ep.size < 1 || ep.rank < 0 || ep.rank >= ep.size) {
    fail(Errc::config_refused, "expert parallelism: rank {} is not in [0, {})", ep.rank, ep.size);
  }
  if (ep.redundant < 0) {
    fail(Errc::config_refused, "expert parallelism: redundant experts must be >= 0, got {}",
         ep.redundant);
  }
  ExpertLocation location;
  location.logical = n_logical;
  location.physical = n_logical + ep.redundant;
  location.ep_size = ep.size;
  if (location.physical % ep.size != 0) {
    fail(Errc::config_refused,
         "expert parallelism: {} physical experts ({} routed + {} redundant) do not divide over "
         "ep size {}; choose a redundant count that makes them divide",
         location.physical, n_logical, ep.redundant, ep.size);
  }
  location.physical_to_logical.resize(static_cast<size_t>(location.physical));
  std::vector<std::vector<int>> replicas(static_cast<size_t>(n_logical));
  for (int p = 0; p < location.physical; ++p) {
    const int logical = p % n_logical;
    location.physical_to_logical[p] = logical;
    replicas[logical].push_back(p);
  }
  location.rank_table.assign(static_cast<size_t>(ep.size),
                             std::vector<int>(static_cast<size_t>(n_logical)));
  for (int rank = 0; rank < ep.size; ++rank) {
    for (int logical = 0; logical < n_logical; ++logical) {
      const std::vector<int>& candidates = replicas[logical];
      int chosen = candidates[static_cast<size_t>(rank) % candidates.size()];
      for (int p : candidates) {
        if (location.owner(p) == rank) chosen = p;
      }
      location.rank_table[rank][logical] = chosen;
    }
  }
  return location;
}

}  // namespace moekit
