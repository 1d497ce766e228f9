// The GPU's fusions of two stages into one kernel (Plan::fusions): resolve decides them and says
// so (no GPU needed), the router kernel writes the physical columns exactly as to_physical does,
// and a whole forward with the fusions gives the same bits as the same plan with fused ops off
// (every stage its own kernel). Outputs are poisoned on the device first. The GPU suites skip
// with the runtime's reason where no GPU is usable.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "block/cuda/block_kernels.hpp"
#include "cuda/cuda_support.hpp"
#include "moekit/expert_location.hpp"
#include "routing/cuda/route.hpp"
#include "runner/cuda/permute.hpp"
#include "support/layer_fixture.hpp"
#include "support/specs.hpp"

namespace moekit::test {
namespace {

using cuda_testing::download;
using cuda_testing::normal;
using cuda_testing::poisoned;
using cuda_testing::upload;

// A device tensor's bytes, for comparing bit for bit.
std::vector<uint8_t> bytes_of(const TensorView& device) {
  Tensor host = Tensor::empty(device.dtype, device.shape);
  copy(host, device);
  std::vector<uint8_t> out(static_cast<size_t>(device.nbytes()));
  if (!out.empty()) std::memcpy(out.data(), host.view().data, out.size());
  return out;
}

// ---- resolve (no GPU needed) ----

Platform with_gpu() {
  Platform p = Platform::cpu_only(2);
  p.cuda_runtime = true;
  p.gpus.push_back({.index = 0,
                    .compute_major = 9,
                    .compute_minor = 0,
                    .name = "test GPU",
                    .sm_count = 132,
                    .memory_bytes = 1LL << 36,
                    .l2_bytes = 60 << 20});
  return p;
}

Options gpu_options() {
  Options options;
  options.runner = RunnerKind::cuda;
  options.device = Device::cuda(0);
  return options;
}

const Decision* find_decision(const Plan& plan, const std::string& topic) {
  for (const Decision& d : plan.decisions) {
    if (d.topic == topic) return &d;
  }
  return nullptr;
}

TEST(CudaResolveFusions, FusesEveryStagePairForALayerWithoutSharedExperts) {
  const Plan plan = resolve(ModelSpec::preset("qwen3-moe"), gpu_options(), with_gpu());
  EXPECT_TRUE(plan.fusions.checks_in_router);
  EXPECT_TRUE(plan.fusions.route_to_physical);
  EXPECT_TRUE(plan.fusions.map_in_sort);
  EXPECT_TRUE(plan.fusions.combine_to_output);
  EXPECT_TRUE(plan.fusions.route_in_runner);
  for (const char* topic : {"finite checks + router", "router + logical -> physical",
                            "map to local slots", "router + one-token kernel", "output"}) {
    const Decision* d = find_decision(plan, topic);
    ASSERT_NE(d, nullptr) << topic;
    EXPECT_EQ(d->choice, "one kernel") << topic;
    EXPECT_NE(plan.explain().find(topic), std::string::npos) << topic;
  }
}

TEST(CudaResolveFusions, KeepsTheOutputStageWhereSharedExpertsAreAdded) {
  const Plan plan = resolve(ModelSpec::preset("dsv3"), gpu_options(), with_gpu());
  ASSERT_EQ(plan.shared_strategy, SharedStrategy::after);
  EXPECT_TRUE(plan.fusions.route_to_physical);
  EXPECT_TRUE(plan.fusions.map_in_sort);
  EXPECT_FALSE(plan.fusions.combine_to_output);
  const Decision* d = find_decision(plan, "output");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->choice, "two kernels");
  EXPECT_NE(d->reason.find("shared experts"), std::string::npos) << d->reason;
}

TEST(CudaResolveFusions, KeepsTheRouterKernelWhereNoOneTokenKernelRunsOneToken) {
  // DeepSeek-V3's token reads 792 MB of bf16 weights: the grouped kernels take it.
  const Plan plan = resolve(ModelSpec::preset("dsv3"), gpu_options(), with_gpu());
  EXPECT_FALSE(plan.fusions.route_in_runner);
  const Decision* d = find_decision(plan, "router + one-token kernel");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->choice, "two kernels");
  EXPECT_NE(d->reason.find("one-token"), std::string::npos) << d->reason;
}

TEST(CudaResolveFusions, KeepsToPhysicalApartWhereASharedGateWeightsFusedSlots) {
  Options options = gpu_options();
  options.form = BlockForm::fused_slot;
  const Plan plan = resolve(small_qwen2_moe(), options, with_gpu());
  ASSERT_EQ(plan.form, BlockForm::fused_slot);
  ASSERT_GT(plan.shared_slots, 0);
  EXPECT_FALSE(plan.fusions.route_to_physical);
  EXPECT_TRUE(plan.fusions.map_in_sort);
  EXPECT_TRUE(plan.fusions.combine_to_output);  // the shared experts are routed slots
  EXPECT_FALSE(plan.fusions.route_in_runner);   // the physical columns wait for the gate
}

TEST(CudaResolveFusions, Gemm1ReadsTheHiddenStatesOfSixteenBitDecodeBatches) {
  const Plan plan = resolve(ModelSpec::preset("qwen3-moe"), gpu_options(), with_gpu());
  EXPECT_TRUE(plan.fusions.gather_in_gemm1);
  const Decision* d = find_decision(plan, "sort + gather in GEMM1");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->choice, "one kernel");
  // Only the decode runs take it; a prefill run keeps the sort + gather.
  ASSERT_TRUE(plan.cuda_kernels);
  EXPECT_TRUE(CudaKernels::for_tokens(plan.cuda_kernels->routed, 2).rows_from_hidden);
  EXPECT_FALSE(CudaKernels::for_tokens(plan.cuda_kernels->routed, 512).rows_from_hidden);
}

TEST(CudaResolveFusions, Fp8KeepsTheSortAndGatherThatQuantisesTheRows) {
  Options options = gpu_options();
  options.weights = QuantParams::Fp8Block(128);
  const Plan plan = resolve(ModelSpec::preset("qwen3-moe"), options, with_gpu());
  EXPECT_FALSE(plan.fusions.gather_in_gemm1);
  const Decision* d = find_decision(plan, "sort + gather in GEMM1");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->choice, "two kernels");
  EXPECT_NE(d->reason.find("16-bit"), std::string::npos) << d->reason;
}

TEST(CudaResolveFusions, FusedOpsOffRunsEveryStageApart) {
  Options options = gpu_options();
  options.fused_ops = FusedOps::off;
  const Plan plan = resolve(ModelSpec::preset("qwen3-moe"), options, with_gpu());
  EXPECT_FALSE(plan.fusions.checks_in_router);
  EXPECT_FALSE(plan.fusions.route_to_physical);
  EXPECT_FALSE(plan.fusions.map_in_sort);
  EXPECT_FALSE(plan.fusions.combine_to_output);
  EXPECT_FALSE(plan.fusions.gather_in_gemm1);
  EXPECT_FALSE(plan.fusions.route_in_runner);
  const Decision* d = find_decision(plan, "output");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->reason, "fused ops are off");
}

TEST(CudaResolveFusions, NoChecksNothingToTakeIn) {
  Options options = gpu_options();
  options.check_finite = false;
  const Plan plan = resolve(ModelSpec::preset("qwen3-moe"), options, with_gpu());
  EXPECT_FALSE(plan.fusions.checks_in_router);
  EXPECT_TRUE(plan.fusions.route_to_physical);
  const Decision* d = find_decision(plan, "finite checks + router");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->reason, "the finite checks are off");
}

TEST(CudaResolveFusions, ACpuPlanHasNone) {
  Options options;
  options.runner = RunnerKind::cpu;
  const Plan plan = resolve(ModelSpec::preset("qwen3-moe"), options, Platform::cpu_only(2));
  EXPECT_FALSE(plan.fusions.checks_in_router);
  EXPECT_FALSE(plan.fusions.route_to_physical);
  EXPECT_FALSE(plan.fusions.map_in_sort);
  EXPECT_FALSE(plan.fusions.combine_to_output);
  EXPECT_EQ(find_decision(plan, "map to local slots"), nullptr);
}

// ---- the router kernel's physical columns ----

struct FusedRouteCase {
  const char* name;
  int n_experts;
  RoutingSpec spec;
};

const FusedRouteCase kRouteCases[] = {
    {"qwen3_softmax_top8_e128",
     128,
     {.scoring = Scoring::softmax, .top_k = 8, .renormalize = true}},
    {"dsv3_sigmoid_bias_grouped",
     256,
     {.scoring = Scoring::sigmoid,
      .top_k = 8,
      .correction_bias = true,
      .n_group = 8,
      .topk_group = 4,
      .group_score = GroupScore::top2_sum,
      .renormalize = true,
      .routed_scaling_factor = 2.5f}},
    {"mixtral_softmax_top2_e8", 8, {.scoring = Scoring::softmax, .top_k = 2, .renormalize = true}},
};

TEST(CudaRouteFused, WritesThePhysicalColumnsBitForBitAsToPhysical) {
  MOEKIT_REQUIRE_GPU();
  for (const FusedRouteCase& c : kRouteCases) {
    const int n = c.n_experts, k = c.spec.top_k;
    for (const ExpertParallel ep : {ExpertParallel::Single(), ExpertParallel::Rank(4, 1, 4)}) {
      const ExpertLocation location = ExpertLocation::build(n, ep);
      std::vector<int32_t> table;
      for (const std::vector<int>& rank : location.rank_table)
        table.insert(table.end(), rank.begin(), rank.end());
      const Tensor d_table = upload(table, DType::i32, {static_cast<int64_t>(table.size())});
      for (const int shared_slots : {0, 2}) {
        for (const int64_t T : {1, 3, 257}) {
          SCOPED_TRACE(std::string(c.name) + " ep " + std::to_string(location.ep_size) +
                       " shared slots " + std::to_string(shared_slots) + " T " + std::to_string(T));
          const int columns = k + shared_slots;
          const Tensor d_logits =
              upload(normal(T * n, 31 + static_cast<uint32_t>(T)), DType::f32, {T, n});
          const Tensor d_bias = upload(normal(n, 5, 0.05f), DType::f32, {n});
          // [0]: route then to_physical; [1]: route with the physical columns.
          Tensor ids[2], weights[2], physical_ids[2], physical_weights[2];
          for (int i = 0; i < 2; ++i) {
            ids[i] = poisoned(DType::i32, {T, k});
            weights[i] = poisoned(DType::f32, {T, k});
            physical_ids[i] = poisoned(DType::i32, {T, columns});
            physical_weights[i] = poisoned(DType::f32, {T, columns});
            const routing::cuda::ToPhysicalArgs physical{
                .logical_ids = ids[i].data<int32_t>(),
                .logical_weights = weights[i].data<float>(),
                .tokens = T,
                .top_k = k,
                .rank_table = d_table.data<int32_t>(),
                .n_logical = n,
                .ep_size = location.ep_size,
                .shared_slots = shared_slots,
                .first_shared_id = location.physical,
                .shared_slot_weight = 0.75f,
                .ids = physical_ids[i].data<int32_t>(),
                .weights = physical_weights[i].data<float>()};
            routing::cuda::route(
                {.logits = d_logits.view().data,
                 .logits_dtype = DType::f32,
                 .tokens = T,
                 .n_experts = n,
                 .spec = c.spec,
                 .correction_bias = c.spec.correction_bias ? d_bias.data<float>() : nullptr,
                 .ids = ids[i].data<int32_t>(),
                 .weights = weights[i].data<float>(),
                 .physical = i == 1 ? &physical : nullptr},
                nullptr);
            if (i == 0) routing::cuda::to_physical(physical, nullptr);
          }
          EXPECT_EQ(bytes_of(ids[1]), bytes_of(ids[0]));
          EXPECT_EQ(bytes_of(weights[1]), bytes_of(weights[0]));
          EXPECT_EQ(bytes_of(physical_ids[1]), bytes_of(physical_ids[0]));
          EXPECT_EQ(bytes_of(physical_weights[1]), bytes_of(physical_weights[0]));
          // And the map is the table's: every routed column is the source rank's replica.
          const std::vector<int32_t> logical = download<int32_t>(ids[1]);
          const std::vector<int32_t> got = download<int32_t>(physical_ids[1]);
          for (int64_t t = 0; t < T; ++t) {
            const std::vector<int>& rank = location.rank_table[t * location.ep_size / T];
            for (int j = 0; j < columns; ++j) {
              const int32_t want = j < k ? rank[logical[t * k + j]] : location.physical + j - k;
              ASSERT_EQ(got[t * columns + j], want) << "token " << t << " column " << j;
            }
          }
        }
      }
    }
  }
}

TEST(CudaRouteFused, RefusesPhysicalColumnsOfOtherIdsOrWithASharedGate) {
  MOEKIT_REQUIRE_GPU();
  const int n = 8, k = 2;
  const Tensor logits = upload(normal(n, 3), DType::f32, {1, n});
  Tensor ids = poisoned(DType::i32, {1, k}), weights = poisoned(DType::f32, {1, k});
  Tensor other = poisoned(DType::i32, {1, k});
  Tensor out_ids = poisoned(DType::i32, {1, k}), out_weights = poisoned(DType::f32, {1, k});
  const Tensor table = upload(std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}, DType::i32, {n});
  const Tensor gate = upload(std::vector<float>{0.5f}, DType::f32, {1});
  routing::cuda::ToPhysicalArgs physical{.logical_ids = other.data<int32_t>(),
                                         .logical_weights = weights.data<float>(),
                                         .tokens = 1,
                                         .top_k = k,
                                         .rank_table = table.data<int32_t>(),
                                         .n_logical = n,
                                         .ids = out_ids.data<int32_t>(),
                                         .weights = out_weights.data<float>()};
  const routing::cuda::RouteArgs args{
      .logits = logits.view().data,
      .tokens = 1,
      .n_experts = n,
      .spec = {.scoring = Scoring::softmax, .top_k = k, .renormalize = true},
      .ids = ids.data<int32_t>(),
      .weights = weights.data<float>(),
      .physical = &physical};
  EXPECT_THROW(routing::cuda::route(args, nullptr), Error);  // other ids
  physical.logical_ids = ids.data<int32_t>();
  physical.shared_gate = gate.data<float>();
  EXPECT_THROW(routing::cuda::route(args, nullptr), Error);  // a shared gate
}

// The router kernel's checks leave the statuses check_finite leaves: the first non-finite
// element of each tensor (lowest row, then column), or none.
TEST(CudaRouteFused, ChecksHiddenAndLogitsAsTheCheckKernelDoes) {
  MOEKIT_REQUIRE_GPU();
  const int n = 128, k = 8;
  const int64_t H = 136;
  const RoutingSpec spec{.scoring = Scoring::softmax, .top_k = k, .renormalize = true};
  for (const int64_t T : {1, 3, 257}) {
    for (const DType dtype : {DType::f32, DType::bf16, DType::f16}) {
      for (int bad = 0; bad < 4; ++bad) {  // none, hidden, logits, both
        SCOPED_TRACE("T " + std::to_string(T) + " " + std::string(dtype_name(dtype)) + " case " +
                     std::to_string(bad));
        std::vector<float> hidden = normal(T * H, 51 + static_cast<uint32_t>(T));
        std::vector<float> logits = normal(T * n, 52 + static_cast<uint32_t>(T));
        if (bad == 1 || bad == 3) {
          hidden[(T - 1) * H + 100] = std::nanf("");
          hidden[(T - 1) * H + 7] = INFINITY;
          if (T > 2) hidden[2 * H + 135] = -INFINITY;
        }
        if (bad == 2 || bad == 3) {
          logits[(T / 2) * n + 77] = std::nanf("");
          logits[(T - 1) * n + 3] = -INFINITY;
        }
        const cuda_testing::Activations h = cuda_testing::as_dtype(hidden, dtype);
        const cuda_testing::Activations l = cuda_testing::as_dtype(logits, dtype);
        const Tensor d_hidden = upload(h.bytes, dtype, {T, H});
        const Tensor d_logits = upload(l.bytes, dtype, {T, n});
        // [0]: check_finite's kernel; [1]: the router's blocks. Two statuses each.
        Tensor status[2];
        std::vector<uint8_t> statuses[2];
        for (int i = 0; i < 2; ++i) {
          status[i] = Tensor::empty(DType::i8,
                                    {static_cast<int64_t>(2 * sizeof(block::cuda::FiniteStatus))},
                                    Device::cuda(0));
          auto* s = static_cast<block::cuda::FiniteStatus*>(status[i].view().data);
          block::cuda::reset_finite_status(s, 2, nullptr);
          const block::cuda::FiniteCheckArgs first{
              .data = d_hidden.view().data, .dtype = dtype, .rows = T, .columns = H, .status = s};
          const block::cuda::FiniteCheckArgs second{.data = d_logits.view().data,
                                                    .dtype = dtype,
                                                    .rows = T,
                                                    .columns = n,
                                                    .status = s + 1};
          Tensor ids = poisoned(DType::i32, {T, k}), weights = poisoned(DType::f32, {T, k});
          const auto checks = block::cuda::finite_check_tensors(first, second);
          if (i == 0) block::cuda::check_finite(first, second, nullptr);
          routing::cuda::route({.logits = d_logits.view().data,
                                .logits_dtype = dtype,
                                .tokens = T,
                                .n_experts = n,
                                .spec = spec,
                                .ids = ids.data<int32_t>(),
                                .weights = weights.data<float>(),
                                .check_first = i == 1 ? checks[0] : cuda_finite::FiniteTensor{},
                                .check_second = i == 1 ? checks[1] : cuda_finite::FiniteTensor{}},
                               nullptr);
          statuses[i] = bytes_of(status[i]);
        }
        EXPECT_EQ(statuses[1], statuses[0]);
        block::cuda::FiniteStatus found[2];
        std::memcpy(found, statuses[1].data(), sizeof(found));
        const block::cuda::NonFiniteAt at_hidden = block::cuda::decode_finite_status(found[0]);
        const block::cuda::NonFiniteAt at_logits = block::cuda::decode_finite_status(found[1]);
        EXPECT_EQ(at_hidden.found, bad == 1 || bad == 3);
        EXPECT_EQ(at_logits.found, bad == 2 || bad == 3);
        if (at_hidden.found) {
          // Row 2 column 135 comes first where row 2 is not the last row (column 7).
          EXPECT_EQ(at_hidden.row, T > 3 ? 2 : T - 1);
          EXPECT_EQ(at_hidden.column, T > 3 ? 135 : 7);
        }
        if (at_logits.found) {
          EXPECT_EQ(at_logits.row, T / 2);
          EXPECT_EQ(at_logits.column, T / 2 == T - 1 ? 3 : 77);
        }
      }
    }
  }
}

// ---- the runner's sort and gather in one launch ----

struct TinyCase {
  const char* name;
  int64_t tokens;
  int columns;
  int n_slots;
  int64_t hidden;
  bool global_ids;  // ids through a table (Plan::fusions.map_in_sort)
};

// Up to 32 entries take the one-launch path; 40 the two launches.
const TinyCase kTinyCases[] = {
    {"qwen3_decode", 1, 8, 128, 2048, true}, {"dsv3_slots", 1, 9, 13, 136, false},
    {"three_tokens", 3, 8, 16, 40, true},    {"four_tokens", 4, 8, 128, 256, false},
    {"odd_hidden", 2, 3, 5, 7, false},       {"one_entry", 1, 1, 1, 64, false},
    {"forty_entries", 5, 8, 16, 136, true},
};

struct TinyOutputs {
  Tensor counts, offsets, row_source, entry_row, rows, scales;
};

TEST(CudaSortAndGather, WritesWhatSortThenGatherWriteBitForBit) {
  MOEKIT_REQUIRE_GPU();
  namespace rc = runner::cuda;
  struct RowsFormat {
    DType dtype;
    int group;  // 0: the row
    bool static_scale;
  };
  const RowsFormat formats[] = {{DType::bf16, 128, false},
                                {DType::f16, 128, false},
                                {DType::f8e4m3, 128, false},
                                {DType::f8e4m3, 0, false},
                                {DType::f8e4m3, 0, true}};
  for (const TinyCase& c : kTinyCases) {
    for (const DType in_dtype : {DType::f32, DType::bf16}) {
      for (const RowsFormat& f : formats) {
        SCOPED_TRACE(std::string(c.name) + " " + std::string(dtype_name(in_dtype)) + " -> " +
                     std::string(dtype_name(f.dtype)) + " group " + std::to_string(f.group) +
                     (f.static_scale ? " static" : ""));
        const int64_t T = c.tokens, H = c.hidden, entries = T * c.columns;
        const int group = f.group == 0 ? static_cast<int>(H) : f.group;
        // Slots with some entries elsewhere (-1) and some ids out of range, repeated slots.
        std::vector<int32_t> ids(static_cast<size_t>(entries));
        for (int64_t e = 0; e < entries; ++e) {
          ids[e] = static_cast<int32_t>((e * 7 + 3) % (c.n_slots + 2)) - 1;
        }
        if (entries > 2) ids[1] = ids[0];
        std::vector<int32_t> table;
        const int n_global = c.n_slots + 4;
        if (c.global_ids) {  // global id g is slot g - 2; the first two and the last two: not here
          for (int g = 0; g < n_global; ++g)
            table.push_back(g >= 2 && g < c.n_slots + 2 ? g - 2 : -1);
          for (int32_t& id : ids) id += 2;
        }
        const Tensor d_ids = upload(ids, DType::i32, {entries});
        const Tensor d_table = upload(table.empty() ? std::vector<int32_t>{0} : table, DType::i32,
                                      {std::max<int64_t>(static_cast<int64_t>(table.size()), 1)});
        const cuda_testing::Activations x = cuda_testing::as_dtype(
            normal(T * H, 61 + static_cast<uint32_t>(entries), 3.0f), in_dtype);
        const Tensor d_hidden = upload(x.bytes, in_dtype, {T, H});
        const Tensor d_static = upload(std::vector<float>{0.02f}, DType::f32, {1});
        const int64_t max_rows = rc::sort_max_rows(entries, c.n_slots, 1, 0);
        const int64_t groups = (H + group - 1) / group;
        const Tensor scratch =
            poisoned(DType::i8, {std::max<int64_t>(rc::sort_scratch_bytes(entries, c.n_slots), 1)});
        TinyOutputs out[2];
        for (int i = 0; i < 2; ++i) {  // 0: two launches, 1: sort_and_gather
          TinyOutputs& o = out[i];
          o.counts = poisoned(DType::i32, {c.n_slots});
          o.offsets = poisoned(DType::i32, {c.n_slots + 1});
          o.row_source = poisoned(DType::i32, {max_rows});
          o.entry_row = poisoned(DType::i32, {entries});
          o.rows = poisoned(f.dtype, {max_rows, H});
          o.scales = poisoned(DType::f32, {max_rows, groups});
          const rc::SortArgs sort{
              .ids = d_ids.data<int32_t>(),
              .global_to_local = c.global_ids ? d_table.data<int32_t>() : nullptr,
              .n_global = c.global_ids ? n_global : 0,
              .tokens = T,
              .columns = c.columns,
              .n_slots = c.n_slots,
              .counts = o.counts.data<int32_t>(),
              .offsets = o.offsets.data<int32_t>(),
              .row_source = o.row_source.data<int32_t>(),
              .entry_row = o.entry_row.data<int32_t>(),
              .scratch = scratch.view().data};
          const rc::GatherArgs gather{
              .hidden = d_hidden.view().data,
              .hidden_dtype = in_dtype,
              .tokens = T,
              .hidden_size = H,
              .columns = c.columns,
              .row_source = o.row_source.data<int32_t>(),
              .offsets = o.offsets.data<int32_t>(),
              .counts = o.counts.data<int32_t>(),
              .n_slots = c.n_slots,
              .max_rows = max_rows,
              .rows = o.rows.view().data,
              .rows_dtype = f.dtype,
              .scales =
                  f.dtype == DType::f8e4m3 && !f.static_scale ? o.scales.data<float>() : nullptr,
              .quant_group = group,
              .static_scale = f.static_scale ? d_static.data<float>() : nullptr};
          if (i == 0) {
            rc::sort_by_slot(sort, nullptr);
            rc::gather_rows(gather, nullptr);
          } else {
            rc::sort_and_gather(sort, gather, nullptr);
          }
        }
        EXPECT_EQ(bytes_of(out[1].counts), bytes_of(out[0].counts));
        EXPECT_EQ(bytes_of(out[1].offsets), bytes_of(out[0].offsets));
        EXPECT_EQ(bytes_of(out[1].row_source), bytes_of(out[0].row_source));
        EXPECT_EQ(bytes_of(out[1].entry_row), bytes_of(out[0].entry_row));
        EXPECT_EQ(bytes_of(out[1].rows), bytes_of(out[0].rows));
        EXPECT_EQ(bytes_of(out[1].scales), bytes_of(out[0].scales));
        // Every entry here has a row (the poison is gone where the layout is used).
        const std::vector<int32_t> entry_row = download<int32_t>(out[1].entry_row);
        const std::vector<int32_t> offsets = download<int32_t>(out[1].offsets);
        int64_t here = 0;
        for (int64_t e = 0; e < entries; ++e) {
          const int32_t local = c.global_ids ? table[ids[e]] : ids[e];
          const bool is_here = local >= 0 && local < c.n_slots;
          here += is_here;
          EXPECT_EQ(entry_row[e] >= 0, is_here) << "entry " << e;
        }
        EXPECT_EQ(offsets[c.n_slots], here);
      }
    }
  }
}

TEST(CudaSortAndGather, RefusesAGatherThatDoesNotReadTheSortsOutputs) {
  MOEKIT_REQUIRE_GPU();
  namespace rc = runner::cuda;
  Tensor a = poisoned(DType::i32, {8}), b = poisoned(DType::i32, {8});
  const rc::SortArgs sort{.tokens = 1, .columns = 2, .n_slots = 3, .row_source = a.data<int32_t>()};
  const rc::GatherArgs gather{
      .tokens = 1, .columns = 2, .row_source = b.data<int32_t>(), .n_slots = 3};
  EXPECT_THROW(rc::sort_and_gather(sort, gather, nullptr), Error);
}

// ---- whole forwards: fused = apart, bit for bit ----

struct FusedLayerCase {
  std::string name;
  ModelSpec spec;
  QuantParams weights;
  BlockForm form;
  DType hidden;
  int64_t tokens;
  int ep_size;
  int ep_rank;
  GpuFusions expected;
};

std::vector<FusedLayerCase> fused_cases() {
  // The 16-bit layers' decode batches run the wgmma decode tiles, whose GEMM1 reads the hidden
  // states itself (gather_in_gemm1); the fp8 ones keep the sort + gather. A batch of one token
  // is routed by the one-token kernel (route_in_runner) wherever that kernel takes the layer's
  // batch of one token: 16-bit weights only.
  const GpuFusions all{true, true, true, true, true, true};
  const GpuFusions all_fp8{true, true, true, true, false, true};
  const GpuFusions qwen_fp8{true, true, true, true, false, false};
  const GpuFusions no_output{true, true, true, false, true, true};
  const GpuFusions no_output_fp8{true, true, true, false, false, false};
  const GpuFusions no_route{true, false, true, true, true, false};
  ModelSpec qwen = small_softmax(16, 4, true);
  std::vector<FusedLayerCase> out;
  for (int64_t T : {1, 3, 8, 257}) {
    out.push_back({"qwen_bf16_T" + std::to_string(T), qwen, WeightFormat::bf16, BlockForm::standard,
                   DType::bf16, T, 1, 0, all});
    out.push_back({"qwen_fp8_block_T" + std::to_string(T), qwen, QuantParams::Fp8Block(128),
                   BlockForm::standard, DType::bf16, T, 1, 0, qwen_fp8});
  }
  out.push_back(
      {"qwen_f32_hidden", qwen, WeightFormat::bf16, BlockForm::standard, DType::f32, 5, 1, 0, all});
  out.push_back(
      {"qwen_f16", qwen, WeightFormat::f16, BlockForm::standard, DType::f16, 5, 1, 0, all});
  out.push_back({"dsv3_standard_fp8_tensor", small_dsv3(),
                 QuantParams::Fp8Tensor(Fp8Scaling::per_channel), BlockForm::standard, DType::bf16,
                 5, 1, 0, no_output_fp8});
  out.push_back({"dsv3_overlapped", small_dsv3(), WeightFormat::bf16, BlockForm::overlapped,
                 DType::bf16, 3, 1, 0, no_output});
  // (small_dsv3's shared expert cannot be split into fp8 slots: resolve falls back.)
  out.push_back({"dsv3_fused_slot", small_dsv3(), WeightFormat::bf16, BlockForm::fused_slot,
                 DType::bf16, 64, 1, 0, all});
  out.push_back({"dsv3_fused_slot_f16", small_dsv3(), WeightFormat::f16, BlockForm::fused_slot,
                 DType::f16, 64, 1, 0, all});
  out.push_back({"qwen2_gate_fused_slot", small_qwen2_moe(), WeightFormat::bf16,
                 BlockForm::fused_slot, DType::bf16, 3, 1, 0, no_route});
  out.push_back({"qwen2_gate_standard", small_qwen2_moe(), WeightFormat::bf16, BlockForm::standard,
                 DType::bf16, 3, 1, 0, no_output});
  // Rank 0 adds the shared experts, rank 1 does not: only rank 1's combine writes the output.
  out.push_back({"dsv3_ep2_rank0", small_dsv3(), WeightFormat::bf16, BlockForm::standard,
                 DType::bf16, 9, 2, 0, no_output});
  out.push_back({"dsv3_ep2_rank1", small_dsv3(), WeightFormat::bf16, BlockForm::standard,
                 DType::bf16, 9, 2, 1, all});
  // A decode step on rank 1: GEMM1 places the entries through the table, half of them elsewhere.
  out.push_back({"dsv3_ep2_rank1_T2", small_dsv3(), WeightFormat::bf16, BlockForm::standard,
                 DType::bf16, 2, 2, 1, all});
  // One token on each of 8 ranks of 2 experts: the one-token kernel maps the global ids through
  // the table itself, most of them elsewhere. The routed batches of 2 tokens have too many rows a
  // slot for the GEMMs to place them, so only rank 0's shared expert does.
  for (int rank = 0; rank < 8; ++rank) {
    out.push_back({"dsv3_ep8_rank" + std::to_string(rank) + "_T1", small_dsv3(), WeightFormat::bf16,
                   BlockForm::standard, DType::bf16, 1, 8, rank, rank == 0 ? no_output : all_fp8});
  }
  return out;
}

Options fused_case_options(const FusedLayerCase& c, FusedOps fused_ops) {
  Options options = gpu_options();
  options.weights = c.weights;
  options.form = c.form;
  options.max_tokens = std::max<int64_t>(c.tokens, 8);
  options.ep =
      c.ep_size == 1 ? ExpertParallel::Single() : ExpertParallel::Rank(c.ep_size, c.ep_rank, 0);
  options.fused_ops = fused_ops;
  return options;
}

// Every case below is planned with the fusions it expects (no GPU needed: a form the case asks
// for that fell back would fuse otherwise).
TEST(CudaResolveFusions, TheFusedLayerCasesArePlannedAsTheyExpect) {
  for (const FusedLayerCase& c : fused_cases()) {
    SCOPED_TRACE(c.name);
    const Plan plan = resolve(c.spec, fused_case_options(c, FusedOps::auto_), with_gpu());
    EXPECT_EQ(plan.form, c.form);
    EXPECT_TRUE(plan.fallbacks().empty());
    EXPECT_EQ(plan.fusions.checks_in_router, c.expected.checks_in_router);
    EXPECT_EQ(plan.fusions.route_to_physical, c.expected.route_to_physical);
    EXPECT_EQ(plan.fusions.map_in_sort, c.expected.map_in_sort);
    EXPECT_EQ(plan.fusions.combine_to_output, c.expected.combine_to_output);
    EXPECT_EQ(plan.fusions.gather_in_gemm1, c.expected.gather_in_gemm1);
    EXPECT_EQ(plan.fusions.route_in_runner, c.expected.route_in_runner);
  }
}

class CudaFusedLayer : public ::testing::TestWithParam<FusedLayerCase> {};

TEST_P(CudaFusedLayer, GivesTheSameBitsAsEveryStageApart) {
  MOEKIT_REQUIRE_GPU();
  const FusedLayerCase& c = GetParam();
  const int64_t T = c.tokens, H = c.spec.hidden;
  const int k = c.spec.routing.top_k;
  const RandomWeights random = RandomWeights::make(c.spec, DType::bf16, 41);
  const Inputs in = random_inputs(c.spec, T, c.hidden, 42);
  std::vector<uint8_t> output[2], ids[2], weights[2];
  for (int i = 0; i < 2; ++i) {  // 0: fused ops off, 1: the plan's fusions
    const Options options = fused_case_options(c, i == 0 ? FusedOps::off : FusedOps::auto_);
    const Plan plan = resolve(c.spec, options, Platform::probe());
    const GpuFusions want = i == 0 ? GpuFusions{} : c.expected;
    ASSERT_EQ(plan.fusions.checks_in_router, want.checks_in_router) << i;
    ASSERT_EQ(plan.fusions.route_to_physical, want.route_to_physical) << i;
    ASSERT_EQ(plan.fusions.map_in_sort, want.map_in_sort) << i;
    ASSERT_EQ(plan.fusions.combine_to_output, want.combine_to_output) << i;
    ASSERT_EQ(plan.fusions.gather_in_gemm1, want.gather_in_gemm1) << i;
    ASSERT_EQ(plan.fusions.route_in_runner, want.route_in_runner) << i;
    MoeLayer layer(plan, random.view());
    const auto up = [](const Tensor& host) {
      Tensor t = Tensor::empty(host.view().dtype, host.view().shape, Device::cuda(0));
      copy(t, host);
      return t;
    };
    const Tensor hidden = up(in.hidden), logits = up(in.logits);
    Tensor out = poisoned(c.hidden, {T, H});
    Tensor routed_ids = poisoned(DType::i32, {T, k});
    Tensor routed_weights = poisoned(DType::f32, {T, k});
    const RoutingResult routing{routed_ids, routed_weights};
    layer.forward(hidden, logits, out, &routing);
    output[i] = bytes_of(out);
    ids[i] = bytes_of(routed_ids);
    weights[i] = bytes_of(routed_weights);
  }
  EXPECT_EQ(ids[1], ids[0]);
  EXPECT_EQ(weights[1], weights[0]);
  ASSERT_EQ(output[1].size(), output[0].size());
  size_t differ = 0;
  for (size_t b = 0; b < output[0].size(); ++b) differ += output[1][b] != output[0][b];
  EXPECT_EQ(differ, 0u) << "bytes of the output differ between the fused and the apart forward";
}

std::string fused_name(const ::testing::TestParamInfo<FusedLayerCase>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaFusedLayer, ::testing::ValuesIn(fused_cases()), fused_name);

}  // namespace
}  // namespace moekit::test
