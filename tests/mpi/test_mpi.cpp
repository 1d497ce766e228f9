// The all-to-all dispatcher across processes, run under mpirun by ctest (tests/CMakeLists.txt):
// every rank runs every test in the same order, with tokens of its own, and checks its output
// against the single-process layer on the same tokens (and the float64 oracle); and what each
// mode's calls cost in exchanges and allocations. test_mpi_reduce.cpp has the reduce forms, bad
// input, the faults and main().

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "core/thread_pool.hpp"
#include "dispatch/dispatcher.hpp"
#include "moekit/error.hpp"
#include "mpi/allocations.hpp"
#include "mpi/mpi_support.hpp"
#include "quant/activation_wire.hpp"

namespace moekit::test {
namespace {

enum class Tokens { uneven, hot_expert };

struct MpiCase {
  A2AMode mode;
  WeightFormat format;
  BlockForm form;
  int extra_replicas;
  Tokens tokens;
  // The wire asked (auto: e4m3 for the fp8 formats where the ranks span hosts).
  A2AWire wire = A2AWire::auto_;
  DType hidden = DType::f32;
};

constexpr A2AWire kAuto = A2AWire::auto_, kE4m3 = A2AWire::e4m3, kAsIs = A2AWire::activations;
constexpr DType kF32 = DType::f32, kBf16 = DType::bf16;

const MpiCase kCases[] = {
    {A2AMode::normal, WeightFormat::f32, BlockForm::standard, 0, Tokens::uneven},
    {A2AMode::low_latency, WeightFormat::f32, BlockForm::standard, 0, Tokens::uneven},
    {A2AMode::normal, WeightFormat::f32, BlockForm::standard, 0, Tokens::hot_expert},
    {A2AMode::low_latency, WeightFormat::f32, BlockForm::standard, 1, Tokens::hot_expert},
    {A2AMode::normal, WeightFormat::f32, BlockForm::overlapped, 1, Tokens::uneven},
    {A2AMode::low_latency, WeightFormat::f32, BlockForm::fused_slot, 0, Tokens::uneven},
    {A2AMode::normal, WeightFormat::f32, BlockForm::fused_slot, 1, Tokens::hot_expert},
    {A2AMode::normal, WeightFormat::bf16, BlockForm::standard, 0, Tokens::uneven, kAuto, kBf16},
    {A2AMode::low_latency, WeightFormat::bf16, BlockForm::overlapped, 0, Tokens::uneven, kAuto,
     kBf16},
    {A2AMode::normal, WeightFormat::fp8_block, BlockForm::standard, 0, Tokens::uneven, kE4m3},
    {A2AMode::low_latency, WeightFormat::fp8_block, BlockForm::standard, 0, Tokens::hot_expert,
     kE4m3, kBf16},
    {A2AMode::normal, WeightFormat::fp8_block, BlockForm::fused_slot, 0, Tokens::uneven, kAsIs},
    {A2AMode::low_latency, WeightFormat::fp8_tensor, BlockForm::standard, 1, Tokens::uneven, kE4m3},
    {A2AMode::normal, WeightFormat::fp8_tensor, BlockForm::standard, 0, Tokens::hot_expert},
    {A2AMode::normal, WeightFormat::fp8_tensor, BlockForm::overlapped, 0, Tokens::uneven, kE4m3,
     kBf16},
    {A2AMode::normal, WeightFormat::int4_group, BlockForm::fused_slot, 0, Tokens::hot_expert},
};

bool quantises_to_e4m3(WeightFormat format) {
  return format == WeightFormat::fp8_block || format == WeightFormat::fp8_tensor;
}

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

std::string case_name(const ::testing::TestParamInfo<MpiCase>& info) {
  const MpiCase& c = info.param;
  return identifier(fmt::format("{}_{}_{}_replicas{}_{}_wire_{}_{}", a2a_mode_name(c.mode),
                                weight_format_name(c.format), block_form_name(c.form),
                                c.extra_replicas,
                                c.tokens == Tokens::uneven ? "uneven" : "hot_expert",
                                a2a_wire_name(c.wire), dtype_name(c.hidden)));
}

class AllToAll : public ::testing::TestWithParam<MpiCase> {};

TEST_P(AllToAll, EveryRankEqualsTheSingleProcessLayerOnItsTokens) {
  const MpiCase& c = GetParam();
  const Platform platform = world();
  const int size = platform.world_size, rank = platform.world_rank;
  const ModelSpec spec = spec_for(c.format);
  const DType dtype = c.hidden;
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
  options.a2a_wire = c.wire;
  options.ep = ExpertParallel::Rank(size, rank, redundant_for(spec, size, c.extra_replicas));
  const Plan plan = resolve(spec, options, platform);
  ASSERT_EQ(plan.a2a_mode, c.mode);
  ASSERT_EQ(plan.form, c.form) << plan.explain();
  const bool e4m3 = c.wire == kE4m3 || (c.wire == kAuto && quantises_to_e4m3(c.format) &&
                                        platform.world_local_size < platform.world_size);
  ASSERT_EQ(plan.a2a_wire, e4m3 ? kE4m3 : kAsIs) << plan.explain();

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
  if (quantises_to_e4m3(c.format)) {
    // The oracle of the format, with GEMM inputs quantised from the rows as the source rank
    // holds them.
    const QuantizedLayerWeights quantized = quantize_layer(weights.view(), plan.quant);
    const OracleRouting routing = oracle_routing(spec, quantized.view(), in, run);
    EXPECT_TRUE(routing.agrees());
    EXPECT_TRUE(compare_with_oracle(spec, quantized.view(), plan.quant, in, routing, run)
                    .within(moekit::test::tolerance(dtype)));
  }
}

struct WireCase {
  A2AMode mode;
  QuantParams quant;
  DType hidden;
};

std::string wire_case_name(const ::testing::TestParamInfo<WireCase>& info) {
  const WireCase& c = info.param;
  return identifier(
      fmt::format("{}_{}_{}", a2a_mode_name(c.mode), c.quant.name(), dtype_name(c.hidden)));
}

class AllToAllWire : public ::testing::TestWithParam<WireCase> {};

// The rows arrive quantised and the runner re-quantises them to the same codes and scales, so
// the layer's output is the activations wire's, bit for bit, on every rank; with half the bytes.
TEST_P(AllToAllWire, E4m3GivesTheActivationsWiresOutputBitForBitInHalfTheRowBytes) {
  const WireCase& c = GetParam();
  const Platform platform = world();
  const int size = platform.world_size, rank = platform.world_rank;
  const ModelSpec spec = spec_for(WeightFormat::fp8_block);
  const RandomWeights weights = RandomWeights::make(spec, DType::f32, 23);
  const Inputs in = rank_inputs(spec, rank, tokens_of(rank) + 4, c.hidden, Tokens::uneven);
  Options options;
  options.runner = RunnerKind::cpu;
  options.weights = c.quant;
  options.max_tokens = 16;
  options.threads = 1;
  options.comm_timeout_ms = kTimeoutMs;
  options.a2a = A2AKind::mpi;
  options.a2a_mode = c.mode;
  options.ep = ExpertParallel::Rank(size, rank, redundant_for(spec, size, 0));
  Communicator& comm = world_communicator(CommKind::mpi);
  struct WireRun {
    LayerRun run;
    int64_t bytes_out = 0;  // to the other ranks, dispatch and combine
  };
  const auto run_with = [&](A2AWire wire) {
    options.a2a_wire = wire;
    const Plan plan = resolve(spec, options, platform);
    EXPECT_EQ(plan.a2a_wire, wire) << plan.explain();
    MoeLayer layer(plan, weights.view());
    const std::vector<int64_t> before = comm.bytes_sent_to();
    WireRun r{run_layer(layer, in)};
    for (int p = 0; p < size; ++p) r.bytes_out += comm.bytes_sent_to()[p] - before[p];
    return r;
  };
  const WireRun e4m3 = run_with(A2AWire::e4m3);
  const WireRun as_is = run_with(A2AWire::activations);
  EXPECT_EQ(as_doubles(e4m3.run.output), as_doubles(as_is.run.output));
  // The same rows go out either way; only their bytes differ. Rows sent to other ranks: those of
  // tokens with an expert on another rank, once per such rank.
  const int columns = spec.routing.top_k;
  const Plan plan = resolve(spec, options, platform);
  const std::vector<int>& physical = plan.location.rank_table[static_cast<size_t>(rank)];
  int64_t rows_out = 0;
  for (int64_t t = 0; t < in.hidden.view().dim(0); ++t) {
    std::vector<bool> to(static_cast<size_t>(size), false);
    for (int j = 0; j < columns; ++j) {
      const int r = physical[e4m3.run.ids[t * columns + j]] / plan.location.per_rank();
      if (r != rank && !to[r]) ++rows_out;
      to[r] = true;
    }
  }
  const E4m3Wire wire = e4m3_wire(c.quant, spec.hidden);
  const int64_t row = dtype_storage_bytes(c.hidden, spec.hidden);
  // f16 rows travel as f16 on either wire.
  const int64_t saved = e4m3_wire_carries(c.hidden) ? row - wire.row_bytes() : 0;
  EXPECT_EQ(as_is.bytes_out - e4m3.bytes_out, rows_out * saved);
  if (c.hidden == DType::bf16) {
    // Half the bytes of a bf16 row, and the scales' few more.
    EXPECT_LE(2 * wire.row_bytes(), row + row / 8);
  }
}

const WireCase kWireCases[] = {
    {A2AMode::normal, QuantParams::Fp8Block(128), DType::bf16},
    {A2AMode::low_latency, QuantParams::Fp8Block(128), DType::f32},
    {A2AMode::low_latency, QuantParams::Fp8Tensor(), DType::bf16},
    {A2AMode::normal, QuantParams::Fp8Tensor(), DType::f32},
    {A2AMode::low_latency, QuantParams::Fp8Block(128), DType::f16},
};

INSTANTIATE_TEST_SUITE_P(Ranks, AllToAllWire, ::testing::ValuesIn(kWireCases), wire_case_name);

INSTANTIATE_TEST_SUITE_P(Ranks, AllToAll, ::testing::ValuesIn(kCases), case_name);

class AllToAllWireMismatch : public ::testing::TestWithParam<A2AMode> {};

// Rank 0 sends e4m3 rows, the others bf16: every rank's first exchange carries which, so every
// rank fails there, none waiting in the next.
TEST_P(AllToAllWireMismatch, RanksWhosePlansDisagreeOnTheWireAllFailNamingIt) {
  const Platform platform = world();
  const int size = platform.world_size, rank = platform.world_rank;
  const ModelSpec spec = spec_for(WeightFormat::fp8_block);
  const RandomWeights weights = RandomWeights::make(spec, DType::f32, 25);
  Options options;
  options.runner = RunnerKind::cpu;
  options.weights = QuantParams::Fp8Block(128);
  options.max_tokens = 16;
  options.threads = 1;
  options.comm_timeout_ms = kTimeoutMs;
  options.a2a = A2AKind::mpi;
  options.a2a_mode = GetParam();
  options.a2a_wire = rank == 0 ? A2AWire::e4m3 : A2AWire::activations;
  options.ep = ExpertParallel::Rank(size, rank, redundant_for(spec, size, 0));
  MoeLayer layer(resolve(spec, options, platform), weights.view());
  const Inputs in = rank_inputs(spec, rank, 4, DType::f32, Tokens::uneven);
  try {
    run_layer(layer, in);
    ADD_FAILURE() << "rank " << rank << ": a forward with rank 0's wire apart returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::comm) << e.what();
    EXPECT_NE(std::string(e.what()).find("the ranks' plans differ"), std::string::npos) << e.what();
  }
}

std::string mode_name(const ::testing::TestParamInfo<A2AMode>& info) {
  return identifier(std::string(a2a_mode_name(info.param)));
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllToAllWireMismatch,
                         ::testing::Values(A2AMode::normal, A2AMode::low_latency), mode_name);

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
  A2AWire wire;
};

class AllToAllCalls : public ::testing::TestWithParam<ModeCost> {};

// Low-latency: one exchange to dispatch (no count round), one to combine; normal: counts, rows,
// combine. Neither allocates once built, on either wire.
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
                    .wire = c.wire,
                    .quant = QuantParams::Fp8Block(128),
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

constexpr ModeCost kModeCosts[] = {{A2AMode::low_latency, 2, kAsIs},
                                   {A2AMode::normal, 3, kAsIs},
                                   {A2AMode::low_latency, 2, kE4m3},
                                   {A2AMode::normal, 3, kE4m3}};

std::string mode_cost_name(const ::testing::TestParamInfo<ModeCost>& info) {
  return identifier(
      fmt::format("{}_{}", a2a_mode_name(info.param.mode), a2a_wire_name(info.param.wire)));
}

INSTANTIATE_TEST_SUITE_P(Ranks, AllToAllCalls, ::testing::ValuesIn(kModeCosts), mode_cost_name);

}  // namespace
}  // namespace moekit::test
