// The all-to-all over NCCL's dispatcher (a2a nccl) between several ranks on one GPU: each rank a
// thread with a stream of its own, joined by a loopback communicator that moves device bytes
// between their buffers with NCCL's rule (a receive takes the exact size sent, or the step fails
// at its deadline). A stand-in runner on the host weights each received row by its slots, so the
// combined output checks every row's destination, its pairs and the way back against a float64
// sum computed from the routed ids alone. The whole layer over a real NCCL communicator of one
// rank is in test_cuda_layer.cpp (the *_a2a_nccl_* cases).

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <random>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "cuda/cuda_support.hpp"
#include "cuda/loopback_world.hpp"
#include "dispatch/dispatcher.hpp"
#include "moekit/error.hpp"

namespace moekit::test {
namespace {

using cuda_testing::download;
using cuda_testing::kPoison;
using cuda_testing::LoopbackCommunicator;
using cuda_testing::LoopbackWorld;
using cuda_testing::message_of;
using cuda_testing::on_every_rank;
using cuda_testing::relative_l2;
using cuda_testing::Stream;
using cuda_testing::upload;

struct A2ACase {
  std::string name;
  std::vector<int64_t> tokens;  // per rank
  int per_rank = 3;             // experts per rank
  int top_k = 2;
  int shared_slots = 0;  // fused shared slots: their columns stay on the token's rank
  int64_t hidden = 64;
  DType dtype = DType::bf16;
  bool hot_expert = false;  // every token's first column is expert 0
  A2AMode mode = A2AMode::normal;
};

// A rank's experts and fused shared slots as the layer lays them out: physical ids
// [rank * per_rank, (rank + 1) * per_rank) at slots 0.., then the shared slots.
struct Layout {
  int size, per_rank, shared_slots;

  int physical() const { return size * per_rank; }
  std::vector<int32_t> global_to_local(int rank) const {
    std::vector<int32_t> table(static_cast<size_t>(physical() + shared_slots), -1);
    for (int s = 0; s < per_rank; ++s) table[static_cast<size_t>(rank * per_rank + s)] = s;
    for (int s = 0; s < shared_slots; ++s)
      table[static_cast<size_t>(physical() + s)] = per_rank + s;
    return table;
  }
  // The slot an id has on the rank that holds it.
  int slot_of(int32_t id) const {
    return id < physical() ? id % per_rank : per_rank + id - physical();
  }
};

// One rank's batch: top_k distinct routed experts per token, then the shared slots.
struct Batch {
  std::vector<int32_t> ids;
  std::vector<float> weights;
  cuda_testing::Activations hidden;
};

Batch random_batch(const A2ACase& c, const Layout& layout, int rank) {
  const int64_t T = c.tokens[static_cast<size_t>(rank)];
  const int columns = c.top_k + c.shared_slots;
  std::mt19937 rng(100 + static_cast<uint32_t>(rank));
  Batch b;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> experts(static_cast<size_t>(layout.physical()));
    for (size_t e = 0; e < experts.size(); ++e) experts[e] = static_cast<int32_t>(e);
    std::shuffle(experts.begin(), experts.end(), rng);
    if (c.hot_expert) std::iter_swap(experts.begin(), std::find(experts.begin(), experts.end(), 0));
    b.ids.insert(b.ids.end(), experts.begin(), experts.begin() + c.top_k);
    for (int s = 0; s < c.shared_slots; ++s) b.ids.push_back(layout.physical() + s);
  }
  std::uniform_real_distribution<float> weight(0.1f, 1.0f);
  for (int64_t e = 0; e < T * columns; ++e) b.weights.push_back(weight(rng));
  b.hidden = cuda_testing::as_dtype(cuda_testing::normal(T * c.hidden, 7 + rank), c.dtype);
  return b;
}

// The stand-in runner: row i's sum is its row times sum over its pairs of weight * (slot + 1).
std::vector<float> stand_in_sums(const std::vector<float>& rows, const std::vector<int32_t>& slots,
                                 const std::vector<float>& weights, int64_t n_rows, int columns,
                                 int64_t H) {
  std::vector<float> sums(static_cast<size_t>(n_rows * H));
  for (int64_t i = 0; i < n_rows; ++i) {
    float scale = 0.0f;
    for (int k = 0; k < columns; ++k) {
      const size_t e = static_cast<size_t>(i * columns + k);
      if (slots[e] >= 0) scale += weights[e] * static_cast<float>(slots[e] + 1);
    }
    for (int64_t h = 0; h < H; ++h)
      sums[static_cast<size_t>(i * H + h)] = scale * rows[static_cast<size_t>(i * H + h)];
  }
  return sums;
}

// What combine() must leave for each token, from the routed ids alone, in float64.
std::vector<double> expected_output(const Batch& b, const Layout& layout, int64_t T, int columns,
                                    int64_t H) {
  std::vector<double> out(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t) {
    double scale = 0.0;
    for (int k = 0; k < columns; ++k) {
      const size_t e = static_cast<size_t>(t * columns + k);
      scale += static_cast<double>(b.weights[e]) * (layout.slot_of(b.ids[e]) + 1);
    }
    for (int64_t h = 0; h < H; ++h) {
      out[static_cast<size_t>(t * H + h)] = scale * b.hidden.values[static_cast<size_t>(t * H + h)];
    }
  }
  return out;
}

// How many rows rank `me` receives: one per (token of any rank, this rank) with a column here.
int64_t expected_rows(const std::vector<Batch>& batches, const A2ACase& c, const Layout& layout,
                      int me) {
  const int columns = c.top_k + c.shared_slots;
  int64_t rows = 0;
  for (size_t r = 0; r < batches.size(); ++r) {
    for (int64_t t = 0; t < c.tokens[r]; ++t) {
      bool here = false;
      for (int k = 0; k < columns; ++k) {
        const int32_t id = batches[r].ids[static_cast<size_t>(t * columns + k)];
        here |= id >= layout.physical() ? static_cast<int>(r) == me : id / layout.per_rank == me;
      }
      rows += here ? 1 : 0;
    }
  }
  return rows;
}

int64_t problem_max_tokens(const A2ACase& c) {
  return std::max<int64_t>(*std::max_element(c.tokens.begin(), c.tokens.end()), 1);
}

DispatcherProblem problem_for(const A2ACase& c, const Layout& layout, int rank,
                              Communicator& comm) {
  const int64_t max_tokens = problem_max_tokens(c);
  return {.hidden = c.hidden,
          .columns = c.top_k + c.shared_slots,
          .max_tokens = max_tokens,
          .max_received_tokens = max_tokens * layout.size,
          .global_to_local = layout.global_to_local(rank),
          .device = Device::cuda(0),
          .comm = &comm,
          .timeout_ms = 20000,
          .mode = c.mode,
          .wire = A2AWire::activations,
          .quant = WeightFormat::bf16,
          .physical = layout.physical(),
          .per_rank = layout.per_rank};
}

// What one rank's dispatch, stand-in runner, combine and synchronize give, on a batch of `dtype`
// rows; the scratch is poisoned first, so that a row or pair the dispatcher did not write shows.
struct RankResult {
  int64_t runner_rows = 0;  // the rows the runner is handed
  int64_t received = 0;     // those with a slot here
  std::vector<float> output;
};

RankResult run_rank(const DispatcherProblem& problem, const Batch& b, DType dtype, int64_t T) {
  const int64_t H = problem.hidden;
  const int columns = problem.columns;
  const auto dispatcher = make_nccl_all_to_all_dispatcher(problem);
  const Buffer scratch = Buffer::allocate(Device::cuda(0), dispatcher->scratch_bytes());
  if (cudaMemset(scratch.data(), kPoison, static_cast<size_t>(scratch.bytes())) != cudaSuccess) {
    fail(Errc::internal, "poisoning the scratch failed");
  }
  const Tensor hidden = upload(b.hidden.bytes, dtype, {T, H});
  const Tensor ids = upload(b.ids, DType::i32, {T * columns});
  const Tensor weights = upload(b.weights, DType::f32, {T * columns});
  const Tensor combined = cuda_testing::poisoned(DType::f32, {T, H});
  const Stream stream;
  const ExecContext ctx = stream.context();
  const DispatchOutput out =
      dispatcher->dispatch(ctx, hidden.view(), ids.data<int32_t>(), weights.data<float>(),
                           combined.data<float>(), scratch.data());
  synchronize_stream(stream.stream);
  const auto on_gpu = [](const void* data, DType type, Shape shape) {
    return TensorView::contiguous(const_cast<void*>(data), type, shape, Device::cuda(0));
  };
  std::vector<float> rows(static_cast<size_t>(out.tokens * H));
  const std::vector<uint8_t> row_bytes = download<uint8_t>(out.hidden);
  convert_to_f32(row_bytes.data(), dtype, out.tokens * H, rows.data());
  const std::vector<int32_t> slots =
      download<int32_t>(on_gpu(out.slots, DType::i32, {out.tokens * columns}));
  int64_t rows_with_a_slot = 0;
  for (int64_t i = 0; i < out.tokens; ++i) {
    rows_with_a_slot += std::any_of(slots.begin() + i * columns, slots.begin() + (i + 1) * columns,
                                    [](int32_t s) { return s >= 0; });
  }
  std::vector<float> sums = stand_in_sums(
      rows, slots, download<float>(on_gpu(out.weights, DType::f32, {out.tokens * columns})),
      out.tokens, columns, H);
  copy(on_gpu(out.sum, DType::f32, {out.tokens, H}),
       TensorView::contiguous(sums.data(), DType::f32, {out.tokens, H}));
  dispatcher->combine(ctx, out, combined.data<float>(), scratch.data());
  dispatcher->synchronize(ctx, scratch.data());
  synchronize_stream(stream.stream);
  return {out.tokens, rows_with_a_slot, download<float>(combined.view())};
}

class CudaAllToAll : public ::testing::TestWithParam<A2ACase> {};

TEST_P(CudaAllToAll, EveryTokensOutputIsTheSumOverTheRanksHoldingItsExperts) {
  MOEKIT_REQUIRE_GPU();
  const A2ACase& c = GetParam();
  const int size = static_cast<int>(c.tokens.size());
  const Layout layout{size, c.per_rank, c.shared_slots};
  const int columns = c.top_k + c.shared_slots;
  std::vector<Batch> batches;
  for (int r = 0; r < size; ++r) batches.push_back(random_batch(c, layout, r));
  std::vector<RankResult> results(static_cast<size_t>(size));
  LoopbackWorld world(size);
  const auto errors = on_every_rank(size, [&](int rank) {
    LoopbackCommunicator comm(world, rank);
    const auto r = static_cast<size_t>(rank);
    results[r] = run_rank(problem_for(c, layout, rank, comm), batches[r], c.dtype, c.tokens[r]);
  });
  for (int rank = 0; rank < size; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const auto r = static_cast<size_t>(rank);
    ASSERT_FALSE(errors[r]) << message_of(errors[r]);
    const int64_t rows = expected_rows(batches, c, layout, rank);
    EXPECT_EQ(results[r].received, rows);
    // Low-latency: every source's fixed slot, the rows past its count masked.
    EXPECT_EQ(results[r].runner_rows,
              c.mode == A2AMode::low_latency ? size * problem_max_tokens(c) : rows);
    const std::vector<double> want =
        expected_output(batches[r], layout, c.tokens[r], columns, c.hidden);
    EXPECT_LE(relative_l2(results[r].output, want), 1e-5);
  }
}

std::vector<A2ACase> a2a_cases() {
  std::vector<A2ACase> cases = {
      {.name = "one_rank", .tokens = {5}},
      {.name = "two_ranks", .tokens = {7, 4}},
      {.name = "three_ranks_one_empty", .tokens = {6, 0, 9}, .per_rank = 2},
      {.name = "four_ranks_hot_expert", .tokens = {33, 300, 1, 64}, .top_k = 3, .hot_expert = true},
      {.name = "fused_shared_slots", .tokens = {8, 3}, .shared_slots = 2},
      {.name = "f32_rows", .tokens = {4, 6}, .dtype = DType::f32},
      // A row of 2 * 67 bytes: the rows move in 2-byte units.
      {.name = "odd_row_bytes", .tokens = {5, 2, 3}, .hidden = 67},
  };
  const size_t normal = cases.size();
  for (size_t i = 0; i < normal; ++i) {
    A2ACase low_latency = cases[i];
    low_latency.name += "_low_latency";
    low_latency.mode = A2AMode::low_latency;
    cases.push_back(low_latency);
  }
  return cases;
}

std::string a2a_case_name(const ::testing::TestParamInfo<A2ACase>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaAllToAll, ::testing::ValuesIn(a2a_cases()), a2a_case_name);

// Two ranks where something goes wrong on one of them: what each rank throws, in each mode (the
// low-latency mode finds it on the device and reports it at synchronize()).
struct Fault {
  const char* name;
  A2AMode mode;
  void (*rank0)(Batch&);  // changes rank 0's batch; nullptr: as planned
  bool rank1_abandons;
  // Fragments of each rank's error; empty: that rank succeeds.
  std::vector<std::string> error0, error1;
};

void id_out_of_range(Batch& b) {
  b.ids[1] = 999;
}

std::vector<Fault> faults() {
  const A2AMode normal = A2AMode::normal, low_latency = A2AMode::low_latency;
  return {
      {"a rank that abandons its input fails the other naming it",
       normal,
       nullptr,
       true,
       {"rank 0", "rank(s) 1 refused their input", "dispatch: row counts"},
       {}},
      {"a routed id out of range fails its rank naming the id, and the other naming the rank",
       normal,
       id_out_of_range,
       false,
       {"routed expert id 999 is out of range"},
       {"rank(s) 0 refused"}},
      {"low-latency: a rank that abandons its input fails the other at synchronize naming it",
       low_latency,
       nullptr,
       true,
       {"rank 0", "rank 1 refused its input", "low-latency dispatch and combine"},
       {}},
      {"low-latency: a routed id out of range fails both ranks at synchronize",
       low_latency,
       id_out_of_range,
       false,
       {"routed expert id 999 is out of range"},
       {"rank 0 refused its input"}},
  };
}

TEST(CudaAllToAllFaults, EachRankFailsWithTheReasonNoneHangs) {
  MOEKIT_REQUIRE_GPU();
  for (const Fault& f : faults()) {
    SCOPED_TRACE(f.name);
    const A2ACase c{.name = "fault", .tokens = {4, 4}, .mode = f.mode};
    const Layout layout{2, c.per_rank, 0};
    std::vector<Batch> batches{random_batch(c, layout, 0), random_batch(c, layout, 1)};
    if (f.rank0 != nullptr) f.rank0(batches[0]);
    LoopbackWorld world(2);
    const auto errors = on_every_rank(2, [&](int rank) {
      LoopbackCommunicator comm(world, rank);
      const DispatcherProblem problem = problem_for(c, layout, rank, comm);
      if (rank == 1 && f.rank1_abandons) {
        const auto dispatcher = make_nccl_all_to_all_dispatcher(problem);
        const Buffer scratch = Buffer::allocate(Device::cuda(0), dispatcher->scratch_bytes());
        const Stream stream;
        dispatcher->abandon(stream.context(), scratch.data());
        return;
      }
      run_rank(problem, batches[static_cast<size_t>(rank)], DType::bf16, 4);
    });
    const std::vector<std::string>* expected[2] = {&f.error0, &f.error1};
    for (int rank = 0; rank < 2; ++rank) {
      SCOPED_TRACE("rank " + std::to_string(rank));
      const std::exception_ptr& error = errors[static_cast<size_t>(rank)];
      if (expected[rank]->empty()) {
        EXPECT_FALSE(error) << message_of(error);
        continue;
      }
      ASSERT_TRUE(error);
      const std::string message = message_of(error);
      for (const std::string& fragment : *expected[rank]) {
        EXPECT_NE(message.find(fragment), std::string::npos) << message << " lacks " << fragment;
      }
    }
  }
}

// Ranks whose hidden states differ in dtype: in normal mode both fail in the first exchange,
// each naming the other's dtype.
TEST(CudaAllToAllFaults, RanksWhoseHiddenStatesDifferInDtypeBothFailNamingIt) {
  MOEKIT_REQUIRE_GPU();
  const A2ACase c{.name = "dtype", .tokens = {4, 4}};
  const Layout layout{2, c.per_rank, 0};
  std::vector<Batch> batches{random_batch(c, layout, 0), random_batch(c, layout, 1)};
  const std::vector<float> values(batches[1].hidden.values);
  batches[1].hidden = cuda_testing::as_dtype(values, DType::f32);
  LoopbackWorld world(2);
  const auto errors = on_every_rank(2, [&](int rank) {
    LoopbackCommunicator comm(world, rank);
    run_rank(problem_for(c, layout, rank, comm), batches[static_cast<size_t>(rank)],
             rank == 0 ? DType::bf16 : DType::f32, 4);
  });
  const char* expected[2] = {"bf16 here but f32 on rank 1", "f32 here but bf16 on rank 0"};
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(errors[static_cast<size_t>(rank)]) << "rank " << rank;
    const std::string message = message_of(errors[static_cast<size_t>(rank)]);
    EXPECT_NE(message.find(expected[rank]), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace moekit::test
