#pragma once
// `moekit bench --device cuda`: whole MoE layers on a GPU, timed with CUDA events (CUDA-graph
// replay for small batches) against that GPU's read bandwidth and tensor-core peaks measured in
// the same run, each checked against the float64 reference runner. The report (table, JSON,
// roofline) builds without CUDA; the run itself (src/bench/cuda/) needs it.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench.hpp"

struct CUstream_st;

namespace moekit::bench {

// Batches of at most this many tokens are captured once in a CUDA graph and replayed: what a
// serving engine does for decode, where launch overhead would otherwise be most of the time.
inline constexpr int64_t kGraphMaxTokens = 64;

struct GpuCeilings {
  std::string name;  // the GPU's
  int64_t l2_bytes = 0;
  double read_bytes_per_s = 0.0;  // a read-only kernel over read_bytes, median of read_passes
  // The dense tensor-core peaks the floors use (f32 accumulation; fp8 0: none): cuBLASLt's where
  // it could be measured, else the mma.sync figures below.
  double bf16_flops_per_s = 0.0;
  double fp8_flops_per_s = 0.0;
  // mma.sync chains in registers: the instructions the cuda runner's GEMMs use.
  double mma_bf16_flops_per_s = 0.0;
  double mma_fp8_flops_per_s = 0.0;
  std::string peak_method;  // how the peaks were measured
  int64_t read_bytes = 0;
  int read_passes = 0;

  // The compute ceiling of a format: fp8 for e4m3 weights with fp8 activations, else bf16.
  double peak_for(const QuantParams& format) const;
  // As Ceilings, for Roofline::Of.
  Ceilings as_ceilings(const QuantParams& format) const;
};

struct GpuCaseResult {
  std::string case_name;
  ModelSpec spec;
  QuantParams format;
  int64_t tokens = 0;
  Routing routing = Routing::uniform;
  std::string path;  // the plan's GEMM kernels for this T
  bool graph = false;
  Timing timing;
  int distinct_experts = 0;
  double expected_distinct_experts = 0.0;
  Roofline roofline;
  double peak_flops_per_s = 0.0;  // the compute ceiling used
  double error = 0.0;
  int64_t checked_tokens = 0;
  bool ok = false;

  double floor_ratio() const { return roofline.floor_s / timing.median_s; }
  double bytes_per_s() const { return static_cast<double>(roofline.bytes) / timing.median_s; }
  double flops_per_s() const { return roofline.flops / timing.median_s; }
};

struct GpuReport {
  GpuCeilings gpu;
  std::vector<GpuCaseResult> results;
  std::vector<Refusal> refusals;
  double setup_s = 0.0;

  bool all_ok() const;
  std::string table() const;
  // One line: how many results passed their check, and the spread of % of floor.
  std::string summary() const;
  std::string json() const;
};

// The result of one timed (case, format, T, routing): its roofline from the distinct experts.
GpuCaseResult gpu_result(const BenchCase& bench_case, const QuantParams& format, int64_t tokens,
                         Routing routing, const GpuCeilings& gpu, std::vector<double> seconds,
                         int distinct_experts);

// Measures the ceilings on GPU `device` (read_bytes: the array the read kernel sweeps).
GpuCeilings measure_gpu_ceilings(int device, int64_t read_bytes, int passes);

// Runs every format, token count and skewed token count of `cases` on options.device; consecutive
// cases of one layer shape share one layer per format.
// `after_each` sees the report after every result (to save it as it grows: a run cut short keeps
// what it measured).
void run_gpu_cases(const std::vector<BenchCase>& cases, const Options& options,
                   const Platform& platform, const BenchSettings& settings, const BenchLog& log,
                   GpuReport& report, const std::function<void(const GpuReport&)>& after_each = {});

// Seconds of each of `repeats` calls of `enqueue` on a stream of GPU `device`, timed with CUDA
// events, after `warmup` untimed calls; the stream is synchronised before it returns.
std::vector<double> time_on_gpu(int device, int warmup, int repeats,
                                const std::function<void(CUstream_st*)>& enqueue);

}  // namespace moekit::bench
