#pragma once
// The streaming kernel of the cpu core: a few input rows times a range of panels of a panel16
// matrix, for experts that received few rows (decode). Each weight step is loaded and widened
// to f32 in registers once and multiplied into every row, so the weights stream through once
// per call, at the rate memory delivers them. Needs AVX2, FMA and F16C (the caller checks).

#include <climits>
#include <cstdint>

#include "moekit/plan.hpp"
#include "runner/cpu/panels.hpp"

namespace moekit::cpu {

// The hardware prefetcher alone leaves the streaming kernels waiting on memory, so they ask for
// every line they will read this far ahead themselves (past a panel's end is the next panel of
// the range, or a harmless prefetch). 2, 4, 6 and 8 KB measured alike for int4; 2 KB is kept.
// The f32 and 16-bit panels and AVX2's int8 rows, for one or two rows, take the plan's distances
// instead (CpuKernels::panel_prefetch and int8_prefetch, through StreamRows and Int8Rows).
inline constexpr int64_t kStreamPrefetchBytes = 2048;
static_assert(StreamPrefetch{}.l1_bytes == kStreamPrefetchBytes && StreamPrefetch{}.l2_bytes == 0);

// Asks for the line of `at` the distances ahead: prefetcht0 and, where set, prefetcht1.
inline void prefetch_ahead(const uint8_t* at, const StreamPrefetch& ahead) {
  __builtin_prefetch(at + ahead.l1_bytes, 0, 3);
  if (ahead.l2_bytes != 0) __builtin_prefetch(at + ahead.l2_bytes, 0, 2);
}

// The most rows one pass over the weights serves; callers split larger sets.
inline constexpr int kStreamRows = 4;

struct StreamRows {
  int m = 0;                              // rows, 1..kStreamRows
  const float* x[kStreamRows] = {};       // the input rows, K floats each
  const float* x_sums[kStreamRows] = {};  // int4 only: step_sums() of each row
  StreamPrefetch prefetch;                // one or two rows of f32 and 16-bit panels
};

// The e4m3 streaming kernel: AVX2's, over rows expanded for it (E4m3Rows), or one AVX-512F
// vector per panel step over the rows as they are (CpuKernels::e4m3_stream_avx512).
enum class E4m3Stream { avx2, avx512 };

// y[r * ldy + 16 * (p - p_begin) + j] = sum_k x[r][k] * w(16 p + j, k) for r < rows.m, panels
// p in [p_begin, p_end) and j < 16 (rows past w.n give 0). e4m3 weights take the AVX-512F
// kernel here, which needs AVX-512F on this CPU; AVX2's is stream_panels_e4m3.
void stream_panels(const PanelMatrix& w, int64_t p_begin, int64_t p_end, const StreamRows& rows,
                   float* y, int64_t ldy);

// Rows expanded for the AVX2 e4m3 kernel (expand_e4m3_row): each value of a row four times in a
// row, times 2^s, so that one 32-byte load gives the vector that multiplies two panel steps'
// codes as the kernel widens them for one or two rows (three or four read x[k] at element 4k;
// stream_avx2.cpp), and `unit` = 2^(120 - s), the factor that restores the row's products.
struct E4m3Rows {
  int m = 0;
  const float* x[kStreamRows] = {};
  float unit[kStreamRows] = {};
};

// Floats of one expanded row of k values (k rounded up to whole pairs).
inline int64_t e4m3_expanded_floats(int64_t k) {
  return (k + 1) / 2 * 8;
}

// Expands x [k] into `expanded` [e4m3_expanded_floats(k)] and returns its unit. s is 112 unless
// the row's largest magnitude would then leave f32's range; NaN and infinities stay what they are.
float expand_e4m3_row(const float* x, int64_t k, float* expanded);

// As stream_panels for e4m3 weights, on AVX2, over expanded rows.
void stream_panels_e4m3(const PanelMatrix& w, int64_t p_begin, int64_t p_end, const E4m3Rows& rows,
                        float* y, int64_t ldy);

// Rows quantised to int16 (quantize_int16) for int4 weights: q ~ x / scale per scale step of
// the weights, with each step's scale and the sum of its q.
struct Int16Rows {
  int m = 0;
  const int16_t* q[kStreamRows] = {};
  const float* scale[kStreamRows] = {};
  const float* sums[kStreamRows] = {};
};

// The largest int16 code, and the longest scale step whose int32 sums of code x activation
// cannot overflow (2048 x 15 x 32767 < 2^31).
inline constexpr float kInt16Max = 32767.0f;
inline constexpr int64_t kInt16MaxStep = 2048;
// The longest scale step over which the AVX2 kernel sums rows 8-15 of a panel at 16 times their
// codes (masked in place, not shifted down: stream_int16.hpp): a pmaddwd adds at most
// 2 x 240 x 32767 to a lane, and a step of k adds k / 2 of them.
inline constexpr int64_t kInt16HighTimes16MaxStep = 256;
static_assert(kInt16HighTimes16MaxStep / 2 * (2 * 240 * int64_t{32767}) <= INT32_MAX);

// The instruction of the int16 kernel's dot products: pmaddwd + add (AVX2), or vpdpwssd (AVX-512
// VNNI, one instruction).
enum class Int16Dot { pmaddwd, vnni };

// As stream_panels for int4 weights and int16 rows: y = sum_k w(n, k) * q[k] * scale[step],
// with 16-bit integer dot products. Needs K and group_k multiples of kInt4BlockK, group_k at
// most kInt16MaxStep, and `dot` on this CPU (Errc::internal otherwise).
void stream_panels_int16(const PanelMatrix& w, int64_t p_begin, int64_t p_end,
                         const Int16Rows& rows, float* y, int64_t ldy, Int16Dot dot);

// Rows quantised to int8 (quantize_int8) for int4 weights whose format quantises activations
// to int8 (QuantParams::Int4GroupA8), per scale step of the weights: the codes of every 4 k in
// the order k0, k2, k1, k3 (the order an int4 block pairs them, stream_int8.hpp), each step's
// scale and the sum of its codes.
struct Int8Rows {
  int m = 0;
  const int8_t* q[kStreamRows] = {};
  const float* scale[kStreamRows] = {};
  const float* sums[kStreamRows] = {};
  StreamPrefetch prefetch;  // one or two rows, AVX2's kernel (pmaddubsw)
};

// The longest scale step whose int32 sums of code x activation cannot overflow (2^20 x 15 x 127
// < 2^31).
inline constexpr int64_t kInt8MaxStep = int64_t{1} << 20;

// The instruction of the int8 kernel's dot products: pmaddubsw into 16-bit partial sums (AVX2),
// or vpdpbusd into int32 (AVX-512 VNNI).
enum class Int8Dot { maddubs, vnni };

// As stream_panels for int4 weights and int8 rows: y = sum_k w(n, k) * q[k] * scale[step], with
// 8-bit integer dot products. Needs K and group_k multiples of kInt4BlockK, group_k at most
// kInt8MaxStep, and `dot` on this CPU (Errc::internal otherwise).
void stream_panels_int8(const PanelMatrix& w, int64_t p_begin, int64_t p_end, const Int8Rows& rows,
                        float* y, int64_t ldy, Int8Dot dot);

// Quantises x [k] (k a multiple of kInt4BlockK) per step of group_k values (a multiple too) as
// the int8 activation format does (quant/activation_quant.hpp): scale = max(max |x|, 1e-10) /
// 127, q = x / scale rounded to nearest even; stored in the order of Int8Rows, with the sum of q
// per step. So rows that already hold q * scale give back the same q. A step holding NaN or an
// infinity gets a NaN scale, so the rows it reaches come out NaN.
void quantize_int8(const float* x, int64_t k, int64_t group_k, int8_t* q, float* scales,
                   float* sums);

// Rounds x [k] in place to the values the int8 activation format gives them per group of
// group_k, q * scale with q and scale as quantize_int8 makes them: exactly what
// quantize_activation_row does for QuantParams::Int4GroupA8, for the rows the GEMM takes. A
// group holding NaN or an infinity becomes NaN.
void round_to_int8(float* x, int64_t k, int64_t group_k);

// Quantises x [k] per step of group_k values: scale = max |x| / 32767, q = x / scale rounded to
// nearest, and the sum of q per step. A step of zeros has scale 0; a step holding NaN or an
// infinity gets a NaN scale, so the rows it reaches come out NaN.
void quantize_int16(const float* x, int64_t k, int64_t group_k, int16_t* q, float* scales,
                    float* sums);

// sums[g] = the sum of x over scale step g of a K of k in steps of group_k: int4 panels
// subtract their offsets through these (sum (u - o) x s = s (sum u x - o sum x)), so the
// kernel's inner loop never touches the offsets.
void step_sums(const float* x, int64_t k, int64_t group_k, float* sums);

}  // namespace moekit::cpu
