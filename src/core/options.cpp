#include "moekit/options.hpp"

#include "core/names.hpp"

namespace moekit {
namespace {

constexpr NameTable<RunnerKind, 5> kRunners = {{RunnerKind::auto_, "auto"},
                                               {RunnerKind::reference, "reference"},
                                               {RunnerKind::cpu, "cpu"},
                                               {RunnerKind::cuda, "cuda"},
                                               {RunnerKind::hopper, "hopper"}};
constexpr NameTable<A2AKind, 3> kA2A = {
    {A2AKind::none, "none"}, {A2AKind::mpi, "mpi"}, {A2AKind::nccl, "nccl"}};
constexpr NameTable<BlockForm, 4> kBlockForms = {{BlockForm::auto_, "auto"},
                                                 {BlockForm::standard, "standard"},
                                                 {BlockForm::overlapped, "overlapped"},
                                                 {BlockForm::fused_slot, "fused-slot"}};

constexpr NameTable<A2AMode, 3> kA2AModes = {
    {A2AMode::auto_, "auto"}, {A2AMode::normal, "normal"}, {A2AMode::low_latency, "low-latency"}};

constexpr NameTable<A2AWire, 3> kA2AWires = {
    {A2AWire::auto_, "auto"}, {A2AWire::activations, "activations"}, {A2AWire::e4m3, "e4m3"}};

}  // namespace

std::string_view a2a_wire_name(A2AWire wire) {
  return name_of(wire, kA2AWires);
}
std::optional<A2AWire> parse_a2a_wire(std::string_view name) {
  return name_lookup(name, kA2AWires);
}
std::string_view a2a_mode_name(A2AMode mode) {
  return name_of(mode, kA2AModes);
}
std::optional<A2AMode> parse_a2a_mode(std::string_view name) {
  return name_lookup(name, kA2AModes);
}
std::string_view runner_name(RunnerKind kind) {
  return name_of(kind, kRunners);
}
std::optional<RunnerKind> parse_runner(std::string_view name) {
  return name_lookup(name, kRunners);
}
std::string_view a2a_name(A2AKind kind) {
  return name_of(kind, kA2A);
}
std::optional<A2AKind> parse_a2a(std::string_view name) {
  return name_lookup(name, kA2A);
}
std::string_view block_form_name(BlockForm form) {
  return name_of(form, kBlockForms);
}
std::optional<BlockForm> parse_block_form(std::string_view name) {
  return name_lookup(name, kBlockForms);
}

}  // namespace moekit
