#pragma once
// Typed reads of config.json keys with the reference's defaults. Every error names the file and
// the key; every key read is remembered, so the keys left over are the ones that do not change
// the MoE layer (HfModelConfig::ignored).

#include <climits>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "moekit/error.hpp"

namespace moekit {

class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& object, std::string label)
      : object_(object), label_(std::move(label)) {}

  // The family being read, for "missing key" messages.
  void set_family(std::string family) { family_ = std::move(family); }

  const std::string& label() const { return label_; }
  bool has(const char* key) const { return object_.contains(key); }

  // The key to read for a setting that transformers also accepts under an alias (a config
  // class's attribute_map): `key` unless only `alias` is present. Both present with different
  // values is refused, as the reference would keep whichever it happened to set last.
  const char* aliased(const char* key, const char* alias);

  // An integer in [lo, hi]. Absent: `fallback`, or an error when the reference has no default.
  int integer(const char* key, std::optional<int> fallback, int lo, int hi = INT_MAX);
  // As integer(), for keys the reference types as Optional: JSON null and an absent key without
  // a default both read as nullopt.
  std::optional<int> integer_or_null(const char* key, std::optional<int> fallback, int lo,
                                     int hi = INT_MAX);
  double number(const char* key, std::optional<double> fallback);
  bool boolean(const char* key, std::optional<bool> fallback);
  std::string string(const char* key, std::optional<std::string> fallback);
  // A list of integers (strings); absent or null is empty.
  std::vector<int> integer_list(const char* key);
  std::vector<std::string> string_list(const char* key);
  // The object under `key`; nullptr when absent or null.
  const nlohmann::json* object(const char* key);

  // The value a required key lacks: an error naming it.
  template <typename T>
  T require(std::optional<T> value, const char* key) const {
    if (!value) missing(key);
    return *value;
  }
  [[noreturn]] void missing(const char* key) const;

  template <typename... Args>
  [[noreturn]] void refuse(fmt::format_string<Args...> format, Args&&... args) const {
    fail(Errc::invalid_argument, "{}: {}", label_,
         fmt::format(format, std::forward<Args>(args)...));
  }

  // Keys present in the file that no read asked for, sorted.
  std::vector<std::string> unread() const;

 private:
  const nlohmann::json* find(const char* key);
  [[noreturn]] void wrong_type(const char* key, const char* expected,
                               const nlohmann::json& value) const;

  const nlohmann::json& object_;
  std::string label_;
  std::string family_;
  std::set<std::string> read_;
};

// A short, safe rendering of a JSON value for an error message (containers are not dumped).
std::string describe_json(const nlohmann::json& value);

}  // namespace moekit
