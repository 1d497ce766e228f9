// The layer (weights from a dict of tensors, forward on borrowed tensors with the GIL released),
// the quantiser, and Hugging Face checkpoints.

#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <mutex>
#include <vector>

#include "bindings.hpp"
#include "moekit/checkpoint.hpp"
#include "moekit/layer.hpp"
#include "tensors.hpp"

#ifdef MOEKIT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace moekit::python {
namespace {

// The weights a dict names, borrowed for as long as the layer is being built (the layer copies
// what it keeps).
struct BorrowedWeights {
  std::vector<Borrowed> keep;
  LayerWeights weights;
};

constexpr const char* kMatrices[] = {"w13", "w2", "shared_w13", "shared_w2"};
constexpr const char* kSuffixes[] = {"", "_scale", "_zero", "_input_scale"};

std::string legal_keys() {
  std::string keys;
  for (const char* matrix : kMatrices) {
    for (const char* suffix : kSuffixes) keys += fmt::format("{}{}, ", matrix, suffix);
  }
  return keys + "correction_bias, shared_gate";
}

ExpertMatrices& matrices_of(LayerWeights& w, std::string_view matrix) {
  if (matrix == "w13") return w.w13;
  if (matrix == "w2") return w.w2;
  if (matrix == "shared_w13") return w.shared_w13;
  return w.shared_w2;
}

BorrowedWeights borrow_weights(const nb::dict& dict, const QuantParams& quant) {
  BorrowedWeights out;
  out.keep.reserve(dict.size());
  for (auto [key, value] : dict) {
    if (!nb::isinstance<nb::str>(key)) {
      throw nb::type_error(fmt::format("weights: keys are the tensors' names ({}), got a {}",
                                       legal_keys(), nb::cast<std::string>(nb::str(key.type())))
                               .c_str());
    }
    const std::string name = nb::cast<std::string>(key);
    const std::string label = "weights['" + name + "']";
    if (name == "correction_bias" || name == "shared_gate") {
      out.keep.push_back(borrow(value, label));
      (name == "correction_bias" ? out.weights.correction_bias : out.weights.shared_gate) =
          out.keep.back().view;
      continue;
    }
    bool known = false;
    for (const char* matrix : kMatrices) {
      for (const char* suffix : kSuffixes) {
        if (name != std::string(matrix) + suffix) continue;
        const std::string_view s = suffix;
        Reinterpret as;
        if (s.empty() && quant.quantized()) as = quant.weight_dtype;
        if (s == "_scale") as = quant.scale_dtype;
        if (s == "_zero") as = DType::i8;
        out.keep.push_back(borrow(value, label, as));
        ExpertMatrices& m = matrices_of(out.weights, matrix);
        const TensorView& view = out.keep.back().view;
        (s.empty()       ? m.weight
         : s == "_scale" ? m.scale
         : s == "_zero"  ? m.zero
                         : m.input_scale) = view;
        known = true;
      }
    }
    if (!known) {
      throw nb::value_error(
          fmt::format("weights: unknown key '{}'; the keys are {}", name, legal_keys()).c_str());
    }
  }
  for (const char* required : {"w13", "w2"}) {
    if (!dict.contains(required)) {
      throw nb::value_error(
          fmt::format("weights: '{}' is missing (w13 [E, 2I, H]: gate rows then up rows; "
                      "w2 [E, H, I])",
                      required)
              .c_str());
    }
  }
  return out;
}

// Kernels launch on the calling thread's current device of moekit's own CUDA runtime (static, so
// not torch's): a forward on cuda:N makes N current for the call, as torch's device guard would.
class PlanDevice {
 public:
  explicit PlanDevice(const Plan& plan) {
#ifdef MOEKIT_WITH_CUDA
    if (plan.options.device.kind != DeviceKind::cuda) return;
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != plan.options.device.index) cudaSetDevice(plan.options.device.index);
#else
    (void)plan;
#endif
  }
  ~PlanDevice() {
#ifdef MOEKIT_WITH_CUDA
    if (previous_ >= 0) cudaSetDevice(previous_);
#endif
  }
  PlanDevice(const PlanDevice&) = delete;
  PlanDevice& operator=(const PlanDevice&) = delete;

 private:
  int previous_ = -1;
};

// One MoeLayer for Python: forward() runs with the GIL released, one call at a time (the layer's
// scratch memory is its own, allocated once).
class Layer {
 public:
  explicit Layer(MoeLayer&& layer)
      : layer_(std::make_unique<MoeLayer>(std::move(layer))),
        mutex_(std::make_unique<std::mutex>()) {}

  static Layer from_weights(const Plan& plan, const nb::dict& weights) {
    const BorrowedWeights borrowed = borrow_weights(weights, plan.quant);
    nb::gil_scoped_release unlocked;
    return Layer(MoeLayer(plan, borrowed.weights));
  }

  void forward(nb::handle hidden, nb::handle logits, nb::handle output, nb::handle topk_ids,
               nb::handle topk_weights, std::optional<uintptr_t> stream) {
    const Borrowed h = borrow(hidden, "hidden_states");
    const Borrowed l = borrow(logits, "router_logits");
    const Borrowed o = borrow_writable(output, "output");
    std::optional<Borrowed> ids, weights;
    RoutingResult routing;
    if (!topk_ids.is_none() || !topk_weights.is_none()) {
      if (topk_ids.is_none() || topk_weights.is_none()) {
        throw nb::value_error("topk_ids and topk_weights: give both or neither");
      }
      ids = borrow_writable(topk_ids, "topk_ids");
      weights = borrow_writable(topk_weights, "topk_weights");
      routing = {.ids = ids->view, .weights = weights->view};
    }
    const RoutingResult* wanted = ids ? &routing : nullptr;
    nb::gil_scoped_release unlocked;
    const std::lock_guard<std::mutex> one_at_a_time(*mutex_);
    const PlanDevice on_device(layer_->plan());
    if (stream) {
      layer_->forward(h.view, l.view, o.view, wanted, reinterpret_cast<CUstream_st*>(*stream));
    } else {
      layer_->forward(h.view, l.view, o.view, wanted);
    }
  }

  void synchronize() {
    nb::gil_scoped_release unlocked;
    const std::lock_guard<std::mutex> one_at_a_time(*mutex_);
    const PlanDevice on_device(layer_->plan());
    layer_->synchronize();
  }

  const Plan& plan() const { return layer_->plan(); }

 private:
  std::unique_ptr<MoeLayer> layer_;
  std::unique_ptr<std::mutex> mutex_;
};

nb::dict describe_view(nb::handle object, const std::string& name) {
  const Borrowed b = borrow(object, name);
  nb::dict out;
  out["data_ptr"] = reinterpret_cast<uintptr_t>(b.view.data);
  out["dtype"] = std::string(dtype_name(b.view.dtype));
  nb::list shape, strides;
  for (int axis = 0; axis < b.view.rank(); ++axis) {
    shape.append(b.view.dim(axis));
    strides.append(b.view.strides[axis]);
  }
  out["shape"] = nb::tuple(shape);
  out["strides"] = nb::tuple(strides);
  out["device"] = b.view.device.str();
  out["contiguous"] = b.view.is_contiguous();
  return out;
}

}  // namespace

void bind_layer(nb::module_& m) {
  nb::class_<Layer>(m, "_Layer")
      .def_static("from_weights", &Layer::from_weights, nb::arg("plan"), nb::arg("weights"))
      .def("forward", &Layer::forward, nb::arg("hidden_states").none(),
           nb::arg("router_logits").none(), nb::arg("output").none(), nb::arg("topk_ids").none(),
           nb::arg("topk_weights").none(), nb::arg("stream").none())
      .def("synchronize", &Layer::synchronize)
      .def_prop_ro("plan", &Layer::plan, nb::rv_policy::reference_internal);

  m.def("_view", &describe_view, nb::arg("tensor").none(), nb::arg("name") = "tensor",
        "What moekit reads of a tensor (data pointer, dtype, shape, strides, device), without a "
        "copy.");

  m.def(
      "quantize_matrices",
      [](nb::handle weights, int parts, const QuantParams& params) {
        const Borrowed w = borrow(weights, "weights");
        QuantizedMatrices q;
        {
          nb::gil_scoped_release unlocked;
          q = quantize_matrices(w.view, parts, params);
        }
        nb::dict out;
        const bool has_zero = q.zero.view().data != nullptr;
        out["weight"] = to_numpy(std::move(q.weight));
        out["scale"] = to_numpy(std::move(q.scale));
        out["zero"] = has_zero ? to_numpy(std::move(q.zero)) : nb::none();
        return out;
      },
      nb::arg("weights"), nb::arg("parts"), nb::arg("params"),
      "Quantises float matrices [E, N, K] of `parts` parts (w13: 2, w2: 1) as a layer's load "
      "does; returns numpy arrays weight, scale and zero (e4m3 and packed int4 as uint8 bytes, "
      "bf16 as uint16 bits).");

  nb::class_<RouterGate>(m, "RouterGate", "A layer's router: logits = hidden @ weight.T (f32).")
      .def(
          "_logits",
          [](const RouterGate& gate, nb::handle hidden, nb::handle out) {
            const Borrowed h = borrow(hidden, "hidden_states");
            const Borrowed o = borrow_writable(out, "router_logits");
            // The gate reads both on the host, as floats.
            for (const auto& [t, name] :
                 {std::pair{&h.view, "hidden_states"}, {&o.view, "router_logits"}}) {
              if (t->device.kind != DeviceKind::cpu) {
                throw nb::value_error(
                    fmt::format("{}: the router runs on the CPU, got {}", name, t->describe())
                        .c_str());
              }
            }
            if (!dtype_is_float(h.view.dtype) || h.view.dtype == DType::f8e4m3) {
              throw nb::value_error(
                  fmt::format("hidden_states: dtype must be f32, bf16 or f16, got {}",
                              h.view.describe())
                      .c_str());
            }
            if (o.view.dtype != DType::f32 || !o.view.is_contiguous()) {
              throw nb::value_error(
                  fmt::format("router_logits: expected contiguous f32, got {}", o.view.describe())
                      .c_str());
            }
            nb::gil_scoped_release unlocked;
            gate.logits(h.view, o.view);
          },
          nb::arg("hidden_states"), nb::arg("out"));

  nb::class_<Checkpoint>(m, "Checkpoint",
                         "A Hugging Face model directory opened for its MoE layers.")
      .def_static(
          "open",
          [](const std::filesystem::path& directory) {
            return Checkpoint::open(directory.string());
          },
          nb::arg("path"))
      .def_prop_ro("directory", &Checkpoint::directory)
      .def_prop_ro("family",
                   [](const Checkpoint& c) { return std::string(family_name(c.config().family)); })
      .def_prop_ro("num_layers", [](const Checkpoint& c) { return c.config().num_layers; })
      .def_prop_ro("moe_layers", [](const Checkpoint& c) { return c.config().moe_layers(); })
      .def("spec", &Checkpoint::spec, nb::arg("layer"))
      .def("stored_format", &Checkpoint::stored_format, nb::arg("layer"))
      .def("format_for", &Checkpoint::format_for, nb::arg("layer"),
           nb::arg("requested").none() = nb::none())
      .def(
          "_load",
          [](const Checkpoint& c, int layer, const Plan& plan) {
            nb::gil_scoped_release unlocked;
            return Layer(c.load(layer, plan));
          },
          nb::arg("layer"), nb::arg("plan"))
      .def("router", &Checkpoint::router, nb::arg("layer"));
}

}  // namespace moekit::python
