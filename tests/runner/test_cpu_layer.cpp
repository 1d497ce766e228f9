// The cpu runner's kernel choices through the whole layer: the plan records the choice for the
// platform it is given, and on every kernel set the kernels (core and fused op, decode and
// larger batches, f32, bf16 and f16 hidden states) match the float64 oracle of each format.

#include <gtest/gtest.h>

#include <algorithm>
#include <ostream>
#include <string>
#include <vector>

#include "runner/cpu_fixture.hpp"
#include "support/layer_fixture.hpp"

namespace moekit::test {
namespace {

const Decision* find_decision(const Plan& plan, std::string_view topic) {
  for (const Decision& d : plan.decisions) {
    if (d.topic == topic) return &d;
  }
  return nullptr;
}

Platform with_avx2() {
  Platform p = Platform::cpu_only(2);
  p.avx2 = true;
  p.fma = true;
  p.f16c = true;
  return p;
}

TEST(CpuKernelChoice, IsAPlanDecisionThatFollowsThePlatform) {
  Options options;
  options.runner = RunnerKind::cpu;
  const Plan portable = resolve(small_dsv3(), options, Platform::cpu_only(2));
  ASSERT_NE(find_decision(portable, "kernels"), nullptr);
  EXPECT_EQ(find_decision(portable, "kernels")->choice, "portable");
  EXPECT_EQ(portable.cpu_kernels->set, CpuKernelSet::portable);
  const Plan avx2 = resolve(small_dsv3(), options, with_avx2());
  ASSERT_NE(find_decision(avx2, "kernels"), nullptr);
  EXPECT_EQ(find_decision(avx2, "kernels")->choice, "avx2 panel16");
  EXPECT_EQ(avx2.cpu_kernels->set, CpuKernelSet::avx2_panels);
}

TEST(CpuKernelChoice, TheAvx2FusedOpServesEveryBatchSizeUnlessFusedOpsAreOff) {
  Options options;
  options.runner = RunnerKind::cpu;
  options.max_tokens = 512;
  EXPECT_EQ(resolve(small_dsv3(), options, with_avx2()).fused_op, "cpu-decode");
  EXPECT_FALSE(resolve(small_dsv3(), options, Platform::cpu_only(2)).fused_op.has_value());
  options.fused_ops = FusedOps::off;
  EXPECT_FALSE(resolve(small_dsv3(), options, with_avx2()).fused_op.has_value());
}

TEST(CpuKernelChoice, OtherRunnersRecordNoKernels) {
  Options options;
  options.runner = RunnerKind::reference;
  const Plan plan = resolve(small_dsv3(), options, with_avx2());
  EXPECT_EQ(find_decision(plan, "kernels"), nullptr);
  EXPECT_FALSE(plan.cpu_kernels.has_value());
}

// A path of the cpu runner, and the batch sizes it is run at through one layer.
struct Path {
  const char* name;
  int64_t max_tokens;
  FusedOps fused_ops;
  std::vector<int64_t> tokens;
};

// The fused op at decode sizes and at a larger batch (tokens sharing experts, some taking the
// GEMM; on the portable kernels the core serves it), and the core with its permutes.
const Path kPaths[] = {{"fused_decode", 4, FusedOps::auto_, {0, 1, 3}},
                       {"fused_batch", 64, FusedOps::auto_, {1, 3, 40}},
                       {"core", 64, FusedOps::off, {0, 1, 3, 40}}};

// A kernel shape as a layer, as it is: H and I not multiples of 8 or 16 reach the part-filled
// panels and partial scale groups at layer level too.
ModelSpec layer_spec(const KernelShape& shape) {
  ModelSpec spec = small_dsv3();
  spec.name = "cpu-layer-" + shape.name;
  spec.hidden = shape.hidden;
  spec.intermediate = shape.intermediate;
  spec.shared_intermediate = shape.intermediate * 2;
  return spec;
}

// The kernels' shapes, and for every format but int4 (which packs two values per byte along
// both H and I) an odd H with an I of neither 8 nor 16 rows.
std::vector<KernelShape> layer_shapes(const QuantParams& quant) {
  std::vector<KernelShape> shapes = kernel_shapes();
  if (quant.weight_dtype != DType::i4) shapes.push_back({"odd", 37, 13});
  return shapes;
}

struct LayerCase {
  KernelSet set;
  KernelFormat format;
  KernelShape shape;
};

std::vector<LayerCase> layer_cases() {
  std::vector<LayerCase> cases;
  for (KernelSet set : kKernelSets) {
    for (const KernelFormat& f : kernel_formats()) {
      for (const KernelShape& s : layer_shapes(f.params)) cases.push_back({set, f, s});
    }
  }
  return cases;
}

std::string layer_case_name(const ::testing::TestParamInfo<LayerCase>& info) {
  return kernel_set_test_name(info.param.set) + "_" + info.param.format.name + "_" +
         info.param.shape.name;
}

void PrintTo(const LayerCase& c, std::ostream* os) {
  *os << layer_case_name({c, 0});
}

class CpuLayer : public KernelSetTest<LayerCase> {};

// On every path, every batch size of the path with f32, bf16 and f16 hidden states through one
// layer, each against the oracle of its format rounded to the output dtype. The paths share a
// case because making the weights and the oracle is most of its time.
TEST_P(CpuLayer, MatchesTheOracleOfItsFormatOnEveryPath) {
  const LayerCase& c = GetParam();
  const QuantParams& quant = c.format.params;
  const ModelSpec spec = layer_spec(c.shape);
  const RandomWeights given = RandomWeights::make(spec, random_weights_dtype(quant.format), 31);
  QuantizedLayerWeights quantized;
  LayerWeights oracle_weights = given.view();
  if (quant.quantized()) {
    quantized = quantize_layer(given.view(), quant);
    oracle_weights = quantized.view();
  }
  const OracleLayer oracle(spec, oracle_weights, quant);
  for (const Path& path : kPaths) {
    SCOPED_TRACE(path.name);
    Options options;
    options.runner = RunnerKind::cpu;
    options.weights = quant;
    options.max_tokens = path.max_tokens;
    options.fused_ops = path.fused_ops;
    const Plan plan = resolve(spec, options, platform(2));
    ASSERT_TRUE(plan.cpu_kernels.has_value());
    const CpuKernels& k = *plan.cpu_kernels;
    const Platform& p = platform(2);
    EXPECT_EQ(k.set,
              c.set == KernelSet::portable ? CpuKernelSet::portable : CpuKernelSet::avx2_panels);
    EXPECT_EQ(k.avx512_vnni, k.set == CpuKernelSet::avx2_panels && p.avx512_vnni);
    // Weights exact in bf16 and GEMM inputs that bf16 may round or that are e4m3 codes (every
    // shape here keeps pairs of k inside a scale group).
    const bool exact_in_bf16 =
        quant.weight_dtype == DType::bf16 || quant.weight_dtype == DType::f8e4m3 ||
        (quant.weight_dtype == DType::i4 && !quant.zero_points && !quant.quantizes_activations());
    EXPECT_EQ(k.bf16_gemm, k.set == CpuKernelSet::avx2_panels && p.avx512_bf16 && exact_in_bf16);
    MoeLayer layer(plan, given.view());
    for (DType hidden : {DType::f32, DType::bf16, DType::f16}) {
      for (int64_t tokens : path.tokens) {
        SCOPED_TRACE(fmt::format("hidden {} T={}", dtype_name(hidden), tokens));
        const Inputs in = random_inputs(spec, tokens, hidden, 37 + static_cast<uint64_t>(tokens));
        const LayerRun run = run_layer(layer, in);
        const OracleRouting routing = oracle_routing(spec, oracle_weights, in, run);
        EXPECT_TRUE(routing.agrees());
        EXPECT_TRUE(compare_with_oracle(oracle, in, routing, run).within(tolerance(hidden)))
            << plan.explain();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(KernelSets, CpuLayer, ::testing::ValuesIn(layer_cases()), layer_case_name);

}  // namespace
}  // namespace moekit::test
