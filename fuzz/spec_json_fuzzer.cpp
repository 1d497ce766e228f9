// libFuzzer target for the model-spec JSON reader: any input either parses or is refused with a
// moekit::Error; a parsed spec round-trips through to_json() and resolve() plans or refuses it.

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "moekit/error.hpp"
#include "moekit/plan.hpp"
#include "moekit/spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace moekit;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ModelSpec spec;
  try {
    spec = ModelSpec::from_json(text);
  } catch (const Error& e) {
    if (e.code() != Errc::invalid_argument) __builtin_trap();
    return 0;
  }
  (void)spec.summary();
  const std::string json = spec.to_json();
  if (ModelSpec::from_json(json).to_json() != json) __builtin_trap();
  const Resolution resolution = try_resolve(spec, Options{}, Platform::cpu_only(1));
  if (!resolution.plan && resolution.refusal.empty()) __builtin_trap();
  return 0;
}
