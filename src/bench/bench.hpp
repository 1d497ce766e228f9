#pragma once
// Times whole MoE layers (routing to combined output) against the machine's measured ceilings,
// and checks each timed layer against the float64 reference runner in the same run.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/cases.hpp"
#include "bench/ceilings.hpp"
#include "bench/roofline.hpp"
#include "moekit/options.hpp"
#include "moekit/platform.hpp"

namespace moekit::bench {

struct BenchSettings {
  int repeats = 20;
  int warmup = 2;
  // Seconds of timed forwards per (case, format, T) after which a slow case stops repeating,
  // once it has kMinRepeats.
  double budget_s = 30.0;
  Routing routing = Routing::uniform;
  uint64_t seed = 2024;
  // Bytes read between repeats to push the layer out of the caches; 0: four times the
  // last-level cache, at least 64 MiB.
  int64_t flush_bytes = 0;
};

inline constexpr int kMinRepeats = 3;
// Tokens of each batch that are checked against the reference runner.
inline constexpr int64_t kCheckedTokens = 4;
// Relative L2 error allowed for bf16 outputs: a few bf16 ulps on the sum.
inline constexpr double kBf16Tolerance = 2e-2;
// Below this share of its threads' CPU time during the ceilings, a run warns that it is sharing
// the machine.
inline constexpr double kBusyShare = 0.9;

struct Timing {
  double median_s = 0.0;
  double min_s = 0.0;
  double max_s = 0.0;
  int repeats = 0;

  static Timing Of(std::vector<double> seconds);
};

struct CaseResult {
  std::string case_name;
  ModelSpec spec;
  QuantParams format;
  int64_t tokens = 0;
  std::string runner;  // the plan's runner
  std::string path;    // the fused op, or the core and its format
  Routing routing = Routing::uniform;
  Timing timing;
  int distinct_experts = 0;  // median over the timed repeats
  double expected_distinct_experts = 0.0;
  Roofline roofline;              // its bandwidth floor from read_bytes_per_s
  double read_bytes_per_s = 0.0;  // median of the reads timed between this case's repeats
  // The read right before the first timed repeat and one right after the last: how far the
  // machine's bandwidth moved while the case ran.
  double read_before_bytes_per_s = 0.0;
  double read_after_bytes_per_s = 0.0;
  double error = 0.0;  // relative L2 against the reference, on the first kCheckedTokens tokens
  bool ok = false;

  double floor_ratio() const { return roofline.floor_s / timing.median_s; }
  double bytes_per_s() const { return static_cast<double>(roofline.bytes) / timing.median_s; }
  double flops_per_s() const { return roofline.flops / timing.median_s; }
};

// A format of a case that resolve() refused on this machine.
struct Refusal {
  std::string case_name;
  std::string format;
  std::string message;
};

struct BenchReport {
  Ceilings machine;
  std::vector<CaseResult> results;
  std::vector<Refusal> refusals;
  double setup_s = 0.0;  // making weights and building layers, outside the ceilings and timing

  bool all_ok() const;
  // The results as a text table, with the ceilings they are measured against.
  std::string table() const;
  // {"machine": {...}, "results": [...]}, the shape the comparison scripts read.
  std::string json() const;
};

// Where a run says what it is doing: notes (setup times, refusals) and progress (one line per
// repeat, meant to be overwritten).
struct BenchLog {
  std::function<void(const std::string&)> note;
  std::function<void(const std::string&)> progress;
};

// Runs every format and token count of `bench_case`, appending to `report` (whose ceilings the
// roofline uses). `options` gives the runner, threads and the rest; its weights and max_tokens
// are set for each run: one plan per (format, T), planned for a batch of T.
void run_case(const BenchCase& bench_case, const Options& options, const Platform& platform,
              const BenchSettings& settings, const BenchLog& log, BenchReport& report);

}  // namespace moekit::bench
