#pragma once
// moekit bench --a2a mpi: the all-to-all dispatcher's dispatch and combine on every rank, timed
// apart from the experts, with the bytes each moved, against the transport's own all-to-all of
// the same bytes measured in the same run (docs/EXPERT_PARALLEL.md).

#include <cstdint>
#include <string>
#include <vector>

#include "moekit/options.hpp"
#include "moekit/platform.hpp"
#include "moekit/spec.hpp"

namespace moekit::bench {

// Collective: every rank of the launcher calls it with the same arguments (and its own rank in
// options.ep). Rank 0 returns the report, the others an empty string.
std::string run_a2a_bench(const ModelSpec& spec, const Options& options, const Platform& platform,
                          const std::vector<int64_t>& tokens, int repeats, uint64_t seed);

}  // namespace moekit::bench
