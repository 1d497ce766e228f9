#include "runner/kernels.hpp"

namespace moekit::kernels {

void activation_row(const TensorView& rows, int64_t row, float* out) {
  const int64_t cols = rows.dim(1);
  const auto* base = static_cast<const char*>(rows.data);
  convert_to_f32(base + dtype_storage_bytes(rows.dtype, row * cols), rows.dtype, cols, out);
}

float dot(const float* a, const float* b, int64_t n) {
  // Eight independent partial sums let the compiler keep the loop in vector registers
  // without reassociating it itself (which it may not do without -ffast-math).
  float partial[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int lane = 0; lane < 8; ++lane) partial[lane] += a[i + lane] * b[i + lane];
  }
  float sum = 0.0f;
  for (; i < n; ++i) sum += a[i] * b[i];
  for (float p : partial) sum += p;
  return sum;
}

}  // namespace moekit::kernels
