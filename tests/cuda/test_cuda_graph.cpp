// The device stages' kernels allocate nothing and never wait, so a stream capture of them
// succeeds (a synchronising call inside would end it with an error), and the replayed graph
// computes what eager launches compute, bit for bit.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <vector>

#include "block/cuda/block_kernels.hpp"
#include "cuda/cuda_support.hpp"
#include "routing/cuda/route.hpp"
#include "runner/cuda/permute.hpp"

namespace moekit {
namespace {

using namespace cuda_testing;
namespace rc = runner::cuda;

// Router, finite checks, logical -> physical, sort, gather (e4m3) and combine of one small
// batch, on `stream`, into tensors made beforehand.
struct Pipeline {
  static constexpr int64_t T = 37, H = 200;
  static constexpr int E = 20, k = 4, columns = k + 1, slots = E + 1;
  RoutingSpec spec{Scoring::sigmoid, k, true, 4, 2, GroupScore::top2_sum, true, 2.0f};
  Tensor logits = upload(normal(T * E, 1), DType::f32, {T, E});
  Tensor hidden = upload(as_dtype(normal(T * H, 2), DType::bf16).bytes, DType::bf16, {T, H});
  Tensor bias = upload(normal(E, 3, 0.1f), DType::f32, {E});
  Tensor table = [] {
    std::vector<int32_t> identity(E);
    for (int e = 0; e < E; ++e) identity[e] = e;
    return upload(identity, DType::i32, {E});
  }();
  int64_t max_rows = rc::sort_max_rows(T * columns, slots, 8, 0);
  Tensor status = poisoned(DType::i8, {static_cast<int64_t>(sizeof(block::cuda::FiniteStatus))});
  Tensor ids = poisoned(DType::i32, {T, k});
  Tensor weights = poisoned(DType::f32, {T, k});
  Tensor slot_ids = poisoned(DType::i32, {T, columns});
  Tensor slot_weights = poisoned(DType::f32, {T, columns});
  Tensor counts = poisoned(DType::i32, {slots});
  Tensor offsets = poisoned(DType::i32, {slots + 1});
  Tensor row_source = poisoned(DType::i32, {max_rows});
  Tensor entry_row = poisoned(DType::i32, {T * columns});
  Tensor scratch =
      poisoned(DType::i8, {std::max<int64_t>(rc::sort_scratch_bytes(T * columns, slots), 1)});
  Tensor rows = poisoned(DType::f8e4m3, {max_rows, H});
  Tensor scales = poisoned(DType::f32, {max_rows, (H + 127) / 128});
  Tensor output = poisoned(DType::bf16, {T, H});

  void enqueue(cudaStream_t stream) {
    auto* s = static_cast<block::cuda::FiniteStatus*>(status.view().data);
    block::cuda::reset_finite_status(s, 1, stream);
    block::cuda::check_finite(
        {.data = hidden.view().data, .dtype = DType::bf16, .rows = T, .columns = H, .status = s},
        stream);
    block::cuda::check_finite({.data = logits.view().data, .rows = T, .columns = E, .status = s},
                              stream);
    routing::cuda::route({.logits = logits.view().data,
                          .tokens = T,
                          .n_experts = E,
                          .spec = spec,
                          .correction_bias = bias.data<float>(),
                          .ids = ids.data<int32_t>(),
                          .weights = weights.data<float>()},
                         stream);
    routing::cuda::to_physical({.logical_ids = ids.data<int32_t>(),
                                .logical_weights = weights.data<float>(),
                                .tokens = T,
                                .top_k = k,
                                .rank_table = table.data<int32_t>(),
                                .n_logical = E,
                                .shared_slots = 1,
                                .first_shared_id = E,
                                .ids = slot_ids.data<int32_t>(),
                                .weights = slot_weights.data<float>()},
                               stream);
    rc::sort_by_slot({.ids = slot_ids.data<int32_t>(),
                      .tokens = T,
                      .columns = columns,
                      .n_slots = slots,
                      .tile = 8,
                      .counts = counts.data<int32_t>(),
                      .offsets = offsets.data<int32_t>(),
                      .row_source = row_source.data<int32_t>(),
                      .entry_row = entry_row.data<int32_t>(),
                      .scratch = scratch.view().data},
                     stream);
    rc::gather_rows({.hidden = hidden.view().data,
                     .hidden_dtype = DType::bf16,
                     .tokens = T,
                     .hidden_size = H,
                     .columns = columns,
                     .row_source = row_source.data<int32_t>(),
                     .offsets = offsets.data<int32_t>(),
                     .counts = counts.data<int32_t>(),
                     .n_slots = slots,
                     .max_rows = max_rows,
                     .rows = rows.view().data,
                     .rows_dtype = DType::f8e4m3,
                     .scales = scales.data<float>()},
                    stream);
    // The scales stand in for GEMM2's output: [max_rows, 2] f32 rows of hidden size 2.
    rc::combine({.rows = scales.view().data,
                 .rows_dtype = DType::f32,
                 .entry_row = entry_row.data<int32_t>(),
                 .weights = slot_weights.data<float>(),
                 .tokens = T,
                 .columns = columns,
                 .hidden_size = 2,
                 .output = output.view().data,
                 .output_dtype = DType::bf16},
                stream);
  }

  std::vector<uint8_t> results() const {
    std::vector<uint8_t> all;
    for (const Tensor* t : {&status, &ids, &weights, &slot_ids, &slot_weights, &counts, &offsets,
                            &entry_row, &rows, &output}) {
      const std::vector<uint8_t> bytes = download<uint8_t>(*t);
      all.insert(all.end(), bytes.begin(), bytes.end());
    }
    return all;
  }
};

TEST(CudaGraph, TheDeviceStagesCaptureAndReplayAsTheyRunEagerly) {
  MOEKIT_REQUIRE_GPU();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  Pipeline eager;
  eager.enqueue(stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

  Pipeline captured;
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  captured.enqueue(stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(captured.results(), eager.results()) << "replay " << replay;
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace moekit
