#include <algorithm>

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "bench/gpu_bench.hpp"

namespace moekit::bench {

double GpuCeilings::peak_for(const QuantParams& format) const {
  const bool fp8 =
      format.weight_dtype == DType::f8e4m3 && format.activation != ActivationQuant::none;
  return fp8 && fp8_flops_per_s > 0 ? fp8_flops_per_s : bf16_flops_per_s;
}

Ceilings GpuCeilings::as_ceilings(const QuantParams& format) const {
  return Ceilings::Known(1, SimdIsa::portable, read_bytes_per_s, peak_for(format));
}

GpuCaseResult gpu_result(const BenchCase& bench_case, const QuantParams& format, int64_t tokens,
                         Routing routing, const GpuCeilings& gpu, std::vector<double> seconds,
                         int distinct_experts) {
  GpuCaseResult r;
  r.case_name = bench_case.name;
  r.spec = bench_case.spec;
  r.format = format;
  r.tokens = tokens;
  r.routing = routing;
  r.graph = tokens <= kGraphMaxTokens;
  r.timing = Timing::Of(std::move(seconds));
  r.distinct_experts = distinct_experts;
  r.expected_distinct_experts =
      expected_distinct_experts(r.spec.n_experts, r.spec.routing.top_k, tokens);
  r.peak_flops_per_s = gpu.peak_for(format);
  r.roofline = Roofline::Of(r.spec, format, tokens, distinct_experts, DType::bf16,
                            gpu.as_ceilings(format), ComputePeak::fma);
  return r;
}

bool GpuReport::all_ok() const {
  return !results.empty() &&
         std::all_of(results.begin(), results.end(), [](const GpuCaseResult& r) { return r.ok; });
}

std::string GpuReport::table() const {
  std::string text = fmt::format(
      "gpu: {}, L2 {} MiB; read bandwidth {:.2f} TB/s (read-only kernel over {} MiB, median of "
      "{}); tensor-core peaks bf16 {:.0f} TFLOP/s, fp8 {:.0f} TFLOP/s ({}; mma.sync reaches "
      "{:.0f} and {:.0f})\n",
      gpu.name, gpu.l2_bytes >> 20, gpu.read_bytes_per_s * 1e-12, gpu.read_bytes >> 20,
      gpu.read_passes, gpu.bf16_flops_per_s * 1e-12, gpu.fp8_flops_per_s * 1e-12, gpu.peak_method,
      gpu.mma_bf16_flops_per_s * 1e-12, gpu.mma_fp8_flops_per_s * 1e-12);
  text += fmt::format(
      "{:<14} {:<10} {:<7} {:>5} {:>5} {:>10} {:>10} {:>4} {:>10} {:>10} {:>7} {:>6} {:>8} "
      "{:<7} {:>8} {}\n",
      "case", "weights", "routing", "T", "graph", "median us", "min us", "n", "D (unif.)",
      "floor us", "floor%", "TB/s", "TFLOP/s", "bound", "error", "check");
  for (const GpuCaseResult& r : results) {
    text += fmt::format(
        "{:<14} {:<10} {:<7} {:>5} {:>5} {:>10.1f} {:>10.1f} {:>4} {:>4} ({:>3.0f}) {:>10.1f} "
        "{:>6.1f}% {:>6.2f} {:>8.1f} {:<7} {:>8.1e} {}\n",
        r.case_name, r.format.name(), routing_name(r.routing), r.tokens, r.graph ? "yes" : "no",
        r.timing.median_s * 1e6, r.timing.min_s * 1e6, r.timing.repeats, r.distinct_experts,
        r.expected_distinct_experts, r.roofline.floor_s * 1e6, 100.0 * r.floor_ratio(),
        r.bytes_per_s() * 1e-12, r.flops_per_s() * 1e-12, bound_name(r.roofline.bound), r.error,
        r.ok ? "ok" : "FAILED");
  }
  for (const Refusal& r : refusals) {
    text += fmt::format("{:<14} {:<10} {}\n", r.case_name, r.format, r.message);
  }
  return text;
}

std::string GpuReport::summary() const {
  const auto passed =
      std::count_if(results.begin(), results.end(), [](const GpuCaseResult& r) { return r.ok; });
  if (results.empty()) {
    return fmt::format("moekit bench cuda: no results, {} refused", refusals.size());
  }
  std::vector<double> ratios;
  for (const GpuCaseResult& r : results) ratios.push_back(100.0 * r.floor_ratio());
  std::sort(ratios.begin(), ratios.end());
  return fmt::format(
      "moekit bench cuda: {}/{} checked ok, {} refused; % of floor min {:.0f}, median {:.0f}, "
      "max {:.0f}",
      passed, results.size(), refusals.size(), ratios.front(), ratios[ratios.size() / 2],
      ratios.back());
}

std::string GpuReport::json() const {
  using Json = nlohmann::ordered_json;
  Json out;
  out["gpu"] = {{"name", gpu.name},
                {"l2_bytes", gpu.l2_bytes},
                {"read_bandwidth_tbs", gpu.read_bytes_per_s * 1e-12},
                {"bf16_peak_tflops", gpu.bf16_flops_per_s * 1e-12},
                {"fp8_peak_tflops", gpu.fp8_flops_per_s * 1e-12},
                {"mma_bf16_peak_tflops", gpu.mma_bf16_flops_per_s * 1e-12},
                {"mma_fp8_peak_tflops", gpu.mma_fp8_flops_per_s * 1e-12},
                {"peak_method", gpu.peak_method}};
  Json list = Json::array();
  for (const GpuCaseResult& r : results) {
    list.push_back({{"case", r.case_name},
                    {"experts", r.spec.n_experts},
                    {"top_k", r.spec.routing.top_k},
                    {"hidden", r.spec.hidden},
                    {"intermediate", r.spec.intermediate},
                    {"weights", r.format.name()},
                    {"tokens", r.tokens},
                    {"routing", routing_name(r.routing)},
                    {"path", r.path},
                    {"graph", r.graph},
                    {"median_us", r.timing.median_s * 1e6},
                    {"min_us", r.timing.min_s * 1e6},
                    {"max_us", r.timing.max_s * 1e6},
                    {"repeats", r.timing.repeats},
                    {"distinct_experts", r.distinct_experts},
                    {"expected_distinct_experts", r.expected_distinct_experts},
                    {"bytes", r.roofline.bytes},
                    {"flops", r.roofline.flops},
                    {"peak_tflops", r.peak_flops_per_s * 1e-12},
                    {"floor_us", r.roofline.floor_s * 1e6},
                    {"floor_ratio", r.floor_ratio()},
                    {"tbs", r.bytes_per_s() * 1e-12},
                    {"tflops", r.flops_per_s() * 1e-12},
                    {"bound", bound_name(r.roofline.bound)},
                    {"error", r.error},
                    {"checked_tokens", r.checked_tokens},
                    {"ok", r.ok}});
  }
  out["results"] = std::move(list);
  Json refused = Json::array();
  for (const Refusal& r : refusals) {
    refused.push_back({{"case", r.case_name}, {"weights", r.format}, {"message", r.message}});
  }
  out["refusals"] = std::move(refused);
  return out.dump(1) + "\n";
}

}  // namespace moekit::bench
