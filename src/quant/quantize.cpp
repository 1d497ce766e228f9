// Online quantisation, one scale block at a time (docs/QUANTIZATION.md gives the rules):
//   fp8:  scale = amax / 448 (1 for an all-zero block), q = e4m3(w / scale)
//   int4, symmetric:  scale = amax / 7, q = clamp(round(w / scale), -8, 7)
//   int4, zero points: scale = (max(hi, 0) - min(lo, 0)) / 15, zero = round(-lo / scale) - 8,
//                      q = clamp(round(w / scale) + zero, -8, 7)
// int4 scales are rounded up to their f16/bf16 storage first (and kept at least the smallest
// normal value), and q is computed with the stored scale, so dequantising reproduces what the
// quantiser meant and no weight is clipped.

#include "quant/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "moekit/error.hpp"
#include "moekit/layer.hpp"
#include "quant/dequantize.hpp"

namespace moekit {
namespace {

// The scale as stored in the scales' dtype, read back; a block's weights are quantised with this
// value. It is never below `value`: a scale rounded down would leave the block's extreme weights
// beyond the last quantisation level, clipped by more than half a step.
float store_scale(const TensorView& scales, int64_t index, float value, std::string_view name) {
  void* at = static_cast<char*>(scales.data) + dtype_storage_bytes(scales.dtype, index);
  convert_from_f32(&value, 1, at, scales.dtype);
  float stored = read_float(scales, index);
  if (stored < value && scales.dtype != DType::f32) {
    // One unit in the last place up: positive f16 and bf16 values order as their bit patterns.
    ++*static_cast<uint16_t*>(at);
    stored = read_float(scales, index);
  }
  if (!std::isfinite(stored) || stored <= 0.0f) {
    fail(Errc::invalid_argument,
         "{}: a block's scale {} is not a positive finite {}; the weights are out of the "
         "format's range",
         name, value, dtype_name(scales.dtype));
  }
  return stored;
}

// int4 scales stay normal numbers of their f16/bf16 storage (f16 subnormals would lose the
// precision the scale needs); a block of weights smaller than 7 times this quantises coarsely,
// to an absolute error below half of it.
float int4_scale_floor(DType scale_dtype) {
  return scale_dtype == DType::f16 ? 0x1p-14f : 0x1p-126f;
}

int clamp_int4(float value) {
  return static_cast<int>(std::clamp(std::nearbyint(value), -8.0f, 7.0f));
}

struct Block {
  const float* w;  // the matrix's f32 values, [N, K]
  int64_t K;
  int64_t r0, r1, c0, c1;
  template <typename Body>
  void for_each(Body body) const {
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) body(r, c, w[r * K + c]);
    }
  }
};

// An unquantised format stored in the source's own dtype: the bits are the stored value, so
// the rows are checked for NaN/Inf on their bits (exponent all ones) and copied as they are.
// This is the load path of every bf16 checkpoint; widening to f32 and back made it ~0.2 GB/s.
bool copy_same_dtype(const TensorView& src, const StoredMatrices& dst, int64_t first_row,
                     std::string_view name) {
  const DType dtype = src.dtype;
  if (dtype != dst.weight.dtype || (dtype != DType::bf16 && dtype != DType::f16)) return false;
  const uint16_t exponent = dtype == DType::bf16 ? 0x7f80u : 0x7c00u;
  const int64_t N = src.dim(0), K = src.dim(1);
  auto* out = static_cast<uint16_t*>(dst.weight.data) + first_row;
  for (int64_t r = 0; r < N; ++r) {
    const auto* row = static_cast<const uint16_t*>(src.data) + r * src.strides[0];
    for (int64_t c = 0; c < K; ++c) {
      if ((row[c] & exponent) == exponent) {
        fail(Errc::invalid_argument, "{}: element [{}, {}] is not finite ({})", name, r, c,
             read_float(src, r * src.strides[0] + c));
      }
    }
    std::memcpy(out + r * K, row, static_cast<size_t>(K) * sizeof(uint16_t));
  }
  return true;
}

}  // namespace

void quantize_into(const QuantParams& params, const TensorView& src, const StoredMatrices& dst,
                   int64_t slot, int part, std::string_view name) {
  const int64_t N = src.dim(0), K = src.dim(1);
  const int64_t first_row = (slot * dst.weight.dim(1) + part * N) * K;  // element index
  if (!params.quantized() && src.strides[1] == 1 && copy_same_dtype(src, dst, first_row, name)) {
    return;
  }
  std::vector<float> w(static_cast<size_t>(N * K));
  for (int64_t r = 0; r < N; ++r) {
    convert_to_f32(
        static_cast<const char*>(src.data) + dtype_storage_bytes(src.dtype, r * src.strides[0]),
        src.dtype, K, w.data() + r * K);
  }
  for (int64_t i = 0; i < N * K; ++i) {
    if (!std::isfinite(w[i])) {
      fail(Errc::invalid_argument, "{}: element [{}, {}] is not finite ({})", name, i / K, i % K,
           w[i]);
    }
  }
  auto* bytes = static_cast<uint8_t*>(dst.weight.data);
  if (!params.quantized()) {
    convert_from_f32(w.data(), N * K, bytes + dtype_storage_bytes(dst.weight.dtype, first_row),
                     dst.weight.dtype);
    return;
  }
  const int64_t br = params.block_rows == 0 ? N : params.block_rows;
  const int64_t bc = params.block_cols == 0 ? K : params.block_cols;
  const int64_t SR = params.scale_rows(N), SC = params.scale_cols(K);
  for (int64_t sr = 0; sr < SR; ++sr) {
    for (int64_t sc = 0; sc < SC; ++sc) {
      const Block block{
          w.data(), K, sr * br, std::min(N, (sr + 1) * br), sc * bc, std::min(K, (sc + 1) * bc)};
      const int64_t index = (slot * dst.parts * SR + part * SR + sr) * SC + sc;
      float lo = 0.0f, hi = 0.0f;
      block.for_each([&](int64_t, int64_t, float v) {
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      });
      const float amax = std::max(hi, -lo);
      if (params.weight_dtype == DType::f8e4m3) {
        const float scale = store_scale(dst.scale, index, amax > 0 ? amax / kE4M3Max : 1.0f, name);
        block.for_each([&](int64_t r, int64_t c, float v) {
          bytes[first_row + r * K + c] = to_e4m3(v / scale).bits;
        });
      } else if (!params.zero_points) {
        const float floor = int4_scale_floor(dst.scale.dtype);
        const float scale =
            store_scale(dst.scale, index, amax > 0 ? std::max(amax / 7.0f, floor) : 1.0f, name);
        block.for_each([&](int64_t r, int64_t c, float v) {
          int4_set(bytes, first_row + r * K + c, clamp_int4(v / scale));
        });
      } else {
        const float floor = int4_scale_floor(dst.scale.dtype);
        const float scale = store_scale(dst.scale, index,
                                        hi > lo ? std::max((hi - lo) / 15.0f, floor) : 1.0f, name);
        const int zero = clamp_int4(std::nearbyint(-lo / scale) - 8.0f);
        static_cast<int8_t*>(dst.zero.data)[index] = static_cast<int8_t>(zero);
        block.for_each([&](int64_t r, int64_t c, float v) {
          int4_set(bytes, first_row + r * K + c,
                   clamp_int4(std::nearbyint(v / scale) + static_cast<float>(zero)));
        });
      }
    }
  }
}

void copy_into(const QuantParams& params, const MatrixSource& src, const StoredMatrices& dst,
               int64_t slot, int part) {
  const int64_t N = src.weight.dim(0), K = src.weight.dim(1);
  const DType dtype = dst.weight.dtype;
  const int64_t first_row = slot * dst.weight.dim(1) + part * N;
  const int64_t row_bytes = dtype_storage_bytes(dtype, K);
  for (int64_t r = 0; r < N; ++r) {
    std::memcpy(
        static_cast<char*>(dst.weight.data) + dtype_storage_bytes(dtype, (first_row + r) * K),
        static_cast<const char*>(src.weight.data) +
            dtype_storage_bytes(dtype, r * src.weight.strides[0]),
        static_cast<size_t>(row_bytes));
  }
  if (!params.quantized()) return;
  const int64_t SR = params.scale_rows(N), SC = params.scale_cols(K);
  const auto copy_grid = [&](const TensorView& from, const TensorView& to) {
    const int64_t element = dtype_storage_bytes(to.dtype, 1);
    for (int64_t r = 0; r < SR; ++r) {
      for (int64_t c = 0; c < SC; ++c) {
        std::memcpy(static_cast<char*>(to.data) +
                        ((slot * dst.parts * SR + part * SR + r) * SC + c) * element,
                    static_cast<const char*>(from.data) +
                        (r * from.strides[0] + c * from.strides[1]) * element,
                    static_cast<size_t>(element));
      }
    }
  };
  copy_grid(src.scale, dst.scale);
  if (params.zero_points) copy_grid(src.zero, dst.zero);
}

QuantizedMatrices quantize_matrices(const TensorView& weights, int parts,
                                    const QuantParams& params) {
  if (std::vector<std::string> problems = params.problems(); !problems.empty()) {
    fail(Errc::invalid_argument, "quantize_matrices: {}", problems.front());
  }
  if (weights.rank() != 3 || parts < 1 || weights.dim(1) % parts != 0 || !weights.is_contiguous() ||
      weights.device.kind != DeviceKind::cpu) {
    fail(Errc::invalid_argument,
         "quantize_matrices: expected contiguous [E, N, K] on the CPU with N a multiple of "
         "{} parts, got {}",
         parts, weights.describe());
  }
  if (weights.dtype != DType::f32 && weights.dtype != DType::bf16 && weights.dtype != DType::f16) {
    fail(Errc::invalid_argument, "quantize_matrices: weights must be f32, bf16 or f16, got {}",
         weights.describe());
  }
  const int64_t E = weights.dim(0), N = weights.dim(1) / parts, K = weights.dim(2);
  if (params.weight_dtype == DType::i4 && K % 2 != 0) {
    fail(Errc::invalid_argument, "quantize_matrices: int4 packs K in pairs, K = {} is odd", K);
  }
  QuantizedMatrices out;
  out.weight = Tensor::empty(params.weight_dtype, weights.shape);
  const Shape grid{E, parts * params.scale_rows(N), params.scale_cols(K)};
  if (params.quantized()) out.scale = Tensor::empty(params.scale_dtype, grid);
  if (params.zero_points) out.zero = Tensor::empty(DType::i8, grid);
  const StoredMatrices dst{out.weight.view(), out.scale.view(), out.zero.view(), parts};
  for (int64_t e = 0; e < E; ++e) {
    for (int part = 0; part < parts; ++part) {
      quantize_into(params, weights.select(e).narrow(0, part * N, N), dst, e, part,
                    fmt::format("expert {} part {}", e, part));
    }
  }
  return out;
}

ExpertMatrices QuantizedMatrices::view() const {
  ExpertMatrices m(weight.view());
  m.scale = scale.view();
  m.zero = zero.view();
  return m;
}

QuantizedLayerWeights quantize_layer(const LayerWeights& weights, const QuantParams& params) {
  QuantizedLayerWeights out;
  out.w13 = quantize_matrices(weights.w13.weight, 2, params);
  out.w2 = quantize_matrices(weights.w2.weight, 1, params);
  if (weights.shared_w13.weight.data != nullptr) {
    out.shared_w13 = quantize_matrices(weights.shared_w13.weight, 2, params);
    out.shared_w2 = quantize_matrices(weights.shared_w2.weight, 1, params);
  }
  out.correction_bias = weights.correction_bias;
  out.shared_gate = weights.shared_gate;
  out.input_scales[0] = weights.w13.input_scale;
  out.input_scales[1] = weights.w2.input_scale;
  out.input_scales[2] = weights.shared_w13.input_scale;
  out.input_scales[3] = weights.shared_w2.input_scale;
  return out;
}

LayerWeights QuantizedLayerWeights::view() const {
  LayerWeights w;
  w.w13 = w13.view();
  w.w2 = w2.view();
  w.shared_w13 = shared_w13.view();
  w.shared_w2 = shared_w2.view();
  w.w13.input_scale = input_scales[0];
  w.w2.input_scale = input_scales[1];
  w.shared_w13.input_scale = input_scales[2];
  w.shared_w2.input_scale = input_scales[3];
  w.correction_bias = correction_bias;
  w.shared_gate = shared_gate;
  return w;
}

}  // namespace moekit
