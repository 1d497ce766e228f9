// Expert parallelism across processes, the reduce forms and faults, run under mpirun by ctest
// (tests/CMakeLists.txt): a2a none summed over the ranks, MoE tensor parallelism, bad input on
// one rank. With --fault=stop or --fault=die one rank stops or dies in the middle of a run
// instead, and the others must fail within their timeout, naming it (tests/mpi/expect_fault.sh
// checks how the run ends).

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "comm/communicator.hpp"
#include "moekit/error.hpp"
#include "mpi/mpi_support.hpp"

namespace moekit::test {
namespace {

// a2a none across processes: every rank sees the same tokens, computes its experts, and the
// combine sums the partial outputs, so every rank returns the whole layer's output.
struct ReduceCase {
  BlockForm form;
  int extra_replicas;
};

class Reduce : public ::testing::TestWithParam<ReduceCase> {};

TEST_P(Reduce, EveryRankReturnsTheSingleProcessOutput) {
  const ReduceCase& c = GetParam();
  const Platform platform = world();
  const int size = platform.world_size, rank = platform.world_rank;
  const ModelSpec spec = small_dsv3();
  const RandomWeights weights = RandomWeights::make(spec, DType::f32, 31);
  const Inputs in = random_inputs(spec, 7, DType::f32, 32);
  Options options;
  options.runner = RunnerKind::cpu;
  options.weights = WeightFormat::f32;
  options.form = c.form;
  options.max_tokens = 8;
  options.threads = 1;
  options.comm_timeout_ms = kTimeoutMs;
  const LayerRun single = run_plan(resolve(spec, options, platform), weights.view(), in);
  options.ep = ExpertParallel::Rank(size, rank, redundant_for(spec, size, c.extra_replicas));
  const Plan plan = resolve(spec, options, platform);
  ASSERT_EQ(plan.comm, CommKind::mpi) << plan.explain();
  const LayerRun run = run_plan(plan, weights.view(), in);
  EXPECT_LT(relative_l2(run.output, single.output), 1e-5);
  const OracleRouting routing = oracle_routing(spec, weights.view(), in, run);
  EXPECT_LT(relative_l2(run.output.view(), oracle_output(spec, weights.view(), in.hidden, routing)),
            1e-5);
}

constexpr ReduceCase kReduceCases[] = {
    {BlockForm::standard, 0}, {BlockForm::overlapped, 1}, {BlockForm::fused_slot, 0}};

std::string reduce_name(const ::testing::TestParamInfo<ReduceCase>& info) {
  return identifier(
      fmt::format("{}_replicas{}", block_form_name(info.param.form), info.param.extra_replicas));
}

INSTANTIATE_TEST_SUITE_P(Ranks, Reduce, ::testing::ValuesIn(kReduceCases), reduce_name);

// MoE tensor parallelism, alone (tp = ranks) and with expert parallelism (tp 2 x ep ranks/2):
// every rank sees every token, holds a slice of every routed expert's I (of its experts), and
// the sum over the ranks is the single-process output.
struct TensorParallelCase {
  bool with_ep;
  WeightFormat format;
  BlockForm form;
};

class TensorParallelRanks : public ::testing::TestWithParam<TensorParallelCase> {};

TEST_P(TensorParallelRanks, EveryRankReturnsTheSingleProcessOutput) {
  const TensorParallelCase& c = GetParam();
  const Platform platform = world();
  const int size = platform.world_size, rank = platform.world_rank;
  if (c.with_ep && size % 2 != 0) GTEST_SKIP() << "tp 2 x ep needs an even number of ranks";
  ModelSpec spec = small_dsv3();
  spec.intermediate = 192;  // slices of 96, 64, 48: whole int4 groups of 16
  spec.shared_intermediate = 192;
  const RandomWeights weights = RandomWeights::make(spec, DType::f32, 61);
  const Inputs in = random_inputs(spec, 6, DType::f32, 62);
  Options options;
  options.runner = RunnerKind::cpu;
  options.weights =
      c.format == WeightFormat::int4_group ? QuantParams::Int4Group(16) : QuantParams(c.format);
  options.form = c.form;
  options.max_tokens = 8;
  options.threads = 1;
  options.comm_timeout_ms = kTimeoutMs;
  const LayerRun single = run_plan(resolve(spec, options, platform), weights.view(), in);
  const int tp = c.with_ep ? 2 : size, ep = size / tp;
  options.tp = {tp, rank % tp};
  options.ep = ExpertParallel::Rank(ep, rank / tp, redundant_for(spec, ep, 0));
  const Plan plan = resolve(spec, options, platform);
  ASSERT_EQ(plan.comm, CommKind::mpi) << plan.explain();
  ASSERT_EQ(plan.routed_intermediate * tp, spec.intermediate);
  const LayerRun run = run_plan(plan, weights.view(), in);
  EXPECT_LT(relative_l2(run.output, single.output), tolerance(c.format, DType::f32));
  if (c.format == WeightFormat::f32) {
    const OracleRouting routing = oracle_routing(spec, weights.view(), in, run);
    EXPECT_LT(
        relative_l2(run.output.view(), oracle_output(spec, weights.view(), in.hidden, routing)),
        1e-5);
  }
}

constexpr TensorParallelCase kTensorParallelCases[] = {
    {false, WeightFormat::f32, BlockForm::standard},
    {false, WeightFormat::int4_group, BlockForm::overlapped},
    {true, WeightFormat::f32, BlockForm::standard},
    {true, WeightFormat::bf16, BlockForm::standard}};

std::string tensor_parallel_name(const ::testing::TestParamInfo<TensorParallelCase>& info) {
  return identifier(fmt::format("{}_{}_{}", info.param.with_ep ? "tp2_x_ep" : "tp_all",
                                weight_format_name(info.param.format),
                                block_form_name(info.param.form)));
}

INSTANTIATE_TEST_SUITE_P(Ranks, TensorParallelRanks, ::testing::ValuesIn(kTensorParallelCases),
                         tensor_parallel_name);

// Bad input on one rank (NaN router logits on rank 1) is an error on every rank, from the
// exchange they would have waited in; afterwards the layer runs normally again.
struct BadInputCase {
  A2AKind a2a;
  A2AMode mode;
};

class BadInput : public ::testing::TestWithParam<BadInputCase> {};

TEST_P(BadInput, NanLogitsOnOneRankFailEveryRankAndTheNextCallWorks) {
  const BadInputCase& c = GetParam();
  const Platform platform = world();
  const int size = platform.world_size, rank = platform.world_rank;
  const ModelSpec spec = small_dsv3();
  const RandomWeights weights = RandomWeights::make(spec, DType::f32, 41);
  Options options;
  options.runner = RunnerKind::cpu;
  options.weights = WeightFormat::f32;
  options.max_tokens = 8;
  options.threads = 1;
  options.comm_timeout_ms = kTimeoutMs;
  options.a2a = c.a2a;
  options.a2a_mode = c.mode;
  options.ep = ExpertParallel::Rank(size, rank, redundant_for(spec, size, 0));
  MoeLayer layer(resolve(spec, options, platform), weights.view());
  Inputs in = random_inputs(spec, 4, DType::f32, 42 + (c.a2a == A2AKind::mpi ? rank : 0));
  float* logit = in.logits.data<float>() + 2;
  const float kept = *logit;
  if (rank == 1) *logit = NAN;
  try {
    run_layer(layer, in);
    ADD_FAILURE() << "rank " << rank << ": a forward with NaN logits on rank 1 returned";
  } catch (const Error& e) {
    if (rank == 1) {
      EXPECT_EQ(e.code(), Errc::invalid_argument) << e.what();
    } else {
      EXPECT_EQ(e.code(), Errc::comm) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank(s) 1 refused"), std::string::npos) << e.what();
    }
  }
  *logit = kept;
  const LayerRun run = run_layer(layer, in);
  for (double v : as_doubles(run.output)) ASSERT_TRUE(std::isfinite(v));
}

constexpr BadInputCase kBadInputCases[] = {{A2AKind::mpi, A2AMode::normal},
                                           {A2AKind::mpi, A2AMode::low_latency},
                                           {A2AKind::none, A2AMode::auto_}};

std::string bad_input_name(const ::testing::TestParamInfo<BadInputCase>& info) {
  return identifier(fmt::format("{}_{}", a2a_name(info.param.a2a), a2a_mode_name(info.param.mode)));
}

INSTANTIATE_TEST_SUITE_P(Ranks, BadInput, ::testing::ValuesIn(kBadInputCases), bad_input_name);

TEST(Resolve, AnEpSizeOtherThanTheLaunchersIsRefusedNamingIt) {
  const Platform platform = world();
  Options options;
  options.a2a = A2AKind::mpi;
  options.ep = ExpertParallel::Rank(platform.world_size + 1, 0);
  try {
    resolve(small_dsv3(), options, platform);
    FAIL() << "resolved";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::config_refused);
    EXPECT_NE(std::string(e.what()).find(fmt::format("--ep-size {}", platform.world_size)),
              std::string::npos)
        << e.what();
  }
}

// --fault=stop|die: rank 1 stops (SIGSTOP) or dies (SIGKILL) before its third forward; every
// other rank must fail within its timeout naming rank 1 and the step, then end the run.
int run_fault(const std::string& fault) {
  const Platform platform = world();
  const int size = platform.world_size, rank = platform.world_rank;
  const ModelSpec spec = small_dsv3();
  const RandomWeights weights = RandomWeights::make(spec, DType::f32, 51);
  Options options;
  options.runner = RunnerKind::cpu;
  options.weights = WeightFormat::f32;
  options.a2a = A2AKind::mpi;
  options.max_tokens = 8;
  options.threads = 1;
  options.comm_timeout_ms = 2000;
  options.ep = ExpertParallel::Rank(size, rank, redundant_for(spec, size, 0));
  try {
    MoeLayer layer(resolve(spec, options, platform), weights.view());
    const Inputs in = random_inputs(spec, 4, DType::f32, 52 + static_cast<uint64_t>(rank));
    for (int call = 0; call < 5; ++call) {
      if (call == 2 && rank == 1) {
        std::fflush(stdout);
        raise(fault == "stop" ? SIGSTOP : SIGKILL);
      }
      run_layer(layer, in);
    }
    std::fprintf(stderr, "rank %d: every forward returned despite the fault\n", rank);
    return 3;
  } catch (const Error& e) {
    std::fprintf(stderr, "moekit: %s\n", e.what());
    std::fflush(stderr);
    if (Communicator* comm = active_world_communicator()) {
      if (!comm->barrier({"every rank fails together", 1000})) comm->abort(1);
    }
    return 1;
  }
}

}  // namespace
}  // namespace moekit::test

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--fault=", 0) == 0) return moekit::test::run_fault(arg.substr(8));
  }
  return RUN_ALL_TESTS();
}
