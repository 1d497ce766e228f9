#include <algorithm>

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "bench/bench.hpp"

namespace moekit::bench {

namespace {

// The bf16 dot-product peak, where the machine has one: bf16 x bf16 GEMM cases are measured
// against it.
std::string bf16_dot_peak_text(const Ceilings& machine) {
  if (machine.bf16_dot_flops_per_s <= 0) return "";
  return fmt::format(
      ", bf16 dot-product peak {:.1f} GFLOP/s (avx512-bf16; the compute ceiling of "
      "bf16 weights)",
      machine.bf16_dot_flops_per_s * 1e-9);
}

// The int8 dot-product peak, where the machine has one: int4-group-a8's GEMM cases are measured
// against it.
std::string int8_dot_peak_text(const Ceilings& machine) {
  if (machine.int8_dot_ops_per_s <= 0) return "";
  return fmt::format(
      ", int8 dot-product peak {:.1f} GOP/s ({}; the compute ceiling of int4-group-a8)",
      machine.int8_dot_ops_per_s * 1e-9, simd_isa_name(machine.int8_isa));
}

}  // namespace

std::string BenchReport::table() const {
  std::string text = fmt::format(
      "machine: {} threads, read bandwidth {:.1f} GB/s, fp32 FMA peak {:.1f} GFLOP/s ({}){}{}\n",
      machine.threads, machine.read_bytes_per_s * 1e-9, machine.fma_flops_per_s * 1e-9,
      simd_isa_name(machine.isa), bf16_dot_peak_text(machine), int8_dot_peak_text(machine));
  if (machine.cpu_share < kBusyShare) {
    text += fmt::format(
        "warning: this process had {:.0f}% of {} threads while measuring the ceilings: other "
        "work shares the machine, so every figure below is low and unreliable\n",
        100.0 * machine.cpu_share, machine.threads);
  }
  text += fmt::format(
      "{:<18} {:<13} {:>5} {:<14} {:>9} {:>9} {:>9} {:>4} {:>11} {:>7} {:>13} {:>9} {:>7} "
      "{:>7} {:>8} {:<7} {:>8} {}\n",
      "case", "weights", "T", "path", "median ms", "min ms", "max ms", "n", "D (unif.)", "read BW",
      "before/after", "floor ms", "floor%", "GB/s", "GFLOP/s", "bound", "error", "check");
  for (const CaseResult& r : results) {
    text += fmt::format(
        "{:<18} {:<13} {:>5} {:<14} {:>9.3f} {:>9.3f} {:>9.3f} {:>4} {:>4} ({:>5.1f}) {:>7.1f} "
        "{:>6.1f}/{:<6.1f} {:>9.3f} {:>6.1f}% {:>7.1f} {:>8.1f} {:<7} {:>8.1e} {}\n",
        r.case_name, r.format.name(), r.tokens, r.path, r.timing.median_s * 1e3,
        r.timing.min_s * 1e3, r.timing.max_s * 1e3, r.timing.repeats, r.distinct_experts,
        r.expected_distinct_experts, r.read_bytes_per_s * 1e-9, r.read_before_bytes_per_s * 1e-9,
        r.read_after_bytes_per_s * 1e-9, r.roofline.floor_s * 1e3, 100.0 * r.floor_ratio(),
        r.bytes_per_s() * 1e-9, r.flops_per_s() * 1e-9, bound_name(r.roofline.bound), r.error,
        r.ok ? "ok" : "FAILED");
  }
  const auto beats_floor = std::count_if(results.begin(), results.end(),
                                         [](const CaseResult& r) { return r.floor_ratio() > 1.0; });
  if (beats_floor > 0) {
    text += fmt::format(
        "warning: {} result(s) ran faster than the floor: the ceilings were measured low (a busy "
        "machine?) or the layer skipped work\n",
        beats_floor);
  }
  for (const Refusal& r : refusals) {
    text += fmt::format("{:<18} {:<13} {}\n", r.case_name, r.format, r.message);
  }
  return text;
}

std::string BenchReport::json() const {
  using Json = nlohmann::ordered_json;
  Json out;
  out["machine"] = {{"threads", machine.threads},
                    {"isa", simd_isa_name(machine.isa)},
                    {"read_bandwidth_gbs", machine.read_bytes_per_s * 1e-9},
                    {"fma_peak_gflops", machine.fma_flops_per_s * 1e-9},
                    {"bf16_dot_peak_gflops", machine.bf16_dot_flops_per_s * 1e-9},
                    {"int8_dot_peak_gops", machine.int8_dot_ops_per_s * 1e-9},
                    {"int8_dot_isa", simd_isa_name(machine.int8_isa)}};
  Json list = Json::array();
  for (const CaseResult& r : results) {
    list.push_back({{"case", r.case_name},
                    {"experts", r.spec.n_experts},
                    {"top_k", r.spec.routing.top_k},
                    {"hidden", r.spec.hidden},
                    {"intermediate", r.spec.intermediate},
                    {"weights", r.format.name()},
                    {"tokens", r.tokens},
                    {"runner", r.runner},
                    {"routing", routing_name(r.routing)},
                    {"median_ms", r.timing.median_s * 1e3},
                    {"min_ms", r.timing.min_s * 1e3},
                    {"max_ms", r.timing.max_s * 1e3},
                    {"repeats", r.timing.repeats},
                    {"distinct_experts", r.distinct_experts},
                    {"expected_distinct_experts", r.expected_distinct_experts},
                    {"bytes", r.roofline.bytes},
                    {"flops", static_cast<int64_t>(r.roofline.flops)},
                    {"read_bandwidth_gbs", r.read_bytes_per_s * 1e-9},
                    {"read_bandwidth_before_gbs", r.read_before_bytes_per_s * 1e-9},
                    {"read_bandwidth_after_gbs", r.read_after_bytes_per_s * 1e-9},
                    {"floor_ms", r.roofline.floor_s * 1e3},
                    {"floor_ratio", r.floor_ratio()},
                    {"gbs", r.bytes_per_s() * 1e-9},
                    {"gflops", r.flops_per_s() * 1e-9},
                    {"bound", bound_name(r.roofline.bound)},
                    {"error", r.error},
                    {"ok", r.ok}});
  }
  out["results"] = std::move(list);
  return out.dump(1) + "\n";
}

}  // namespace moekit::bench
