// Bad input gets a clear error naming the input, and nothing is written.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>
#include <vector>

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

  // forward() must throw invalid_argument mentioning every fragment and write nothing into
  // `storage`, the memory the output view lies in.
  void expect_refused(const TensorView& hidden, const TensorView& logits, const TensorView& out,
                      const Tensor& storage, std::initializer_list<const char*> fragments) {
    const auto* bytes = static_cast<const uint8_t*>(storage.view().data);
    const std::vector<uint8_t> before(bytes, bytes + storage.view().nbytes());
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
    ASSERT_TRUE(std::equal(before.begin(), before.end(), bytes)) << "forward wrote its output";
  }

  void expect_refused(const TensorView& hidden, const TensorView& logits, Tensor& out,
                      std::initializer_list<const char*> fragments) {
    out.fill_bytes(kPoison);
    expect_refused(hidden, logits, out.view(), out, fragments);
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

// Every other column of a tensor twice as wide: the right shape, but strided.
TensorView strided_columns(const Tensor& wide) {
  return wide.view().narrow(1, 0, wide.view().dim(1) / 2);
}

TEST_F(BadInput, StridedTensorsAreRefusedNamingThem) {
  std::mt19937_64 rng(46);
  const Tensor wide_hidden = random_tensor({4, 2 * spec.hidden}, DType::f32, rng);
  const Tensor wide_logits = random_tensor({4, 2 * spec.n_experts}, DType::f32, rng);
  Tensor wide_output = Tensor::empty(DType::f32, {4, 2 * spec.hidden});
  wide_output.fill_bytes(kPoison);
  output.fill_bytes(kPoison);
  struct Case {
    const char* name;
    TensorView hidden, logits, out;
    const Tensor& storage;
  };
  const Case cases[] = {
      {"hidden_states", strided_columns(wide_hidden), in.logits, output, output},
      {"router_logits", in.hidden, strided_columns(wide_logits), output, output},
      {"output", in.hidden, in.logits, strided_columns(wide_output), wide_output},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    expect_refused(c.hidden, c.logits, c.out, c.storage, {c.name, "contiguous"});
  }
}

TEST_F(BadInput, OutputThatIsTheHiddenStatesIsRefused) {
  expect_refused(in.hidden, in.logits, in.hidden.view(), in.hidden,
                 {"output", "overlaps", "hidden_states"});
}

TEST_F(BadInput, OutputOverlappingTheHiddenStatesByRowsIsRefused) {
  // Rows 0-3 of one buffer as hidden states, rows 1-4 as the output.
  Tensor rows = Tensor::empty(DType::f32, {5, spec.hidden});
  rows.fill_bytes(kPoison);
  std::copy_n(in.hidden.data<float>(), in.hidden.view().numel(), rows.data<float>());
  expect_refused(rows.view().narrow(0, 0, 4), in.logits, rows.view().narrow(0, 1, 4), rows,
                 {"output", "overlaps", "hidden_states"});
}

TEST_F(BadInput, OutputOverlappingTheRouterLogitsIsRefused) {
  // The router logits are the first 4 x E floats of the output's memory.
  Tensor memory = Tensor::empty(DType::f32, {4, spec.hidden});
  memory.fill_bytes(kPoison);
  std::copy_n(in.logits.data<float>(), in.logits.view().numel(), memory.data<float>());
  const TensorView logits =
      TensorView::contiguous(memory.data<float>(), DType::f32, {4, spec.n_experts});
  expect_refused(in.hidden, logits, memory.view(), memory, {"output", "overlaps", "router_logits"});
}

TEST_F(BadInput, OutputRightAfterTheHiddenStatesInOneBufferIsAccepted) {
  // Rows 0-3 of one buffer as hidden states, rows 4-7 as the output: adjacent, not overlapping.
  Tensor rows = Tensor::empty(DType::f32, {8, spec.hidden});
  rows.fill_bytes(kPoison);
  std::copy_n(in.hidden.data<float>(), in.hidden.view().numel(), rows.data<float>());
  output.fill_bytes(kPoison);
  layer->forward(in.hidden, in.logits, output);
  layer->forward(rows.view().narrow(0, 0, 4), in.logits, rows.view().narrow(0, 4, 4));
  EXPECT_LT(relative_l2(rows.view().narrow(0, 4, 4), output), 1e-6);
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

TEST(BadWeights, NonFiniteCorrectionBiasIsRefusedNamingTheFirstBadElement) {
  const ModelSpec spec = small_dsv3();
  Options options;
  options.max_tokens = 4;
  const Plan plan = resolve(spec, options, Platform::cpu_only(2));
  struct Case {
    const char* name;
    std::vector<std::pair<int64_t, float>> spoilt;  // index, value
    const char* element;
    const char* value;
  };
  const Case cases[] = {
      {"nan", {{3, NAN}}, "element [3]", "nan"},
      {"inf", {{0, INFINITY}}, "element [0]", "inf"},
      {"-inf", {{15, -INFINITY}}, "element [15]", "-inf"},
      {"the first of two", {{9, INFINITY}, {5, NAN}}, "element [5]", "nan"},
  };
  for (const Case& c : cases) {
    RandomWeights weights = RandomWeights::make(spec, DType::f32, 47);
    for (const auto& [index, value] : c.spoilt)
      weights.correction_bias.data<float>()[index] = value;
    try {
      MoeLayer layer(plan, weights.view());
      ADD_FAILURE() << c.name << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), Errc::invalid_argument) << c.name;
      for (const char* fragment : {"weights.correction_bias", c.element, c.value}) {
        EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos)
            << c.name << ": '" << e.what() << "' lacks '" << fragment << "'";
      }
    }
  }
}

}  // namespace
}  // namespace moekit::test
