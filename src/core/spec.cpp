#include "moekit/spec.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "core/names.hpp"
#include "moekit/error.hpp"

namespace moekit {
namespace {

constexpr std::pair<Scoring, std::string_view> kScorings[] = {
    {Scoring::softmax, "softmax"},
    {Scoring::sigmoid, "sigmoid"},
    {Scoring::sqrt_softplus, "sqrt_softplus"},
};
constexpr std::pair<GroupScore, std::string_view> kGroupScores[] = {
    {GroupScore::max, "max"},
    {GroupScore::top2_sum, "top2_sum"},
};
constexpr std::pair<ActivationKind, std::string_view> kActivations[] = {
    {ActivationKind::silu_gated, "silu_gated"},
    {ActivationKind::gelu_gated, "gelu_gated"},
    {ActivationKind::swiglu_oai, "swiglu_oai"},
};

ModelSpec deepseek_v3() {
  ModelSpec spec;
  spec.name = "dsv3";
  spec.hidden = 7168;
  spec.intermediate = 2048;
  spec.n_experts = 256;
  spec.routing = {.scoring = Scoring::sigmoid,
                  .top_k = 8,
                  .correction_bias = true,
                  .n_group = 8,
                  .topk_group = 4,
                  .group_score = GroupScore::top2_sum,
                  .renormalize = true,
                  .routed_scaling_factor = 2.5f};
  spec.n_shared = 1;
  spec.shared_intermediate = 2048;
  return spec;
}

ModelSpec qwen3_moe() {  // Qwen3-30B-A3B
  ModelSpec spec;
  spec.name = "qwen3-moe";
  spec.hidden = 2048;
  spec.intermediate = 768;
  spec.n_experts = 128;
  spec.routing = {.scoring = Scoring::softmax, .top_k = 8, .renormalize = true};
  return spec;
}

ModelSpec mixtral() {  // Mixtral-8x7B
  ModelSpec spec;
  spec.name = "mixtral";
  spec.hidden = 4096;
  spec.intermediate = 14336;
  spec.n_experts = 8;
  spec.routing = {.scoring = Scoring::softmax, .top_k = 2, .renormalize = true};
  return spec;
}

using nlohmann::json;

// Each field is checked for its JSON type and range here: the JSON library itself would cast a
// float or an out-of-range number to an integer silently (and, past the range, undefinedly).
template <typename T>
T get_field(const json& object, const char* key) {
  const auto it = object.find(key);
  if (it == object.end()) fail(Errc::invalid_argument, "model spec: missing key '{}'", key);
  const json& value = *it;
  if constexpr (std::is_same_v<T, bool>) {
    if (!value.is_boolean()) {
      fail(Errc::invalid_argument, "model spec: key '{}' must be true or false, got {}", key,
           value.dump());
    }
    return value.get<bool>();
  } else if constexpr (std::is_integral_v<T>) {
    const bool in_range =
        (value.is_number_unsigned() &&
         value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())) ||
        (value.is_number_integer() && !value.is_number_unsigned() &&
         value.get<int64_t>() >= std::numeric_limits<T>::min() &&
         value.get<int64_t>() <= std::numeric_limits<T>::max());
    if (!in_range) {
      fail(Errc::invalid_argument, "model spec: key '{}' must be an integer in range, got {}", key,
           value.dump());
    }
    return static_cast<T>(value.get<int64_t>());
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!value.is_number() || !(std::fabs(value.get<double>()) <= std::numeric_limits<T>::max())) {
      fail(Errc::invalid_argument, "model spec: key '{}' must be a finite number, got {}", key,
           value.dump());
    }
    return static_cast<T>(value.get<double>());
  } else {
    if (!value.is_string()) {
      fail(Errc::invalid_argument, "model spec: key '{}' must be a string, got {}", key,
           value.dump());
    }
    return value.get<std::string>();
  }
}

template <typename T>
void get_optional(const json& object, const char* key, T& into) {
  if (object.contains(key)) into = get_field<T>(object, key);
}

template <typename Enum, size_t N>
Enum get_enum(const json& object, const char* key,
              const std::pair<Enum, std::string_view> (&table)[N]) {
  const auto text = get_field<std::string>(object, key);
  if (auto value = name_lookup(text, table)) return *value;
  fail(Errc::invalid_argument, "model spec: key '{}': '{}' is not one of {}", key, text,
       name_list(table));
}

}  // namespace

std::string_view scoring_name(Scoring scoring) {
  return name_of(scoring, kScorings);
}
std::string_view group_score_name(GroupScore rule) {
  return name_of(rule, kGroupScores);
}
std::string_view activation_name(ActivationKind kind) {
  return name_of(kind, kActivations);
}

std::string Activation::str() const {
  if (kind == ActivationKind::swiglu_oai) {
    return fmt::format("swiglu_oai(alpha={}, limit={})", alpha, limit);
  }
  return std::string(activation_name(kind));
}

std::vector<std::string> ModelSpec::preset_names() {
  return {"dsv3", "qwen3-moe", "mixtral"};
}

ModelSpec ModelSpec::preset(std::string_view name) {
  if (name == "dsv3") return deepseek_v3();
  if (name == "qwen3-moe") return qwen3_moe();
  if (name == "mixtral") return mixtral();
  fail(Errc::invalid_argument, "unknown preset '{}': the presets are dsv3, qwen3-moe, mixtral",
       name);
}

ModelSpec ModelSpec::demo() {
  ModelSpec spec = deepseek_v3();
  spec.name = "demo (dsv3-shaped)";
  spec.hidden = 1024;
  spec.intermediate = 256;
  spec.n_experts = 64;
  spec.routing.top_k = 6;
  spec.shared_intermediate = 512;
  return spec;
}

ModelSpec ModelSpec::from_json(std::string_view json_text) {
  json object;
  try {
    object = json::parse(json_text);
  } catch (const json::exception& e) {
    fail(Errc::invalid_argument, "model spec: not valid JSON: {}", e.what());
  }
  if (!object.is_object())
    fail(Errc::invalid_argument, "model spec: the top level must be an object");
  static const std::vector<std::string> kKnown = {"name",
                                                  "hidden_size",
                                                  "moe_intermediate_size",
                                                  "n_experts",
                                                  "top_k",
                                                  "scoring",
                                                  "correction_bias",
                                                  "n_group",
                                                  "topk_group",
                                                  "group_score",
                                                  "renormalize",
                                                  "routed_scaling_factor",
                                                  "n_shared_experts",
                                                  "shared_intermediate_size",
                                                  "shared_expert_gate",
                                                  "activation",
                                                  "swiglu_alpha",
                                                  "swiglu_limit"};
  for (const auto& [key, value] : object.items()) {
    if (std::find(kKnown.begin(), kKnown.end(), key) == kKnown.end()) {
      fail(Errc::invalid_argument, "model spec: unknown key '{}'", key);
    }
  }
  ModelSpec spec;
  get_optional(object, "name", spec.name);
  spec.hidden = get_field<int64_t>(object, "hidden_size");
  spec.intermediate = get_field<int64_t>(object, "moe_intermediate_size");
  spec.n_experts = get_field<int>(object, "n_experts");
  RoutingSpec& routing = spec.routing;
  routing.top_k = get_field<int>(object, "top_k");
  routing.scoring = get_enum(object, "scoring", kScorings);
  get_optional(object, "correction_bias", routing.correction_bias);
  get_optional(object, "n_group", routing.n_group);
  get_optional(object, "topk_group", routing.topk_group);
  if (object.contains("group_score")) {
    routing.group_score = get_enum(object, "group_score", kGroupScores);
  }
  get_optional(object, "renormalize", routing.renormalize);
  get_optional(object, "routed_scaling_factor", routing.routed_scaling_factor);
  get_optional(object, "n_shared_experts", spec.n_shared);
  get_optional(object, "shared_intermediate_size", spec.shared_intermediate);
  get_optional(object, "shared_expert_gate", spec.shared_gate);
  if (object.contains("activation")) {
    spec.activation.kind = get_enum(object, "activation", kActivations);
  }
  if (spec.activation.kind == ActivationKind::swiglu_oai) {
    spec.activation = Activation::SwigluOai();
    get_optional(object, "swiglu_alpha", spec.activation.alpha);
    get_optional(object, "swiglu_limit", spec.activation.limit);
  } else if (object.contains("swiglu_alpha") || object.contains("swiglu_limit")) {
    fail(Errc::invalid_argument,
         "model spec: swiglu_alpha and swiglu_limit need activation swiglu_oai");
  }
  return spec;
}

ModelSpec ModelSpec::from_json_file(const std::string& path) {
  std::ifstream file(path);
  if (!file) fail(Errc::io, "cannot open model spec file '{}'", path);
  std::stringstream text;
  text << file.rdbuf();
  try {
    return from_json(text.str());
  } catch (const Error& e) {
    throw Error(e.code(), fmt::format("{}: {}", path, e.what()));
  }
}

std::string ModelSpec::to_json() const {
  json object = {
      {"name", name},
      {"hidden_size", hidden},
      {"moe_intermediate_size", intermediate},
      {"n_experts", n_experts},
      {"top_k", routing.top_k},
      {"scoring", scoring_name(routing.scoring)},
      {"correction_bias", routing.correction_bias},
      {"n_group", routing.n_group},
      {"topk_group", routing.topk_group},
      {"group_score", group_score_name(routing.group_score)},
      {"renormalize", routing.renormalize},
      {"routed_scaling_factor", routing.routed_scaling_factor},
      {"n_shared_experts", n_shared},
      {"shared_intermediate_size", shared_intermediate},
      {"shared_expert_gate", shared_gate},
      {"activation", activation_name(activation.kind)},
  };
  if (activation.kind == ActivationKind::swiglu_oai) {
    object["swiglu_alpha"] = activation.alpha;
    object["swiglu_limit"] = activation.limit;
  }
  return object.dump(2);
}

std::vector<std::string> ModelSpec::problems() const {
  std::vector<std::string> found;
  auto check = [&](bool ok, std::string message) {
    if (!ok) found.push_back(std::move(message));
  };
  const RoutingSpec& r = routing;
  // Limits far above any model in use; they keep every size product inside int64.
  constexpr int64_t kMaxWidth = int64_t{1} << 20;
  constexpr int kMaxExperts = 1 << 16;
  check(hidden <= kMaxWidth && intermediate <= kMaxWidth && shared_intermediate <= kMaxWidth,
        fmt::format("hidden and intermediate sizes are limited to {}", kMaxWidth));
  check(n_experts <= kMaxExperts && n_shared <= kMaxExperts,
        fmt::format("expert counts are limited to {}", kMaxExperts));
  check(hidden > 0, fmt::format("hidden size must be positive, got {}", hidden));
  check(intermediate > 0,
        fmt::format("expert intermediate size must be positive, got {}", intermediate));
  check(n_experts > 0, fmt::format("number of experts must be positive, got {}", n_experts));
  check(r.top_k >= 1 && r.top_k <= n_experts,
        fmt::format("top-k {} must be between 1 and the number of experts {}", r.top_k, n_experts));
  check(r.n_group >= 1, fmt::format("n_group must be at least 1, got {}", r.n_group));
  if (r.n_group >= 1 && n_experts > 0) {
    const bool divides = n_experts % r.n_group == 0;
    check(divides, fmt::format("n_group {} does not divide the {} experts", r.n_group, n_experts));
    check(r.topk_group >= 1 && r.topk_group <= r.n_group,
          fmt::format("topk_group {} must be between 1 and n_group {}", r.topk_group, r.n_group));
    if (divides && r.n_group > 1) {
      const int per_group = n_experts / r.n_group;
      check(static_cast<int64_t>(r.topk_group) * per_group >= r.top_k,
            fmt::format("topk_group {} groups of {} experts cannot hold top-k {} experts",
                        r.topk_group, per_group, r.top_k));
      check(r.group_score != GroupScore::top2_sum || per_group >= 2,
            fmt::format("group score top2_sum needs at least 2 experts per group, got {}",
                        per_group));
    }
  }
  check(std::isfinite(r.routed_scaling_factor) && r.routed_scaling_factor > 0,
        fmt::format("routed scaling factor must be positive and finite, got {}",
                    r.routed_scaling_factor));
  check(n_shared >= 0, fmt::format("number of shared experts must be >= 0, got {}", n_shared));
  check(
      n_shared == 0 || shared_intermediate > 0,
      fmt::format("shared experts need a positive intermediate size, got {}", shared_intermediate));
  check(!shared_gate || n_shared > 0, "a shared expert gate needs shared experts");
  if (activation.kind == ActivationKind::swiglu_oai) {
    check(activation.alpha > 0 && std::isfinite(activation.alpha),
          fmt::format("swiglu alpha must be positive, got {}", activation.alpha));
    check(activation.limit > 0 && std::isfinite(activation.limit),
          fmt::format("swiglu limit must be positive, got {}", activation.limit));
  }
  return found;
}

std::string ModelSpec::summary() const {
  std::string text = fmt::format("{}: E={} top-{} H={} I={}, {}", name, n_experts, routing.top_k,
                                 hidden, intermediate, scoring_name(routing.scoring));
  if (routing.correction_bias) text += " + correction bias";
  if (routing.n_group > 1) {
    text += fmt::format(", {} groups keep {} ({})", routing.n_group, routing.topk_group,
                        group_score_name(routing.group_score));
  }
  if (routing.renormalize) text += ", renormalised";
  if (routing.routed_scaling_factor != 1.0f)
    text += fmt::format(", scaled x{}", routing.routed_scaling_factor);
  if (n_shared > 0)
    text += fmt::format(", {} shared expert(s) of I={}{}", n_shared, shared_intermediate,
                        shared_gate ? " with a sigmoid gate" : "");
  return text + ", " + activation.str();
}

}  // namespace moekit
