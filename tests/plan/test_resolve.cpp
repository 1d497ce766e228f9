// resolve(): what it picks, what it refuses and why, and that it is pure.

#include <gtest/gtest.h>

#include "comm/communicator.hpp"
#include "moekit/error.hpp"
#include "moekit/plan.hpp"
#include "support/layer_fixture.hpp"

namespace moekit::test {
namespace {

std::string refusal(const ModelSpec& spec, const Options& options) {
  const Resolution r = try_resolve(spec, options, Platform::cpu_only(2));
  EXPECT_FALSE(r.plan.has_value()) << "expected a refusal";
  return r.refusal;
}

void expect_mentions(const std::string& text, std::initializer_list<const char*> fragments) {
  for (const char* fragment : fragments) {
    EXPECT_NE(text.find(fragment), std::string::npos)
        << "'" << text << "' lacks '" << fragment << "'";
  }
}

TEST(Resolve, AutoPicksTheCpuCoreOnACpuMachine) {
  const Plan plan = resolve(small_dsv3(), Options{}, Platform::cpu_only(2));
  EXPECT_EQ(plan.runner, RunnerKind::cpu);
  EXPECT_EQ(plan.form, BlockForm::standard);
  EXPECT_TRUE(plan.fallbacks().empty());
}

// The cuda runner is built where nvcc was found; either way, asked for on the CPU it is refused
// with the runners that can serve there.
TEST(Resolve, GpuRunnerOnTheCpuIsRefusedWithTheLegalAlternatives) {
  Options options;
  options.runner = RunnerKind::cuda;
#ifdef MOEKIT_WITH_CUDA
  const char* why = "computes on a GPU";
#else
  const char* why = "not built";
#endif
  expect_mentions(refusal(small_dsv3(), options), {"runner=cuda", why, "cpu", "reference"});
  options.runner = RunnerKind::hopper;
  expect_mentions(refusal(small_dsv3(), options), {"runner=hopper", "not built", "--runner cuda"});
}

TEST(Resolve, GpuDeviceWithoutAGpuRunnerIsRefused) {
  Options options;
  options.device = Device::cuda(0);
  expect_mentions(refusal(small_dsv3(), options), {"device=cuda:0", "device=cpu"});
}

TEST(Resolve, UnbuiltCommunicationIsRefused) {
  Options options;
  options.ep = ExpertParallel::Rank(2, 0);
  for (A2AKind a2a : {A2AKind::mpi, A2AKind::nccl}) {
    options.a2a = a2a;
    expect_mentions(refusal(small_dsv3(), options), {a2a_name(a2a).data(), "a2a none"});
  }
}

// Under a launcher of 4 ranks (as mpirun's environment tells Platform::probe).
Platform launched(int size, int rank) {
  Platform platform = Platform::cpu_only(2);
  platform.world_size = size;
  platform.world_rank = rank;
  return platform;
}

TEST(Resolve, AnAllToAllOverOtherRanksThanTheLaunchersIsRefused) {
  if (!communicator_built(CommKind::mpi)) GTEST_SKIP() << communicator_absent_reason(CommKind::mpi);
  Options options;
  options.a2a = A2AKind::mpi;
  options.ep = ExpertParallel::Rank(2, 0);
  const Resolution r = try_resolve(small_dsv3(), options, launched(4, 1));
  ASSERT_FALSE(r.plan);
  expect_mentions(r.refusal, {"--ep-size 4 --ep-rank 1", "mpirun -np 2", "a2a none"});
}

struct ModeCase {
  int64_t max_tokens;
  A2AMode asked;
  A2AMode chosen;
};

TEST(Resolve, TheAllToAllModeFollowsTheBatchSizeUnlessAsked) {
  if (!communicator_built(CommKind::mpi)) GTEST_SKIP() << communicator_absent_reason(CommKind::mpi);
  constexpr ModeCase kCases[] = {{16, A2AMode::auto_, A2AMode::low_latency},
                                 {128, A2AMode::auto_, A2AMode::low_latency},
                                 {129, A2AMode::auto_, A2AMode::normal},
                                 {16, A2AMode::normal, A2AMode::normal},
                                 {4096, A2AMode::low_latency, A2AMode::low_latency}};
  for (const ModeCase& c : kCases) {
    Options options;
    options.a2a = A2AKind::mpi;
    options.ep = ExpertParallel::Rank(4, 2);
    options.max_tokens = c.max_tokens;
    options.a2a_mode = c.asked;
    const Plan plan = resolve(small_dsv3(), options, launched(4, 2));
    EXPECT_EQ(plan.a2a_mode, c.chosen) << c.max_tokens;
    EXPECT_EQ(plan.comm, CommKind::mpi);
    EXPECT_EQ(plan.max_received_tokens, 4 * c.max_tokens);
    EXPECT_TRUE(plan.adds_shared_output)
        << "a2a mpi: every rank adds its own tokens' shared output";
    expect_mentions(plan.explain(),
                    {"mode", std::string(a2a_mode_name(c.chosen)).c_str(), "wire format"});
  }
}

struct WireCase {
  QuantParams weights;
  A2AWire asked;
  A2AWire chosen;
  std::vector<std::string> explained;  // what explain() says of the wire
  int local_size = 1;                  // of the 4 ranks, those on this host
};

TEST(Resolve, RowsTravelAsE4m3BetweenHostsWhereTheFormatQuantisesThemSoUnlessAsked) {
  if (!communicator_built(CommKind::mpi)) GTEST_SKIP() << communicator_absent_reason(CommKind::mpi);
  ModelSpec spec = small_dsv3();
  spec.hidden = 256;
  spec.intermediate = 128;
  spec.shared_intermediate = 256;
  // Bytes per token and destination: the row, and 8 per (slot, weight) pair.
  const int64_t pairs = 8 * spec.routing.top_k;
  const std::string bf16 = fmt::format("{} bytes out as bf16", 2 * 256 + pairs);
  const std::vector<WireCase> cases = {
      {QuantParams::Fp8Block(128),
       A2AWire::auto_,
       A2AWire::e4m3,
       {"e4m3 rows with one f32 scale per 128 columns",
        fmt::format("{} bytes out (256 code bytes + 8 scale bytes) instead of {}", 264 + pairs,
                    bf16)}},
      {QuantParams::Fp8Tensor(),
       A2AWire::auto_,
       A2AWire::e4m3,
       {"one f32 scale per 256 columns", fmt::format("{} bytes out", 260 + pairs)}},
      {QuantParams::Fp8Block(128),
       A2AWire::activations,
       A2AWire::activations,
       {"rows in the hidden states' dtype", "asked", bf16}},
      {QuantParams::Fp8Block(128),
       A2AWire::auto_,
       A2AWire::activations,
       {"rows in the hidden states' dtype", "every rank is on this host (4 of 4)"},
       4},
      {QuantParams::Fp8Block(128), A2AWire::e4m3, A2AWire::e4m3, {"e4m3 rows", "asked"}, 4},
      {WeightFormat::bf16,
       A2AWire::auto_,
       A2AWire::activations,
       {"rows in the hidden states' dtype", "keeps GEMM1's inputs as they come"}},
      {QuantParams::Fp8Tensor(Fp8Scaling::per_tensor, Fp8Activations::static_),
       A2AWire::auto_,
       A2AWire::activations,
       {"static scale"}},
  };
  for (const WireCase& c : cases) {
    Options options;
    options.a2a = A2AKind::mpi;
    options.ep = ExpertParallel::Rank(4, 1);
    options.weights = c.weights;
    options.a2a_wire = c.asked;
    Platform platform = launched(4, 1);
    platform.world_local_size = c.local_size;
    const Plan plan = resolve(spec, options, platform);
    EXPECT_EQ(plan.a2a_wire, c.chosen) << c.weights.name();
    for (const std::string& fragment : c.explained) {
      EXPECT_NE(plan.explain().find(fragment), std::string::npos)
          << plan.explain() << "\nlacks: " << fragment;
    }
  }
}

TEST(Resolve, AnE4m3WireForAFormatThatKeepsItsInputsIsRefusedNamingTheAlternatives) {
  if (!communicator_built(CommKind::mpi)) GTEST_SKIP() << communicator_absent_reason(CommKind::mpi);
  Options options;
  options.a2a = A2AKind::mpi;
  options.ep = ExpertParallel::Rank(4, 1);
  options.a2a_wire = A2AWire::e4m3;
  const Resolution r = try_resolve(small_dsv3(), options, launched(4, 1));
  ASSERT_FALSE(r.plan);
  expect_mentions(r.refusal, {"a2a wire e4m3", "--a2a-wire auto or activations", "fp8-block"});
}

TEST(Resolve, ANoneAcrossProcessesSumsOverTheRanksAndEveryRankAddsTheSharedOutput) {
  if (!communicator_built(CommKind::mpi)) GTEST_SKIP() << communicator_absent_reason(CommKind::mpi);
  Options options;
  options.ep = ExpertParallel::Rank(2, 1);
  const Plan across = resolve(small_dsv3(), options, launched(2, 1));
  EXPECT_EQ(across.comm, CommKind::mpi);
  EXPECT_TRUE(across.adds_shared_output);
  const Plan within = resolve(small_dsv3(), options, Platform::cpu_only(2));
  EXPECT_EQ(within.comm, CommKind::none) << "in one process the caller sums the ranks";
  EXPECT_FALSE(within.adds_shared_output);
}

TEST(Resolve, ATensorParallelSliceThatCutsScaleBlocksIsRefusedNamingSizesThatFit) {
  ModelSpec spec = small_dsv3();
  spec.hidden = 256;
  spec.intermediate = 256;
  spec.shared_intermediate = 256;
  Options options;
  options.weights = QuantParams::Fp8Block(128);
  options.tp = {4, 1};
  expect_mentions(refusal(spec, options), {"tp size 4", "scale blocks of 128", "--tp-size 1 or 2"});
  options.tp = {2, 1};
  const Plan plan = resolve(spec, options, Platform::cpu_only(2));
  EXPECT_EQ(plan.routed_intermediate, 128);
  EXPECT_EQ(plan.routed_first, 128);
  EXPECT_FALSE(plan.adds_shared_output) << "in one process tp rank 0 adds the shared output";
}

struct BadQuant {
  const char* name;
  QuantParams params;
  const char* fragment;
};

QuantParams with(QuantParams params, void (*change)(QuantParams&)) {
  change(params);
  return params;
}

TEST(Resolve, QuantParamsThatDescribeNoFormatAreRefused) {
  const BadQuant cases[] = {
      {"odd int4 group", QuantParams::Int4Group(63), "even group size"},
      {"f32 int4 scales", QuantParams::Int4Group(64, DType::f32), "f16 or bf16"},
      {"empty fp8 block", QuantParams::Fp8Block(0), "positive block sizes"},
      {"fp8-tensor in blocks",
       with(QuantParams::Fp8Tensor(), [](QuantParams& q) { q.block_cols = 128; }),
       "one output channel"},
      {"fp8-block activation group off its block",
       with(QuantParams::Fp8Block(), [](QuantParams& q) { q.activation_group = 64; }),
       "per block_cols columns"},
      {"bf16 with scales",
       with(QuantParams::Unquantized(WeightFormat::bf16), [](QuantParams& q) { q.block_rows = 1; }),
       "no scales"},
      {"int4 quantising activations",
       with(QuantParams::Int4Group(),
            [](QuantParams& q) { q.activation = ActivationQuant::fp8_per_token; }),
       "leaves activations unquantised"},
  };
  for (const BadQuant& c : cases) {
    SCOPED_TRACE(c.name);
    Options options;
    options.weights = c.params;
    expect_mentions(refusal(small_dsv3(), options),
                    {weight_format_name(c.params.format).data(), c.fragment});
  }
}

TEST(Resolve, Int4IsRefusedForAnOddK) {
  ModelSpec spec = small_dsv3();
  spec.hidden = 47;
  Options options;
  options.weights = WeightFormat::int4_group;
  expect_mentions(refusal(spec, options), {"int4-group", "odd K = 47"});
}

TEST(Resolve, QuantisedFormatsOnUnbuiltRunnersAreRefusedNamingTheFormat) {
  for (WeightFormat format :
       {WeightFormat::fp8_tensor, WeightFormat::fp8_block, WeightFormat::int4_group}) {
    Options options;
    options.weights = format;
    options.runner = RunnerKind::cuda;
    expect_mentions(refusal(small_dsv3(), options),
                    {weight_format_name(format).data(), "cuda", "cpu, reference"});
  }
}

TEST(Resolve, EveryFormatResolvesOnTheCpuAndRecordsItsParameters) {
  for (WeightFormat format : kAllWeightFormats) {
    Options options;
    options.weights = format;
    const Plan plan = resolve(small_dsv3(), options, Platform::cpu_only(2));
    EXPECT_EQ(plan.quant, QuantParams(format));
    EXPECT_EQ(plan.runner, RunnerKind::cpu);
    EXPECT_NE(plan.explain().find(plan.quant.describe()), std::string::npos);
  }
}

TEST(Resolve, FusedSlotFallsBackWhenASharedSplitWouldCutAScaleBlock) {
  ModelSpec spec = small_dsv3();  // shared I = 32 = 2 x routed I = 16
  Options options;
  options.form = BlockForm::fused_slot;
  options.weights = QuantParams::Int4Group(32);
  const Plan plan = resolve(spec, options, Platform::cpu_only(2));
  EXPECT_EQ(plan.form, BlockForm::standard);
  ASSERT_EQ(plan.fallbacks().size(), 1u);
  EXPECT_NE(plan.fallbacks()[0]->reason.find("scale blocks of 32"), std::string::npos);
  options.weights = QuantParams::Int4Group(16);
  EXPECT_EQ(resolve(spec, options, Platform::cpu_only(2)).form, BlockForm::fused_slot);
}

struct ImpossibleSpec {
  const char* name;
  void (*spoil)(ModelSpec&);
  const char* fragment;
};

TEST(Resolve, ImpossibleSpecsAreRefused) {
  const ImpossibleSpec cases[] = {
      {"top-k above experts", [](ModelSpec& s) { s.routing.top_k = s.n_experts + 1; }, "top-k"},
      {"groups do not divide", [](ModelSpec& s) { s.routing.n_group = 5; }, "does not divide"},
      {"topk_group too small",
       [](ModelSpec& s) {
         s.routing.topk_group = 1;
         s.routing.top_k = 5;
       },
       "cannot hold top-k"},
      {"topk_group above n_group", [](ModelSpec& s) { s.routing.topk_group = 5; }, "topk_group"},
      {"no hidden size", [](ModelSpec& s) { s.hidden = 0; }, "hidden size"},
      {"shared without width", [](ModelSpec& s) { s.shared_intermediate = 0; }, "shared experts"},
  };
  for (const ImpossibleSpec& c : cases) {
    ModelSpec spec = small_dsv3();
    c.spoil(spec);
    expect_mentions(refusal(spec, Options{}), {"model spec", c.fragment});
  }
}

TEST(Resolve, FallbackIsRecordedAndStrictRefusesIt) {
  ModelSpec spec = small_dsv3();
  spec.n_shared = 0;
  Options options;
  options.form = BlockForm::overlapped;
  const Plan plan = resolve(spec, options, Platform::cpu_only(2));
  ASSERT_EQ(plan.fallbacks().size(), 1u);
  EXPECT_NE(plan.explain().find("FALLBACK"), std::string::npos);
  options.strict = true;
  expect_mentions(refusal(spec, options), {"--strict", "overlapped"});
}

TEST(Resolve, ExplainShowsTheFiveLayersWithReasons) {
  const std::string text = resolve(small_dsv3(), Options{}, Platform::cpu_only(2)).explain();
  expect_mentions(text,
                  {"1 block", "2 experts", "3 dispatcher", "4 runner", "5 quant method", "why:"});
}

TEST(Resolve, IsPure) {
  Options options;
  options.ep = ExpertParallel::Rank(4, 1, 4);
  const Plan a = resolve(small_dsv3(), options, Platform::cpu_only(2));
  const Plan b = resolve(small_dsv3(), options, Platform::cpu_only(2));
  EXPECT_EQ(a.explain(), b.explain());
}

TEST(Resolve, BadOptionsAreRefused) {
  Options options;
  options.max_tokens = 0;
  expect_mentions(refusal(small_dsv3(), options), {"max_tokens"});
  options.max_tokens = int64_t{1} << 62;
  expect_mentions(refusal(small_dsv3(), options), {"max_tokens=4611686018427387904", "1 to"});
  options = Options{};
  options.ep = ExpertParallel::Rank(2, 2);
  expect_mentions(refusal(small_dsv3(), options), {"rank 2"});
}

struct ThreadLimit {
  int cpu_threads;  // the machine's
  int limit;        // the most resolve grants
};

// A thread count far above the machine's would start that many threads and starve it.
TEST(Resolve, ThreadsAboveFourPerHardwareThreadAreRefusedNamingTheLimit) {
  // A machine whose thread count is unknown (0) still gets 4.
  for (const ThreadLimit& c : {ThreadLimit{2, 8}, ThreadLimit{16, 64}, ThreadLimit{0, 4}}) {
    SCOPED_TRACE(fmt::format("{} CPU threads", c.cpu_threads));
    Platform platform;
    platform.cpu_threads = c.cpu_threads;
    Options options;
    options.threads = c.limit;
    EXPECT_EQ(resolve(small_dsv3(), options, platform).threads, c.limit);
    for (const int refused : {c.limit + 1, 100000}) {
      options.threads = refused;
      try {
        resolve(small_dsv3(), options, platform);
        ADD_FAILURE() << "threads=" << refused << " resolved";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), Errc::config_refused);
        const std::string threads = fmt::format("threads={}", refused);
        const std::string limit = fmt::format("limit {}", c.limit);
        expect_mentions(e.what(), {threads.c_str(), limit.c_str()});
      }
    }
  }
}

}  // namespace
}  // namespace moekit::test
