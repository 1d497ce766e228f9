#pragma once
// The answer of a backend's capability check: yes or no, always with a reason.

#include <string>

#include "moekit/options.hpp"
#include "moekit/platform.hpp"
#include "moekit/spec.hpp"

namespace moekit {

struct Capability {
  bool ok = false;
  std::string reason;

  static Capability Yes(std::string reason) { return {true, std::move(reason)}; }
  static Capability No(std::string reason) { return {false, std::move(reason)}; }
};

// What a backend is asked to support: the layer and where it will run.
struct Deployment {
  const ModelSpec& spec;
  const Options& options;
  const Platform& platform;
  const QuantParams& quant;
};

}  // namespace moekit
