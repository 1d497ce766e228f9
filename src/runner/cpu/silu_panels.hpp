#pragma once
// The SiLU-gated activation of GEMM1's results as the panel16 w13 layout leaves them (panel p's
// rows 0-7 the gate rows of outputs 8p.., its rows 8-15 the up rows of the same outputs), eight
// outputs at a time on AVX2 (silu_panels_avx2.cpp). exp(-gate) is a polynomial within 2 f32 ulps
// of std::exp over the range that matters (beyond +-88 the result is the limit: 0 or gate x up),
// so the outputs are within a few ulps of kernels::activate's. A NaN gate or up stays NaN.

#include <cstdint>

namespace moekit::cpu {

// act[i] = gate_i / (1 + exp(-gate_i)) * up_i for i in [0, n), gate_i = y[16 (i / 8) + i % 8],
// up_i = y[16 (i / 8) + 8 + i % 8]. Needs AVX2 and FMA (the caller's plan says so).
void silu_gated_panels(const float* y, int64_t n, float* act);

}  // namespace moekit::cpu
