#include "io/strict_json.hpp"

#include <set>
#include <string>
#include <vector>

#include "moekit/error.hpp"

namespace moekit::io {

using nlohmann::json;

json parse_strict_json(std::string_view text, std::string_view label, int max_depth) {
  std::vector<std::set<std::string>> open_objects;
  const auto check = [&](int depth, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth > max_depth) {
          fail(Errc::invalid_argument, "{}: JSON nests deeper than {} levels", label, max_depth);
        }
        if (event == json::parse_event_t::object_start) open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.back().insert(parsed.get<std::string>()).second) {
          fail(Errc::invalid_argument, "{}: key '{}' appears twice in one JSON object", label,
               parsed.get<std::string>());
        }
        break;
      default:
        break;
    }
    return true;
  };
  // nlohmann's lexer takes a NUL byte for the end of the input and would ignore what follows;
  // JSON has no raw NUL anywhere, so any one is an error.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos) {
    fail(Errc::invalid_argument, "{}: not valid JSON: a NUL byte at offset {}", label, nul);
  }
  try {
    return json::parse(text.begin(), text.end(), check);
  } catch (const json::exception& e) {
    fail(Errc::invalid_argument, "{}: not valid JSON: {}", label, e.what());
  }
}

size_t first_invalid_utf8(std::string_view text) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char lead = byte(i);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    size_t length = 0;
    uint32_t code = 0;
    uint32_t smallest = 0;  // the lowest code point that needs this many bytes: less is overlong
    if ((lead & 0xE0) == 0xC0) {
      length = 2;
      code = lead & 0x1Fu;
      smallest = 0x80;
    } else if ((lead & 0xF0) == 0xE0) {
      length = 3;
      code = lead & 0x0Fu;
      smallest = 0x800;
    } else if ((lead & 0xF8) == 0xF0) {
      length = 4;
      code = lead & 0x07u;
      smallest = 0x10000;
    } else {
      return i;
    }
    if (text.size() - i < length) return i;
    for (size_t k = 1; k < length; ++k) {
      if ((byte(i + k) & 0xC0) != 0x80) return i;
      code = (code << 6) | (byte(i + k) & 0x3Fu);
    }
    if (code < smallest || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return i;
    i += length;
  }
  return std::string_view::npos;
}

}  // namespace moekit::io
