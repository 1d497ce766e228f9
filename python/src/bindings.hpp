#pragma once
// The parts of the module, each registering its classes and functions on it.

#include <nanobind/nanobind.h>

#include <string>
#include <string_view>

#include "moekit/dtype.hpp"

namespace moekit::python {

namespace nb = nanobind;

void bind_spec(nb::module_& m);     // ModelSpec, RoutingSpec, Activation
void bind_options(nb::module_& m);  // QuantParams and its constructors, Options, Platform
void bind_plan(nb::module_& m);     // resolve, Plan, Decision
void bind_layer(nb::module_& m);    // the layer, quantize, Checkpoint, RouterGate

// "bf16" -> DType::bf16; ValueError naming `what` and the legal names otherwise.
DType dtype_from(std::string_view name, const char* what);

}  // namespace moekit::python
