// The whole matrix of axes: every combination either resolves and then matches the float64
// oracle (summed over ranks under expert parallelism), or is refused by resolve with a message.
// None fails later.

#include <gtest/gtest.h>

#include "support/layer_fixture.hpp"

namespace moekit::test {
namespace {

TEST(Matrix, EveryCombinationResolvesAndMatchesOrIsRefused) {
  const ModelSpec spec = small_dsv3();
  int resolved = 0, refused = 0;
  for (RunnerKind runner : kAllRunners) {
    for (A2AKind a2a : kAllA2A) {
      for (WeightFormat format : kAllWeightFormats) {
        for (BlockForm form : kAllBlockForms) {
          for (int ep_size : {1, 2}) {
            for (int64_t max_tokens : {4, 16}) {
              Options options;
              options.runner = runner;
              options.a2a = a2a;
              options.weights = format;
              options.form = form;
              options.max_tokens = max_tokens;
              const std::string label =
                  fmt::format("runner={} a2a={} weights={} form={} ep={} max_tokens={}",
                              runner_name(runner), a2a_name(a2a), weight_format_name(format),
                              block_form_name(form), ep_size, max_tokens);
              SCOPED_TRACE(label);
              options.ep = ExpertParallel::Rank(ep_size, 0);
              const Resolution first = try_resolve(spec, options, Platform::cpu_only(2));
              if (!first.plan) {
                ++refused;
                EXPECT_NE(first.refusal.find("refused"), std::string::npos) << first.refusal;
                continue;
              }
              ++resolved;
              // Quantised formats get float weights and quantise them at load time; the
              // oracle reads the same quantisation, made apart from the layer.
              const RandomWeights weights =
                  RandomWeights::make(spec, random_weights_dtype(format), 52);
              const QuantizedLayerWeights quantized = quantize_layer(weights.view(), format);
              const LayerWeights& held =
                  options.weights.quantized() ? quantized.view() : weights.view();
              const Inputs sized =
                  random_inputs(spec, std::min<int64_t>(max_tokens, 7), DType::f32, 51);
              const RankSum ranks = run_all_ranks(spec, options, weights.view(), sized);
              const OracleComparison comparison =
                  compare_with_oracle(spec, held, options.weights, sized.hidden, ranks.rank0.ids,
                                      ranks.rank0.weights, ranks.sum);
              EXPECT_LT(comparison.error, 1e-5);
              EXPECT_LE(comparison.rounded_apart, 1);
            }
          }
        }
      }
    }
  }
  EXPECT_GT(resolved, 0);
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace moekit::test
