#pragma once
// JSON for the file formats moekit reads, parsed by nlohmann_json but stricter than its defaults:
// a key repeated in one object is an error (nlohmann would keep the last one silently, so two
// entries of a header could name the same tensor), and nesting deeper than the format can use is
// refused while parsing, before a hostile file makes a deep tree.

#include <string_view>

#include <nlohmann/json.hpp>

namespace moekit::io {

// Throws Error(invalid_argument) naming `label` when `text` is not JSON, repeats a key in an
// object, contains a NUL byte, or opens an array or object below `max_depth` (the top-level
// value is at depth 0).
nlohmann::json parse_strict_json(std::string_view text, std::string_view label, int max_depth);

// Where `text` first breaks UTF-8 (overlong forms, surrogates and code points past U+10FFFF
// included), or npos when it is valid.
size_t first_invalid_utf8(std::string_view text);

}  // namespace moekit::io
