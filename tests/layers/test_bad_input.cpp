// Bad input gets a clear error naming the input, and nothing is written.

#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "support/layer_fixture.hpp"

namespace moekit::test {
namespace {

class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    options.max_tokens = 8;
    options.weights = WeightFormat::f32;
    plan.emplace(resolve(spec, options, Platform::cpu_only(2)));
    layer.emplace(*plan, weights.view());
  }

  // forward() must throw invalid_argument mentioning every fragment, leaving output untouched.
  void expect_refused(const TensorView& hidden, const TensorView& logits, Tensor& out,
                      std::initializer_list<const char*> fragments) {
    out.fill_bytes(kPoison);
    try {
      layer->forward(hidden, logits, out);
      FAIL() << "forward accepted bad input";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument);
      for (const char* fragment : fragments) {
        EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
            << "message '" << e.what() << "' lacks '" << fragment << "'";
      }
    }
    const auto* bytes = static_cast<const uint8_t*>(out.view().data);
    for (int64_t i = 0; i < out.view().nbytes(); ++i) ASSERT_EQ(bytes[i], kPoison);
  }

  ModelSpec spec = small_dsv3();
  Options options;
  RandomWeights weights = RandomWeights::make(spec, DType::f32, 41);
  std::optional<Plan> plan;
  std::optional<MoeLayer> layer;
  Inputs in = random_inputs(spec, 4, DType::f32, 42);
  Tensor output = Tensor::empty(DType::f32, {4, spec.hidden});
};

void set_f32(Tensor& t, int64_t index, float value) {
  t.data<float>()[index] = value;
}

TEST_F(BadInput, NanLogitIsRefusedNamingItsRow) {
  set_f32(in.logits, 2 * spec.n_experts + 5, NAN);
  expect_refused(in.hidden, in.logits, output, {"router_logits", "row 2"});
}

TEST_F(BadInput, InfiniteLogitIsRefusedNamingItsRow) {
  set_f32(in.logits, 3 * spec.n_experts, -INFINITY);
  expect_refused(in.hidden, in.logits, output, {"router_logits", "row 3"});
}

TEST_F(BadInput, NanHiddenStateIsRefusedNamingItsRow) {
  set_f32(in.hidden, 1 * spec.hidden + 7, NAN);
  expect_refused(in.hidden, in.logits, output, {"hidden_states", "row 1"});
}

TEST_F(BadInput, HiddenOfTheWrongWidthIsRefused) {
  const Tensor narrow = Tensor::empty(DType::f32, {4, spec.hidden - 1});
  expect_refused(narrow, in.logits, output, {"hidden_states", "expected shape"});
}

TEST_F(BadInput, LogitsForAnotherTokenCountAreRefused) {
  const Tensor logits = Tensor::empty(DType::f32, {3, spec.n_experts});
  expect_refused(in.hidden, logits, output, {"router_logits", "[4, 16]"});
}

TEST_F(BadInput, IntegerHiddenStatesAreRefused) {
  const Tensor ints = Tensor::empty(DType::i32, {4, spec.hidden});
  expect_refused(ints, in.logits, output, {"hidden_states", "dtype"});
}

TEST_F(BadInput, OutputOfAnotherDtypeIsRefused) {
  Tensor bf16_output = Tensor::empty(DType::bf16, {4, spec.hidden});
  expect_refused(in.hidden, in.logits, bf16_output, {"output", "dtype"});
}

TEST_F(BadInput, BatchLargerThanPlannedIsRefused) {
  const Inputs big = random_inputs(spec, 9, DType::f32, 43);
  Tensor big_output = Tensor::empty(DType::f32, {9, spec.hidden});
  expect_refused(big.hidden, big.logits, big_output, {"max_tokens 8"});
}

TEST_F(BadInput, TensorOnAGpuIsRefused) {
  TensorView on_gpu = in.hidden.view();
  on_gpu.device = Device::cuda(0);
  expect_refused(on_gpu, in.logits, output, {"hidden_states", "cuda:0"});
}

TEST_F(BadInput, RoutingResultOfTheWrongShapeIsRefused) {
  std::vector<int32_t> ids(4 * 3);
  std::vector<float> routing_weights(4 * spec.routing.top_k);
  const RoutingResult routing{
      TensorView::contiguous(ids.data(), DType::i32, {4, 3}),
      TensorView::contiguous(routing_weights.data(), DType::f32, {4, spec.routing.top_k})};
  output.fill_bytes(kPoison);
  try {
    layer->forward(in.hidden, in.logits, output, &routing);
    FAIL() << "forward accepted topk_ids of 3 columns for top-4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("topk_ids"), std::string::npos) << e.what();
  }
}

TEST_F(BadInput, EmptyBatchGivesAnEmptyOutput) {
  const Tensor hidden = Tensor::empty(DType::f32, {0, spec.hidden});
  const Tensor logits = Tensor::empty(DType::f32, {0, spec.n_experts});
  Tensor empty_output = Tensor::empty(DType::f32, {0, spec.hidden});
  EXPECT_NO_THROW(layer->forward(hidden, logits, empty_output));
}

TEST_F(BadInput, FiniteCheckCanBeTurnedOff) {
  options.check_finite = false;
  MoeLayer unchecked(resolve(spec, options, Platform::cpu_only(2)), weights.view());
  set_f32(in.logits, 0, NAN);
  EXPECT_NO_THROW(unchecked.forward(in.hidden, in.logits, output));
}

struct WeightCase {
  const char* name;
  std::function<void(LayerWeights&, const RandomWeights&)> spoil;
  const char* fragment;
};

TEST(BadWeights, AreRefusedAtBuildNamingTheTensor) {
  const ModelSpec spec = small_dsv3();
  const RandomWeights good = RandomWeights::make(spec, DType::f32, 44);
  const Tensor ints = Tensor::empty(DType::i32, {spec.n_experts, spec.hidden, spec.intermediate});
  const Tensor bf16_bias = Tensor::empty(DType::bf16, {spec.n_experts});
  const WeightCase cases[] = {
      {"w13 shape", [](LayerWeights& w, const RandomWeights& r) { w.w13 = r.w2.view(); }, "w13"},
      {"w2 dtype", [&](LayerWeights& w, const RandomWeights&) { w.w2 = ints.view(); }, "w2"},
      {"missing bias", [](LayerWeights& w, const RandomWeights&) { w.correction_bias = {}; },
       "correction_bias"},
      {"bias dtype",
       [&](LayerWeights& w, const RandomWeights&) { w.correction_bias = bf16_bias.view(); },
       "correction_bias"},
      {"missing shared", [](LayerWeights& w, const RandomWeights&) { w.shared_w13 = {}; },
       "shared_w13"},
      {"shared w2 shape",
       [](LayerWeights& w, const RandomWeights& r) { w.shared_w2 = r.w2.view(); }, "shared_w2"},
  };
  Options options;
  options.max_tokens = 4;
  const Plan plan = resolve(spec, options, Platform::cpu_only(2));
  for (const WeightCase& c : cases) {
    LayerWeights weights = good.view();
    c.spoil(weights, good);
    try {
      MoeLayer layer(plan, weights);
      ADD_FAILURE() << c.name << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument) << c.name;
      EXPECT_NE(std::string(e.what()).find(c.fragment), std::string::npos)
          << c.name << ": " << e.what();
    }
  }
}

}  // namespace
}  // namespace moekit::test
