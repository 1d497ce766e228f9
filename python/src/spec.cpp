// ModelSpec and its parts, with the C++ field names; enums read and written as their names.

#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <fmt/format.h>

#include <filesystem>

#include "bindings.hpp"
#include "moekit/hf_config.hpp"
#include "moekit/spec.hpp"

namespace moekit::python {
namespace {

template <typename Enum, size_t N>
Enum parse_name(std::string_view text, const Enum (&values)[N], std::string_view (*name)(Enum),
                const char* what) {
  std::string legal;
  for (Enum value : values) {
    if (name(value) == text) return value;
    legal += fmt::format("{}{}", legal.empty() ? "" : ", ", name(value));
  }
  throw nb::value_error(fmt::format("{}: '{}' is not one of {}", what, text, legal).c_str());
}

constexpr Scoring kScorings[] = {Scoring::softmax, Scoring::sigmoid, Scoring::sqrt_softplus};
constexpr GroupScore kGroupScores[] = {GroupScore::max, GroupScore::top2_sum};
constexpr ActivationKind kActivations[] = {ActivationKind::silu_gated, ActivationKind::gelu_gated,
                                           ActivationKind::swiglu_oai};

// A config.json's MoE layer `layer` (the first MoE layer when none is given), named as
// Checkpoint::spec names it; dense layers are refused with the config's reason.
ModelSpec spec_of_hf_layer(const HfModelConfig& config, std::optional<int> wanted) {
  const std::vector<int> moe_layers = config.moe_layers();
  if (!wanted && moe_layers.empty()) {
    throw nb::value_error(
        fmt::format("{}: the config has no MoE layer", config.model_type).c_str());
  }
  const int layer = wanted ? *wanted : moe_layers.front();
  config.tensor_names(layer);
  ModelSpec spec = config.spec;
  spec.name = fmt::format("{} layer {}", config.spec.name, layer);
  return spec;
}

// T(**fields): the defaults, then each field set by its property (so enums take their names), as
// C++'s designated initialisers read. An unknown name is a TypeError naming it.
template <typename T>
void init_with_fields(T* self, const nb::kwargs& fields) {
  T value;
  const nb::object view = nb::cast(&value, nb::rv_policy::reference);
  const nb::handle type = nb::type<T>();
  for (auto [key, field] : fields) {
    const std::string name = nb::cast<std::string>(key);
    const bool settable = nb::hasattr(type, name.c_str()) &&
                          PyObject_IsInstance(nb::getattr(type, name.c_str()).ptr(),
                                              reinterpret_cast<PyObject*>(&PyProperty_Type)) == 1;
    if (!settable) {
      throw nb::type_error(
          fmt::format("{}: no field '{}'", nb::cast<std::string>(nb::type_name(type)), name)
              .c_str());
    }
    nb::setattr(view, name.c_str(), field);
  }
  new (self) T(value);
}

}  // namespace

void bind_spec(nb::module_& m) {
  nb::class_<Activation>(m, "Activation", "The experts' gated activation.")
      .def("__init__", &init_with_fields<Activation>)
      .def_static("SiluGated", &Activation::SiluGated)
      .def_static("GeluGated", &Activation::GeluGated)
      .def_static("SwigluOai", &Activation::SwigluOai, nb::arg("alpha") = 1.702f,
                  nb::arg("limit") = 7.0f)
      .def_prop_rw(
          "kind", [](const Activation& a) { return std::string(activation_name(a.kind)); },
          [](Activation& a, std::string_view kind) {
            a.kind = parse_name(kind, kActivations, activation_name, "activation");
          })
      .def_rw("alpha", &Activation::alpha)
      .def_rw("limit", &Activation::limit)
      .def("__repr__", [](const Activation& a) { return a.str(); });

  nb::class_<RoutingSpec>(m, "RoutingSpec", "How a token's experts are chosen and weighted.")
      .def("__init__", &init_with_fields<RoutingSpec>)
      .def_prop_rw(
          "scoring", [](const RoutingSpec& r) { return std::string(scoring_name(r.scoring)); },
          [](RoutingSpec& r, std::string_view name) {
            r.scoring = parse_name(name, kScorings, scoring_name, "scoring");
          })
      .def_rw("top_k", &RoutingSpec::top_k)
      .def_rw("correction_bias", &RoutingSpec::correction_bias)
      .def_rw("n_group", &RoutingSpec::n_group)
      .def_rw("topk_group", &RoutingSpec::topk_group)
      .def_prop_rw(
          "group_score",
          [](const RoutingSpec& r) { return std::string(group_score_name(r.group_score)); },
          [](RoutingSpec& r, std::string_view name) {
            r.group_score = parse_name(name, kGroupScores, group_score_name, "group_score");
          })
      .def_rw("renormalize", &RoutingSpec::renormalize)
      .def_rw("routed_scaling_factor", &RoutingSpec::routed_scaling_factor);

  nb::class_<ModelSpec>(m, "ModelSpec",
                        "What a model's MoE layer computes: sizes, routing, shared experts and "
                        "activation.")
      .def("__init__", &init_with_fields<ModelSpec>)
      .def_rw("name", &ModelSpec::name)
      .def_rw("hidden", &ModelSpec::hidden)
      .def_rw("intermediate", &ModelSpec::intermediate)
      .def_rw("n_experts", &ModelSpec::n_experts)
      .def_rw("routing", &ModelSpec::routing)
      .def_rw("n_shared", &ModelSpec::n_shared)
      .def_rw("shared_intermediate", &ModelSpec::shared_intermediate)
      .def_rw("shared_gate", &ModelSpec::shared_gate)
      .def_rw("activation", &ModelSpec::activation)
      .def_static("preset", &ModelSpec::preset, nb::arg("name"),
                  "A preset with the real sizes of the model it names: dsv3, qwen3-moe, mixtral.")
      .def_static("preset_names", &ModelSpec::preset_names)
      .def_static("demo", &ModelSpec::demo)
      .def_static(
          "from_json",
          [](const std::filesystem::path& path) {
            return ModelSpec::from_json_file(path.string());
          },
          nb::arg("path"), "A spec from our own JSON form (the keys of to_json()).")
      .def_static("from_json_text", &ModelSpec::from_json, nb::arg("text"))
      .def_static(
          "_from_hf_config_text",
          [](std::string_view text, std::optional<int> layer, std::string_view label) {
            return spec_of_hf_layer(HfModelConfig::parse(text, label), layer);
          },
          nb::arg("text"), nb::arg("layer").none(), nb::arg("label"))
      .def("to_json", &ModelSpec::to_json)
      .def("problems", &ModelSpec::problems)
      .def("summary", &ModelSpec::summary)
      .def("copy", [](const ModelSpec& s) { return s; })
      .def("__copy__", [](const ModelSpec& s) { return s; })
      .def(
          "__deepcopy__", [](const ModelSpec& s, nb::handle) { return s; }, nb::arg("memo"))
      .def("__repr__", [](const ModelSpec& s) { return "ModelSpec(" + s.summary() + ")"; });
}

}  // namespace moekit::python
