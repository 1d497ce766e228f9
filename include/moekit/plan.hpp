#pragma once
// resolve(): every decision about a deployment, made once, before any weight is loaded, with the
// reason for each. Objects are built from the Plan; forward() does not branch on configuration.

#include <optional>
#include <string>
#include <vector>

#include "moekit/expert_location.hpp"
#include "moekit/options.hpp"
#include "moekit/platform.hpp"
#include "moekit/spec.hpp"

namespace moekit {

enum class PlanLayer { model = 0, block = 1, experts = 2, dispatcher = 3, runner = 4, quant = 5 };
std::string_view plan_layer_name(PlanLayer layer);

struct Rejected {
  std::string candidate;
  std::string reason;
};

struct Decision {
  PlanLayer layer = PlanLayer::model;
  std::string topic;   // what was decided, e.g. "form", "core"
  std::string choice;  // what was chosen
  std::string reason;
  std::vector<Rejected> rejected;
  std::optional<std::string> fallback;  // set when the choice is not what the options asked for
};

enum class DispatcherKind { standard };
enum class DispatchFormat { standard };
enum class RunnerFormat { standard, contiguous };
std::string_view dispatcher_name(DispatcherKind kind);
std::string_view runner_format_name(RunnerFormat format);

struct Plan {
  ModelSpec spec;
  Options options;
  Platform platform;

  BlockForm form = BlockForm::standard;  // never auto_ once resolved
  bool adds_shared_output = false;       // standard/overlapped: this rank adds the shared experts
  ExpertLocation location;
  int local_routed = 0;  // physical routed experts held by this rank
  int first_local = 0;   // global physical id of local slot 0
  int shared_slots = 0;  // fused_slot form: shared experts appended as local slots
  float shared_slot_weight = 1.0f;
  QuantParams quant;  // the weight format and how it is read
  DispatcherKind dispatcher = DispatcherKind::standard;
  DispatchFormat dispatch_format = DispatchFormat::standard;
  RunnerKind runner = RunnerKind::cpu;  // never auto_ once resolved
  std::optional<std::string> fused_op;  // the fused op that replaces permutes and core, if any
  RunnerFormat core_format = RunnerFormat::standard;
  int threads = 1;
  std::vector<Decision> decisions;

  std::vector<const Decision*> fallbacks() const;
  // The five layers, each with what was chosen and why, rejected candidates and fallbacks.
  std::string explain() const;
};

// Pure: the same inputs give the same plan. Throws Error(config_refused) naming the axes in
// conflict and the legal alternatives, or Error(invalid_argument) for an impossible spec.
Plan resolve(const ModelSpec& spec, const Options& options, const Platform& platform);

struct Resolution {
  std::optional<Plan> plan;
  std::string refusal;  // set when plan is empty
};
Resolution try_resolve(const ModelSpec& spec, const Options& options, const Platform& platform);

}  // namespace moekit
