#pragma once
// Name tables for enums: one table per enum gives both directions.

#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace moekit {

template <typename Enum, size_t N>
using NameTable = std::pair<Enum, std::string_view>[N];

template <typename Enum, size_t N>
std::optional<Enum> name_lookup(std::string_view name, const NameTable<Enum, N>& table) {
  for (const auto& [value, text] : table) {
    if (text == name) return value;
  }
  return std::nullopt;
}

template <typename Enum, size_t N>
std::string_view name_of(Enum value, const NameTable<Enum, N>& table) {
  for (const auto& [entry, text] : table) {
    if (entry == value) return text;
  }
  return "?";
}

template <typename Enum, size_t N>
std::string name_list(const NameTable<Enum, N>& table) {
  std::string text;
  for (const auto& [entry, name] : table) {
    if (!text.empty()) text += ", ";
    text += name;
  }
  return text;
}

}  // namespace moekit
