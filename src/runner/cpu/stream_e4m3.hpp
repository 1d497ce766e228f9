#pragma once
// The e4m3 streaming kernel on AVX-512F (stream_e4m3_avx512f.cpp), which stream_panels calls
// for e4m3 panels.

#include "runner/cpu/stream.hpp"

namespace moekit::cpu {

void stream_panels_e4m3_avx512(const PanelMatrix& w, int64_t p_begin, int64_t p_end,
                               const StreamRows& rows, float* y, int64_t ldy);

}  // namespace moekit::cpu
