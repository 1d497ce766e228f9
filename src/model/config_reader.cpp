#include "model/config_reader.hpp"

#include <cmath>
#include <cstdint>

namespace moekit {

using nlohmann::json;

std::string describe_json(const json& value) {
  constexpr size_t kMaxText = 48;
  switch (value.type()) {
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string: {
      const auto& text = value.get_ref<const std::string&>();
      if (text.size() <= kMaxText) return value.dump();
      return json(text.substr(0, kMaxText)).dump(-1, ' ', false, json::error_handler_t::replace) +
             "...";
    }
    default:
      return value.dump();
  }
}

const json* ConfigReader::find(const char* key) {
  const auto it = object_.find(key);
  if (it == object_.end()) return nullptr;
  read_.insert(key);
  return &*it;
}

const char* ConfigReader::aliased(const char* key, const char* alias) {
  const json* primary = object_.contains(key) ? &object_.at(key) : nullptr;
  const json* secondary = find(alias);
  if (secondary == nullptr) return key;
  if (primary == nullptr) return alias;
  if (*primary != *secondary) {
    refuse("keys '{}' and '{}' name the same setting and disagree ({} and {})", key, alias,
           describe_json(*primary), describe_json(*secondary));
  }
  return key;
}

void ConfigReader::missing(const char* key) const {
  refuse("missing key '{}': the {} MoE layer needs it and its reference gives it no default", key,
         family_);
}

void ConfigReader::wrong_type(const char* key, const char* expected, const json& value) const {
  refuse("key '{}' must be {}, got {}", key, expected, describe_json(value));
}

std::optional<int> ConfigReader::integer_or_null(const char* key, std::optional<int> fallback,
                                                 int lo, int hi) {
  const json* value = find(key);
  if (value == nullptr) return fallback;
  if (value->is_null()) return std::nullopt;
  // The JSON library would cast a float or an out-of-range number to an integer silently.
  const bool in_range =
      (value->is_number_unsigned() && value->get<uint64_t>() <= static_cast<uint64_t>(hi) &&
       static_cast<int64_t>(value->get<uint64_t>()) >= lo) ||
      (value->is_number_integer() && !value->is_number_unsigned() && value->get<int64_t>() >= lo &&
       value->get<int64_t>() <= hi);
  if (!in_range) {
    const std::string expected = hi == INT_MAX ? fmt::format("an integer >= {}", lo)
                                               : fmt::format("an integer from {} to {}", lo, hi);
    wrong_type(key, expected.c_str(), *value);
  }
  return static_cast<int>(value->get<int64_t>());
}

int ConfigReader::integer(const char* key, std::optional<int> fallback, int lo, int hi) {
  const json* value = find(key);
  if (value == nullptr) return require(fallback, key);
  if (value->is_null()) wrong_type(key, "an integer", *value);
  return *integer_or_null(key, fallback, lo, hi);
}

double ConfigReader::number(const char* key, std::optional<double> fallback) {
  const json* value = find(key);
  if (value == nullptr) return require(fallback, key);
  if (!value->is_number() || !std::isfinite(value->get<double>())) {
    wrong_type(key, "a finite number", *value);
  }
  return value->get<double>();
}

bool ConfigReader::boolean(const char* key, std::optional<bool> fallback) {
  const json* value = find(key);
  if (value == nullptr) return require(fallback, key);
  if (!value->is_boolean()) wrong_type(key, "true or false", *value);
  return value->get<bool>();
}

std::string ConfigReader::string(const char* key, std::optional<std::string> fallback) {
  const json* value = find(key);
  if (value == nullptr) return require(std::move(fallback), key);
  if (!value->is_string()) wrong_type(key, "a string", *value);
  return value->get<std::string>();
}

std::vector<int> ConfigReader::integer_list(const char* key) {
  const json* value = find(key);
  if (value == nullptr || value->is_null()) return {};
  if (!value->is_array()) wrong_type(key, "a list of integers", *value);
  std::vector<int> items;
  for (const json& item : *value) {
    const bool ok = item.is_number_unsigned()
                        ? item.get<uint64_t>() <= INT_MAX
                        : item.is_number_integer() && item.get<int64_t>() >= INT_MIN &&
                              item.get<int64_t>() <= INT_MAX;
    if (!ok) refuse("key '{}' must be a list of integers, it holds {}", key, describe_json(item));
    items.push_back(static_cast<int>(item.get<int64_t>()));
  }
  return items;
}

std::vector<std::string> ConfigReader::string_list(const char* key) {
  const json* value = find(key);
  if (value == nullptr || value->is_null()) return {};
  if (!value->is_array()) wrong_type(key, "a list of strings", *value);
  std::vector<std::string> items;
  for (const json& item : *value) {
    if (!item.is_string()) {
      refuse("key '{}' must be a list of strings, it holds {}", key, describe_json(item));
    }
    items.push_back(item.get<std::string>());
  }
  return items;
}

const json* ConfigReader::object(const char* key) {
  const json* value = find(key);
  if (value == nullptr || value->is_null()) return nullptr;
  if (!value->is_object()) wrong_type(key, "an object", *value);
  return value;
}

std::vector<std::string> ConfigReader::unread() const {
  std::vector<std::string> keys;
  for (const auto& [key, value] : object_.items()) {
    if (read_.count(key) == 0) keys.push_back(key);
  }
  return keys;
}

}  // namespace moekit
