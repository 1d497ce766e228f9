// resolve() and the Plan it returns: every decision with its reason, rejected candidates and
// fallbacks, read-only.

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <fmt/format.h>

#include "bindings.hpp"
#include "moekit/plan.hpp"

namespace moekit::python {

void bind_plan(nb::module_& m) {
  nb::class_<Rejected>(m, "Rejected", "A candidate resolve() did not choose, and why.")
      .def_ro("candidate", &Rejected::candidate)
      .def_ro("reason", &Rejected::reason)
      .def("__repr__", [](const Rejected& r) {
        return fmt::format("Rejected('{}', '{}')", r.candidate, r.reason);
      });

  nb::class_<Decision>(m, "Decision", "One choice of the plan, with its reason.")
      .def_prop_ro("layer", [](const Decision& d) { return std::string(plan_layer_name(d.layer)); })
      .def_ro("topic", &Decision::topic)
      .def_ro("choice", &Decision::choice)
      .def_ro("reason", &Decision::reason)
      .def_ro("rejected", &Decision::rejected)
      .def_ro("fallback", &Decision::fallback)
      .def("__repr__", [](const Decision& d) {
        return fmt::format("Decision(layer='{}', topic='{}', choice='{}'{})",
                           plan_layer_name(d.layer), d.topic, d.choice,
                           d.fallback ? ", fallback=" + *d.fallback : "");
      });

  nb::class_<Plan>(m, "Plan", "Every decision about a deployment, made once by resolve().")
      .def_ro("spec", &Plan::spec)
      .def_ro("options", &Plan::options)
      .def_ro("platform", &Plan::platform)
      .def_prop_ro("runner", [](const Plan& p) { return std::string(runner_name(p.runner)); })
      .def_prop_ro("form", [](const Plan& p) { return std::string(block_form_name(p.form)); })
      .def_prop_ro("device", [](const Plan& p) { return p.options.device.str(); })
      .def_ro("quant", &Plan::quant)
      .def_ro("fused_op", &Plan::fused_op)
      .def_ro("stages", &Plan::stages)
      .def_ro("threads", &Plan::threads)
      .def_prop_ro("max_tokens", [](const Plan& p) { return p.options.max_tokens; })
      .def_ro("local_routed", &Plan::local_routed)
      .def_ro("shared_slots", &Plan::shared_slots)
      .def_ro("decisions", &Plan::decisions)
      .def_prop_ro("fallbacks",
                   [](const Plan& p) {
                     std::vector<Decision> out;
                     for (const Decision* d : p.fallbacks()) out.push_back(*d);
                     return out;
                   })
      .def("explain", &Plan::explain)
      .def("__repr__", [](const Plan& p) {
        return fmt::format("Plan(spec='{}', runner='{}', form='{}', weights='{}', device='{}')",
                           p.spec.name, runner_name(p.runner), block_form_name(p.form),
                           p.quant.name(), p.options.device.str());
      });

  m.def(
      "resolve",
      [](const ModelSpec& spec, const Options& options, const std::optional<Platform>& platform) {
        const Platform machine = platform ? *platform : Platform::probe();
        nb::gil_scoped_release unlocked;
        return resolve(spec, options, machine);
      },
      nb::arg("spec"), nb::arg("options"), nb::arg("platform") = nb::none(),
      "Plans a layer of `spec` deployed as `options` on `platform` (this machine by default). "
      "Raises ConfigRefused naming the axes in conflict and the legal alternatives.");
}

}  // namespace moekit::python
