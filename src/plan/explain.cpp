#include <fmt/format.h>

#include "core/names.hpp"
#include "moekit/error.hpp"
#include "moekit/plan.hpp"

namespace moekit {
namespace {

constexpr NameTable<PlanLayer, 6> kLayers = {
    {PlanLayer::model, "model"},       {PlanLayer::block, "1 block"},
    {PlanLayer::experts, "2 experts"}, {PlanLayer::dispatcher, "3 dispatcher"},
    {PlanLayer::runner, "4 runner"},   {PlanLayer::quant, "5 quant method"}};

}  // namespace

std::string_view plan_layer_name(PlanLayer layer) {
  return name_of(layer, kLayers);
}

std::string_view dispatcher_name(DispatcherKind kind) {
  switch (kind) {
    case DispatcherKind::standard:
      return "standard";
    case DispatcherKind::all_to_all:
      return "all-to-all";
  }
  return "?";
}

std::string_view comm_name(CommKind kind) {
  switch (kind) {
    case CommKind::none:
      return "none";
    case CommKind::mpi:
      return "mpi";
    case CommKind::nccl:
      return "nccl";
  }
  return "?";
}

std::string_view cuda_gemm_kernel_name(CudaGemmKernel kernel) {
  switch (kernel) {
    case CudaGemmKernel::decode:
      return "decode";
    case CudaGemmKernel::prefill:
      return "prefill";
    case CudaGemmKernel::wgmma:
      return "wgmma";
    case CudaGemmKernel::one_token:
      return "one-token";
  }
  return "?";
}

std::string_view dispatch_format_name(DispatchFormat format) {
  switch (format) {
    case DispatchFormat::standard:
      return "standard";
  }
  return "?";
}

std::string_view runner_format_name(RunnerFormat format) {
  switch (format) {
    case RunnerFormat::standard:
      return "standard";
    case RunnerFormat::contiguous:
      return "contiguous";
  }
  return "?";
}

const CudaGemmChoice& CudaKernels::for_tokens(const std::vector<CudaGemmChoice>& runs,
                                              int64_t tokens) {
  for (const CudaGemmChoice& choice : runs) {
    if (tokens <= choice.up_to_tokens) return choice;
  }
  fail(Errc::internal, "no cuda kernel choice for {} tokens (planned up to {})", tokens,
       runs.empty() ? 0 : runs.back().up_to_tokens);
}

std::vector<const Decision*> Plan::fallbacks() const {
  std::vector<const Decision*> found;
  for (const Decision& d : decisions) {
    if (d.fallback) found.push_back(&d);
  }
  return found;
}

std::string Plan::explain() const {
  const Options& o = options;
  std::string text = fmt::format("plan for {}\n", spec.summary());
  text += fmt::format("  platform: {}\n", platform.summary());
  text += fmt::format(
      "  options:  runner={} a2a={} weights={} form={} ep={}/{} (+{} redundant) device={} "
      "strict={} max_tokens={} threads={}\n",
      runner_name(o.runner), a2a_name(o.a2a), o.weights.name(), block_form_name(o.form), o.ep.rank,
      o.ep.size, o.ep.redundant, o.device.str(), o.strict ? "yes" : "no", o.max_tokens, threads);
  if (o.tp.size > 1) text += fmt::format("            tp={}/{}\n", o.tp.rank, o.tp.size);
  for (const Decision& d : decisions) {
    text += fmt::format("  {:<15} {:<15} {}\n", plan_layer_name(d.layer), d.topic, d.choice);
    if (!d.reason.empty()) text += fmt::format("  {:<31} why: {}\n", "", d.reason);
    for (const Rejected& r : d.rejected) {
      text += fmt::format("  {:<31} not {}: {}\n", "", r.candidate, r.reason);
    }
    if (d.fallback) text += fmt::format("  {:<31} FALLBACK: {}\n", "", *d.fallback);
  }
  const auto found = fallbacks();
  text += found.empty()
              ? "  fallbacks: none\n"
              : fmt::format("  fallbacks: {} (--strict would refuse this plan)\n", found.size());
  return text;
}

}  // namespace moekit
