// Bad quantised weights are refused when the layer is built, with invalid_argument naming the
// tensor and what is wrong with it; QuantParams that describe no format are refused by
// resolve().

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <initializer_list>
#include <ostream>
#include <string>
#include <vector>

#include "support/layer_fixture.hpp"

namespace moekit::test {
namespace {

// H and I are two blocks or groups of 32 wide, the shared expert twice a routed one.
ModelSpec spec() {
  ModelSpec s = small_dsv3();
  s.hidden = 64;
  s.intermediate = 32;
  s.shared_intermediate = 64;
  return s;
}

const QuantParams kFp8Block = QuantParams::Fp8Block(32);
const QuantParams kFp8Dynamic = QuantParams::Fp8Tensor();
const QuantParams kFp8Static =
    QuantParams::Fp8Tensor(Fp8Scaling::per_channel, Fp8Activations::static_);
const QuantParams kInt4 = QuantParams::Int4Group(32, DType::bf16);
const QuantParams kInt4Zero = QuantParams::Int4Group(32, DType::bf16, true);
const QuantParams kBf16 = WeightFormat::bf16;

// A layer's weights in the plan's format (quantised ahead of time, with input scales for fp8
// static activations), which a case spoils before the layer is built from them.
struct Weights {
  explicit Weights(const QuantParams& plan_format)
      : floats(RandomWeights::make(spec(), DType::bf16, 111)) {
    LayerWeights source = floats.view();
    if (plan_format.activation == ActivationQuant::fp8_static) {
      const int64_t counts[4] = {spec().n_experts, spec().n_experts, spec().n_shared,
                                 spec().n_shared};
      ExpertMatrices* stacks[4] = {&source.w13, &source.w2, &source.shared_w13, &source.shared_w2};
      for (int i = 0; i < 4; ++i) stacks[i]->input_scale = filled(DType::f32, {counts[i]}, 0.01f);
    }
    if (plan_format.quantized()) {
      quantized = quantize_layer(source, plan_format);
      given = quantized.view();
    } else {
      given = source;
    }
  }

  // A tensor that lives as long as these weights, every element `value`.
  TensorView filled(DType dtype, Shape shape, float value) {
    Tensor& t = made.emplace_back(Tensor::empty(dtype, shape));
    for (int64_t i = 0; i < shape.numel(); ++i) set(t.view(), i, value);
    return t.view();
  }

  // The same layer's weights in another format, kept alive here.
  LayerWeights in_format(const QuantParams& format) {
    return other.emplace_back(quantize_layer(floats.view(), format)).view();
  }

  // Element `index` of a float tensor (f32, f16 or bf16) or of i8 zero points.
  static void set(const TensorView& t, int64_t index, float value) {
    if (t.dtype == DType::i8) {
      t.as<int8_t>()[index] = static_cast<int8_t>(value);
      return;
    }
    convert_from_f32(&value, 1, static_cast<char*>(t.data) + dtype_storage_bytes(t.dtype, index),
                     t.dtype);
  }

  // The flat index of [a, b, c] in a rank-3 tensor.
  static int64_t at(const TensorView& t, int64_t a, int64_t b, int64_t c) {
    return (a * t.dim(1) + b) * t.dim(2) + c;
  }

  RandomWeights floats;
  QuantizedLayerWeights quantized;
  LayerWeights given;
  std::vector<Tensor> made;
  std::vector<QuantizedLayerWeights> other;
};

struct BadCase {
  const char* name;
  QuantParams plan_format;
  std::function<void(Weights&)> spoil;
  std::vector<std::string> fragments;  // the message names the tensor and what is wrong
};

std::vector<BadCase> bad_cases() {
  using W = Weights;
  return {
      // Scales that are not finite and positive, named by their element.
      {"scale_nan",
       kFp8Block,
       [](W& w) { W::set(w.given.w13.scale, W::at(w.given.w13.scale, 1, 0, 0), NAN); },
       {"weights.w13.scale", "element [1, 0, 0] is nan", "finite and positive"}},
      {"scale_infinite",
       kFp8Block,
       [](W& w) { W::set(w.given.w2.scale, W::at(w.given.w2.scale, 2, 1, 0), INFINITY); },
       {"weights.w2.scale", "element [2, 1, 0] is inf", "finite and positive"}},
      {"scale_zero",
       kInt4Zero,
       [](W& w) {
         W::set(w.given.shared_w13.scale, W::at(w.given.shared_w13.scale, 0, 3, 1), 0.0f);
       },
       {"weights.shared_w13.scale", "element [0, 3, 1] is 0", "finite and positive"}},
      {"scale_negative",
       kInt4,
       [](W& w) {
         W::set(w.given.shared_w2.scale, W::at(w.given.shared_w2.scale, 0, 5, 1), -0.5f);
       },
       {"weights.shared_w2.scale", "element [0, 5, 1] is -0.5", "finite and positive"}},
      // Scales of the wrong grid, dtype, or none.
      {"scale_shape",
       kFp8Dynamic,
       [](W& w) {
         w.given.w13.scale = w.filled(DType::f32, {16, 2, 2}, 1.0f);
       },
       {"weights.w13.scale", "expected f32[16, 2, 1], got f32[16, 2, 2]"}},
      {"scale_f16_for_fp8",
       kFp8Block,
       [](W& w) {
         w.given.w2.scale = w.filled(DType::f16, {16, 2, 1}, 1.0f);
       },
       {"weights.w2.scale", "expected f32[16, 2, 1], got f16[16, 2, 1]"}},
      {"scale_f32_for_bf16_int4",
       kInt4,
       [](W& w) {
         w.given.w13.scale = w.filled(DType::f32, {16, 64, 2}, 1.0f);
       },
       {"weights.w13.scale", "expected bf16[16, 64, 2], got f32[16, 64, 2]"}},
      {"scale_missing",
       kFp8Static,
       [](W& w) { w.given.shared_w13.scale = {}; },
       {"weights.shared_w13.scale", "missing", "f32[1, 128, 1]"}},
      // Zero points out of range, given without the plan having them, or missing.
      {"zero_above_7",
       kInt4Zero,
       [](W& w) { W::set(w.given.w2.zero, W::at(w.given.w2.zero, 3, 5, 0), 8.0f); },
       {"weights.w2.zero", "element [3, 5, 0] is 8", "[-8, 7]"}},
      {"zero_below_minus_8",
       kInt4Zero,
       [](W& w) { W::set(w.given.shared_w2.zero, W::at(w.given.shared_w2.zero, 0, 2, 1), -9.0f); },
       {"weights.shared_w2.zero", "element [0, 2, 1] is -9", "[-8, 7]"}},
      {"zero_for_symmetric",
       kInt4,
       [](W& w) { w.given.w13.zero = w.in_format(kInt4Zero).w13.zero; },
       {"weights.w13.zero", "given", "no zero points"}},
      {"zero_missing",
       kInt4Zero,
       [](W& w) { w.given.shared_w2.zero = {}; },
       {"weights.shared_w2.zero", "missing", "i8[1, 64, 2]"}},
      // Scales with float weights; weights of another format.
      {"scale_with_float_weights",
       kFp8Block,
       [](W& w) { w.given.w13.weight = w.floats.w13.view(); },
       {"weights.w13.scale", "given", "only with weights already in the format"}},
      {"e4m3_for_int4",
       kInt4,
       [](W& w) { w.given.w2 = w.in_format(kFp8Block).w2; },
       {"weights.w2", "f8e4m3 weights do not fit the plan's format int4-group"}},
      {"i4_for_fp8",
       kFp8Block,
       [](W& w) { w.given.shared_w13 = w.in_format(kInt4).shared_w13; },
       {"weights.shared_w13", "i4 weights do not fit the plan's format fp8-block"}},
      {"e4m3_for_bf16",
       kBf16,
       [](W& w) { w.given.w13 = w.in_format(kFp8Block).w13; },
       {"weights.w13", "f8e4m3 weights do not fit the plan's format bf16"}},
      // Input scales of fp8 static activations.
      {"input_scale_missing",
       kFp8Static,
       [](W& w) { w.given.w2.input_scale = {}; },
       {"weights.w2.input_scale", "missing", "f32[16]"}},
      {"input_scale_for_dynamic",
       kFp8Dynamic,
       [](W& w) { w.given.w13.input_scale = w.filled(DType::f32, {16}, 0.01f); },
       {"weights.w13.input_scale", "given", "not static"}},
      {"input_scale_nan",
       kFp8Static,
       [](W& w) { W::set(w.given.shared_w2.input_scale, 0, NAN); },
       {"weights.shared_w2.input_scale", "element [0] is nan"}},
      {"input_scale_negative",
       kFp8Static,
       [](W& w) { W::set(w.given.w13.input_scale, 5, -0.01f); },
       {"weights.w13.input_scale", "element [5] is -0.01"}},
      {"input_scale_shape",
       kFp8Static,
       [](W& w) { w.given.w2.input_scale = w.filled(DType::f32, {8}, 0.01f); },
       {"weights.w2.input_scale", "expected f32[16], got f32[8]"}},
      // Quantised weights that encode no number: e4m3fn has NaN codes (0x7F, 0xFF).
      {"e4m3_weight_nan",
       kFp8Block,
       [](W& w) { w.given.w2.weight.as<uint8_t>()[W::at(w.given.w2.weight, 2, 10, 3)] = 0x7F; },
       {"weights.w2", "[2, 10, 3]", "NaN"}},
      // Float weights that online quantisation cannot quantise, named by their element in the
      // stack (an up row of w13 lies after the I gate rows).
      {"float_nan_routed",
       kFp8Block,
       [](W& w) {
         w.given = w.floats.view();
         W::set(w.given.w13.weight, W::at(w.given.w13.weight, 3, 40, 5), NAN);
       },
       {"weights.w13", "[3, 40, 5]", "not finite"}},
      {"float_nan_shared",
       kInt4,
       [](W& w) {
         w.given = w.floats.view();
         W::set(w.given.shared_w2.weight, W::at(w.given.shared_w2.weight, 0, 7, 9), NAN);
       },
       {"weights.shared_w2", "[0, 7, 9]", "not finite"}},
  };
}

class BadQuantizedWeights : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadQuantizedWeights, AreRefusedAtBuildNamingTheTensor) {
  const BadCase& c = GetParam();
  Options options;
  options.weights = c.plan_format;
  options.max_tokens = 4;
  const Plan plan = resolve(spec(), options, Platform::cpu_only(2));
  Weights weights(c.plan_format);
  c.spoil(weights);
  try {
    MoeLayer layer(plan, weights.given);
    FAIL() << "the layer was built";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
    for (const std::string& fragment : c.fragments) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
          << "message '" << e.what() << "' lacks '" << fragment << "'";
    }
  }
}

std::string bad_case_name(const ::testing::TestParamInfo<BadCase>& info) {
  return info.param.name;
}

void PrintTo(const BadCase& c, std::ostream* os) {
  *os << c.name;
}

INSTANTIATE_TEST_SUITE_P(BadQuantizedWeights, BadQuantizedWeights, ::testing::ValuesIn(bad_cases()),
                         bad_case_name);

TEST(BadQuantizedWeightsBaseline, TheUnspoiledWeightsBuildALayer) {
  // Every case above starts from these; each must fail for its own reason only.
  for (const QuantParams& format : {kFp8Block, kFp8Dynamic, kFp8Static, kInt4, kInt4Zero, kBf16}) {
    SCOPED_TRACE(format.describe());
    Options options;
    options.weights = format;
    options.max_tokens = 4;
    const Weights weights(format);
    EXPECT_NO_THROW(MoeLayer(resolve(spec(), options, Platform::cpu_only(2)), weights.given));
  }
}

struct BadParams {
  const char* name;
  QuantParams params;
  const char* fragment;
};

TEST(BadQuantizedWeightsParams, ParamsThatDescribeNoFormatAreRefusedByResolve) {
  const BadParams cases[] = {{"odd int4 group", QuantParams::Int4Group(63), "even group size"},
                             {"empty fp8 block", QuantParams::Fp8Block(0), "positive block sizes"}};
  for (const BadParams& c : cases) {
    SCOPED_TRACE(c.name);
    Options options;
    options.weights = c.params;
    try {
      resolve(spec(), options, Platform::cpu_only(2));
      ADD_FAILURE() << "resolved";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::config_refused) << e.what();
    }
    const Resolution resolution = try_resolve(spec(), options, Platform::cpu_only(2));
    EXPECT_FALSE(resolution.plan.has_value());
    for (const char* fragment :
         {"refused", weight_format_name(c.params.format).data(), c.fragment}) {
      EXPECT_NE(resolution.refusal.find(fragment), std::string::npos)
          << "refusal '" << resolution.refusal << "' lacks '" << fragment << "'";
    }
  }
}

}  // namespace
}  // namespace moekit::test
