// The NCCL communicator on one GPU (a world of one rank: every exchange goes to itself through
// ncclSend/ncclRecv), its fixed-order sum kernel against the host's, and resolve's choice of it
// for the reduce form on a Platform that describes GPUs (no GPU needed). The CudaNccl tests skip
// with the reason where no GPU is usable or NCCL cannot be loaded. A step that times out needs a
// second rank: not here.

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/nccl/segment_sum.hpp"
#include "cuda/cuda_support.hpp"
#include "moekit/error.hpp"
#include "support/layer_fixture.hpp"

namespace moekit::test {
namespace {

using cuda_testing::download;
using cuda_testing::kPoison;
using cuda_testing::poisoned;
using cuda_testing::Stream;
using cuda_testing::upload;

#define MOEKIT_REQUIRE_NCCL()                                     \
  do {                                                            \
    MOEKIT_REQUIRE_GPU();                                         \
    if (!communicator_built(CommKind::nccl))                      \
      GTEST_SKIP() << communicator_absent_reason(CommKind::nccl); \
  } while (0)

std::vector<uint8_t> counting_bytes(int64_t n) {
  std::vector<uint8_t> bytes(static_cast<size_t>(n));
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 1);
  return bytes;
}

TEST(CudaNccl, AOneRankWorldIsRankZeroOfOneWithDeviceBuffers) {
  MOEKIT_REQUIRE_NCCL();
  Communicator& comm = world_communicator(CommKind::nccl);
  EXPECT_EQ(comm.size(), 1);
  EXPECT_EQ(comm.rank(), 0);
  EXPECT_EQ(comm.name(), "nccl");
  EXPECT_EQ(comm.buffers(), DeviceKind::cuda);
  EXPECT_TRUE(comm.barrier({"test barrier", 10000}));
}

struct SelfExchange {
  const char* name;
  int64_t send_offset, bytes, recv_offset;
};

TEST(CudaNccl, AnAllToAllToItselfMovesExactlyTheBytesAskedBetweenTheOffsets) {
  MOEKIT_REQUIRE_NCCL();
  Communicator& comm = world_communicator(CommKind::nccl);
  constexpr int64_t kSize = 4096;
  const SelfExchange cases[] = {{"whole", 0, kSize, 0},
                                {"offsets on both sides", 24, 1000, 8},
                                {"one byte", kSize - 1, 1, 17},
                                {"nothing", 5, 0, 3}};
  const std::vector<uint8_t> source = counting_bytes(kSize);
  const Tensor send = upload(source, DType::i8, {kSize});
  const Stream stream;
  for (const SelfExchange& c : cases) {
    SCOPED_TRACE(c.name);
    const Tensor recv = poisoned(DType::i8, {kSize});
    ExchangeArrays a(1);
    a.send_offsets[0] = c.send_offset;
    a.send_bytes[0] = c.bytes;
    a.recv_offsets[0] = c.recv_offset;
    a.recv_capacity[0] = c.bytes;
    a.received[0] = -1;
    comm.all_to_all(stream.context(), a.view(send.data<std::byte>(), recv.data<std::byte>()),
                    {"test exchange", 10000});
    EXPECT_EQ(a.received[0], c.bytes);
    const std::vector<uint8_t> got = download<uint8_t>(recv.view());
    for (int64_t i = 0; i < kSize; ++i) {
      const bool inside = i >= c.recv_offset && i < c.recv_offset + c.bytes;
      const uint8_t expected =
          inside ? source[static_cast<size_t>(c.send_offset + i - c.recv_offset)] : kPoison;
      ASSERT_EQ(got[static_cast<size_t>(i)], expected) << "byte " << i;
    }
  }
}

TEST(CudaNccl, AReceiveOfOtherSizeThanTheSendIsRefusedBeforeNcclSeesIt) {
  MOEKIT_REQUIRE_NCCL();
  Communicator& comm = world_communicator(CommKind::nccl);
  const Tensor buffer = poisoned(DType::i8, {64});
  const Stream stream;
  ExchangeArrays a(1);
  a.send_bytes[0] = 16;
  a.recv_capacity[0] = 32;
  EXPECT_THROW(
      comm.all_to_all(stream.context(), a.view(buffer.data<std::byte>(), buffer.data<std::byte>()),
                      {"mismatched exchange", 10000}),
      Error);
  EXPECT_TRUE(comm.barrier({"after the refusal", 10000})) << "the refusal broke the communicator";
}

TEST(CudaNccl, OneRanksSumIsItsOwnDataBitForBit) {
  MOEKIT_REQUIRE_NCCL();
  Communicator& comm = world_communicator(CommKind::nccl);
  constexpr int64_t kCount = 1037;
  const std::vector<float> values = cuda_testing::normal(kCount, 11);
  const Tensor data = upload(values, DType::f32, {kCount});
  const Tensor scratch = poisoned(DType::f32, {comm.all_reduce_scratch(kCount)});
  const Stream stream;
  comm.all_reduce_sum(stream.context(), data.data<float>(), kCount, scratch.data<float>(),
                      {"test sum", 10000});
  cudaStreamSynchronize(stream.stream);
  const std::vector<float> got = download<float>(data.view());
  EXPECT_EQ(std::memcmp(got.data(), values.data(), values.size() * sizeof(float)), 0);
}

TEST(CudaNccl, AnExchangeOnACapturingStreamIsRefusedAndTheCommunicatorStillWorks) {
  MOEKIT_REQUIRE_NCCL();
  Communicator& comm = world_communicator(CommKind::nccl);
  const Tensor buffer = poisoned(DType::i8, {64});
  const Stream stream;
  ExchangeArrays a(1);
  a.send_bytes[0] = 16;
  a.recv_offsets[0] = 32;
  a.recv_capacity[0] = 16;
  ASSERT_EQ(cudaStreamBeginCapture(stream.stream, cudaStreamCaptureModeRelaxed), cudaSuccess);
  try {
    comm.all_to_all(stream.context(), a.view(buffer.data<std::byte>(), buffer.data<std::byte>()),
                    {"captured", 10000});
    ADD_FAILURE() << "an exchange was captured";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("CUDA graph"), std::string::npos) << e.what();
  }
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream.stream, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  comm.all_to_all(stream.context(), a.view(buffer.data<std::byte>(), buffer.data<std::byte>()),
                  {"after", 10000});
  EXPECT_EQ(a.received[0], 16);
}

// The sum of several ranks' segments runs on the GPU in rank order: the same bits as the host's.
TEST(CudaNccl, TheGpusSegmentSumHasTheHostsBits) {
  MOEKIT_REQUIRE_GPU();
  for (const int parts : {1, 2, 3, 8}) {
    SCOPED_TRACE(parts);
    constexpr int64_t kN = 1000, kStride = 1003;
    const std::vector<float> values = cuda_testing::normal(kStride * parts, 5 + parts, 3.0f);
    std::vector<float> expected(kN);
    host_segment_sum({}, expected.data(), values.data(), kStride, parts, kN);
    const Tensor device_parts = upload(values, DType::f32, {kStride * parts});
    const Tensor out = poisoned(DType::f32, {kN});
    comm::cuda::segment_sum(out.data<float>(), device_parts.data<float>(), kStride, parts, kN,
                            nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> got = download<float>(out.view());
    EXPECT_EQ(std::memcmp(got.data(), expected.data(), expected.size() * sizeof(float)), 0);
  }
}

// resolve on a Platform of two GPUs under a launcher of two ranks (no GPU needed).
Platform two_gpus_launched(int rank) {
  Platform p = Platform::cpu_only(2);
  p.cuda_runtime = true;
  for (int index = 0; index < 2; ++index) {
    p.gpus.push_back({.index = index,
                      .compute_major = 9,
                      .compute_minor = 0,
                      .name = "test GPU",
                      .sm_count = 132,
                      .memory_bytes = 1LL << 36,
                      .l2_bytes = 60 << 20});
  }
  p.world_size = 2;
  p.world_rank = rank;
  p.world_local_rank = rank;
  return p;
}

Options reduce_form_on(int device, int rank) {
  Options options;
  options.runner = RunnerKind::cuda;
  options.device = Device::cuda(device);
  options.weights = WeightFormat::bf16;
  options.ep = ExpertParallel::Rank(2, rank);
  return options;
}

void expect_mentions(const std::string& text, const std::vector<const char*>& fragments) {
  for (const char* fragment : fragments) {
    EXPECT_NE(text.find(fragment), std::string::npos)
        << "'" << text << "' lacks '" << fragment << "'";
  }
}

// Whether NCCL loads is a fact about the machine, which resolve reads: both answers are checked,
// whichever this machine gives (the other is checked by running with MOEKIT_NCCL_LIBRARY naming
// a file that is not NCCL).
TEST(CudaResolve, TheReduceFormAcrossGpuProcessesSumsOverNcclOrIsRefusedSayingWhyNot) {
  const Resolution r = try_resolve(small_dsv3(), reduce_form_on(1, 1), two_gpus_launched(1));
  if (communicator_built(CommKind::nccl)) {
    ASSERT_TRUE(r.plan.has_value()) << r.refusal;
    EXPECT_EQ(r.plan->comm, CommKind::nccl);
    EXPECT_TRUE(r.plan->adds_shared_output) << "the sum is whole on every rank";
    expect_mentions(r.plan->explain(), {"nccl: reduce form", "ncclSend/ncclRecv"});
  } else {
    ASSERT_FALSE(r.plan.has_value());
    expect_mentions(r.refusal,
                    {"device=cuda:1", communicator_absent_reason(CommKind::nccl).c_str()});
  }
}

TEST(CudaResolve, TheReduceFormWaitsForItsExchangesUnlessLowLatencyIsAsked) {
  if (!communicator_built(CommKind::nccl)) {
    GTEST_SKIP() << communicator_absent_reason(CommKind::nccl);
  }
  for (const A2AMode asked : {A2AMode::auto_, A2AMode::normal, A2AMode::low_latency}) {
    SCOPED_TRACE(a2a_mode_name(asked));
    Options options = reduce_form_on(1, 1);
    options.max_tokens = 16;
    options.a2a_mode = asked;
    const Resolution r = try_resolve(small_dsv3(), options, two_gpus_launched(1));
    ASSERT_TRUE(r.plan.has_value()) << r.refusal;
    const bool enqueued = asked == A2AMode::low_latency;
    EXPECT_EQ(r.plan->a2a_mode, enqueued ? A2AMode::low_latency : A2AMode::normal);
    expect_mentions(r.plan->explain(),
                    {"reduce exchanges", enqueued ? "CUDA graph" : "waited for"});
  }
}

TEST(CudaResolve, TheReduceFormRefusesAGpuOtherThanTheLocalRanks) {
  const Resolution r = try_resolve(small_dsv3(), reduce_form_on(0, 1), two_gpus_launched(1));
  ASSERT_FALSE(r.plan.has_value());
  expect_mentions(r.refusal, {"local rank is 1", "--device cuda:1"});
}

Options nccl_all_to_all_on(int device, int rank) {
  Options options = reduce_form_on(device, rank);
  options.a2a = A2AKind::nccl;
  return options;
}

TEST(CudaResolve, TheNcclAllToAllSendsRowsBetweenGpusInNormalModeOrIsRefusedSayingWhyNot) {
  const Resolution r = try_resolve(small_dsv3(), nccl_all_to_all_on(1, 1), two_gpus_launched(1));
  if (!communicator_built(CommKind::nccl)) {
    ASSERT_FALSE(r.plan.has_value());
    expect_mentions(r.refusal, {"a2a=nccl", communicator_absent_reason(CommKind::nccl).c_str()});
    return;
  }
  ASSERT_TRUE(r.plan.has_value()) << r.refusal;
  EXPECT_EQ(r.plan->comm, CommKind::nccl);
  EXPECT_EQ(r.plan->dispatcher, DispatcherKind::all_to_all);
  EXPECT_EQ(r.plan->a2a_mode, A2AMode::normal);
  EXPECT_EQ(r.plan->a2a_wire, A2AWire::activations);
  EXPECT_EQ(r.plan->max_received_tokens, 2 * r.plan->options.max_tokens);
  EXPECT_TRUE(r.plan->adds_shared_output) << "each rank holds its own tokens";
  expect_mentions(r.plan->explain(), {"a2a nccl", "NCCL_NVLS_ENABLE=0", "rank order"});
}

TEST(CudaResolve, TheNcclAllToAllOfDecodeBatchesIsTheLowLatencyModeWithoutAHostSync) {
  if (!communicator_built(CommKind::nccl))
    GTEST_SKIP() << communicator_absent_reason(CommKind::nccl);
  Options options = nccl_all_to_all_on(1, 1);
  options.max_tokens = 128;
  const Resolution r = try_resolve(small_dsv3(), options, two_gpus_launched(1));
  ASSERT_TRUE(r.plan.has_value()) << r.refusal;
  EXPECT_EQ(r.plan->a2a_mode, A2AMode::low_latency);
  expect_mentions(r.plan->explain(), {"no host synchronisation", "CUDA graph", "masked"});
  options.a2a_mode = A2AMode::normal;
  EXPECT_EQ(try_resolve(small_dsv3(), options, two_gpus_launched(1)).plan->a2a_mode,
            A2AMode::normal)
      << "asked";
}

struct RefusedAllToAll {
  const char* name;
  void (*change)(Options&);
  std::vector<const char*> fragments;
};

TEST(CudaResolve, TheNcclAllToAllRefusesWhatItHasNotBuiltOrCannotSpan) {
  const RefusedAllToAll cases[] = {
      {"the e4m3 wire",
       [](Options& o) { o.a2a_wire = A2AWire::e4m3; },
       {"e4m3", "not built", "--a2a-wire auto or activations"}},
      {"an ep rank other than the launcher's",
       [](Options& o) { o.ep.rank = 0; },
       {"a2a=nccl with ep size 2 rank 0", "--ep-rank 1"}},
      {"tensor parallelism",
       [](Options& o) { o.tp = {.size = 2, .rank = 0}; },
       {"a2a=nccl with tp size 2", "not built"}},
      {"a GPU other than the local rank's",
       [](Options& o) { o.device = Device::cuda(0); },
       {"local rank is 1", "--device cuda:1"}},
      {"the CPU",
       [](Options& o) {
         o.device = Device::cpu();
         o.runner = RunnerKind::cpu;
       },
       {"a2a=nccl on device=cpu", "a2a mpi on device=cpu"}},
  };
  for (const RefusedAllToAll& c : cases) {
    SCOPED_TRACE(c.name);
    Options options = nccl_all_to_all_on(1, 1);
    c.change(options);
    const Resolution r = try_resolve(small_dsv3(), options, two_gpus_launched(1));
    ASSERT_FALSE(r.plan.has_value());
    // Where NCCL does not load, the refusal may name that first: either is a plain refusal.
    if (!communicator_built(CommKind::nccl) &&
        r.refusal.find(communicator_absent_reason(CommKind::nccl)) != std::string::npos) {
      continue;
    }
    expect_mentions(r.refusal, c.fragments);
  }
}

}  // namespace
}  // namespace moekit::test
