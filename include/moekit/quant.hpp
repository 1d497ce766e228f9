#pragma once
// Weight formats and their quantisation parameters: one value type, built by named
// constructors, that resolve() records in the plan and every runner core (CPU now, GPU later)
// reads. Also the stacks of expert matrices a layer is given, float or already quantised, and
// the quantiser that online quantisation, the tests and checkpoint writers share.
// The formats and their layouts are described in docs/QUANTIZATION.md.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "moekit/dtype.hpp"
#include "moekit/tensor.hpp"

namespace moekit {

enum class WeightFormat { f32, f16, bf16, fp8_tensor, fp8_block, int4_group };

std::string_view weight_format_name(WeightFormat format);
std::optional<WeightFormat> parse_weight_format(std::string_view name);

inline constexpr WeightFormat kAllWeightFormats[] = {
    WeightFormat::f32,        WeightFormat::f16,       WeightFormat::bf16,
    WeightFormat::fp8_tensor, WeightFormat::fp8_block, WeightFormat::int4_group};

// How the inputs of the two GEMMs are quantised at run time.
enum class ActivationQuant : uint8_t {
  none,                 // they enter as they are, widened to f32 (weight-only formats)
  fp8_per_token,        // dynamic: e4m3 with one scale per token row, amax / 448
  fp8_per_token_group,  // dynamic: one scale per token per `activation_group` columns
  fp8_static,           // one scale per GEMM input, from the checkpoint
  // dynamic: int8 with one scale per token per `activation_group` columns, amax / 127 (W4A8)
  int8_per_token_group,
};
std::string_view activation_quant_name(ActivationQuant quant);

enum class Fp8Scaling { per_tensor, per_channel };
enum class Fp8Activations { dynamic, static_ };

struct QuantParams {
  WeightFormat format = WeightFormat::bf16;
  DType weight_dtype = DType::bf16;  // f32, f16, bf16, f8e4m3 or i4
  // One weight scale covers block_rows x block_cols elements of one [N, K] matrix (gate, up and
  // down are separate matrices); 0 spans the whole dimension. Edge blocks may be partial.
  int64_t block_rows = 0;
  int64_t block_cols = 0;
  DType scale_dtype = DType::f32;
  bool zero_points = false;  // int4: w = (q - zero) * scale; otherwise zero is 0
  ActivationQuant activation = ActivationQuant::none;
  int64_t activation_group = 0;  // columns per scale, for the per token group quantisations

  QuantParams() = default;
  // The format's defaults, so that `options.weights = WeightFormat::fp8_block` reads naturally.
  QuantParams(WeightFormat format);  // NOLINT(google-explicit-constructor)

  // f32, f16 or bf16 stored as they are; activations are not quantised.
  static QuantParams Unquantized(WeightFormat format);
  // W8A8: e4m3 weights with one f32 scale per expert matrix or per output channel; activations
  // quantised per token at run time, or with a static scale per GEMM input from the checkpoint.
  static QuantParams Fp8Tensor(Fp8Scaling scaling = Fp8Scaling::per_tensor,
                               Fp8Activations activations = Fp8Activations::dynamic);
  // DeepSeek-V3 / Qwen3-FP8: e4m3 weights with one f32 weight_scale_inv per block x block tile;
  // activations quantised per token per `block` columns.
  static QuantParams Fp8Block(int64_t block = 128);
  // W4A16 (GPTQ/AWQ style): int4 weights packed along K with one scale per `group` columns of a
  // row, f16 or bf16 scales, symmetric or with zero points.
  static QuantParams Int4Group(int64_t group = 128, DType scale_dtype = DType::bf16,
                               bool zero_points = false);
  // W4A8: int4-group weights, with activations quantised at run time to int8 per token per
  // weight group (amax / 127), as llama.cpp's Q4 x Q8 and sgl-kernel's DA8W4 do on CPUs. Integer
  // dot products then cost half of int16's, at an activation error of up to 1/254 of each group's
  // largest magnitude (docs/QUANTIZATION.md).
  static QuantParams Int4GroupA8(int64_t group = 128, DType scale_dtype = DType::bf16,
                                 bool zero_points = false);

  bool quantized() const { return weight_dtype == DType::f8e4m3 || weight_dtype == DType::i4; }
  bool quantizes_activations() const { return activation != ActivationQuant::none; }
  // The scale grid of one [rows, cols] matrix.
  int64_t scale_rows(int64_t rows) const;
  int64_t scale_cols(int64_t cols) const;

  // What is wrong with these parameters, empty when they describe a format moekit has.
  std::vector<std::string> problems() const;
  std::string describe() const;
  // The format's name, with "-a8" where int4-group quantises its activations to int8.
  std::string name() const;
  bool operator==(const QuantParams& other) const = default;
};

// A stack of expert matrices [E, N, K], each made of `parts` matrices of N/parts rows (w13 is
// gate then up: 2 parts; w2 is 1), as a layer is given it. Either float weights (f32, bf16,
// f16), which a layer with a quantised format quantises at load time, or weights already in the
// plan's format with their scales.
struct ExpertMatrices {
  TensorView weight;       // [E, N, K]: f32/bf16/f16, or e4m3 (fp8 formats), or i4 (int4-group)
  TensorView scale;        // [E, parts * scale_rows(N / parts), scale_cols(K)], scale_dtype
  TensorView zero;         // the scale's shape, i4: int4-group with zero points
  TensorView input_scale;  // [E] f32: fp8 static activations; the layer uses the largest

  ExpertMatrices() = default;
  ExpertMatrices(const TensorView& float_weight)  // NOLINT(google-explicit-constructor)
      : weight(float_weight) {}
};

// Quantised matrices with their scales, owning.
struct QuantizedMatrices {
  Tensor weight;
  Tensor scale;
  Tensor zero;
  ExpertMatrices view() const;
};

// Quantises float matrices [E, N, K] of `parts` parts each, exactly as a layer's online
// quantisation does (see docs/QUANTIZATION.md). Throws invalid_argument for non-float or
// non-finite weights and for shapes the format cannot hold.
QuantizedMatrices quantize_matrices(const TensorView& weights, int parts,
                                    const QuantParams& params);

}  // namespace moekit
