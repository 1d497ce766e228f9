// The whole matrix of axes on every kernel set: every combination either resolves and then
// matches the float64 oracle (summed over ranks under expert parallelism), or is refused by
// resolve with a message. None fails later.

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "support/layer_fixture.hpp"

namespace moekit::test {
namespace {

struct MatrixCase {
  KernelSet set;
};

// Batch sizes and fused-op settings that reach each path of a set: on the portable kernels the
// fused op serves decode sizes only, so max_tokens picks it; on AVX2 it serves every batch size,
// so only turning fused ops off reaches the core.
struct Sizing {
  int64_t max_tokens;
  FusedOps fused_ops;
};

std::vector<Sizing> sizings(KernelSet set) {
  if (set == KernelSet::portable) return {{4, FusedOps::auto_}, {16, FusedOps::auto_}};
  return {{16, FusedOps::auto_}, {16, FusedOps::off}};
}

class Matrix : public KernelSetTest<MatrixCase> {};

TEST_P(Matrix, EveryCombinationResolvesAndMatchesOrIsRefused) {
  const ModelSpec spec = small_dsv3();
  int resolved = 0, refused = 0;
  for (WeightFormat format : kAllWeightFormats) {
    // Quantised formats get float weights and quantise them at load time; the oracle reads the
    // same quantisation, made apart from the layer.
    const RandomWeights weights = RandomWeights::make(spec, random_weights_dtype(format), 52);
    const QuantizedLayerWeights quantized = quantize_layer(weights.view(), format);
    for (RunnerKind runner : kAllRunners) {
      for (A2AKind a2a : kAllA2A) {
        for (BlockForm form : kAllBlockForms) {
          for (int ep_size : {1, 2}) {
            for (const Sizing& sizing : sizings(GetParam().set)) {
              Options options;
              options.runner = runner;
              options.a2a = a2a;
              options.weights = format;
              options.form = form;
              options.max_tokens = sizing.max_tokens;
              options.fused_ops = sizing.fused_ops;
              SCOPED_TRACE(fmt::format(
                  "runner={} a2a={} weights={} form={} ep={} max_tokens={} fused_ops={}",
                  runner_name(runner), a2a_name(a2a), weight_format_name(format),
                  block_form_name(form), ep_size, sizing.max_tokens,
                  sizing.fused_ops == FusedOps::off ? "off" : "auto"));
              options.ep = ExpertParallel::Rank(ep_size, 0);
              const Resolution first = try_resolve(spec, options, platform(2));
              if (!first.plan) {
                ++refused;
                EXPECT_NE(first.refusal.find("refused"), std::string::npos) << first.refusal;
                continue;
              }
              ++resolved;
              const LayerWeights& held =
                  options.weights.quantized() ? quantized.view() : weights.view();
              const Inputs sized =
                  random_inputs(spec, std::min<int64_t>(sizing.max_tokens, 7), DType::f32, 51);
              const RankSum ranks =
                  run_all_ranks(spec, options, weights.view(), sized, platform(2));
              const OracleRouting routing = oracle_routing(spec, held, sized, ranks.rank0);
              EXPECT_TRUE(routing.agrees());
              EXPECT_TRUE(compare_with_oracle(spec, held, options.weights, sized.hidden, routing,
                                              ranks.sum, DType::f32)
                              .within(1e-5));
            }
          }
        }
      }
    }
  }
  EXPECT_GT(resolved, 0);
  EXPECT_GT(refused, 0);
}

std::string matrix_name(const ::testing::TestParamInfo<MatrixCase>& info) {
  return kernel_set_test_name(info.param.set);
}

void PrintTo(const MatrixCase& c, std::ostream* os) {
  *os << kernel_set_name(c.set);
}

INSTANTIATE_TEST_SUITE_P(KernelSets, Matrix,
                         ::testing::Values(MatrixCase{KernelSet::portable},
                                           MatrixCase{KernelSet::avx2},
                                           MatrixCase{KernelSet::avx512_bf16},
                                           MatrixCase{KernelSet::avx512_vnni},
                                           MatrixCase{KernelSet::all}),
                         matrix_name);

}  // namespace
}  // namespace moekit::test
