#include "quant/check.hpp"

#include <algorithm>
#include <cmath>

#include "moekit/error.hpp"
#include "quant/dequantize.hpp"

namespace moekit {
namespace {

void check_layout(const TensorView& t, std::string_view name, const Shape& expected, DType dtype) {
  if (t.data == nullptr) {
    fail(Errc::invalid_argument, "{}: missing, expected {}{}", name, dtype_name(dtype),
         expected.str());
  }
  if (!(t.shape == expected) || t.dtype != dtype) {
    fail(Errc::invalid_argument, "{}: expected {}{}, got {}", name, dtype_name(dtype),
         expected.str(), t.describe());
  }
  if (t.device.kind != DeviceKind::cpu || !t.is_contiguous()) {
    fail(Errc::invalid_argument, "{}: must be contiguous on the CPU, got {}", name, t.describe());
  }
}

void refuse_extra(const TensorView& t, std::string_view name, std::string_view why) {
  if (t.data != nullptr) fail(Errc::invalid_argument, "{}: given, but {}", name, why);
}

std::string index_text(const Shape& shape, int64_t flat) {
  std::string text;
  for (int axis = shape.rank - 1; axis >= 0; --axis) {
    text = std::to_string(flat % shape[axis]) + (text.empty() ? "" : ", ") + text;
    flat /= shape[axis];
  }
  return "[" + text + "]";
}

void check_positive(const TensorView& t, std::string_view name) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = read_float(t, i);
    if (!std::isfinite(v) || v <= 0.0f) {
      fail(Errc::invalid_argument, "{}: element {} is {}; scales must be finite and positive", name,
           index_text(t.shape, i), v);
    }
  }
}

}  // namespace

bool is_float_weight(DType dtype) {
  return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
}

void check_matrices(const ExpertMatrices& m, std::string_view name, int64_t experts, int64_t rows,
                    int64_t cols, int parts, const QuantParams& params) {
  const Shape shape{experts, parts * rows, cols};
  const std::string scale_name = fmt::format("{}.scale", name);
  const std::string zero_name = fmt::format("{}.zero", name);
  const std::string input_name = fmt::format("{}.input_scale", name);
  if (m.weight.data == nullptr) {
    fail(Errc::invalid_argument, "{}: missing, expected {}", name, shape.str());
  }
  if (is_float_weight(m.weight.dtype)) {
    check_layout(m.weight, name, shape, m.weight.dtype);
    // Checked here, over the whole stack, so the error names the tensor and the expert whatever
    // rank, form or format loads it.
    for (int64_t i = 0; i < m.weight.numel(); ++i) {
      const float v = read_float(m.weight, i);
      if (!std::isfinite(v)) {
        fail(Errc::invalid_argument, "{}: element {} is not finite ({})", name,
             index_text(shape, i), v);
      }
    }
    refuse_extra(m.scale, scale_name, "scales come only with weights already in the format");
    refuse_extra(m.zero, zero_name, "zero points come only with weights already in the format");
  } else {
    if (!params.quantized() || m.weight.dtype != params.weight_dtype) {
      fail(Errc::invalid_argument,
           "{}: {} weights do not fit the plan's format {}, which takes f32, bf16 or f16 "
           "weights{}",
           name, dtype_name(m.weight.dtype), weight_format_name(params.format),
           params.quantized()
               ? fmt::format(" or {} weights with scales", dtype_name(params.weight_dtype))
               : std::string());
    }
    check_layout(m.weight, name, shape, params.weight_dtype);
    if (params.weight_dtype == DType::f8e4m3) {
      // e4m3fn has no infinities; 0x7F and 0xFF are its NaNs.
      const auto* codes = m.weight.as<const uint8_t>();
      for (int64_t i = 0; i < m.weight.numel(); ++i) {
        if ((codes[i] & 0x7F) == 0x7F) {
          fail(Errc::invalid_argument, "{}: element {} is an e4m3 NaN (0x{:02X})", name,
               index_text(shape, i), codes[i]);
        }
      }
    }
    const Shape grid{experts, parts * params.scale_rows(rows), params.scale_cols(cols)};
    check_layout(m.scale, scale_name, grid, params.scale_dtype);
    check_positive(m.scale, scale_name);
    if (params.zero_points) {
      check_layout(m.zero, zero_name, grid, DType::i8);
      const auto* zeros = m.zero.as<const int8_t>();
      for (int64_t i = 0; i < m.zero.numel(); ++i) {
        if (zeros[i] < -8 || zeros[i] > 7) {
          fail(Errc::invalid_argument, "{}: element {} is {}; int4 zero points lie in [-8, 7]",
               zero_name, index_text(grid, i), zeros[i]);
        }
      }
    } else {
      refuse_extra(m.zero, zero_name, "the format has no zero points");
    }
  }
  if (params.activation == ActivationQuant::fp8_static) {
    check_layout(m.input_scale, input_name, Shape{experts}, DType::f32);
    check_positive(m.input_scale, input_name);
  } else {
    refuse_extra(m.input_scale, input_name,
                 fmt::format("the plan's activations are {}, not static",
                             activation_quant_name(params.activation)));
  }
}

float largest_input_scale(const ExpertMatrices& m) {
  if (m.input_scale.data == nullptr) return 0.0f;
  const auto* scales = m.input_scale.as<const float>();
  return *std::max_element(scales, scales + m.input_scale.numel());
}

}  // namespace moekit
