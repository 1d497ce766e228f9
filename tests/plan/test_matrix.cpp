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
              const RandomWeights weights =
                  RandomWeights::make(spec, random_weights_dtype(format), 52);
              const Inputs sized = max_tokens >= 7
                                       ? random_inputs(spec, 7, DType::f32, 51)
                                       : random_inputs(spec, max_tokens, DType::f32, 51);
              std::vector<double> sum(static_cast<size_t>(sized.hidden.view().numel()), 0.0);
              LayerRun rank0;
              for (int rank = 0; rank < ep_size; ++rank) {
                options.ep.rank = rank;
                LayerRun run =
                    run_plan(resolve(spec, options, Platform::cpu_only(2)), weights.view(), sized);
                const std::vector<double> part = as_doubles(run.output);
                for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
                if (rank == 0) rank0 = std::move(run);
              }
              const std::vector<double> want =
                  oracle_output(spec, weights.view(), sized.hidden, rank0.ids, rank0.weights);
              double diff = 0, norm = 0;
              for (size_t i = 0; i < sum.size(); ++i) {
                diff += (sum[i] - want[i]) * (sum[i] - want[i]);
                norm += want[i] * want[i];
              }
              EXPECT_LT(std::sqrt(diff / norm), 1e-5);
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
