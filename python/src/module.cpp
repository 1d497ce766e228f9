// moekit._moekit: the C++ library's API for Python. moekit/__init__.py wraps it with what only
// Python knows (torch and numpy outputs, torch's current stream, the torch custom op).

#include <nanobind/nanobind.h>

#include <fmt/format.h>

#include "bindings.hpp"
#include "moekit/error.hpp"

namespace moekit::python {
namespace {

PyObject* config_refused = nullptr;

// moekit::Error by category; std::invalid_argument (Device::parse) and std::bad_alloc are
// nanobind's own ValueError and MemoryError.
void translate(const std::exception_ptr& error, void*) {
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    PyObject* type = PyExc_RuntimeError;
    switch (e.code()) {
      case Errc::invalid_argument:
        type = PyExc_ValueError;
        break;
      case Errc::config_refused:
        type = config_refused;
        break;
      case Errc::out_of_memory:
        type = PyExc_MemoryError;
        break;
      case Errc::io:
        type = PyExc_OSError;
        break;
      case Errc::internal:
        type = PyExc_RuntimeError;
        break;
    }
    PyErr_SetString(type, e.what());
  }
}

}  // namespace

DType dtype_from(std::string_view name, const char* what) {
  if (std::optional<DType> dtype = parse_dtype(name)) return *dtype;
  throw nb::value_error(
      fmt::format("{}: unknown dtype '{}' (f32, f16, bf16, f8e4m3, i32, i8, i4)", what, name)
          .c_str());
}

}  // namespace moekit::python

NB_MODULE(_moekit, m) {
  using namespace moekit::python;
  m.doc() = "moekit: the MoE layer of LLMs, planned then run (C++ core)";
  m.attr("__version__") = MOEKIT_VERSION;
  config_refused = PyErr_NewExceptionWithDoc(
      "moekit.ConfigRefused",
      "resolve() refused a combination of the deployment's axes; the message names the axes in "
      "conflict and the legal alternatives.",
      PyExc_ValueError, nullptr);
  m.attr("ConfigRefused") = nb::handle(config_refused);
  nb::register_exception_translator(translate);
  bind_spec(m);
  bind_options(m);
  bind_plan(m);
  bind_layer(m);
}
