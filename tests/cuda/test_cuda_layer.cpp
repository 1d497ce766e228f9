// The whole layer on the GPU (runner cuda) against the float64 oracle: every weight format the
// cuda core reads, the routing variants and activations, the three block forms, expert parallel
// ranks with replicas, odd shapes; outputs poisoned on the device first. Skipped with the
// runtime's reason where no GPU is usable.

#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include <cuda_runtime_api.h>

#include "comm/communicator.hpp"
#include "cuda/cuda_support.hpp"
#include "support/layer_fixture.hpp"
#include "support/specs.hpp"

namespace moekit::test {
namespace {

using cuda_testing::download;

struct CudaLayerCase {
  std::string name;
  ModelSpec spec;
  QuantParams weights;
  BlockForm form = BlockForm::standard;
  DType hidden = DType::bf16;
  int64_t tokens = 3;
  int ep_size = 1;
  int redundant = 0;
  // nccl: the all-to-all over a real NCCL communicator of one rank (this process): every row
  // goes through the plan, pack, rank-order sum and NCCL's self-exchange.
  A2AKind a2a = A2AKind::none;
};

// Odd sizes: H and I not multiples of 128 (nor of 16 for the fp8 formats), E not a power of two.
ModelSpec odd_dsv3() {
  ModelSpec spec = small_dsv3();
  spec.hidden = 136;
  spec.intermediate = 40;
  spec.n_experts = 12;
  spec.routing.n_group = 3;
  spec.routing.topk_group = 2;
  spec.shared_intermediate = 80;
  return spec;
}

// H and I of exactly one 128-column group: fp8-block still scales its activations per group.
ModelSpec one_block_dsv3() {
  ModelSpec spec = small_dsv3();
  spec.hidden = 128;
  spec.intermediate = 128;
  spec.shared_intermediate = 256;
  return spec;
}

// Few experts of many weight rows (Mixtral's shape, scaled down): at T = 1 GEMM2's tiles split K
// (choose_gemm), so the core's split partials and counters are in the path; its token reads
// 151 MB of 16-bit weights, more than the one-token kernel takes.
ModelSpec wide_mixtral() {
  ModelSpec spec = ModelSpec::preset("mixtral");
  spec.hidden = 2048;
  spec.intermediate = 6144;
  return spec;
}

// small_dsv3 with another H and I.
ModelSpec sized_dsv3(int64_t hidden, int64_t intermediate) {
  ModelSpec spec = small_dsv3();
  spec.hidden = hidden;
  spec.intermediate = intermediate;
  return spec;
}

std::vector<CudaLayerCase> cases() {
  const std::pair<std::string, QuantParams> formats[] = {
      {"bf16", WeightFormat::bf16},
      {"f16", WeightFormat::f16},
      {"fp8_block", QuantParams::Fp8Block(128)},
      {"fp8_tensor", QuantParams::Fp8Tensor(Fp8Scaling::per_tensor)},
      {"fp8_channel", QuantParams::Fp8Tensor(Fp8Scaling::per_channel)},
      {"fp8_channel_static",
       QuantParams::Fp8Tensor(Fp8Scaling::per_channel, Fp8Activations::static_)}};
  std::vector<NamedSpec> specs = routing_specs();
  specs.push_back({"odd_dsv3", odd_dsv3()});
  specs.push_back({"one_block_dsv3", one_block_dsv3()});
  std::vector<CudaLayerCase> out;
  for (const auto& [fname, format] : formats) {
    for (const NamedSpec& s : specs) {
      for (int64_t tokens : {1, 3, 257}) {
        out.push_back({fname + "_" + s.name + "_T" + std::to_string(tokens), s.spec, format,
                       BlockForm::standard, DType::bf16, tokens});
      }
    }
    for (BlockForm form : {BlockForm::overlapped, BlockForm::fused_slot}) {
      for (int64_t tokens : {1, 64}) {
        out.push_back(
            {fname + "_dsv3_" + std::string(block_form_name(form)) + "_T" + std::to_string(tokens),
             small_dsv3(), format, form, DType::bf16, tokens});
      }
    }
    out.push_back({fname + "_wide_mixtral_split_k_T1", wide_mixtral(), format, BlockForm::standard,
                   DType::bf16, 1});
    // Vectors longer than one staging pass of the one-token kernel, each staged in two or more
    // passes, the last partial: the hidden state (H over 2048 elements), and the token's
    // activations (over 1024 16-byte chunks). Few columns besides, so that the token reads little
    // (compute-sanitizer runs them).
    out.push_back({fname + "_long_hidden_T1", sized_dsv3(2112, 32), format, BlockForm::standard,
                   DType::bf16, 1});
    out.push_back({fname + "_long_intermediate_T1", sized_dsv3(64, 2064), format,
                   BlockForm::standard, DType::bf16, 1});
    for (int64_t tokens : {1, 5}) {
      out.push_back({fname + "_dsv3_f32_hidden_T" + std::to_string(tokens), small_dsv3(), format,
                     BlockForm::standard, DType::f32, tokens});
    }
    out.push_back(
        {fname + "_dsv3_f16_hidden", small_dsv3(), format, BlockForm::standard, DType::f16, 5});
    for (int64_t tokens : {1, 9}) {
      out.push_back({fname + "_dsv3_ep2_redundant_T" + std::to_string(tokens), small_dsv3(), format,
                     BlockForm::standard, DType::bf16, tokens, 2, 2});
    }
    out.push_back({fname + "_dsv3_ep4", small_dsv3(), format, BlockForm::fused_slot, DType::bf16,
                   1000, 4, 0});
    // T = 9 plans the low-latency mode (max_tokens <= 128), T = 200 the normal one.
    for (BlockForm form : {BlockForm::standard, BlockForm::fused_slot}) {
      for (int64_t tokens : {9, 200}) {
        out.push_back({fname + "_dsv3_a2a_nccl_" + std::string(block_form_name(form)) + "_T" +
                           std::to_string(tokens),
                       small_dsv3(), format, form, DType::bf16, tokens, 1, 0, A2AKind::nccl});
      }
    }
  }
  for (auto& c : out) {
    for (char& ch : c.name) {
      if (ch == '-') ch = '_';
    }
  }
  return out;
}

// A checkpoint's input scales for fp8 static activations, [E] per stack (w13, w2, shared_w13,
// shared_w2), random in [0.005, 0.02]: the layer takes the largest of each kind.
struct InputScales {
  Tensor stacks[4];

  InputScales(const ModelSpec& spec, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uniform(0.005f, 0.02f);
    const int64_t counts[4] = {spec.n_experts, spec.n_experts, spec.n_shared, spec.n_shared};
    for (int i = 0; i < 4; ++i) {
      stacks[i] = Tensor::empty(DType::f32, {counts[i]});
      std::generate_n(stacks[i].data<float>(), counts[i], [&] { return uniform(rng); });
    }
  }
  // The weights a layer of `quant` is given: with the input scales for static activations.
  LayerWeights attach(LayerWeights w, const QuantParams& quant) const {
    if (quant.activation != ActivationQuant::fp8_static) return w;
    w.w13.input_scale = stacks[0].view();
    w.w2.input_scale = stacks[1].view();
    if (stacks[2].view().numel() > 0) {
      w.shared_w13.input_scale = stacks[2].view();
      w.shared_w2.input_scale = stacks[3].view();
    }
    return w;
  }
};

// Host inputs on the GPU, the output poisoned there.
struct DeviceRun {
  Tensor hidden, logits, output, ids, weights;
};

DeviceRun device_inputs(const Inputs& in, int64_t T, int64_t H, int k) {
  DeviceRun d;
  const auto up = [](const Tensor& host) {
    Tensor t = Tensor::empty(host.view().dtype, host.view().shape, Device::cuda(0));
    copy(t, host);
    return t;
  };
  d.hidden = up(in.hidden);
  d.logits = up(in.logits);
  d.output = cuda_testing::poisoned(in.hidden.view().dtype, {T, H});
  d.ids = cuda_testing::poisoned(DType::i32, {T, k});
  d.weights = cuda_testing::poisoned(DType::f32, {T, k});
  return d;
}

// The cuda runner on GPU 0, as the layer tests plan it.
Options on_gpu() {
  Options options;
  options.runner = RunnerKind::cuda;
  options.device = Device::cuda(0);
  return options;
}

class CudaLayer : public ::testing::TestWithParam<CudaLayerCase> {};

TEST_P(CudaLayer, MatchesTheFloat64OracleOfItsFormat) {
  MOEKIT_REQUIRE_GPU();
  const CudaLayerCase& c = GetParam();
  const ModelSpec& spec = c.spec;
  const int64_t T = c.tokens, H = spec.hidden;
  const int k = spec.routing.top_k;
  if (c.a2a == A2AKind::nccl && !communicator_built(CommKind::nccl)) {
    GTEST_SKIP() << communicator_absent_reason(CommKind::nccl);
  }
  Options options = on_gpu();
  options.a2a = c.a2a;
  options.weights = c.weights;
  options.form = c.form;
  options.max_tokens = std::max<int64_t>(T, 8);
  const RandomWeights random = RandomWeights::make(spec, DType::bf16, 21);
  const InputScales input_scales(spec, 23);
  const LayerWeights given = input_scales.attach(random.view(), c.weights);
  const QuantizedLayerWeights quantized = quantize_layer(given, c.weights);
  const LayerWeights& held = c.weights.quantized() ? quantized.view() : given;
  const Inputs in = random_inputs(spec, T, c.hidden, 22);
  std::vector<double> sum(static_cast<size_t>(T * H), 0.0);
  std::vector<int32_t> ids;
  std::vector<float> weights;
  for (int rank = 0; rank < c.ep_size; ++rank) {
    options.ep = ExpertParallel::Rank(c.ep_size, rank, c.redundant);
    const Plan plan = resolve(spec, options, Platform::probe());
    MoeLayer layer(plan, given);
    DeviceRun d = device_inputs(in, T, H, k);
    const RoutingResult routing{d.ids, d.weights};
    layer.forward(d.hidden, d.logits, d.output, &routing);
    layer.synchronize();
    Tensor out = Tensor::empty(d.output.view().dtype, d.output.view().shape);
    copy(out, d.output);
    const std::vector<double> part = to_doubles(out.view());
    for (size_t i = 0; i < part.size(); ++i) sum[i] += part[i];
    if (rank == 0) {
      ids = download<int32_t>(d.ids);
      weights = download<float>(d.weights);
    }
  }
  const OracleRouting routing =
      oracle_routing(spec, given.correction_bias, in.logits, ids, weights);
  EXPECT_TRUE(routing.agrees());
  // Ranks' outputs are each rounded to the output's dtype before they are summed.
  const DType rounded = c.ep_size == 1 ? c.hidden : DType::f32;
  const OracleComparison comparison =
      compare_with_oracle(spec, held, c.weights, in.hidden, routing, sum, rounded);
  // The GEMMs take their inputs in the weights' dtype (bf16/f16, or e4m3 by the format's rule,
  // which the oracle computes too), as tensor cores do; the output adds the rounding of its dtype.
  const double tolerance = !c.weights.quantized() || c.hidden == DType::bf16 ? 1e-2
                           : c.hidden == DType::f16                          ? 5e-3
                                                                             : 1e-3;
  EXPECT_TRUE(comparison.within(tolerance));
}

std::string case_name(const ::testing::TestParamInfo<CudaLayerCase>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaLayer, ::testing::ValuesIn(cases()), case_name);

TEST(CudaLayer, AnEmptyBatchWritesNothing) {
  MOEKIT_REQUIRE_GPU();
  const ModelSpec spec = small_dsv3();
  const RandomWeights given = RandomWeights::make(spec, DType::bf16, 3);
  MoeLayer layer(resolve(spec, on_gpu(), Platform::probe()), given.view());
  const Tensor hidden = Tensor::empty(DType::bf16, {0, spec.hidden}, Device::cuda(0));
  const Tensor logits = Tensor::empty(DType::f32, {0, spec.n_experts}, Device::cuda(0));
  const Tensor output = Tensor::empty(DType::bf16, {0, spec.hidden}, Device::cuda(0));
  EXPECT_NO_THROW(layer.forward(hidden, logits, output));
}

TEST(CudaLayer, ANonFiniteInputIsReportedAtSynchronizeNamingItsRow) {
  MOEKIT_REQUIRE_GPU();
  const ModelSpec spec = small_dsv3();
  const RandomWeights given = RandomWeights::make(spec, DType::bf16, 3);
  MoeLayer layer(resolve(spec, on_gpu(), Platform::probe()), given.view());
  Inputs in = random_inputs(spec, 4, DType::f32, 5);
  in.logits.data<float>()[2 * spec.n_experts + 7] = NAN;
  DeviceRun d = device_inputs(in, 4, spec.hidden, spec.routing.top_k);
  layer.forward(d.hidden, d.logits, d.output, nullptr, nullptr);
  try {
    layer.synchronize();
    FAIL() << "a NaN logit was not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Errc::invalid_argument);
    EXPECT_NE(std::string(e.what()).find("router_logits: row 2"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(layer.synchronize()) << "a report clears what it reported";
}

// A whole forward captured in one CUDA graph and replayed on new inputs written into the same
// buffers gives the eager result bit for bit; a host sync, allocation or pageable copy inside
// forward would make the capture fail.
void expect_replay_bit_for_bit(const Options& options, int64_t T) {
  const ModelSpec spec = small_dsv3();
  const RandomWeights given = RandomWeights::make(spec, DType::bf16, 3);
  MoeLayer layer(resolve(spec, options, Platform::probe()), given.view());
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  DeviceRun d =
      device_inputs(random_inputs(spec, T, DType::bf16, 7), T, spec.hidden, spec.routing.top_k);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  layer.forward(d.hidden, d.logits, d.output, nullptr, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);

  const Inputs fresh = random_inputs(spec, T, DType::bf16, 8);
  copy(d.hidden, fresh.hidden);
  copy(d.logits, fresh.logits);
  d.output.fill_bytes(cuda_testing::kPoison);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const std::vector<uint16_t> replayed = download<uint16_t>(d.output);

  d.output.fill_bytes(cuda_testing::kPoison);
  layer.forward(d.hidden, d.logits, d.output, nullptr, stream);
  layer.synchronize();
  const std::vector<uint16_t> eager = download<uint16_t>(d.output);
  EXPECT_EQ(replayed, eager);
  layer.forward(d.hidden, d.logits, d.output, nullptr, stream);
  layer.synchronize();
  EXPECT_EQ(download<uint16_t>(d.output), eager) << "the same inputs gave other bits";

  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST(CudaLayer, AForwardCapturedInACudaGraphReplaysBitForBit) {
  MOEKIT_REQUIRE_GPU();
  // fused-slot: the routed combine writes the output (Plan::fusions.combine_to_output). One
  // token of 16-bit weights: the one-token kernel's cooperative launch, in the overlapped form
  // on two streams at once.
  for (BlockForm form : {BlockForm::standard, BlockForm::overlapped, BlockForm::fused_slot}) {
    for (const int64_t T : {16, 1}) {
      SCOPED_TRACE(std::string(block_form_name(form)) + " T=" + std::to_string(T));
      Options options = on_gpu();
      options.form = form;
      // small_dsv3's shared expert cannot be split into fp8 slots (resolve would fall back).
      options.weights = form == BlockForm::fused_slot || T == 1 ? QuantParams(WeightFormat::bf16)
                                                                : QuantParams::Fp8Block(128);
      options.max_tokens = 16;
      expect_replay_bit_for_bit(options, T);
    }
  }
}

// The all-to-all over NCCL in its low-latency mode (max_tokens 16) enqueues its exchanges
// without waiting: the whole layer is captured, over a world of this one process.
TEST(CudaLayer, TheLowLatencyAllToAllOverNcclIsCapturedInACudaGraph) {
  MOEKIT_REQUIRE_GPU();
  if (!communicator_built(CommKind::nccl))
    GTEST_SKIP() << communicator_absent_reason(CommKind::nccl);
  for (BlockForm form : {BlockForm::standard, BlockForm::overlapped, BlockForm::fused_slot}) {
    SCOPED_TRACE(block_form_name(form));
    Options options = on_gpu();
    options.a2a = A2AKind::nccl;
    options.form = form;
    options.max_tokens = 16;
    ASSERT_EQ(resolve(small_dsv3(), options, Platform::probe()).a2a_mode, A2AMode::low_latency);
    expect_replay_bit_for_bit(options, 16);
  }
}

// resolve's GPU refusals, on a Platform that describes GPUs (no GPU needed).
Platform with_gpu(int major, int minor) {
  Platform p = Platform::cpu_only(2);
  p.cuda_runtime = true;
  p.gpus.push_back({.index = 0,
                    .compute_major = major,
                    .compute_minor = minor,
                    .name = "test GPU",
                    .sm_count = 132,
                    .memory_bytes = 1LL << 36,
                    .l2_bytes = 60 << 20});
  return p;
}

struct Refusal {
  const char* name;
  Platform platform;
  Device device;
  QuantParams weights;
  const char* reason;
};

TEST(CudaResolve, RefusesWhatTheCudaCoreCannotRunNamingWhy) {
  const Refusal refusals[] = {
      {"below sm_80", with_gpu(7, 5), Device::cuda(0), WeightFormat::bf16, "sm_75"},
      {"an absent device", with_gpu(9, 0), Device::cuda(3), WeightFormat::bf16, "no GPU 3"},
      {"no GPU at all", Platform::cpu_only(2), Device::cuda(0), WeightFormat::bf16, "no GPU"},
      {"int4", with_gpu(9, 0), Device::cuda(0), WeightFormat::int4_group, "INT4"},
      {"f32 weights", with_gpu(9, 0), Device::cuda(0), WeightFormat::f32, "f32"},
      {"fp8 blocks of 64", with_gpu(9, 0), Device::cuda(0), QuantParams::Fp8Block(64), "128 x 128"},
  };
  for (const Refusal& r : refusals) {
    SCOPED_TRACE(r.name);
    Options options;
    options.runner = RunnerKind::cuda;
    options.device = r.device;
    options.weights = r.weights;
    const Resolution resolution = try_resolve(small_dsv3(), options, r.platform);
    ASSERT_FALSE(resolution.plan.has_value());
    EXPECT_NE(resolution.refusal.find(r.reason), std::string::npos) << resolution.refusal;
  }
}

// DeepSeek-V3 in fp8-block on GPU 0 of `platform`, planned for batches up to 4096 tokens.
Plan fp8_dsv3_plan(RunnerKind runner, const Platform& platform) {
  Options options;
  options.runner = runner;
  options.device = Device::cuda(0);
  options.weights = QuantParams::Fp8Block(128);
  options.max_tokens = 4096;
  return resolve(ModelSpec::preset("dsv3"), options, platform);
}

TEST(CudaResolve, PlansTheCudaCoreOnAnSm90GpuWithItsKernelsRecorded) {
  const Plan plan = fp8_dsv3_plan(RunnerKind::auto_, with_gpu(9, 0));
  EXPECT_EQ(plan.runner, RunnerKind::cuda);
  EXPECT_EQ(plan.stages, "cuda");
  ASSERT_TRUE(plan.cuda_kernels.has_value());
  ASSERT_FALSE(plan.cuda_kernels->routed.empty());
  EXPECT_EQ(plan.cuda_kernels->routed.back().up_to_tokens, 4096);
  // Hopper: e4m3 on wgmma at every batch size.
  EXPECT_EQ(plan.cuda_kernels->routed.front().kernel, CudaGemmKernel::wgmma);
  EXPECT_EQ(plan.cuda_kernels->routed.back().kernel, CudaGemmKernel::wgmma);
}

TEST(CudaResolve, PlansDecodeThenPrefillOnAnSm80Gpu) {
  const Plan plan = fp8_dsv3_plan(RunnerKind::cuda, with_gpu(8, 0));
  ASSERT_TRUE(plan.cuda_kernels.has_value());
  EXPECT_EQ(plan.cuda_kernels->routed.front().kernel, CudaGemmKernel::decode);
  EXPECT_EQ(plan.cuda_kernels->routed.back().kernel, CudaGemmKernel::prefill);
}

}  // namespace
}  // namespace moekit::test
