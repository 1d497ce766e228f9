// quantize_e4m3_row: the checks and the choice of kernel, compiled for any x86-64; the kernels
// are in e4m3_rows_avx2.cpp and e4m3_rows_avx512f.cpp.

#include "runner/cpu/e4m3_rows.hpp"

#include "moekit/error.hpp"
#include "quant/activation_quant.hpp"

namespace moekit::cpu {

void quantize_e4m3_row(E4m3Rounding rounding, const QuantParams& q, float static_scale,
                       const float* x, int64_t n, float* out, float* scales) {
  require(q.activation == ActivationQuant::fp8_per_token ||
              q.activation == ActivationQuant::fp8_per_token_group ||
              q.activation == ActivationQuant::fp8_static,
          "quantize_e4m3_row: the format's activations are not quantised to e4m3");
  require(n >= 0, "quantize_e4m3_row: row length {} is negative", n);
  if (n == 0) return;
  const int64_t group = activation_group(q, n);
  require(group > 0, "quantize_e4m3_row: activation group {} is not positive", group);
  const e4m3_rows::Row row{.x = x,
                           .n = n,
                           .out = out,
                           .scales = scales,
                           .group = group,
                           .dynamic = q.activation != ActivationQuant::fp8_static,
                           .static_scale = static_scale};
  switch (rounding) {
    case E4m3Rounding::avx512:
      return e4m3_rows::quantize_avx512(row);
    case E4m3Rounding::avx2:
      return e4m3_rows::quantize_avx2(row);
    case E4m3Rounding::scalar:
      break;
  }
  quantize_activation_row(q, static_scale, x, n, out, scales);
}

}  // namespace moekit::cpu
