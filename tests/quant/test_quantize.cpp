// The quantiser (quantize_matrices), the library's row reader (dequantize_row) and run-time
// activation quantisation (quantize_activation_row), checked against the rules in the top
// comment of src/quant/quantize.cpp and against the test oracle (tests/support/oracle.hpp).
// Expected values are built from the formats' definitions (e4m3 codes, int4 levels, scales
// chosen by the test), never from the code under test.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "moekit/dtype.hpp"
#include "moekit/error.hpp"
#include "moekit/quant.hpp"
#include "moekit/tensor.hpp"
#include "quant/activation_quant.hpp"
#include "quant/dequantize.hpp"
#include "runner/runner_core.hpp"
#include "support/oracle.hpp"

namespace moekit {
namespace {

// ---------------------------------------------------------------------------------------------
// Helpers

size_t sz(int64_t i) {
  return static_cast<size_t>(i);
}

struct Variant {
  std::string name;
  QuantParams params;
};

std::vector<Variant> quantized_variants() {
  std::vector<Variant> out = {
      {"fp8-tensor per-tensor", QuantParams::Fp8Tensor()},
      {"fp8-tensor per-channel", QuantParams::Fp8Tensor(Fp8Scaling::per_channel)},
      {"fp8-tensor per-tensor static",
       QuantParams::Fp8Tensor(Fp8Scaling::per_tensor, Fp8Activations::static_)},
      {"fp8-tensor per-channel static",
       QuantParams::Fp8Tensor(Fp8Scaling::per_channel, Fp8Activations::static_)},
      {"fp8-block 128", QuantParams::Fp8Block()},
      {"fp8-block 64", QuantParams::Fp8Block(64)},
  };
  for (const int64_t group : {32, 64, 128}) {
    for (const DType scale : {DType::f16, DType::bf16}) {
      for (const bool zero_points : {false, true}) {
        out.push_back({"int4-group " + std::to_string(group) + " " +
                           std::string(dtype_name(scale)) + (zero_points ? " zero points" : ""),
                       QuantParams::Int4Group(group, scale, zero_points)});
      }
    }
  }
  return out;
}

std::vector<Variant> all_variants() {
  std::vector<Variant> out = {
      {"f32", QuantParams::Unquantized(WeightFormat::f32)},
      {"f16", QuantParams::Unquantized(WeightFormat::f16)},
      {"bf16", QuantParams::Unquantized(WeightFormat::bf16)},
  };
  for (Variant& v : quantized_variants()) out.push_back(std::move(v));
  return out;
}

Tensor tensor_from(const std::vector<float>& values, Shape shape, DType dtype = DType::f32) {
  Tensor t = Tensor::empty(dtype, shape);
  convert_from_f32(values.data(), shape.numel(), t.view().data, dtype);
  return t;
}

std::vector<float> floats_of(const TensorView& t) {
  std::vector<float> out(sz(t.numel()));
  convert_to_f32(t.data, t.dtype, t.numel(), out.data());
  return out;
}

// `value` as stored in a scale of `dtype` and read back.
float stored_as(float value, DType dtype) {
  switch (dtype) {
    case DType::f16:
      return to_float(to_f16(value));
    case DType::bf16:
      return to_float(to_bf16(value));
    default:
      return value;
  }
}

// The smallest f16/bf16 value at or above `value` (an int4 scale as the quantiser stores it):
// the nearest one, or, when that is below, the smallest that is above, found by bisecting
// between them.
float stored_rounded_up(float value, DType dtype) {
  const float nearest = stored_as(value, dtype);
  if (nearest >= value) return nearest;
  float lo = value, hi = value * 2.0f;  // the next stored value lies within a factor of 2
  for (int step = 0; step < 64; ++step) {
    const float mid = lo + (hi - lo) / 2.0f;
    if (stored_as(mid, dtype) > nearest) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return stored_as(hi, dtype);
}

// int4 scales are kept at or above the smallest normal value of their storage.
float int4_floor(const QuantParams& q) {
  return q.scale_dtype == DType::f16 ? 0x1p-14f : 0x1p-126f;
}

// Nibble i of a packed int4 array, as dtype.hpp documents the layout (element 2j in the low
// nibble of byte j, signed); written apart from int4_get.
int nibble_at(const TensorView& t, int64_t i) {
  const auto* bytes = t.as<const uint8_t>();
  const int v = i % 2 == 0 ? bytes[i / 2] & 0xF : bytes[i / 2] >> 4;
  return v >= 8 ? v - 16 : v;
}

// The scale grid of a stack [E, parts * N, K], walked block by block; rows r are within a part.
struct Grid {
  int64_t E, parts, N, K, br, bc, SR, SC;

  Grid(const QuantParams& q, const Shape& shape, int parts_)
      : E(shape[0]), parts(parts_), N(shape[1] / parts_), K(shape[2]) {
    br = q.block_rows == 0 ? N : q.block_rows;
    bc = q.block_cols == 0 ? K : q.block_cols;
    SR = (N + br - 1) / br;
    SC = (K + bc - 1) / bc;
  }
  Shape scale_shape() const { return {E, parts * SR, SC}; }
  int64_t element(int64_t e, int64_t part, int64_t r, int64_t c) const {
    return ((e * parts + part) * N + r) * K + c;
  }
};

struct BlockRef {
  int64_t e, part, sr, sc, index, r0, r1, c0, c1;
};

void for_each_block(const Grid& g, const std::function<void(const BlockRef&)>& body) {
  for (int64_t e = 0; e < g.E; ++e) {
    for (int64_t p = 0; p < g.parts; ++p) {
      for (int64_t sr = 0; sr < g.SR; ++sr) {
        for (int64_t sc = 0; sc < g.SC; ++sc) {
          body({e, p, sr, sc, ((e * g.parts + p) * g.SR + sr) * g.SC + sc, sr * g.br,
                std::min(g.N, (sr + 1) * g.br), sc * g.bc, std::min(g.K, (sc + 1) * g.bc)});
        }
      }
    }
  }
}

template <typename Body>
void for_each_element(const Grid& g, const BlockRef& b, Body body) {
  for (int64_t r = b.r0; r < b.r1; ++r) {
    for (int64_t c = b.c0; c < b.c1; ++c) body(g.element(b.e, b.part, r, c));
  }
}

struct Span {
  float lo = 0.0f, hi = 0.0f;  // of the block's values
  float amax() const { return std::max(std::fabs(lo), std::fabs(hi)); }
};

Span span_of(const Grid& g, const BlockRef& b, const std::vector<float>& w) {
  Span s{INFINITY, -INFINITY};
  for_each_element(g, b, [&](int64_t i) {
    s.lo = std::min(s.lo, w[sz(i)]);
    s.hi = std::max(s.hi, w[sz(i)]);
  });
  return s;
}

std::string where(const BlockRef& b) {
  return "expert " + std::to_string(b.e) + " part " + std::to_string(b.part) + " block (" +
         std::to_string(b.sr) + ", " + std::to_string(b.sc) + ")";
}

// Random weights of order `stddev`, with per-row magnitudes spread over 2^-3 .. 2^3.
std::vector<float> random_weights(const Shape& shape, uint64_t seed, float stddev = 0.05f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::uniform_int_distribution<int> octave(-3, 3);
  const int64_t rows = shape[0] * shape[1], K = shape[2];
  std::vector<float> w(sz(rows * K));
  for (int64_t r = 0; r < rows; ++r) {
    const float factor = std::ldexp(1.0f, octave(rng));
    for (int64_t c = 0; c < K; ++c) w[sz(r * K + c)] = normal(rng) * factor;
  }
  return w;
}

StoredMatrices stored(const QuantizedMatrices& q, int parts) {
  return {q.weight.view(), q.scale.view(), q.zero.view(), parts};
}

struct StackShape {
  int64_t E;
  int parts;
  int64_t rows;  // parts * N
  int64_t K;
  Shape shape() const { return {E, rows, K}; }
  std::string str() const {
    return "[E=" + std::to_string(E) + ", parts=" + std::to_string(parts) +
           ", rows=" + std::to_string(rows) + ", K=" + std::to_string(K) + "]";
  }
};

// Partial edge blocks in both directions for the 128 and 64 blocks, and for the int4 groups.
constexpr StackShape kRandomShapes[] = {{2, 2, 2 * 72, 192}, {1, 1, 200, 130}};

// ---------------------------------------------------------------------------------------------
// 1. int4 packing

TEST(Int4Packing, EveryValueAtEvenAndOddNibbleRoundTripsAndKeepsItsNeighbour) {
  constexpr uint8_t kFill[4] = {0x96, 0x69, 0xF0, 0x0F};
  for (const int64_t index : {0, 1, 2, 3, 6, 7}) {
    const int64_t neighbour = index ^ 1;
    const int shift = index % 2 == 0 ? 0 : 4;
    for (int other = -8; other <= 7; ++other) {
      for (int value = -8; value <= 7; ++value) {
        uint8_t packed[4] = {kFill[0], kFill[1], kFill[2], kFill[3]};
        int4_set(packed, neighbour, other);
        int4_set(packed, index, value);
        ASSERT_EQ(int4_get(packed, index), value) << "index " << index << " neighbour " << other;
        ASSERT_EQ(int4_get(packed, neighbour), other) << "index " << index << " value " << value;
        // The byte holds both nibbles as the documented layout says: 2j low, 2j + 1 high.
        const unsigned want = (static_cast<unsigned>(value) & 0xFu) << shift |
                              (static_cast<unsigned>(other) & 0xFu) << (4 - shift);
        ASSERT_EQ(packed[index / 2], want) << "index " << index << " value " << value;
        for (int64_t byte = 0; byte < 4; ++byte) {
          if (byte != index / 2) {
            ASSERT_EQ(packed[byte], kFill[byte]) << "byte " << byte;
          }
        }
      }
    }
  }
}

TEST(Int4Packing, SettingOneNibbleOverAnyOldValueLeavesTheOtherNibble) {
  for (const int64_t index : {0, 1}) {
    for (int old_value = -8; old_value <= 7; ++old_value) {
      for (int other = -8; other <= 7; ++other) {
        for (int value = -8; value <= 7; ++value) {
          uint8_t packed[1] = {0};
          int4_set(packed, index, old_value);
          int4_set(packed, index ^ 1, other);
          int4_set(packed, index, value);
          ASSERT_EQ(int4_get(packed, index), value);
          ASSERT_EQ(int4_get(packed, index ^ 1), other);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 2. fp8: weights that are e4m3 codes times a scale come back exactly

// Every finite e4m3 code (both zeros, subnormals, normals up to 448, both signs), then +-448
// again, laid out so that each half of a 256-wide row holds a code of magnitude 448.
std::vector<uint8_t> finite_e4m3_row() {
  std::vector<uint8_t> codes;
  for (unsigned b = 0; b < 256; ++b) {
    if ((b & 0x7Fu) != 0x7Fu) codes.push_back(static_cast<uint8_t>(b));
  }
  codes.push_back(0x7E);
  codes.push_back(0xFE);
  return codes;  // 256: 0x7E at 126 and 254, 0xFE at 253 and 255
}

struct Fp8ExactCase {
  Variant variant;
  DType input;
  float base_scales[4];  // per (expert, part)
  bool per_row;          // the row's scale is base * 2^row (per-channel only)
};

TEST(Fp8RoundTrip, WeightsThatAreCodesTimesScaleQuantizeToThoseCodesAndScales) {
  const std::vector<uint8_t> row = finite_e4m3_row();
  ASSERT_EQ(row.size(), 256u);
  const Variant tensor{"fp8-tensor", QuantParams::Fp8Tensor()};
  const Variant channel{"fp8-tensor per-channel", QuantParams::Fp8Tensor(Fp8Scaling::per_channel)};
  const Variant block{"fp8-block 128", QuantParams::Fp8Block()};
  const Variant block64{"fp8-block 64", QuantParams::Fp8Block(64)};
  const float f32_scales[4] = {0x1p-10f, 3 * 0x1p-7f, 1.0f, 5 * 0x1p-3f};
  const float pow2_scales[4] = {0x1p-6f, 0x1p-2f, 2.0f, 0x1p-8f};
  const float f16_scales[4] = {0x1p-4f, 1.0f, 8.0f, 0x1p-6f};
  const Fp8ExactCase cases[] = {
      {tensor, DType::f32, {f32_scales[0], f32_scales[1], f32_scales[2], f32_scales[3]}, false},
      {channel, DType::f32, {f32_scales[0], f32_scales[1], f32_scales[2], f32_scales[3]}, false},
      {channel, DType::f32, {f32_scales[0], f32_scales[1], f32_scales[2], f32_scales[3]}, true},
      {block, DType::f32, {f32_scales[0], f32_scales[1], f32_scales[2], f32_scales[3]}, false},
      {tensor,
       DType::bf16,
       {pow2_scales[0], pow2_scales[1], pow2_scales[2], pow2_scales[3]},
       false},
      {channel,
       DType::bf16,
       {pow2_scales[0], pow2_scales[1], pow2_scales[2], pow2_scales[3]},
       true},
      {block, DType::bf16, {pow2_scales[0], pow2_scales[1], pow2_scales[2], pow2_scales[3]}, false},
      {block64, DType::f16, {f16_scales[0], f16_scales[1], f16_scales[2], f16_scales[3]}, false},
      {tensor, DType::f16, {f16_scales[0], f16_scales[1], f16_scales[2], f16_scales[3]}, false},
  };
  constexpr int kParts = 2;
  constexpr int64_t kN = 3, kK = 256;
  const Shape shape{2, kParts * kN, kK};
  for (const Fp8ExactCase& c : cases) {
    SCOPED_TRACE(c.variant.name + " from " + std::string(dtype_name(c.input)) +
                 (c.per_row ? ", a scale per row" : ""));
    const QuantParams& q = c.variant.params;
    // For the 64-wide block every quarter of the row needs a code of magnitude 448.
    std::vector<uint8_t> layout = row;
    if (q.block_cols == 64) {
      for (int64_t i = 63; i < kK; i += 64) layout[sz(i)] = i % 128 == 63 ? 0x7E : 0xFE;
    }
    const Grid g(q, shape, kParts);
    std::vector<uint8_t> codes(sz(shape.numel()));
    std::vector<float> w(sz(shape.numel())), intended(sz(shape.numel()));
    for (int64_t e = 0; e < 2; ++e) {
      for (int64_t p = 0; p < kParts; ++p) {
        for (int64_t r = 0; r < kN; ++r) {
          const float scale = c.base_scales[e * kParts + p] *
                              (c.per_row ? std::ldexp(1.0f, static_cast<int>(r)) : 1.0f);
          for (int64_t k = 0; k < kK; ++k) {
            // Rotate within each 64-column quarter so rows differ yet keep their 448s.
            const int64_t from = k / 64 * 64 + (k % 64 + 5 * r) % 64;
            const int64_t i = g.element(e, p, r, k);
            codes[sz(i)] = layout[sz(from)];
            w[sz(i)] = to_float(e4m3_t{codes[sz(i)]}) * scale;
            intended[sz(i)] = scale;
          }
        }
      }
    }
    const Tensor input = tensor_from(w, shape, c.input);
    ASSERT_EQ(floats_of(input), w) << "the weights are not exact in the input dtype";
    const QuantizedMatrices out = quantize_matrices(input, kParts, q);
    ASSERT_EQ(out.weight.view().dtype, DType::f8e4m3);
    const auto* bytes = out.weight.data<const uint8_t>();
    int64_t wrong_codes = 0;
    for (int64_t i = 0; i < shape.numel(); ++i) {
      if (bytes[i] != codes[sz(i)] && wrong_codes++ < 5) {
        ADD_FAILURE() << "element " << i << ": code 0x" << std::hex << int{bytes[i]} << ", want 0x"
                      << int{codes[sz(i)]} << std::dec;
      }
    }
    EXPECT_EQ(wrong_codes, 0);
    const std::vector<float> scales = floats_of(out.scale);
    ASSERT_EQ(out.scale.view().shape, g.scale_shape());
    for_each_block(g, [&](const BlockRef& b) {
      EXPECT_EQ(scales[sz(b.index)], intended[sz(g.element(b.e, b.part, b.r0, b.c0))]) << where(b);
    });
    const std::vector<double> back = test::dequantized(out.view(), kParts, q);
    int64_t wrong_values = 0;
    for (int64_t i = 0; i < shape.numel(); ++i) {
      if (back[sz(i)] != static_cast<double>(w[sz(i)]) && wrong_values++ < 5) {
        ADD_FAILURE() << "element " << i << ": " << back[sz(i)] << ", want " << w[sz(i)];
      }
    }
    EXPECT_EQ(wrong_values, 0);
  }
}

// ---------------------------------------------------------------------------------------------
// 3. int4: weights on the quantisation grid come back exactly

// Scales exact in f16 and bf16 (at most 7 significant bits) and with 7 * s and 15 * s exact.
constexpr float kInt4Multipliers[] = {1, 3, 5, 6, 7, 9, 12, 100};
float int4_block_scale(int64_t block_index) {
  return kInt4Multipliers[block_index % 8] * 0x1p-10f;
}

struct Int4ExactCase {
  int64_t group;
  DType scale_dtype;
};
constexpr Int4ExactCase kInt4ExactCases[] = {{32, DType::f16},  {64, DType::f16},
                                             {128, DType::f16}, {32, DType::bf16},
                                             {64, DType::bf16}, {128, DType::bf16}};

TEST(Int4RoundTrip, SymmetricGridWeightsReproduceExactly) {
  constexpr int kParts = 2;
  const Shape shape{2, kParts * 3, 256};
  for (const Int4ExactCase& c : kInt4ExactCases) {
    const QuantParams q = QuantParams::Int4Group(c.group, c.scale_dtype);
    SCOPED_TRACE(q.describe());
    const Grid g(q, shape, kParts);
    std::vector<float> w(sz(shape.numel()));
    std::vector<int> levels(sz(shape.numel()));
    for_each_block(g, [&](const BlockRef& b) {
      const float scale = int4_block_scale(b.index);
      int64_t n = 0;
      for_each_element(g, b, [&](int64_t i) {
        // Levels in [-7, 7]; the block's first element is +-7, so amax = 7 * scale.
        int level = static_cast<int>((i * 7 + b.index) % 15) - 7;
        if (n++ == 0) level = b.index % 2 == 0 ? 7 : -7;
        levels[sz(i)] = level;
        w[sz(i)] = static_cast<float>(level) * scale;
      });
    });
    const QuantizedMatrices out = quantize_matrices(tensor_from(w, shape), kParts, q);
    ASSERT_EQ(out.weight.view().dtype, DType::i4);
    ASSERT_EQ(out.scale.view().dtype, c.scale_dtype);
    const std::vector<float> scales = floats_of(out.scale);
    for_each_block(g, [&](const BlockRef& b) {
      ASSERT_EQ(scales[sz(b.index)], int4_block_scale(b.index)) << where(b);
      for_each_element(g, b, [&](int64_t i) {
        ASSERT_EQ(nibble_at(out.weight, i), levels[sz(i)]) << where(b) << " element " << i;
      });
    });
    const std::vector<double> back = test::dequantized(out.view(), kParts, q);
    for (int64_t i = 0; i < shape.numel(); ++i) {
      ASSERT_EQ(back[sz(i)], static_cast<double>(w[sz(i)])) << "element " << i;
    }
  }
}

TEST(Int4RoundTrip, ZeroPointGridWeightsReproduceExactlyWithTheirZeroPoints) {
  constexpr int kParts = 2;
  const Shape shape{2, kParts * 3, 256};
  for (const Int4ExactCase& c : kInt4ExactCases) {
    const QuantParams q = QuantParams::Int4Group(c.group, c.scale_dtype, true);
    SCOPED_TRACE(q.describe());
    const Grid g(q, shape, kParts);
    std::vector<float> w(sz(shape.numel()));
    std::vector<int> levels(sz(shape.numel()));
    const auto zero_of = [](int64_t block_index) {
      return static_cast<int>(block_index * 5 % 16) - 8;  // every zero point in [-8, 7]
    };
    for_each_block(g, [&](const BlockRef& b) {
      const float scale = int4_block_scale(b.index);
      const int zero = zero_of(b.index);
      int64_t n = 0;
      for_each_element(g, b, [&](int64_t i) {
        // Levels in [-8, 7], both ends present, so the block spans exactly 15 * scale.
        int level = static_cast<int>((i * 7 + b.index) % 16) - 8;
        if (n == 0) level = -8;
        if (n == 1) level = 7;
        ++n;
        levels[sz(i)] = level;
        w[sz(i)] = static_cast<float>(level - zero) * scale;
      });
    });
    const QuantizedMatrices out = quantize_matrices(tensor_from(w, shape), kParts, q);
    ASSERT_EQ(out.zero.view().dtype, DType::i8);
    ASSERT_EQ(out.zero.view().shape, g.scale_shape());
    const std::vector<float> scales = floats_of(out.scale);
    const auto* zeros = out.zero.data<const int8_t>();
    for_each_block(g, [&](const BlockRef& b) {
      ASSERT_EQ(scales[sz(b.index)], int4_block_scale(b.index)) << where(b);
      ASSERT_EQ(zeros[b.index], zero_of(b.index)) << where(b);
      for_each_element(g, b, [&](int64_t i) {
        ASSERT_EQ(nibble_at(out.weight, i), levels[sz(i)]) << where(b) << " element " << i;
      });
    });
    const std::vector<double> back = test::dequantized(out.view(), kParts, q);
    for (int64_t i = 0; i < shape.numel(); ++i) {
      ASSERT_EQ(back[sz(i)], static_cast<double>(w[sz(i)])) << "element " << i;
    }
  }
}

// The most (q - zero) * scale can miss a weight by: half a step, plus f32 rounding of w / scale.
// (The stored scale is rounded up, so the span never overshoots the 15 steps and no weight is
// clipped.)
double zero_point_tolerance(float scale) {
  return 0.5 * scale + 1e-5 * scale;
}

// A stored int4 scale is the exact one rounded up to its f16/bf16 storage: at most one unit in
// the last place (2^-7 relative for bf16) above it.
void expect_rounded_up(double scale, double exact) {
  EXPECT_GE(scale, exact * (1.0 - 1e-7));
  EXPECT_LE(scale, exact * (1.0 + 0x1p-7));
}

TEST(Int4RoundTrip, ZeroPointBlocksOfAnySpanQuantizeWithinHalfAScale) {
  struct SpanKind {
    const char* name;
    float lo, hi;
  };
  const SpanKind kinds[] = {{"mixed", -0.3f, 0.7f},
                            {"mostly negative", -2.0f, 0.01f},
                            {"all positive", 0.25f, 0.5f},
                            {"all negative", -0.9f, -0.6f},
                            {"narrow positive", 1.0f, 1.01f},
                            {"symmetric", -0.5f, 0.5f},
                            {"wide", -40.0f, 3.0f}};
  std::mt19937_64 rng(31);
  const Shape shape{1, 8, 256};
  for (const int64_t group : {32, 64, 128}) {
    for (const DType scale_dtype : {DType::f16, DType::bf16}) {
      const QuantParams q = QuantParams::Int4Group(group, scale_dtype, true);
      SCOPED_TRACE(q.describe());
      const Grid g(q, shape, 1);
      std::vector<float> w(sz(shape.numel()));
      std::vector<Span> spans;
      for_each_block(g, [&](const BlockRef& b) {
        const SpanKind& kind = kinds[b.index % 7];
        std::uniform_real_distribution<float> jitter(0.8f, 1.2f);
        const float lo = kind.lo * jitter(rng), hi = kind.hi * jitter(rng);
        std::uniform_real_distribution<float> uniform(std::min(lo, hi), std::max(lo, hi));
        int64_t n = 0;
        for_each_element(g, b, [&](int64_t i) {
          w[sz(i)] = n == 0 ? lo : n == 1 ? hi : uniform(rng);
          ++n;
        });
        spans.push_back(span_of(g, b, w));
      });
      const QuantizedMatrices out = quantize_matrices(tensor_from(w, shape), 1, q);
      const std::vector<float> scales = floats_of(out.scale);
      const auto* zeros = out.zero.data<const int8_t>();
      for_each_block(g, [&](const BlockRef& b) {
        const float scale = scales[sz(b.index)];
        const int zero = zeros[b.index];
        const Span& s = spans[sz(b.index)];
        const double span = static_cast<double>(std::max(s.hi, 0.0f)) - std::min(s.lo, 0.0f);
        SCOPED_TRACE(where(b) + " span [" + std::to_string(s.lo) + ", " + std::to_string(s.hi) +
                     "]");
        EXPECT_GE(zero, -8);
        EXPECT_LE(zero, 7);
        // The scale is the span (from 0) over 15 steps, rounded up to its storage.
        expect_rounded_up(scale, span / 15.0);
        for_each_element(g, b, [&](int64_t i) {
          const double value = static_cast<double>(nibble_at(out.weight, i) - zero) * scale;
          ASSERT_LE(std::fabs(value - w[sz(i)]), zero_point_tolerance(scale))
              << "element " << i << " weight " << w[sz(i)] << " scale " << scale << " zero "
              << zero;
        });
      });
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 4. Error bounds on random weights

TEST(QuantizeErrorBounds, EveryElementIsWithinItsFormatsRoundingOfTheWeight) {
  constexpr double kE4M3HalfUlp = 0x1p-4;        // relative, normal e4m3 range
  constexpr double kE4M3MinNormal = 0x1p-6;      // smallest normal e4m3 magnitude
  constexpr double kE4M3SubnormalStep = 0x1p-9;  // spacing of e4m3 subnormals
  uint64_t seed = 1;
  for (const StackShape& s : kRandomShapes) {
    for (const Variant& v : quantized_variants()) {
      SCOPED_TRACE(v.name + " " + s.str());
      const QuantParams& q = v.params;
      const std::vector<float> w = random_weights(s.shape(), seed++);
      const QuantizedMatrices out = quantize_matrices(tensor_from(w, s.shape()), s.parts, q);
      const std::vector<double> back = test::dequantized(out.view(), s.parts, q);
      const std::vector<float> scales = floats_of(out.scale);
      const Grid g(q, s.shape(), s.parts);
      ASSERT_EQ(out.scale.view().shape, g.scale_shape());
      int64_t failures = 0;
      for_each_block(g, [&](const BlockRef& b) {
        const float scale = scales[sz(b.index)];
        const Span span = span_of(g, b, w);
        const double amax = span.amax();
        // The scale is sensible (a huge scale would make any bound hold).
        if (q.weight_dtype == DType::f8e4m3) {
          ASSERT_NEAR(scale * 448.0, amax, amax * 0x1p-22) << where(b);
        } else if (!q.zero_points) {
          expect_rounded_up(scale * 7.0, amax);
        }
        for_each_element(g, b, [&](int64_t i) {
          const double want = w[sz(i)], got = back[sz(i)];
          const double error = std::fabs(got - want);
          double bound;
          if (q.weight_dtype == DType::f8e4m3) {
            bound = std::fabs(want) / scale >= kE4M3MinNormal
                        ? (kE4M3HalfUlp + 0x1p-20) * std::fabs(want)
                        : (kE4M3SubnormalStep / 2 + 0x1p-20) * scale;
          } else if (q.zero_points) {
            bound = zero_point_tolerance(scale);
          } else {
            bound = (0.5 + 1e-5) * scale;
          }
          if (!(error <= bound) && failures++ < 5) {
            ADD_FAILURE() << where(b) << " element " << i << ": " << got << " for " << want
                          << " (error " << error << " > " << bound << ", scale " << scale << ")";
          }
        });
      });
      EXPECT_EQ(failures, 0);
    }
  }
}

TEST(QuantizeErrorBounds, TheLargestWeightOfAnFp8BlockIsExactlyPlusMinus448) {
  uint64_t seed = 100;
  for (const StackShape& s : kRandomShapes) {
    for (const Variant& v : quantized_variants()) {
      if (v.params.weight_dtype != DType::f8e4m3) continue;
      SCOPED_TRACE(v.name + " " + s.str());
      const std::vector<float> w = random_weights(s.shape(), seed++);
      const QuantizedMatrices out = quantize_matrices(tensor_from(w, s.shape()), s.parts, v.params);
      const Grid g(v.params, s.shape(), s.parts);
      const auto* bytes = out.weight.data<const uint8_t>();
      for_each_block(g, [&](const BlockRef& b) {
        const Span span = span_of(g, b, w);
        const float top = span.hi >= -span.lo ? span.hi : span.lo;
        bool found = false;
        for_each_element(g, b, [&](int64_t i) {
          if (w[sz(i)] == top && !found) {
            found = true;
            EXPECT_EQ(to_float(e4m3_t{bytes[i]}), std::copysign(448.0f, top)) << where(b);
          }
        });
        EXPECT_TRUE(found);
      });
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 5. Scale grid shapes, and edge blocks scaled from their own elements

TEST(QuantizeScaleGrid, ShapesFollowTheBlockGridAndEveryBlockIsScaledFromItsOwnElements) {
  const StackShape shapes[] = {
      {2, 2, 200, 130}, {1, 1, 128, 256}, {1, 1, 96, 96}, {2, 1, 130, 96}, {1, 2, 4, 2}};
  for (const StackShape& s : shapes) {
    // Magnitudes fall with the row and the column, so that a block reading past its edge (into
    // the next row, part or expert) would see larger values than its own.
    std::mt19937_64 rng(static_cast<uint64_t>(s.rows * 1000 + s.K));
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    const int64_t N = s.rows / s.parts;
    std::vector<float> w(sz(s.shape().numel()));
    for (int64_t e = 0; e < s.E; ++e) {
      for (int64_t r = 0; r < s.rows; ++r) {
        for (int64_t c = 0; c < s.K; ++c) {
          w[sz((e * s.rows + r) * s.K + c)] =
              uniform(rng) / static_cast<float>(1 + r % N + c) * (e % 2 == 0 ? 1.0f : 3.0f);
        }
      }
    }
    const Tensor input = tensor_from(w, s.shape());
    for (const Variant& v : quantized_variants()) {
      const QuantParams& q = v.params;
      SCOPED_TRACE(v.name + " " + s.str());
      const QuantizedMatrices out = quantize_matrices(input, s.parts, q);
      const int64_t br = q.block_rows == 0 ? N : q.block_rows;
      const int64_t bc = q.block_cols == 0 ? s.K : q.block_cols;
      const Shape grid{s.E, s.parts * ((N + br - 1) / br), (s.K + bc - 1) / bc};
      EXPECT_EQ(out.weight.view().shape, s.shape());
      EXPECT_EQ(out.weight.view().dtype, q.weight_dtype);
      ASSERT_EQ(out.scale.view().shape, grid);
      EXPECT_EQ(out.scale.view().dtype, q.scale_dtype);
      if (q.zero_points) {
        ASSERT_EQ(out.zero.view().shape, grid);
        EXPECT_EQ(out.zero.view().dtype, DType::i8);
      } else {
        EXPECT_EQ(out.zero.view().data, nullptr);
      }
      const std::vector<float> scales = floats_of(out.scale);
      const Grid g(q, s.shape(), s.parts);
      for_each_block(g, [&](const BlockRef& b) {
        const Span span = span_of(g, b, w);
        float want;
        if (q.weight_dtype == DType::f8e4m3) {
          want = span.amax() / 448.0f;
        } else if (!q.zero_points) {
          want = stored_rounded_up(std::max(span.amax() / 7.0f, int4_floor(q)), q.scale_dtype);
        } else {
          want = stored_rounded_up(
              std::max((std::max(span.hi, 0.0f) - std::min(span.lo, 0.0f)) / 15.0f, int4_floor(q)),
              q.scale_dtype);
          const int zero = static_cast<int>(
              std::clamp(std::nearbyint(-std::min(span.lo, 0.0f) / want) - 8.0f, -8.0f, 7.0f));
          EXPECT_EQ(out.zero.data<const int8_t>()[b.index], zero) << where(b);
        }
        EXPECT_EQ(scales[sz(b.index)], want) << where(b) << " rows [" << b.r0 << ", " << b.r1
                                             << ") cols [" << b.c0 << ", " << b.c1 << ")";
      });
    }
  }
}

TEST(QuantizeScaleGrid, UnquantizedFormatsStoreTheWeightsRoundedAndNoScales) {
  const StackShape s{2, 2, 6, 10};
  const std::vector<float> w = random_weights(s.shape(), 7, 1.0f);
  for (const WeightFormat format : {WeightFormat::f32, WeightFormat::f16, WeightFormat::bf16}) {
    const QuantParams q = QuantParams::Unquantized(format);
    SCOPED_TRACE(q.describe());
    const QuantizedMatrices out = quantize_matrices(tensor_from(w, s.shape()), s.parts, q);
    EXPECT_EQ(out.weight.view().dtype, q.weight_dtype);
    EXPECT_EQ(out.weight.view().shape, s.shape());
    EXPECT_EQ(out.scale.view().data, nullptr);
    const std::vector<float> got = floats_of(out.weight);
    for (size_t i = 0; i < w.size(); ++i) {
      ASSERT_EQ(got[i], stored_as(w[i], q.weight_dtype)) << i;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 6. All-zero blocks

TEST(QuantizeZeroBlocks, AllZeroBlocksGetScaleOneAndZeroCodes) {
  const StackShape s{2, 2, 2 * 40, 130};
  for (const Variant& v : quantized_variants()) {
    const QuantParams& q = v.params;
    SCOPED_TRACE(v.name);
    const Grid g(q, s.shape(), s.parts);
    // Blocks alternate: +0, random, -0, random, ...; per-tensor scaling makes whole matrices.
    std::vector<float> w = random_weights(s.shape(), 5);
    for_each_block(g, [&](const BlockRef& b) {
      if (b.index % 2 == 1) return;
      for_each_element(g, b, [&](int64_t i) { w[sz(i)] = b.index % 4 == 0 ? 0.0f : -0.0f; });
    });
    const QuantizedMatrices out = quantize_matrices(tensor_from(w, s.shape()), s.parts, q);
    const std::vector<float> scales = floats_of(out.scale);
    const std::vector<double> back = test::dequantized(out.view(), s.parts, q);
    for (const double value : back) ASSERT_TRUE(std::isfinite(value));
    for_each_block(g, [&](const BlockRef& b) {
      if (b.index % 2 == 1) return;
      const bool positive = b.index % 4 == 0;
      EXPECT_EQ(scales[sz(b.index)], 1.0f) << where(b) << (positive ? " +0" : " -0");
      const int zero = q.zero_points ? out.zero.data<const int8_t>()[b.index] : 0;
      for_each_element(g, b, [&](int64_t i) {
        if (q.weight_dtype == DType::f8e4m3) {
          const uint8_t code = out.weight.data<const uint8_t>()[i];
          if (positive) {
            ASSERT_EQ(code, 0x00) << where(b) << " element " << i;
          } else {
            ASSERT_EQ(to_float(e4m3_t{code}), 0.0f) << where(b) << " element " << i;
          }
        } else {
          ASSERT_EQ(nibble_at(out.weight, i) - zero, 0) << where(b) << " element " << i;
          if (!q.zero_points) {
            ASSERT_EQ(nibble_at(out.weight, i), 0);
          }
        }
        ASSERT_EQ(back[sz(i)], 0.0) << where(b) << " element " << i;
      });
    });
  }
}

// ---------------------------------------------------------------------------------------------
// 7. Refusals

void expect_invalid_argument(const std::function<void()>& call,
                             const std::vector<std::string>& fragments) {
  try {
    call();
    ADD_FAILURE() << "no exception";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), Errc::invalid_argument) << error.what();
    for (const std::string& fragment : fragments) {
      EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos)
          << "\"" << fragment << "\" not in: " << error.what();
    }
  }
}

TEST(QuantizeRefuses, NonFiniteWeightNamingExpertPartAndElement) {
  struct Case {
    int64_t e, part, r, c;
    float value;
    const char* text;
  };
  const Case cases[] = {{1, 1, 3, 5, NAN, "nan"},
                        {0, 0, 0, 0, INFINITY, "inf"},
                        {1, 0, 2, 7, -INFINITY, "-inf"},
                        {0, 1, 3, 7, NAN, "nan"}};
  const StackShape s{2, 2, 2 * 4, 8};
  for (const Variant& v : all_variants()) {
    for (const Case& c : cases) {
      SCOPED_TRACE(v.name + " " + c.text);
      std::vector<float> w = random_weights(s.shape(), 3);
      w[sz(((c.e * s.parts + c.part) * (s.rows / s.parts) + c.r) * s.K + c.c)] = c.value;
      const Tensor input = tensor_from(w, s.shape());
      expect_invalid_argument(
          [&] { (void)quantize_matrices(input, s.parts, v.params); },
          {"expert " + std::to_string(c.e) + " part " + std::to_string(c.part),
           "element [" + std::to_string(c.r) + ", " + std::to_string(c.c) + "]", "not finite"});
    }
  }
}

TEST(QuantizeRefuses, NonFloatInputDtypes) {
  for (const DType dtype : {DType::i32, DType::i8, DType::i4, DType::f8e4m3}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor input = Tensor::empty(dtype, {1, 2, 8});
    for (const QuantParams& q : {QuantParams::Fp8Tensor(), QuantParams::Int4Group(4),
                                 QuantParams::Unquantized(WeightFormat::f32)}) {
      expect_invalid_argument([&] { (void)quantize_matrices(input, 1, q); },
                              {"must be f32, bf16 or f16", std::string(dtype_name(dtype))});
    }
  }
}

TEST(QuantizeRefuses, OddKForInt4) {
  for (const int64_t K : {1, 7, 129}) {
    const Tensor input = tensor_from(std::vector<float>(sz(2 * K), 0.5f), {1, 2, K});
    for (const bool zero_points : {false, true}) {
      expect_invalid_argument(
          [&] {
            (void)quantize_matrices(input, 1, QuantParams::Int4Group(2, DType::bf16, zero_points));
          },
          {"int4", "K = " + std::to_string(K) + " is odd"});
    }
  }
}

TEST(QuantizeRefuses, RankOtherThanThree) {
  const std::vector<float> values(64, 0.5f);
  for (const Shape& shape : {Shape{8, 8}, Shape{64}, Shape{1, 2, 4, 8}}) {
    SCOPED_TRACE(shape.str());
    const Tensor input = tensor_from(values, shape);
    expect_invalid_argument([&] { (void)quantize_matrices(input, 1, QuantParams::Fp8Block()); },
                            {"[E, N, K]", shape.str()});
  }
}

TEST(QuantizeRefuses, RowsNotDivisibleIntoParts) {
  const Tensor input = tensor_from(std::vector<float>(5 * 8, 0.5f), {1, 5, 8});
  expect_invalid_argument([&] { (void)quantize_matrices(input, 2, QuantParams::Fp8Tensor()); },
                          {"multiple of 2 parts", "[1, 5, 8]"});
  expect_invalid_argument([&] { (void)quantize_matrices(input, 0, QuantParams::Fp8Tensor()); },
                          {"[E, N, K]"});
}

TEST(QuantizeRefuses, NonContiguousOrNonCpuWeights) {
  const Tensor input = tensor_from(std::vector<float>(2 * 4 * 8, 0.5f), {2, 4, 8});
  expect_invalid_argument(
      [&] { (void)quantize_matrices(input.view().narrow(2, 0, 4), 1, QuantParams::Fp8Tensor()); },
      {"contiguous"});
  TensorView on_gpu = input.view();
  on_gpu.device = Device::cuda(0);
  expect_invalid_argument([&] { (void)quantize_matrices(on_gpu, 1, QuantParams::Fp8Tensor()); },
                          {"on the CPU", "cuda"});
}

TEST(QuantizeRefuses, InvalidQuantParams) {
  QuantParams fp8_tensor_with_columns = QuantParams::Fp8Tensor();
  fp8_tensor_with_columns.block_cols = 64;
  QuantParams int4_with_fp8_activations = QuantParams::Int4Group();
  int4_with_fp8_activations.activation = ActivationQuant::fp8_per_token;
  QuantParams int8_activations_of_another_group = QuantParams::Int4GroupA8(128);
  int8_activations_of_another_group.activation_group = 64;
  struct Case {
    QuantParams params;
    const char* fragment;
  };
  const Case cases[] = {
      {QuantParams::Int4Group(63), "even group size"},
      {int8_activations_of_another_group, "int8 per token per weight group"},
      {QuantParams::Int4Group(0), "even group size"},
      {QuantParams::Int4Group(128, DType::f32), "scales are f16 or bf16"},
      {QuantParams::Fp8Block(0), "positive block sizes"},
      {QuantParams::Fp8Block(-128), "must not be negative"},
      {fp8_tensor_with_columns, "one whole matrix"},
      {int4_with_fp8_activations, "leaves activations unquantised"},
  };
  const Tensor input = tensor_from(std::vector<float>(2 * 128, 0.5f), {1, 2, 128});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.fragment);
    expect_invalid_argument([&] { (void)quantize_matrices(input, 1, c.params); },
                            {"quantize_matrices", c.fragment});
  }
}

// ---------------------------------------------------------------------------------------------
// 8. dequantize_row against the oracle's reader

TEST(DequantizeRow, DoubleAndFloatRowsMatchTheOracleForEveryFormat) {
  uint64_t seed = 200;
  for (const StackShape& s : kRandomShapes) {
    for (const Variant& v : all_variants()) {
      SCOPED_TRACE(v.name + " " + s.str());
      const QuantParams& q = v.params;
      // Unquantized formats are read from their own dtype; quantized ones from the quantiser.
      const std::vector<float> w = random_weights(s.shape(), seed++);
      const QuantizedMatrices out = quantize_matrices(tensor_from(w, s.shape()), s.parts, q);
      const std::vector<double> want = test::dequantized(out.view(), s.parts, q);
      const StoredMatrices m = stored(out, s.parts);
      std::vector<double> row_d(sz(s.K));
      std::vector<float> row_f(sz(s.K));
      int64_t failures = 0;
      for (int64_t e = 0; e < s.E; ++e) {
        for (int64_t r = 0; r < s.rows; ++r) {
          dequantize_row<double>(q, m, e, r, row_d.data());
          dequantize_row<float>(q, m, e, r, row_f.data());
          for (int64_t k = 0; k < s.K; ++k) {
            const double oracle = want[sz((e * s.rows + r) * s.K + k)];
            // The double row is q * scale exactly; the float row is it rounded once to f32.
            if ((row_d[sz(k)] != oracle || row_f[sz(k)] != static_cast<float>(oracle)) &&
                failures++ < 5) {
              ADD_FAILURE() << "expert " << e << " row " << r << " column " << k << ": double "
                            << row_d[sz(k)] << ", float " << row_f[sz(k)] << ", oracle " << oracle;
            }
          }
        }
      }
      EXPECT_EQ(failures, 0);
    }
  }
}

TEST(DequantizeRow, ScaleRowIndexPointsAtTheRowsBlockForEveryFormat) {
  const StackShape s{2, 2, 2 * 72, 192};
  for (const Variant& v : quantized_variants()) {
    const QuantParams& q = v.params;
    SCOPED_TRACE(v.name);
    const QuantizedMatrices out =
        quantize_matrices(tensor_from(random_weights(s.shape(), 9), s.shape()), s.parts, q);
    const StoredMatrices m = stored(out, s.parts);
    const Grid g(q, s.shape(), s.parts);
    for (int64_t e = 0; e < s.E; ++e) {
      for (int64_t r = 0; r < s.rows; ++r) {
        const int64_t part = r / g.N, within = r % g.N;
        const int64_t want = ((e * g.parts + part) * g.SR + within / g.br) * g.SC;
        ASSERT_EQ(scale_row_index(q, m, e, r), want) << "expert " << e << " row " << r;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// 9. Activation quantisation against the oracle

std::vector<float> random_row(int64_t n, uint64_t seed, float group_ratio = 1.0f,
                              int64_t group = 0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(sz(n));
  for (int64_t k = 0; k < n; ++k) {
    // Later groups are smaller, so a group scaled with another group's amax would show.
    const float factor = group > 0 ? std::pow(group_ratio, static_cast<float>(k / group)) : 1.0f;
    x[sz(k)] = normal(rng) * factor;
  }
  return x;
}

struct ActivationCase {
  std::string name;
  QuantParams params;
  int64_t n;
  float static_scale;
};

std::vector<ActivationCase> activation_cases() {
  const QuantParams per_token = QuantParams::Fp8Tensor();
  const QuantParams per_group = QuantParams::Fp8Block(128);
  const QuantParams per_group64 = QuantParams::Fp8Block(64);
  const QuantParams fixed = QuantParams::Fp8Tensor(Fp8Scaling::per_tensor, Fp8Activations::static_);
  return {
      {"per token n=200", per_token, 200, 0.0f},
      {"per token n=1", per_token, 1, 0.0f},
      {"per group 128 n=200 (partial last group)", per_group, 200, 0.0f},
      {"per group 128 n=256", per_group, 256, 0.0f},
      {"per group 128 n=100 (one partial group)", per_group, 100, 0.0f},
      {"per group 64 n=200", per_group64, 200, 0.0f},
      {"static scale 0.01", fixed, 200, 0.01f},
      {"static scale 3", fixed, 130, 3.0f},
  };
}

// The static cases also get values past 448 * scale, which must saturate.
std::vector<float> activation_input(const ActivationCase& c, uint64_t seed) {
  const int64_t group =
      c.params.activation == ActivationQuant::fp8_per_token_group ? c.params.activation_group : 0;
  std::vector<float> x = random_row(c.n, seed, 1.0f / 64, group);
  if (c.params.activation == ActivationQuant::fp8_static) {
    for (int64_t k = 0; k < c.n; k += 7) x[sz(k)] *= 1000.0f * c.static_scale;
  }
  return x;
}

TEST(ActivationQuant, RowsMatchTheOracleInDoubleAndFloat) {
  uint64_t seed = 300;
  for (const ActivationCase& c : activation_cases()) {
    SCOPED_TRACE(c.name);
    const std::vector<float> x = activation_input(c, seed++);
    const std::vector<double> want =
        test::quantized_input(c.params, c.static_scale, std::vector<double>(x.begin(), x.end()));
    std::vector<double> got_d(sz(c.n));
    std::vector<float> got_f(sz(c.n));
    quantize_activation_row<double>(c.params, c.static_scale, x.data(), c.n, got_d.data());
    quantize_activation_row<float>(c.params, c.static_scale, x.data(), c.n, got_f.data());
    std::vector<float> in_place = x;
    quantize_activation_row<float>(c.params, c.static_scale, in_place.data(), c.n, in_place.data());
    for (int64_t k = 0; k < c.n; ++k) {
      ASSERT_EQ(got_d[sz(k)], want[sz(k)]) << "column " << k << " x " << x[sz(k)];
      ASSERT_EQ(got_f[sz(k)], static_cast<float>(want[sz(k)])) << "column " << k;
      ASSERT_EQ(in_place[sz(k)], got_f[sz(k)]) << "column " << k;
    }
  }
}

TEST(ActivationQuant, ResultsAreE4M3CodesTimesTheGroupScaleAndTheGroupMaxIs448) {
  uint64_t seed = 400;
  for (const ActivationCase& c : activation_cases()) {
    SCOPED_TRACE(c.name);
    const std::vector<float> x = activation_input(c, seed++);
    std::vector<double> got(sz(c.n));
    quantize_activation_row<double>(c.params, c.static_scale, x.data(), c.n, got.data());
    const int64_t group = c.params.activation == ActivationQuant::fp8_per_token_group
                              ? c.params.activation_group
                              : c.n;
    for (int64_t k0 = 0; k0 < c.n; k0 += group) {
      const int64_t k1 = std::min(c.n, k0 + group);
      float amax = 0.0f;
      int64_t top = k0;
      for (int64_t k = k0; k < k1; ++k) {
        if (std::fabs(x[sz(k)]) > amax) {
          amax = std::fabs(x[sz(k)]);
          top = k;
        }
      }
      const float scale = c.params.activation == ActivationQuant::fp8_static
                              ? c.static_scale
                              : std::max(amax, 1e-10f) / 448.0f;
      for (int64_t k = k0; k < k1; ++k) {
        const double code = got[sz(k)] / static_cast<double>(scale);
        ASSERT_LE(std::fabs(code), 448.0) << "column " << k;
        ASSERT_EQ(static_cast<double>(to_float(to_e4m3(static_cast<float>(code)))), code)
            << "column " << k << ": " << got[sz(k)] << " is not an e4m3 code times " << scale;
        // Within e4m3 rounding of the input, where it is not saturated.
        if (std::fabs(x[sz(k)]) / scale <= 448.0f && std::fabs(x[sz(k)]) / scale >= 0x1p-6f) {
          ASSERT_NEAR(got[sz(k)], x[sz(k)], std::fabs(x[sz(k)]) * (0x1p-4 + 0x1p-20))
              << "column " << k;
        }
      }
      if (c.params.activation != ActivationQuant::fp8_static) {
        EXPECT_EQ(got[sz(top)], std::copysign(448.0, x[sz(top)]) * static_cast<double>(scale))
            << "group at " << k0;
      }
    }
  }
}

TEST(ActivationQuant, StaticScaleSaturatesValuesBeyond448TimesTheScale) {
  const QuantParams q = QuantParams::Fp8Tensor(Fp8Scaling::per_channel, Fp8Activations::static_);
  for (const float scale : {0.01f, 0.5f, 3.0f}) {
    SCOPED_TRACE(scale);
    const float limit = 448.0f * scale;
    const std::vector<float> x = {
        limit * 1.001f, -limit * 1.001f, limit * 2.0f, -limit * 1e6f, limit,
        -limit,         1e30f,           -1e30f,       limit * 0.5f,  0.0f};
    std::vector<double> got(x.size());
    quantize_activation_row<double>(q, scale, x.data(), static_cast<int64_t>(x.size()), got.data());
    const double s = scale;
    const double want[] = {448 * s,  -448 * s, 448 * s,  -448 * s, 448 * s,
                           -448 * s, 448 * s,  -448 * s, 224 * s,  0.0};
    for (size_t k = 0; k < x.size(); ++k) EXPECT_EQ(got[k], want[k]) << "x = " << x[k];
    const std::vector<double> oracle =
        test::quantized_input(q, scale, std::vector<double>(x.begin(), x.end()));
    for (size_t k = 0; k < x.size(); ++k) EXPECT_EQ(got[k], oracle[k]) << "x = " << x[k];
  }
}

TEST(ActivationQuant, AllZeroRowStaysZero) {
  for (const ActivationCase& c : activation_cases()) {
    SCOPED_TRACE(c.name);
    const std::vector<float> x(sz(c.n), 0.0f);
    std::vector<double> got_d(sz(c.n), -1.0);
    std::vector<float> got_f(sz(c.n), -1.0f);
    quantize_activation_row<double>(c.params, c.static_scale, x.data(), c.n, got_d.data());
    quantize_activation_row<float>(c.params, c.static_scale, x.data(), c.n, got_f.data());
    for (int64_t k = 0; k < c.n; ++k) {
      ASSERT_EQ(got_d[sz(k)], 0.0) << "column " << k;
      ASSERT_EQ(got_f[sz(k)], 0.0f) << "column " << k;
    }
  }
}

TEST(ActivationQuant, FormatsWithoutActivationQuantisationPassValuesThrough) {
  const std::vector<float> x = random_row(50, 17);
  for (const QuantParams& q :
       {QuantParams::Int4Group(), QuantParams::Unquantized(WeightFormat::bf16)}) {
    std::vector<double> got(x.size());
    quantize_activation_row<double>(q, 0.0f, x.data(), static_cast<int64_t>(x.size()), got.data());
    for (size_t k = 0; k < x.size(); ++k) ASSERT_EQ(got[k], static_cast<double>(x[k])) << k;
  }
}

}  // namespace
}  // namespace moekit
