// Expert parallelism over NCCL across processes, one GPU each: on every rank the a2a nccl
// layer's output on its own tokens equals the single-GPU layer's on the same tokens, in both
// modes, for each GPU format, with uneven batches (one rank with none), a hot expert and
// replicas; so does the reduce form's (a2a none, every rank the same tokens) in both of its ways
// to exchange. The low-latency ones are also captured in a CUDA graph and replayed bit for bit.
// scripts/gpu.sh runs this suite as N processes of this binary on a machine of N >= 2 GPUs
// (MOEKIT_WORLD_SIZE / _RANK / _LOCAL_RANK and a fresh MOEKIT_NCCL_ID_FILE); a process that is not
// one of several ranks skips it, saying why.

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "cuda/cuda_support.hpp"
#include "support/layer_fixture.hpp"
#include "support/specs.hpp"

namespace moekit::test {
namespace {

using cuda_testing::relative_l2;

// Empty when this process is one of several ranks, each with a GPU of its own and NCCL.
std::string not_ranks_reason(const Platform& platform) {
  if (!cuda_testing::no_gpu_reason().empty()) return cuda_testing::no_gpu_reason();
  if (platform.world_size < 2) {
    return "one process: this suite runs as several ranks, one GPU each (scripts/gpu.sh starts "
           "them on a machine of two or more GPUs)";
  }
  if (platform.world_local_rank >= static_cast<int>(platform.gpus.size())) {
    return fmt::format("local rank {} has no GPU of its own ({} here)", platform.world_local_rank,
                       platform.gpus.size());
  }
  if (!communicator_built(CommKind::nccl)) return communicator_absent_reason(CommKind::nccl);
  return {};
}

enum class Load { uneven, hot_expert };

struct RanksCase {
  std::string name;
  A2AMode mode;
  QuantParams weights;
  BlockForm form = BlockForm::standard;
  Load load = Load::uneven;
  int extra_replicas = 0;
  A2AKind a2a = A2AKind::nccl;  // none: the reduce form
};

std::vector<RanksCase> ranks_cases() {
  const A2AMode normal = A2AMode::normal, low_latency = A2AMode::low_latency;
  return {
      {"normal_bf16_standard", normal, WeightFormat::bf16},
      {"low_latency_bf16_standard", low_latency, WeightFormat::bf16},
      {"normal_bf16_overlapped_hot_expert", normal, WeightFormat::bf16, BlockForm::overlapped,
       Load::hot_expert},
      {"low_latency_bf16_fused_slot_replicas", low_latency, WeightFormat::bf16,
       BlockForm::fused_slot, Load::uneven, 1},
      {"normal_fp8_block_standard_replicas", normal, QuantParams::Fp8Block(128),
       BlockForm::standard, Load::uneven, 1},
      {"low_latency_fp8_block_standard_hot_expert", low_latency, QuantParams::Fp8Block(128),
       BlockForm::standard, Load::hot_expert},
      {"low_latency_fp8_tensor_standard", low_latency,
       QuantParams::Fp8Tensor(Fp8Scaling::per_channel)},
      {"normal_f16_standard", normal, WeightFormat::f16},
      {"reduce_normal_bf16_standard", normal, WeightFormat::bf16, BlockForm::standard, Load::uneven,
       0, A2AKind::none},
      {"reduce_low_latency_fp8_block_overlapped", low_latency, QuantParams::Fp8Block(128),
       BlockForm::overlapped, Load::hot_expert, 0, A2AKind::none},
  };
}

// Uneven batches, one rank with none; max_tokens 16.
int64_t tokens_of(int rank) {
  constexpr int64_t kTokens[] = {5, 0, 16, 3, 11, 1, 7, 12};
  return kTokens[rank % 8];
}

// Physical experts must divide over the ranks: replicas make up the difference.
int redundant_for(const ModelSpec& spec, int size, int extra) {
  return (size - spec.n_experts % size) % size + extra * size;
}

// One forward on this rank's GPU, the output poisoned first; the output back on the host. With
// `replay`, the forward is also captured in a CUDA graph and replayed, which must give the same
// bits.
std::vector<double> forward_on_gpu(const Plan& plan, const LayerWeights& weights, const Inputs& in,
                                   bool replay = false) {
  MoeLayer layer(plan, weights);
  const Device gpu = plan.options.device;
  const auto up = [&](const Tensor& host) {
    Tensor t = Tensor::empty(host.view().dtype, host.view().shape, gpu);
    copy(t, host);
    return t;
  };
  const Tensor hidden = up(in.hidden), logits = up(in.logits);
  Tensor output = Tensor::empty(in.hidden.view().dtype, in.hidden.view().shape, gpu);
  const auto read = [&] {
    Tensor host = Tensor::empty(output.view().dtype, output.view().shape);
    copy(host, output);
    return to_doubles(host.view());
  };
  output.fill_bytes(cuda_testing::kPoison);
  layer.forward(hidden, logits, output);
  layer.synchronize();
  const std::vector<double> eager = read();
  if (!replay) return eager;
  cudaStream_t stream = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  layer.forward(hidden, logits, output, nullptr, stream);
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  output.fill_bytes(cuda_testing::kPoison);
  EXPECT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  layer.synchronize();
  EXPECT_EQ(read(), eager) << "the replayed graph gave other bits";
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  return eager;
}

class CudaRanks : public ::testing::TestWithParam<RanksCase> {};

TEST_P(CudaRanks, EveryRanksOutputEqualsTheSingleGpuLayerOnItsTokens) {
  const Platform platform = Platform::probe();
  if (const std::string why = not_ranks_reason(platform); !why.empty()) GTEST_SKIP() << why;
  const RanksCase& c = GetParam();
  const int size = platform.world_size, rank = platform.world_rank;
  ModelSpec spec = small_dsv3();
  spec.hidden = 128;  // whole fp8-block scale blocks
  spec.intermediate = 128;
  spec.shared_intermediate = 256;
  const RandomWeights weights = RandomWeights::make(spec, DType::bf16, 31);
  // The reduce form: every rank the same tokens.
  const bool reduce = c.a2a == A2AKind::none;
  const int64_t T = reduce ? 13 : tokens_of(rank);
  Inputs in = random_inputs(spec, T, DType::bf16, reduce ? 200 : 200 + rank);
  if (c.load == Load::hot_expert) {
    float* logits = in.logits.data<float>();
    for (int64_t t = 0; t < T; ++t) logits[t * spec.n_experts + 3] += 6.0f;
  }
  Options options;
  options.runner = RunnerKind::cuda;
  options.device = Device::cuda(platform.world_local_rank);
  options.weights = c.weights;
  options.form = c.form;
  options.max_tokens = 16;
  options.comm_timeout_ms = 20000;
  const Plan single = resolve(spec, options, platform);
  options.a2a = c.a2a;
  options.a2a_mode = c.mode;
  options.ep = ExpertParallel::Rank(size, rank, redundant_for(spec, size, c.extra_replicas));
  const Plan plan = resolve(spec, options, platform);
  ASSERT_EQ(plan.a2a_mode, c.mode);
  ASSERT_EQ(plan.form, c.form) << plan.explain();
  if (reduce) {
    ASSERT_EQ(plan.comm, CommKind::nccl) << plan.explain();
  }
  const std::vector<double> got =
      forward_on_gpu(plan, weights.view(), in, c.mode == A2AMode::low_latency);
  if (T == 0) return;
  const std::vector<double> want = forward_on_gpu(single, weights.view(), in);
  EXPECT_LT(relative_l2(got, want), c.weights.quantized() ? 2e-2 : 1e-2);
}

std::string ranks_case_name(const ::testing::TestParamInfo<RanksCase>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaRanks, ::testing::ValuesIn(ranks_cases()), ranks_case_name);

}  // namespace
}  // namespace moekit::test
