// Expert parallelism across processes, run under mpirun by ctest (tests/CMakeLists.txt): every
// rank runs every test in the same order, with tokens of its own, and checks its output against
// the single-process layer on the same tokens (and the float64 oracle). With --fault=stop or
// --fault=die one rank stops or dies in the middle of a run instead, and the others must fail
// within their timeout, naming it (tests/mpi/expect_fault.sh checks how the run ends).

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "core/thread_pool.hpp"
#include "dispatch/dispatcher.hpp"
#include "moekit/error.hpp"
#include "support/layer_fixture.hpp"

#include "mpi/allocations.hpp"

namespace moekit::test {
namespace {

constexpr int64_t kTimeoutMs = 5000;

Platform world() {
  Platform platform = Platform::probe();
  platform.cpu_threads = 1;
  return platform;
}

// Physical experts must divide over the ranks: replicas make up the difference (16 experts over
// 3 ranks take 2), and `extra` more replicas per rank test replicas themselves.
int redundant_for(const ModelSpec& spec, int size, int extra) {
  return (size - spec.n_experts % size) % size + extra * size;
}

// Uneven batches, one rank with none.
int64_t tokens_of(int rank) {
  constexpr int64_t kTokens[] = {5, 0, 9, 3};
  return kTokens[rank % 4];
}

enum class Tokens { uneven, hot_expert };

struct MpiCase {
  A2AMode mode;
  WeightFormat format;
  BlockForm form;
  int extra_replicas;
  Tokens tokens;
};

const MpiCase kCases[] = {
    {A2AMode::normal, WeightFormat::f32, BlockForm::standard, 0, Tokens::uneven},
    {A2AMode::low_latency, WeightFormat::f32, BlockForm::standard, 0, Tokens::uneven},
    {A2AMode::normal, WeightFormat::f32, BlockForm::standard, 0, Tokens::hot_expert},
    {A2AMode::low_latency, WeightFormat::f32, BlockForm::standard, 1, Tokens::hot_expert},
    {A2AMode::normal, WeightFormat::f32, BlockForm::overlapped, 1, Tokens::uneven},
    {A2AMode::low_latency, WeightFormat::f32, BlockForm::fused_slot, 0, Tokens::uneven},
    {A2AMode::normal, WeightFormat::f32, BlockForm::fused_slot, 1, Tokens::hot_expert},
    {A2AMode::normal, WeightFormat::bf16, BlockForm::standard, 0, Tokens::uneven},
    {A2AMode::low_latency, WeightFormat::bf16, BlockForm::overlapped, 0, Tokens::uneven},
    {A2AMode::normal, WeightFormat::fp8_block, BlockForm::standard, 0, Tokens::uneven},
    {A2AMode::low_latency, WeightFormat::fp8_tensor, BlockForm::standard, 1, Tokens::uneven},
    {A2AMode::normal, WeightFormat::int4_group, BlockForm::fused_slot, 0, Tokens::hot_expert},
};

// A spec whose sizes every format's scale blocks divide (fp8-block's 128, int4's groups).
ModelSpec spec_for(WeightFormat format) {
  ModelSpec spec = small_dsv3();
  if (format == WeightFormat::fp8_block || format == WeightFormat::int4_group) {
    spec.hidden = 128;
    spec.intermediate = 128;
    spec.shared_intermediate = 256;
  }
  return spec;
}

QuantParams quant_for(WeightFormat format) {
  switch (format) {
    case WeightFormat::fp8_block:
      return QuantParams::Fp8Block(128);
    case WeightFormat::int4_group:
      return QuantParams::Int4Group(64);
    default:
      return format;
  }
}

Inputs rank_inputs(const ModelSpec& spec, int rank, int64_t tokens, DType dtype, Tokens kind) {
  Inputs in = random_inputs(spec, tokens, dtype, 100 + static_cast<uint64_t>(rank));
  if (kind == Tokens::hot_expert) {
    // Expert 3 wins nearly every token's routing.
    float* logits = in.logits.data<float>();
    for (int64_t t = 0; t < tokens; ++t) logits[t * spec.n_experts + 3] += 6.0f;
  }
  return in;
}

double tolerance(WeightFormat format, DType output) {
  if (output == DType::bf16) return 1e-2;
  // The single-process layer computes the same rows, quantised alike; only the order of the
  // ranks' partial sums differs, and where a row's kernel does (fewer rows per expert), an
  // activation can round to the neighbouring fp8/int step.
  return format == WeightFormat::f32 ? 1e-5 : 2e-2;
}

std::string identifier(std::string name) {
  for (char& ch : name) {
    if (ch == '-') ch = '_';
  }
  return name;
}

std::string case_name(const ::testing::TestParamInfo<MpiCase>& info) {
  const MpiCase& c = info.param;
  return identifier(fmt::format("{}_{}_{}_replicas{}_{}", a2a_mode_name(c.mode),
                                weight_format_name(c.format), block_form_name(c.form),
                                c.extra_replicas,
                                c.tokens == Tokens::uneven ? "uneven" : "hot_expert"));
}

class AllToAll : public ::testing::TestWithParam<MpiCase> {};

TEST_P(AllToAll, EveryRankEqualsTheSingleProcessLayerOnItsTokens) {
  const MpiCase& c = GetParam();
  const Platform platform = world();
  const int size = platform.world_size, rank = platform.world_rank;
  const ModelSpec spec = spec_for(c.format);
  const DType dtype = c.format == WeightFormat::bf16 ? DType::bf16 : DType::f32;
  const RandomWeights weights = RandomWeights::make(spec, DType::f32, 21);
  const Inputs in = rank_inputs(spec, rank, tokens_of(rank), dtype, c.tokens);

  Options options;
  options.runner = RunnerKind::cpu;
  options.weights = quant_for(c.format);
  options.form = c.form;
  options.max_tokens = 16;
  options.threads = 1;
  options.comm_timeout_ms = kTimeoutMs;
  const Plan single_plan = resolve(spec, options, platform);
  options.a2a = A2AKind::mpi;
  options.a2a_mode = c.mode;
  options.ep = ExpertParallel::Rank(size, rank, redundant_for(spec, size, c.extra_replicas));
  const Plan plan = resolve(spec, options, platform);
  ASSERT_EQ(plan.a2a_mode, c.mode);
  ASSERT_EQ(plan.form, c.form) << plan.explain();

  MoeLayer layer(plan, weights.view());
  const LayerRun run = run_layer(layer, in);
  if (tokens_of(rank) == 0) return;
  const LayerRun single = run_plan(single_plan, weights.view(), in);
  EXPECT_EQ(run.ids, single.ids);
  EXPECT_LT(relative_l2(run.output, single.output), tolerance(c.format, dtype));
  if (c.format == WeightFormat::f32) {
    const OracleRouting routing = oracle_routing(spec, weights.view(), in, run);
    EXPECT_TRUE(routing.agrees());
    EXPECT_LT(
        relative_l2(run.output.view(), oracle_output(spec, weights.view(), in.hidden, routing)),
        1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllToAll, ::testing::ValuesIn(kCases), case_name);

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

// The world communicator with its exchanges counted.
class CountedExchanges final : public Communicator {
 public:
  explicit CountedExchanges(Communicator& world) : world_(world) {}
  int rank() const override { return world_.rank(); }
  int size() const override { return world_.size(); }
  std::string_view name() const override { return world_.name(); }
  DeviceKind buffers() const override { return world_.buffers(); }
  void all_to_all(const ExecContext& ctx, const Exchange& x, const CommStep& step) override {
    ++exchanges;
    world_.all_to_all(ctx, x, step);
  }
  void all_reduce_sum(const ExecContext& ctx, float* data, int64_t count, float* scratch,
                      const CommStep& step) override {
    world_.all_reduce_sum(ctx, data, count, scratch, step);
  }
  int64_t all_reduce_scratch(int64_t count) const override {
    return world_.all_reduce_scratch(count);
  }
  bool barrier(const CommStep& step) override { return world_.barrier(step); }
  [[noreturn]] void abort(int code) override {
    world_.abort(code);
    std::_Exit(code);
  }
  const std::vector<int64_t>& bytes_sent_to() const override { return world_.bytes_sent_to(); }
  double bare_all_to_all_seconds(const std::vector<int64_t>& bytes_to, int repeats) override {
    return world_.bare_all_to_all_seconds(bytes_to, repeats);
  }

  int exchanges = 0;

 private:
  Communicator& world_;
};

struct ModeCost {
  A2AMode mode;
  int exchanges;  // dispatch and combine together
};

class AllToAllCalls : public ::testing::TestWithParam<ModeCost> {};

// Low-latency: one exchange to dispatch (no count round), one to combine; normal: counts, rows,
// combine. Neither allocates once built.
TEST_P(AllToAllCalls, ExchangeOnlyTheirRoundsAndAllocateNothing) {
  const ModeCost& c = GetParam();
  const Platform platform = world();
  const int size = platform.world_size, rank = platform.world_rank;
  const ModelSpec spec = small_dsv3();
  Options options;
  options.runner = RunnerKind::cpu;
  options.a2a = A2AKind::mpi;
  options.a2a_mode = c.mode;
  options.max_tokens = 8;
  options.threads = 1;
  options.comm_timeout_ms = kTimeoutMs;
  options.ep = ExpertParallel::Rank(size, rank, redundant_for(spec, size, 0));
  const Plan plan = resolve(spec, options, platform);
  CountedExchanges comm(world_communicator(CommKind::mpi));
  std::vector<int32_t> global_to_local(static_cast<size_t>(plan.location.physical), -1);
  for (int s = 0; s < plan.local_routed; ++s) global_to_local[plan.first_local + s] = s;
  const int columns = spec.routing.top_k;
  std::unique_ptr<Dispatcher> dispatcher =
      find_dispatcher(A2AKind::mpi)
          ->create({.hidden = spec.hidden,
                    .columns = columns,
                    .max_tokens = 8,
                    .max_received_tokens = plan.max_received_tokens,
                    .global_to_local = std::move(global_to_local),
                    .comm = &comm,
                    .timeout_ms = kTimeoutMs,
                    .mode = plan.a2a_mode,
                    .physical = plan.location.physical,
                    .per_rank = plan.location.per_rank()});
  Buffer scratch = Buffer::allocate(Device::cpu(), dispatcher->scratch_bytes());
  const ExecContext ctx{.device = Device::cpu(), .pool = &ThreadPool::shared(1)};
  const Inputs in = random_inputs(spec, tokens_of(rank) % 9, DType::bf16, 70);
  const int64_t T = in.hidden.view().dim(0);
  std::vector<int32_t> ids(static_cast<size_t>(T * columns));
  for (size_t e = 0; e < ids.size(); ++e) {
    ids[e] = static_cast<int32_t>((e * 7 + static_cast<size_t>(rank)) % plan.location.physical);
  }
  const std::vector<float> weights(ids.size(), 0.25f);
  std::vector<float> combined(static_cast<size_t>(T * spec.hidden));
  const auto call = [&] {
    const DispatchOutput out = dispatcher->dispatch(
        ctx, in.hidden.view(), ids.data(), weights.data(), combined.data(), scratch.data());
    dispatcher->combine(ctx, out, combined.data(), scratch.data());
  };
  call();  // the first call may start the thread pool's workers
  comm.exchanges = 0;
  const int64_t before = allocations_so_far();
  call();
  const int64_t allocations = allocations_so_far() - before;
  EXPECT_EQ(comm.exchanges, c.exchanges);
  EXPECT_EQ(allocations, 0);
}

constexpr ModeCost kModeCosts[] = {{A2AMode::low_latency, 2}, {A2AMode::normal, 3}};

std::string mode_cost_name(const ::testing::TestParamInfo<ModeCost>& info) {
  return identifier(std::string(a2a_mode_name(info.param.mode)));
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllToAllCalls, ::testing::ValuesIn(kModeCosts), mode_cost_name);

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
