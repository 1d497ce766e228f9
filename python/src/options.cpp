// The deployment: weight formats with their parameters, Options by keyword, the Platform.

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/variant.h>

#include <fmt/format.h>

#include <variant>

#include "bindings.hpp"
#include "moekit/options.hpp"
#include "moekit/platform.hpp"

namespace moekit::python {
namespace {

template <typename Enum>
Enum parsed(std::optional<Enum> value, std::string_view text, const char* what, const char* legal) {
  if (!value)
    throw nb::value_error(fmt::format("{}: '{}' is not one of {}", what, text, legal).c_str());
  return *value;
}

RunnerKind runner_from(std::string_view name) {
  return parsed(parse_runner(name), name, "runner", "auto, reference, cpu, cuda, hopper");
}
A2AKind a2a_from(std::string_view name) {
  return parsed(parse_a2a(name), name, "a2a", "none, mpi, nccl");
}
BlockForm form_from(std::string_view name) {
  return parsed(parse_block_form(name), name, "form", "auto, standard, overlapped, fused-slot");
}
FusedOps fused_ops_from(std::string_view name) {
  if (name == "auto") return FusedOps::auto_;
  if (name == "off") return FusedOps::off;
  throw nb::value_error(fmt::format("fused_ops: '{}' is not one of auto, off", name).c_str());
}

using WeightsArg = std::variant<QuantParams, std::string>;

// A format's name takes its defaults (QuantParams(WeightFormat)); "int4-group-a8" is
// Int4GroupA8's.
QuantParams weights_from(const WeightsArg& weights) {
  if (const auto* params = std::get_if<QuantParams>(&weights)) return *params;
  const std::string& name = std::get<std::string>(weights);
  if (name == "int4-group-a8") return QuantParams::Int4GroupA8();
  if (std::optional<WeightFormat> format = parse_weight_format(name)) return QuantParams(*format);
  throw nb::value_error(fmt::format("weights: '{}' is not one of f32, f16, bf16, fp8-tensor, "
                                    "fp8-block, int4-group, int4-group-a8 (or a QuantParams: "
                                    "moekit.Fp8Block(128), moekit.Int4Group(64), ...)",
                                    name)
                            .c_str());
}

Fp8Scaling scaling_from(std::string_view name) {
  if (name == "tensor") return Fp8Scaling::per_tensor;
  if (name == "channel") return Fp8Scaling::per_channel;
  throw nb::value_error(fmt::format("scaling: '{}' is not one of tensor, channel", name).c_str());
}
Fp8Activations fp8_activations_from(std::string_view name) {
  if (name == "dynamic") return Fp8Activations::dynamic;
  if (name == "static") return Fp8Activations::static_;
  throw nb::value_error(
      fmt::format("activations: '{}' is not one of dynamic, static", name).c_str());
}

// The parameters are checked where they are made, as resolve would check them.
QuantParams checked(QuantParams params) {
  const std::vector<std::string> problems = params.problems();
  if (!problems.empty()) throw nb::value_error(problems.front().c_str());
  return params;
}

std::string options_repr(const Options& o) {
  return fmt::format(
      "Options(runner='{}', a2a='{}', weights={}, form='{}', device='{}', max_tokens={}, "
      "threads={}, strict={}, ep_size={}, ep_rank={}, redundant={})",
      runner_name(o.runner), a2a_name(o.a2a), o.weights.describe(), block_form_name(o.form),
      o.device.str(), o.max_tokens, o.threads, o.strict ? "True" : "False", o.ep.size, o.ep.rank,
      o.ep.redundant);
}

}  // namespace

void bind_options(nb::module_& m) {
  nb::class_<QuantParams>(m, "QuantParams",
                          "A weight format and its parameters; made by moekit.Fp8Block(128), "
                          "moekit.Int4Group(64, zero_points=True), ... or from a format's name.")
      .def(nb::init<>())
      .def("__init__",
           [](QuantParams* self, std::string_view name) {
             new (self) QuantParams(weights_from(std::string(name)));
           })
      .def_prop_ro("format",
                   [](const QuantParams& q) { return std::string(weight_format_name(q.format)); })
      .def_prop_ro("weight_dtype",
                   [](const QuantParams& q) { return std::string(dtype_name(q.weight_dtype)); })
      .def_prop_ro("scale_dtype",
                   [](const QuantParams& q) { return std::string(dtype_name(q.scale_dtype)); })
      .def_ro("block_rows", &QuantParams::block_rows)
      .def_ro("block_cols", &QuantParams::block_cols)
      .def_ro("zero_points", &QuantParams::zero_points)
      .def_prop_ro(
          "activation",
          [](const QuantParams& q) { return std::string(activation_quant_name(q.activation)); })
      .def_ro("activation_group", &QuantParams::activation_group)
      .def_prop_ro("quantized", &QuantParams::quantized)
      .def("scale_rows", &QuantParams::scale_rows, nb::arg("rows"))
      .def("scale_cols", &QuantParams::scale_cols, nb::arg("cols"))
      .def("name", &QuantParams::name)
      .def("describe", &QuantParams::describe)
      .def("__eq__", [](const QuantParams& a, const QuantParams& b) { return a == b; })
      .def("__repr__", [](const QuantParams& q) { return "QuantParams(" + q.describe() + ")"; });

  m.def(
      "Unquantized",
      [](std::string_view format) {
        const WeightFormat f =
            parsed(parse_weight_format(format), format, "format", "f32, f16, bf16");
        if (f != WeightFormat::f32 && f != WeightFormat::f16 && f != WeightFormat::bf16) {
          throw nb::value_error(
              fmt::format("format: '{}' is quantised; Unquantized takes f32, f16 or bf16", format)
                  .c_str());
        }
        return QuantParams::Unquantized(f);
      },
      nb::arg("format") = "bf16", "f32, f16 or bf16 weights, stored as they are.");
  m.def(
      "Fp8Tensor",
      [](std::string_view scaling, std::string_view activations) {
        return checked(
            QuantParams::Fp8Tensor(scaling_from(scaling), fp8_activations_from(activations)));
      },
      nb::arg("scaling") = "tensor", nb::arg("activations") = "dynamic",
      "W8A8: e4m3 weights, one scale per expert matrix ('tensor') or per output row ('channel').");
  m.def(
      "Fp8Block", [](int64_t block) { return checked(QuantParams::Fp8Block(block)); },
      nb::arg("block") = 128, "DeepSeek-V3's e4m3 weights with one scale per block x block tile.");
  m.def(
      "Int4Group",
      [](int64_t group, std::string_view scale_dtype, bool zero_points) {
        return checked(
            QuantParams::Int4Group(group, dtype_from(scale_dtype, "scale_dtype"), zero_points));
      },
      nb::arg("group") = 128, nb::arg("scale_dtype") = "bf16", nb::arg("zero_points") = false,
      "W4A16: int4 weights with one scale per `group` columns of a row.");
  m.def(
      "Int4GroupA8",
      [](int64_t group, std::string_view scale_dtype, bool zero_points) {
        return checked(
            QuantParams::Int4GroupA8(group, dtype_from(scale_dtype, "scale_dtype"), zero_points));
      },
      nb::arg("group") = 128, nb::arg("scale_dtype") = "bf16", nb::arg("zero_points") = false,
      "W4A8: int4-group weights with activations quantised to int8 per token per group.");

  nb::class_<Options>(m, "Options", "How a layer is deployed: the three axes and the limits.")
      .def(
          "__init__",
          [](Options* self, std::string_view runner, std::string_view a2a,
             const WeightsArg& weights, std::string_view form, std::string_view fused_ops,
             std::string_view device, int64_t max_tokens, int threads, bool strict,
             bool check_finite, int ep_size, int ep_rank, int redundant) {
            Options o;
            o.runner = runner_from(runner);
            o.a2a = a2a_from(a2a);
            o.weights = weights_from(weights);
            o.form = form_from(form);
            o.fused_ops = fused_ops_from(fused_ops);
            o.device = Device::parse(device);
            o.max_tokens = max_tokens;
            o.threads = threads;
            o.strict = strict;
            o.check_finite = check_finite;
            o.ep = ExpertParallel::Rank(ep_size, ep_rank, redundant);
            new (self) Options(o);
          },
          nb::kw_only(), nb::arg("runner") = "auto", nb::arg("a2a") = "none",
          nb::arg("weights") = "bf16", nb::arg("form") = "auto", nb::arg("fused_ops") = "auto",
          nb::arg("device") = "cpu", nb::arg("max_tokens") = 4096, nb::arg("threads") = 0,
          nb::arg("strict") = false, nb::arg("check_finite") = true, nb::arg("ep_size") = 1,
          nb::arg("ep_rank") = 0, nb::arg("redundant") = 0)
      .def_prop_rw(
          "runner", [](const Options& o) { return std::string(runner_name(o.runner)); },
          [](Options& o, std::string_view name) { o.runner = runner_from(name); })
      .def_prop_rw(
          "a2a", [](const Options& o) { return std::string(a2a_name(o.a2a)); },
          [](Options& o, std::string_view name) { o.a2a = a2a_from(name); })
      .def_prop_rw(
          "weights", [](const Options& o) { return o.weights; },
          [](Options& o, const WeightsArg& weights) { o.weights = weights_from(weights); })
      .def_prop_rw(
          "form", [](const Options& o) { return std::string(block_form_name(o.form)); },
          [](Options& o, std::string_view name) { o.form = form_from(name); })
      .def_prop_rw(
          "fused_ops",
          [](const Options& o) {
            return std::string(o.fused_ops == FusedOps::off ? "off" : "auto");
          },
          [](Options& o, std::string_view name) { o.fused_ops = fused_ops_from(name); })
      .def_prop_rw(
          "device", [](const Options& o) { return o.device.str(); },
          [](Options& o, std::string_view text) { o.device = Device::parse(text); })
      .def_rw("max_tokens", &Options::max_tokens)
      .def_rw("threads", &Options::threads)
      .def_rw("strict", &Options::strict)
      .def_rw("check_finite", &Options::check_finite)
      .def_prop_rw(
          "ep_size", [](const Options& o) { return o.ep.size; },
          [](Options& o, int size) { o.ep.size = size; })
      .def_prop_rw(
          "ep_rank", [](const Options& o) { return o.ep.rank; },
          [](Options& o, int rank) { o.ep.rank = rank; })
      .def_prop_rw(
          "redundant", [](const Options& o) { return o.ep.redundant; },
          [](Options& o, int redundant) { o.ep.redundant = redundant; })
      .def("__repr__", options_repr);

  nb::class_<Platform>(m, "Platform", "What the machine offers, probed in one place.")
      .def_static("probe", &Platform::probe)
      .def_static("cpu_only", &Platform::cpu_only, nb::arg("threads"))
      .def_ro("cpu_threads", &Platform::cpu_threads)
      .def_ro("avx2", &Platform::avx2)
      .def_ro("avx512_bf16", &Platform::avx512_bf16)
      .def_ro("avx512_vnni", &Platform::avx512_vnni)
      .def_ro("cpu_vendor", &Platform::cpu_vendor)
      .def_ro("cpu_family", &Platform::cpu_family)
      .def_ro("cuda_runtime", &Platform::cuda_runtime)
      .def_prop_ro("gpu_count", [](const Platform& p) { return static_cast<int>(p.gpus.size()); })
      .def_ro("gpu_note", &Platform::gpu_note)
      .def("summary", &Platform::summary)
      .def("__repr__", [](const Platform& p) { return "Platform(" + p.summary() + ")"; });
}

}  // namespace moekit::python
