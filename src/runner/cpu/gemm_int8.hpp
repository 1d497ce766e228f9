#pragma once
// The many-rows GEMM of the cpu core for int4-group-a8 (QuantParams::Int4GroupA8) on AVX-512 VNNI
// (vpdpbusd: four unsigned int4 codes times four signed int8 activations per 32-bit lane, summed
// exactly in int32), or where the CPU lacks VNNI on AVX2 (pmaddubsw, the same products summed in
// pairs into 16-bit lanes, gemm_int8_avx2.cpp; the same floats): rows quantised to int8 per weight
// group (quantize_int8, the codes the format defines) times a panel16 int4 matrix, each group's
// integer sums less offset x the sum of the row's codes, times the weight and activation scales,
// summed in f32. So it computes what the format defines, as the int8 streaming kernel does, for
// many rows: each panel K-block is widened to bytes once per call and shared by all rows. The
// caller splits panels across threads (one call is single-threaded), only where the plan's
// CpuKernels::int8_gemm says the shape suits it (gemm_int8_reads), with the dot product its
// CpuKernels::avx512_vnni says the CPU has.

#include <cstdint>

#include "runner/cpu/panels.hpp"
#include "runner/cpu/stream.hpp"

namespace moekit::cpu {

// Rows quantised by quantize_int8 (stream.hpp), row r's codes at q + r * ldq (k of them, each 4
// in the order k0, k2, k1, k3), its per-group scales and code sums at scale + r * steps and
// sums + r * steps.
struct Int8Matrix {
  const int8_t* q = nullptr;
  int64_t ldq = 0;
  const float* scale = nullptr;
  const float* sums = nullptr;
  int64_t steps = 0;
};

// Whether gemm_panels_int8 reads int4 weights in scale groups of group_k along a K of k: whole
// int4 blocks (K and the group multiples of 4) and groups of at most one K-block (256).
bool gemm_int8_reads(int64_t group_k, int64_t k);

// Bytes of per-thread scratch gemm_panels_int8 needs (a group of widened panel K-blocks).
int64_t gemm_int8_scratch_bytes();

// c[r * ldc + n] = sum over groups g of (sum_{k in g} code(n, k) q_r[k] - offset(n, g) sums_r[g])
// * scale(n, g) * scale_r[g], r in [0, m), n in [16 * p_begin, min(16 * p_end, w.n)): the int4
// weights (symmetric or with zero points) times the rows' int8 values. Overwrites those elements
// of c and no others. `work` holds gemm_int8_scratch_bytes() bytes (any alignment) and is
// clobbered. `dot` must be on this CPU (the caller checks; the plan's choice). Throws
// Errc::invalid_argument for a bad range, stride, dtype or group.
void gemm_panels_int8(const Int8Matrix& a, int64_t m, const PanelMatrix& w, int64_t p_begin,
                      int64_t p_end, float* c, int64_t ldc, void* work, Int8Dot dot);

namespace int8_gemm {

inline constexpr int64_t kBlockK = 256;
inline constexpr int64_t kGroupPanels = 2;

// A panel16 int4 matrix as the kernel reads it (plain fields: see gemm_bf16.hpp's Weights).
struct Weights {
  const uint8_t* data = nullptr;
  int64_t n = 0;
  int64_t k = 0;
  int64_t panel_bytes = 0;
  int64_t group_k = 0;
  int64_t scale_steps = 0;
  const float* scale = nullptr;   // [panels][scale_steps][16]
  const float* offset = nullptr;  // the same shape; null: every offset is 8
};

// The kernels without the checks (the arguments are valid, m > 0, p_begin < p_end, the CPU has
// the instructions), compiled apart from them: on AVX-512 VNNI (gemm_avx512vnni.cpp) and on
// AVX2 (gemm_int8_avx2.cpp).
void gemm_unchecked(const Int8Matrix& a, int64_t m, const Weights& w, int64_t p_begin,
                    int64_t p_end, float* c, int64_t ldc, void* work);
void gemm_unchecked_maddubs(const Int8Matrix& a, int64_t m, const Weights& w, int64_t p_begin,
                            int64_t p_end, float* c, int64_t ldc, void* work);

}  // namespace int8_gemm

}  // namespace moekit::cpu
