// Quantised weight formats through the whole layer: every format and variant on every CPU path of
// every kernel set against the float64 oracle of the same format, weights quantised ahead of time
// against online quantisation, the size of each format's quantisation error, the block forms and
// expert parallelism. The layer is given float weights unless a test says otherwise.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "support/layer_fixture.hpp"

namespace moekit::test {
namespace {

struct Variant {
  std::string name;
  QuantParams params;
};

std::string scaling_name(Fp8Scaling scaling) {
  return scaling == Fp8Scaling::per_tensor ? "per_tensor" : "per_channel";
}

std::string activations_name(Fp8Activations activations) {
  return activations == Fp8Activations::dynamic ? "dynamic" : "static";
}

Variant fp8_tensor(Fp8Scaling scaling, Fp8Activations activations) {
  return {fmt::format("fp8_tensor_{}_{}", scaling_name(scaling), activations_name(activations)),
          QuantParams::Fp8Tensor(scaling, activations)};
}

Variant fp8_block(int64_t block) {
  return {fmt::format("fp8_block_{}", block), QuantParams::Fp8Block(block)};
}

Variant int4_group(int64_t group, DType scale_dtype, bool zero_points) {
  return {fmt::format("int4_group_{}_{}_{}", group, dtype_name(scale_dtype),
                      zero_points ? "zero_points" : "symmetric"),
          QuantParams::Int4Group(group, scale_dtype, zero_points)};
}

Variant int4_group_a8(int64_t group, DType scale_dtype, bool zero_points) {
  return {fmt::format("int4_group_a8_{}_{}_{}", group, dtype_name(scale_dtype),
                      zero_points ? "zero_points" : "symmetric"),
          QuantParams::Int4GroupA8(group, scale_dtype, zero_points)};
}

// Every quantised format with every variant of its parameters.
std::vector<Variant> every_variant() {
  std::vector<Variant> variants;
  for (Fp8Scaling scaling : {Fp8Scaling::per_tensor, Fp8Scaling::per_channel}) {
    for (Fp8Activations activations : {Fp8Activations::dynamic, Fp8Activations::static_}) {
      variants.push_back(fp8_tensor(scaling, activations));
    }
  }
  for (int64_t block : {128, 32}) variants.push_back(fp8_block(block));
  for (int64_t group : {32, 64, 128}) {
    for (DType scale_dtype : {DType::f16, DType::bf16}) {
      for (bool zero_points : {false, true}) {
        variants.push_back(int4_group(group, scale_dtype, zero_points));
      }
    }
  }
  variants.push_back(int4_group_a8(32, DType::bf16, false));
  variants.push_back(int4_group_a8(128, DType::f16, true));
  return variants;
}

// A DeepSeek-V3-shaped layer with one shared expert twice as wide as a routed one.
ModelSpec dsv3_like(int64_t hidden, int64_t intermediate) {
  ModelSpec spec = small_dsv3();
  spec.name = fmt::format("dsv3-like-{}x{}", hidden, intermediate);
  spec.hidden = hidden;
  spec.intermediate = intermediate;
  spec.shared_intermediate = 2 * intermediate;
  return spec;
}

struct LayerShape {
  const char* name;
  ModelSpec spec;
};

// H and I multiples of 128 (whole blocks and groups), and neither a multiple of 32 nor of 128
// (partial edge blocks and groups everywhere).
std::vector<LayerShape> shapes() {
  return {{"aligned", dsv3_like(256, 128)}, {"ragged", dsv3_like(200, 72)}};
}

// Small enough that I is one block or group of 32, so the shared experts split into slots.
ModelSpec slot_spec() {
  ModelSpec spec = dsv3_like(96, 32);
  spec.name = "dsv3-like-slots";
  spec.n_shared = 2;
  return spec;
}

// A layer's float weights (bf16, the usual source of online quantisation) and the checkpoint's
// input scales [E] of every stack for fp8 static activations, random in [0.005, 0.02]. Made once
// per shape: making them takes longer than most tests.
struct FloatLayer {
  RandomWeights weights;
  Tensor input_scales[4];  // w13, w2, shared_w13, shared_w2

  // The weights a layer of this format is given: input scales only for static activations.
  LayerWeights view(const QuantParams& quant) const {
    LayerWeights w = weights.view();
    if (quant.activation == ActivationQuant::fp8_static) {
      w.w13.input_scale = input_scales[0].view();
      w.w2.input_scale = input_scales[1].view();
      w.shared_w13.input_scale = input_scales[2].view();
      w.shared_w2.input_scale = input_scales[3].view();
    }
    return w;
  }
};

const FloatLayer& float_layer(const ModelSpec& spec) {
  static std::map<std::string, std::unique_ptr<FloatLayer>> made;
  std::unique_ptr<FloatLayer>& layer = made[spec.name];
  if (!layer) {
    layer = std::make_unique<FloatLayer>();
    layer->weights = RandomWeights::make(spec, DType::bf16, 61);
    std::mt19937_64 rng(62);
    std::uniform_real_distribution<float> uniform(0.005f, 0.02f);
    const int64_t counts[4] = {spec.n_experts, spec.n_experts, spec.n_shared, spec.n_shared};
    for (int i = 0; i < 4; ++i) {
      layer->input_scales[i] = Tensor::empty(DType::f32, {counts[i]});
      std::generate_n(layer->input_scales[i].data<float>(), counts[i],
                      [&] { return uniform(rng); });
    }
  }
  return *layer;
}

// A shape's float weights quantised into a variant's format, as the oracle reads them; made
// once per shape and variant.
const QuantizedLayerWeights& quantized_layer(const ModelSpec& spec, const Variant& variant) {
  static std::map<std::string, std::unique_ptr<QuantizedLayerWeights>> made;
  std::unique_ptr<QuantizedLayerWeights>& quantized = made[spec.name + "/" + variant.name];
  if (!quantized) {
    quantized = std::make_unique<QuantizedLayerWeights>(
        quantize_layer(float_layer(spec).view(variant.params), variant.params));
  }
  return *quantized;
}

// The oracle of a shape in a variant's format; made once per shape and variant.
const OracleLayer& oracle_layer(const ModelSpec& spec, const Variant& variant) {
  static std::map<std::string, std::unique_ptr<OracleLayer>> made;
  std::unique_ptr<OracleLayer>& oracle = made[spec.name + "/" + variant.name];
  if (!oracle) {
    oracle =
        std::make_unique<OracleLayer>(spec, quantized_layer(spec, variant).view(), variant.params);
  }
  return *oracle;
}

std::string test_name(std::string name) {
  std::replace(name.begin(), name.end(), '-', '_');
  return name;
}

// Every format and variant, on every path of every kernel set, with f32 and bf16 hidden states
// (f16: tests/runner/test_cpu_layer.cpp) and several batch sizes through one layer, on both
// shapes, against the oracle of its format.

struct Path {
  const char* name;
  RunnerKind runner;
  FusedOps fused_ops;
  int64_t max_tokens;
  std::vector<int64_t> tokens;
  bool fused_op;  // the cpu-decode op replaces permutes and core
};

// The reference core (which reads no kernel set, so on the portable set only), the cpu core with
// its permutes, the cpu fused op at decode sizes, and on AVX2 the fused op at a batch too.
std::vector<Path> paths(KernelSet set) {
  std::vector<Path> p;
  if (set == KernelSet::portable) {
    p.push_back({"reference", RunnerKind::reference, FusedOps::auto_, 16, {0, 1, 3, 13}, false});
  }
  p.push_back({"cpu", RunnerKind::cpu, FusedOps::off, 16, {0, 1, 3, 13}, false});
  p.push_back({"cpu_decode", RunnerKind::cpu, FusedOps::auto_, 4, {0, 1, 3}, true});
  if (set != KernelSet::portable) {
    p.push_back({"cpu_fused_batch", RunnerKind::cpu, FusedOps::auto_, 16, {13}, true});
  }
  return p;
}

struct PathCase {
  KernelSet set;
  Variant variant;
  LayerShape shape;
};

std::vector<PathCase> path_cases() {
  std::vector<PathCase> cases;
  for (KernelSet set : kKernelSets) {
    for (const Variant& variant : every_variant()) {
      for (const LayerShape& shape : shapes()) cases.push_back({set, variant, shape});
    }
  }
  return cases;
}

class QuantizedLayerPath : public KernelSetTest<PathCase> {};

// One case per format, shape and set, looping over the paths: most of a case's time is making
// the layer's weights and the oracle, which the paths share.
TEST_P(QuantizedLayerPath, MatchesTheOracleOfItsFormatOnEveryPath) {
  const PathCase& c = GetParam();
  const ModelSpec& spec = c.shape.spec;
  const QuantParams& quant = c.variant.params;
  const LayerWeights oracle_weights = quantized_layer(spec, c.variant).view();
  const OracleLayer& oracle = oracle_layer(spec, c.variant);
  for (const Path& path : paths(c.set)) {
    SCOPED_TRACE(path.name);
    Options options;
    options.runner = path.runner;
    options.weights = quant;
    options.max_tokens = path.max_tokens;
    options.fused_ops = path.fused_ops;
    const Plan plan = resolve(spec, options, platform(2));
    ASSERT_EQ(plan.fused_op.has_value(), path.fused_op) << plan.explain();
    MoeLayer layer(plan, float_layer(spec).view(quant));
    for (DType hidden : {DType::f32, DType::bf16}) {
      for (int64_t tokens : path.tokens) {
        SCOPED_TRACE(fmt::format("hidden {} T={}", dtype_name(hidden), tokens));
        const Inputs in = random_inputs(spec, tokens, hidden, 63 + static_cast<uint64_t>(tokens));
        const LayerRun run = run_layer(layer, in);
        const OracleRouting routing = oracle_routing(spec, oracle_weights, in, run);
        EXPECT_TRUE(routing.agrees());
        EXPECT_TRUE(compare_with_oracle(oracle, in, routing, run).within(tolerance(hidden)))
            << plan.explain();
      }
    }
  }
}

std::string path_case_name(const ::testing::TestParamInfo<PathCase>& info) {
  const PathCase& c = info.param;
  return test_name(
      fmt::format("{}_{}_{}", kernel_set_test_name(c.set), c.variant.name, c.shape.name));
}

void PrintTo(const PathCase& c, std::ostream* os) {
  *os << path_case_name({c, 0});
}

INSTANTIATE_TEST_SUITE_P(QuantizedLayer, QuantizedLayerPath, ::testing::ValuesIn(path_cases()),
                         path_case_name);

// One case per variant and shape.

struct VariantCase {
  Variant variant;
  LayerShape shape;
};

std::vector<VariantCase> variant_cases() {
  std::vector<VariantCase> cases;
  for (const Variant& variant : every_variant()) {
    for (const LayerShape& shape : shapes()) cases.push_back({variant, shape});
  }
  return cases;
}

std::string variant_case_name(const ::testing::TestParamInfo<VariantCase>& info) {
  return test_name(fmt::format("{}_{}", info.param.variant.name, info.param.shape.name));
}

void PrintTo(const VariantCase& c, std::ostream* os) {
  *os << variant_case_name({c, 0});
}

struct SetVariantCase {
  KernelSet set;
  VariantCase c;
};

// Quantising ahead of time against at load time is a matter of the layout the weights are
// stored in, canonical for the portable kernels and panel16 for every AVX2 set alike, so the
// portable set and "all" cover it; the other sets would repeat "all".
std::vector<SetVariantCase> set_variant_cases() {
  std::vector<SetVariantCase> cases;
  for (KernelSet set : {KernelSet::portable, KernelSet::all}) {
    for (const VariantCase& c : variant_cases()) cases.push_back({set, c});
  }
  return cases;
}

std::string set_variant_case_name(const ::testing::TestParamInfo<SetVariantCase>& info) {
  return kernel_set_test_name(info.param.set) + "_" + variant_case_name({info.param.c, 0});
}

void PrintTo(const SetVariantCase& c, std::ostream* os) {
  *os << set_variant_case_name({c, 0});
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* bytes = static_cast<const uint8_t*>(t.view().data);
  return {bytes, bytes + t.view().nbytes()};
}

class QuantizedLayerWeightsAhead : public KernelSetTest<SetVariantCase> {};

TEST_P(QuantizedLayerWeightsAhead, GiveTheSameBitsAsOnlineQuantisation) {
  const VariantCase& c = GetParam().c;
  const ModelSpec& spec = c.shape.spec;
  Options options;
  options.runner = RunnerKind::cpu;
  options.weights = c.variant.params;
  options.max_tokens = 16;
  const Plan plan = resolve(spec, options, platform(2));
  const LayerWeights given = float_layer(spec).view(c.variant.params);
  const Inputs in = random_inputs(spec, 11, DType::f32, 72);
  const LayerRun online = run_plan(plan, given, in);
  const LayerRun ahead = run_plan(plan, quantized_layer(spec, c.variant).view(), in);
  EXPECT_EQ(bytes_of(online.output), bytes_of(ahead.output));
}

INSTANTIATE_TEST_SUITE_P(QuantizedLayer, QuantizedLayerWeightsAhead,
                         ::testing::ValuesIn(set_variant_cases()), set_variant_case_name);

// The relative L2 error a format's quantisation (weights, and activations where it quantises
// them) adds to the unquantised layer, both computed by the oracle (so on no kernel set), on
// random weights with a trained layer's scales: below the format's bound, and clearly above
// zero, so a format that silently kept bf16 fails.
struct ErrorBounds {
  double lowest;
  double highest;
};

ErrorBounds expected_error(const QuantParams& q) {
  switch (q.format) {
    case WeightFormat::fp8_tensor:
    case WeightFormat::fp8_block:
      return {1e-2, 0.08};
    default:
      return {1e-2, 0.25};
  }
}

class QuantizedLayerError : public ::testing::TestWithParam<VariantCase> {};

TEST_P(QuantizedLayerError, IsWithinTheFormatsExpectedError) {
  const VariantCase& c = GetParam();
  const ModelSpec& spec = c.shape.spec;
  const LayerWeights given = float_layer(spec).view(c.variant.params);
  const Inputs in = random_inputs(spec, 16, DType::f32, 82);
  const OracleRouting routing = oracle_routing(spec, given.correction_bias, in.logits);
  const std::vector<double> exact = oracle_output(spec, given, in.hidden, routing);
  const std::vector<double> approximate = oracle_output(
      spec, quantized_layer(spec, c.variant).view(), in.hidden, routing, c.variant.params);
  const double error = relative_l2(approximate, exact);
  const ErrorBounds bounds = expected_error(c.variant.params);
  EXPECT_GT(error, bounds.lowest) << "the format does not quantise";
  EXPECT_LT(error, bounds.highest);
}

INSTANTIATE_TEST_SUITE_P(QuantizedLayer, QuantizedLayerError, ::testing::ValuesIn(variant_cases()),
                         variant_case_name);

// The block forms compute the same quantised numbers, where the shared experts split into slots.

std::vector<Variant> slot_variants() {
  return {fp8_block(32),
          int4_group(32, DType::bf16, true),
          int4_group(32, DType::f16, false),
          int4_group_a8(32, DType::bf16, true),
          fp8_tensor(Fp8Scaling::per_tensor, Fp8Activations::static_),
          fp8_tensor(Fp8Scaling::per_channel, Fp8Activations::static_)};
}

struct FormCase {
  KernelSet set;
  Variant variant;
  int64_t tokens;
  int64_t max_tokens;  // 4: the cpu-decode op
};

std::vector<FormCase> form_cases() {
  std::vector<FormCase> cases;
  for (KernelSet set : kKernelSets) {
    for (const Variant& variant : slot_variants()) {
      cases.push_back({set, variant, 17, 32});
      cases.push_back({set, variant, 3, 4});
    }
  }
  return cases;
}

std::string form_case_name(const ::testing::TestParamInfo<FormCase>& info) {
  return test_name(fmt::format("{}_{}_max{}", kernel_set_test_name(info.param.set),
                               info.param.variant.name, info.param.max_tokens));
}

void PrintTo(const FormCase& c, std::ostream* os) {
  *os << form_case_name({c, 0});
}

constexpr BlockForm kForms[] = {BlockForm::standard, BlockForm::overlapped, BlockForm::fused_slot};

class QuantizedLayerForms : public KernelSetTest<FormCase> {
 protected:
  Plan plan(BlockForm form) const {
    Options options;
    options.runner = RunnerKind::cpu;
    options.weights = GetParam().variant.params;
    options.max_tokens = GetParam().max_tokens;
    options.form = form;
    return resolve(spec, options, platform(2));
  }

  const ModelSpec spec = slot_spec();
  const LayerWeights given = float_layer(spec).view(GetParam().variant.params);
  const Inputs in = random_inputs(spec, GetParam().tokens, DType::f32, 92);
};

TEST_P(QuantizedLayerForms, StandardOverlappedAndFusedSlotAgree) {
  std::vector<LayerRun> runs;
  for (BlockForm form : kForms) {
    const Plan p = plan(form);
    ASSERT_EQ(p.form, form) << p.explain();
    runs.push_back(run_plan(p, given, in));
  }
  const std::vector<double> standard = as_doubles(runs[0].output);
  EXPECT_LT(relative_l2(runs[1].output, standard), 1e-5) << "overlapped";
  EXPECT_LT(relative_l2(runs[2].output, standard), 1e-5) << "fused-slot";
}

TEST_P(QuantizedLayerForms, WeightsQuantisedAheadGiveTheSameBitsInEveryForm) {
  const LayerWeights ahead = quantized_layer(spec, GetParam().variant).view();
  for (BlockForm form : kForms) {
    SCOPED_TRACE(block_form_name(form));
    const Plan p = plan(form);
    EXPECT_EQ(bytes_of(run_plan(p, given, in).output), bytes_of(run_plan(p, ahead, in).output));
  }
}

INSTANTIATE_TEST_SUITE_P(QuantizedLayer, QuantizedLayerForms, ::testing::ValuesIn(form_cases()),
                         form_case_name);

TEST(QuantizedLayerFormFallback, FusedSlotFallsBackWhenActivationsAreScaledPerToken) {
  // One scale per token over the shared expert's whole I cannot be split into slots.
  Options options;
  options.weights = QuantParams::Fp8Tensor(Fp8Scaling::per_channel, Fp8Activations::dynamic);
  options.form = BlockForm::fused_slot;
  const Plan plan = resolve(slot_spec(), options, Platform::cpu_only(2));
  EXPECT_EQ(plan.form, BlockForm::standard);
  ASSERT_EQ(plan.fallbacks().size(), 1u);
  EXPECT_NE(plan.fallbacks()[0]->reason.find("per token"), std::string::npos)
      << plan.fallbacks()[0]->reason;
}

// Under expert parallelism the ranks' outputs add up to the single-rank output.

struct EpCase {
  KernelSet set;
  Variant variant;
  int ep_size;
  BlockForm form;
};

std::vector<EpCase> ep_cases() {
  const Variant variants[] = {fp8_tensor(Fp8Scaling::per_tensor, Fp8Activations::dynamic),
                              fp8_tensor(Fp8Scaling::per_channel, Fp8Activations::static_),
                              fp8_block(32),
                              fp8_block(128),
                              int4_group(32, DType::bf16, true),
                              int4_group(64, DType::f16, false)};
  std::vector<EpCase> cases;
  for (KernelSet set : kKernelSets) {
    for (const Variant& variant : variants) {
      for (int ep_size : {2, 4}) cases.push_back({set, variant, ep_size, BlockForm::standard});
    }
    for (const Variant& variant : slot_variants()) {
      for (int ep_size : {2, 4}) cases.push_back({set, variant, ep_size, BlockForm::fused_slot});
    }
  }
  return cases;
}

class QuantizedLayerRanks : public KernelSetTest<EpCase> {
 protected:
  Options options() const {
    Options o;
    o.runner = RunnerKind::cpu;
    o.weights = GetParam().variant.params;
    o.form = GetParam().form;
    o.max_tokens = 32;
    return o;
  }
  Options ranks() const {
    Options o = options();
    o.ep = ExpertParallel::Rank(GetParam().ep_size, 0);
    return o;
  }

  const ModelSpec spec = slot_spec();
  const LayerWeights given = float_layer(spec).view(GetParam().variant.params);
  const Inputs in = random_inputs(spec, 24, DType::f32, 102);
};

TEST_P(QuantizedLayerRanks, SumToTheSingleRankOutput) {
  const Plan single_plan = resolve(spec, options(), platform(2));
  ASSERT_EQ(single_plan.form, GetParam().form) << single_plan.explain();
  const LayerRun single = run_plan(single_plan, given, in);
  EXPECT_LT(relative_l2(single.output, run_all_ranks(spec, ranks(), given, in, platform(2)).sum),
            1e-5);
}

TEST_P(QuantizedLayerRanks, WeightsQuantisedAheadGiveTheSameSum) {
  const LayerWeights ahead = quantized_layer(spec, GetParam().variant).view();
  EXPECT_EQ(run_all_ranks(spec, ranks(), given, in, platform(2)).sum,
            run_all_ranks(spec, ranks(), ahead, in, platform(2)).sum);
}

std::string ep_case_name(const ::testing::TestParamInfo<EpCase>& info) {
  return test_name(fmt::format("{}_{}_ep{}_{}", kernel_set_test_name(info.param.set),
                               info.param.variant.name, info.param.ep_size,
                               block_form_name(info.param.form)));
}

void PrintTo(const EpCase& c, std::ostream* os) {
  *os << ep_case_name({c, 0});
}

INSTANTIATE_TEST_SUITE_P(QuantizedLayer, QuantizedLayerRanks, ::testing::ValuesIn(ep_cases()),
                         ep_case_name);

}  // namespace
}  // namespace moekit::test
