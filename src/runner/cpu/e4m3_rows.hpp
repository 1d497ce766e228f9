#pragma once
// The fp8 formats' run-time quantisation of GEMM inputs (quant/activation_quant.hpp) for the cpu
// runner, vectorised: the values quantize_activation_row gives, bit for bit, computed 8 (AVX2)
// or 16 (AVX-512F) at a time. The scalar reference rounds each value to e4m3 through the
// integer fields of its bits; the vectors round it as a multiple of its e4m3 step instead
// (nearest even), which is the same rounding: the step 2^(e - 3) of a value of exponent e, and
// 2^-9 below e4m3's smallest normal 2^-6 (its subnormals). Everything past 448 saturates to
// 448, NaN stays NaN; the scale is computed from the same f32 amax (which NaN never enters, as
// std::max keeps the first operand against a NaN) with the same division.

#include <cstdint>

#include "moekit/plan.hpp"
#include "moekit/quant.hpp"

namespace moekit::cpu {

// out[k] = the value GEMM input x[k] has after the format q's e4m3 quantisation, per group of
// activation_group(q, n) values; scales[g], where given, gets group g's scale. x and out may be
// the same array. q must quantise activations to e4m3 (Errc::invalid_argument otherwise), and
// the CPU must have what `rounding` needs (the plan's CpuKernels::e4m3 says it does).
void quantize_e4m3_row(E4m3Rounding rounding, const QuantParams& q, float static_scale,
                       const float* x, int64_t n, float* out, float* scales = nullptr);

namespace e4m3_rows {

// One row as the vector kernels read it: plain fields, so that the files compiled for AVX2 and
// AVX-512 call no inline function of the headers above (the linker could keep their copy).
struct Row {
  const float* x = nullptr;
  int64_t n = 0;
  float* out = nullptr;
  float* scales = nullptr;  // may be null
  int64_t group = 0;        // values per scale, > 0
  bool dynamic = true;      // the scale from each group's amax, else static_scale
  float static_scale = 0.0f;
};

void quantize_avx2(const Row& row);    // e4m3_rows_avx2.cpp
void quantize_avx512(const Row& row);  // e4m3_rows_avx512f.cpp

}  // namespace e4m3_rows
}  // namespace moekit::cpu
