#pragma once
// The benchmark cases of shared/BENCHMARKS.md, and the parsing of what the command line adds to
// them. Every case is a layer of routed experts only (softmax top-k, no groups, no shared
// experts), so that the roofline of BENCHMARKS.md describes all the work it does.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/quant.hpp"
#include "moekit/spec.hpp"
#include "moekit/tensor.hpp"

namespace moekit::bench {

struct BenchCase {
  std::string name;
  ModelSpec spec;
  std::vector<QuantParams> formats;
  std::vector<int64_t> tokens;
  DeviceKind device = DeviceKind::cpu;
  // Token counts timed again with skewed routing (GPU cases): hot experts, uneven groups.
  std::vector<int64_t> skewed_tokens;

  // A layer of E routed experts of hidden H and intermediate I, top-k by softmax.
  static BenchCase Routed(std::string name, int experts, int top_k, int64_t hidden,
                          int64_t intermediate, std::vector<QuantParams> formats,
                          std::vector<int64_t> tokens, DeviceKind device);
  // The case timed at these token counts alone (`moekit bench --tokens`): its skewed rows go too,
  // so that a short run on a device measures what was asked for and nothing else.
  void time_only(std::vector<int64_t> counts);
};

// The headline cases that run on `device`, in the order of BENCHMARKS.md.
std::vector<BenchCase> headline_cases(DeviceKind device);
// The case of that name among `device`'s; invalid_argument naming the cases there are, or the
// device the name belongs to.
BenchCase find_case(std::string_view name, DeviceKind device);

// "1,16,512": token counts, each a positive integer; invalid_argument naming the bad entry.
std::vector<int64_t> parse_token_list(std::string_view text);

// How the router logits of each repeat are drawn.
enum class Routing {
  uniform,  // independent normal logits: every expert equally likely
  skewed,   // a few hot experts, a different few each repeat, get most tokens
};
std::string_view routing_name(Routing routing);
std::optional<Routing> parse_routing(std::string_view name);

}  // namespace moekit::bench
