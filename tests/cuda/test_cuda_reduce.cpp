// The reduce form's standard dispatcher on the GPU (a2a none across processes) between ranks of
// a loopback world on one GPU, in both of its ways to exchange: waited for (normal) and
// enqueued (low-latency, the one a CUDA graph captures, which checks the ranks' agreement on the
// device and reports it at synchronize()). Each rank's partial output stands in for its experts';
// every rank must end with their sum in rank order, bit for bit. The layer across real GPUs is
// CudaRanks (test_cuda_ranks.cpp).

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

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
using cuda_testing::Stream;
using cuda_testing::upload;

constexpr int64_t kHidden = 40, kMaxTokens = 8;
constexpr int kColumns = 2, kPerRank = 3;

DispatcherProblem reduce_problem(int size, int rank, A2AMode mode, Communicator& comm) {
  std::vector<int32_t> table(static_cast<size_t>(size * kPerRank), -1);
  for (int s = 0; s < kPerRank; ++s) table[static_cast<size_t>(rank * kPerRank + s)] = s;
  return {.hidden = kHidden,
          .columns = kColumns,
          .max_tokens = kMaxTokens,
          .max_received_tokens = kMaxTokens,
          .global_to_local = std::move(table),
          .device = Device::cuda(0),
          .comm = &comm,
          .timeout_ms = 20000,
          .mode = mode,
          .physical = size * kPerRank,
          .per_rank = kPerRank};
}

// Rank r's partial output: its experts' weighted sum for the batch, [kMaxTokens, H] (the
// layer's buffer), rows past the batch poisoned.
std::vector<float> partial_of(int rank, int64_t tokens) {
  std::mt19937 rng(300 + static_cast<uint32_t>(rank));
  std::normal_distribution<float> value(0.0f, 1.0f);
  std::vector<float> rows(static_cast<size_t>(kMaxTokens * kHidden));
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i] = static_cast<int64_t>(i) < tokens * kHidden ? value(rng) : NAN;
  }
  return rows;
}

struct RankRun {
  std::vector<int32_t> local_ids;  // what dispatch() handed the runner
  std::vector<float> output;       // the batch's rows after combine()
};

// One rank's dispatch, stand-in experts, combine and synchronize; `abandons`: it fails its input
// before dispatch instead.
RankRun run_rank(const DispatcherProblem& problem, int rank, int64_t tokens,
                 const std::vector<int32_t>& ids, bool abandons) {
  const auto dispatcher = make_cuda_standard_dispatcher(problem);
  const Buffer scratch = Buffer::allocate(Device::cuda(0), dispatcher->scratch_bytes());
  cudaMemset(scratch.data(), kPoison, static_cast<size_t>(scratch.bytes()));
  const Stream stream;
  const ExecContext ctx = stream.context();
  if (abandons) {
    dispatcher->abandon(ctx, scratch.data());
    return {};
  }
  const Tensor hidden = Tensor::empty(DType::bf16, {tokens, kHidden}, Device::cuda(0));
  const Tensor global_ids = upload(ids, DType::i32, {tokens * kColumns});
  const Tensor weights = Tensor::empty(DType::f32, {tokens * kColumns}, Device::cuda(0));
  const Tensor combined = upload(partial_of(rank, tokens), DType::f32, {kMaxTokens, kHidden});
  const DispatchOutput out =
      dispatcher->dispatch(ctx, hidden.view(), global_ids.data<int32_t>(), weights.data<float>(),
                           combined.data<float>(), scratch.data());
  RankRun run;
  synchronize_stream(stream.stream);
  run.local_ids = download<int32_t>(TensorView::contiguous(
      const_cast<int32_t*>(out.slots), DType::i32, {tokens * kColumns}, Device::cuda(0)));
  dispatcher->combine(ctx, out, combined.data<float>(), scratch.data());
  dispatcher->synchronize(ctx, scratch.data());
  synchronize_stream(stream.stream);
  run.output = download<float>(combined.view().narrow(0, 0, tokens));
  return run;
}

std::vector<int32_t> random_ids(int size, int64_t tokens) {
  std::mt19937 rng(17);
  std::uniform_int_distribution<int32_t> id(0, size * kPerRank - 1);
  std::vector<int32_t> ids(static_cast<size_t>(tokens * kColumns));
  for (int32_t& x : ids) x = id(rng);
  return ids;
}

struct ReduceCase {
  std::string name;
  int size;
  A2AMode mode;
};

std::string reduce_case_name(const ::testing::TestParamInfo<ReduceCase>& info) {
  return info.param.name;
}

class CudaReduce : public ::testing::TestWithParam<ReduceCase> {};

TEST_P(CudaReduce, EveryRankEndsWithTheRankOrderSumOfThePartialOutputs) {
  MOEKIT_REQUIRE_GPU();
  const ReduceCase& c = GetParam();
  constexpr int64_t kTokens = 5;
  const std::vector<int32_t> ids = random_ids(c.size, kTokens);
  std::vector<RankRun> runs(static_cast<size_t>(c.size));
  LoopbackWorld world(c.size);
  const auto errors = on_every_rank(c.size, [&](int rank) {
    LoopbackCommunicator comm(world, rank);
    runs[static_cast<size_t>(rank)] =
        run_rank(reduce_problem(c.size, rank, c.mode, comm), rank, kTokens, ids, false);
  });
  // The sum in rank order, in f32 as the segment sums add: the same bits on every rank.
  std::vector<float> expected = partial_of(0, kTokens);
  expected.resize(static_cast<size_t>(kTokens * kHidden));
  for (int r = 1; r < c.size; ++r) {
    const std::vector<float> part = partial_of(r, kTokens);
    for (size_t i = 0; i < expected.size(); ++i) expected[i] += part[i];
  }
  for (int rank = 0; rank < c.size; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const auto r = static_cast<size_t>(rank);
    ASSERT_FALSE(errors[r]) << message_of(errors[r]);
    ASSERT_EQ(runs[r].output.size(), expected.size());
    EXPECT_EQ(std::memcmp(runs[r].output.data(), expected.data(), expected.size() * 4), 0);
    for (size_t e = 0; e < ids.size(); ++e) {
      const bool here = ids[e] / kPerRank == rank;
      EXPECT_EQ(runs[r].local_ids[e], here ? ids[e] % kPerRank : -1) << "entry " << e;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, CudaReduce,
    ::testing::Values(ReduceCase{"two_ranks_normal", 2, A2AMode::normal},
                      ReduceCase{"two_ranks_low_latency", 2, A2AMode::low_latency},
                      ReduceCase{"three_ranks_normal", 3, A2AMode::normal},
                      ReduceCase{"three_ranks_low_latency", 3, A2AMode::low_latency}),
    reduce_case_name);

// Two ranks where one abandons its input or passes other tokens: what each throws (the
// enqueued form at synchronize(), after exchanges whose sizes never depend on a batch).
struct ReduceFault {
  const char* name;
  A2AMode mode;
  bool rank1_abandons;
  int64_t rank1_tokens;
  std::string error0, error1;  // a fragment of each rank's error; empty: it succeeds
};

TEST(CudaReduceFaults, EachRankFailsWithTheReasonNoneHangs) {
  MOEKIT_REQUIRE_GPU();
  const A2AMode normal = A2AMode::normal, low_latency = A2AMode::low_latency;
  const ReduceFault faults[] = {
      {"abandon, normal", normal, true, 5, "rank(s) 1 refused their input", ""},
      {"abandon, low-latency", low_latency, true, 5, "rank(s) 1 refused their input", ""},
      {"other tokens, normal", normal, false, 4, "this rank has 5 and rank 1 has 4",
       "this rank has 4 and rank 0 has 5"},
      {"other tokens, low-latency", low_latency, false, 4, "this rank has 5 and rank 1 has 4",
       "this rank has 4 and rank 0 has 5"},
  };
  for (const ReduceFault& f : faults) {
    SCOPED_TRACE(f.name);
    LoopbackWorld world(2);
    const auto errors = on_every_rank(2, [&](int rank) {
      LoopbackCommunicator comm(world, rank);
      const int64_t tokens = rank == 1 ? f.rank1_tokens : 5;
      run_rank(reduce_problem(2, rank, f.mode, comm), rank, tokens, random_ids(2, tokens),
               rank == 1 && f.rank1_abandons);
    });
    const std::string* expected[2] = {&f.error0, &f.error1};
    for (int rank = 0; rank < 2; ++rank) {
      SCOPED_TRACE("rank " + std::to_string(rank));
      const std::exception_ptr& error = errors[static_cast<size_t>(rank)];
      if (expected[rank]->empty()) {
        EXPECT_FALSE(error) << message_of(error);
        continue;
      }
      ASSERT_TRUE(error);
      EXPECT_NE(message_of(error).find(*expected[rank]), std::string::npos) << message_of(error);
    }
  }
}

}  // namespace
}  // namespace moekit::test
