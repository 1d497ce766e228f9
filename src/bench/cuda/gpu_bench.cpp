#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <numeric>
#include <random>

#include <fmt/format.h>

#include "bench/cuda/cublaslt_peak.hpp"
#include "bench/cuda/gpu_kernels.hpp"
#include "bench/gpu_bench.hpp"
#include "bench/random_layer.hpp"
#include "moekit/error.hpp"
#include "moekit/layer.hpp"
#include "moekit/testing.hpp"
#include "quant/quant_method.hpp"

namespace moekit::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void check(cudaError_t status, const char* what) {
  check_cuda(status, what);
}

class Stream {
 public:
  Stream() {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }
  ~Stream() { cudaStreamDestroy(stream_); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// A start and a stop event per repeat, all recorded before the host waits once.
class EventPairs {
 public:
  explicit EventPairs(int pairs) : events_(static_cast<size_t>(2 * pairs)) {
    for (cudaEvent_t& e : events_) check(cudaEventCreate(&e), "cudaEventCreate");
  }
  ~EventPairs() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  EventPairs(const EventPairs&) = delete;
  EventPairs& operator=(const EventPairs&) = delete;
  void start(int i, cudaStream_t s) {
    check(cudaEventRecord(events_[2 * i], s), "cudaEventRecord");
  }
  void stop(int i, cudaStream_t s) {
    check(cudaEventRecord(events_[2 * i + 1], s), "cudaEventRecord");
  }
  double seconds(int i) const {
    float ms = 0.0f;
    check(cudaEventElapsedTime(&ms, events_[2 * i], events_[2 * i + 1]), "cudaEventElapsedTime");
    return ms * 1e-3;
  }

 private:
  std::vector<cudaEvent_t> events_;
};

class GraphExec {
 public:
  GraphExec() = default;
  ~GraphExec() {
    if (exec_) cudaGraphExecDestroy(exec_);
    if (graph_) cudaGraphDestroy(graph_);
  }
  GraphExec(const GraphExec&) = delete;
  GraphExec& operator=(const GraphExec&) = delete;
  template <typename Enqueue>
  void capture(cudaStream_t stream, const Enqueue& enqueue) {
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), "begin capture");
    enqueue();
    check(cudaStreamEndCapture(stream, &graph_), "a forward captured in a CUDA graph");
    check(cudaGraphInstantiate(&exec_, graph_, 0), "cudaGraphInstantiate");
  }
  void launch(cudaStream_t stream) const {
    check(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch");
  }

 private:
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// e4m3 codes of this standard deviation use most of the format's range (3.5 sigma < 448); the
// block scales bring the weights back to 1/sqrt(fan-in).
constexpr float kCodeStddev = 64.0f;

// The routed experts of a benchmark layer, each made when the layer asks for it, directly in the
// plan's stored format (bf16 for float formats, e4m3 codes and scales for fp8): no stack of
// every expert exists on the host, and a given (seed, expert) always gives the same weights,
// which is how the reference layer gets the same experts as the timed one.
class RandomExperts final : public LayerWeightSource {
 public:
  RandomExperts(const ModelSpec& spec, const QuantParams& format, uint64_t seed, int threads)
      : spec_(spec), format_(format), seed_(seed), threads_(threads) {
    if (format.weight_dtype == DType::i4) {
      fail(Errc::invalid_argument, "bench on cuda: random int4 experts are not made");
    }
  }
  ExpertWeights routed(int expert) override {
    const int64_t H = spec_.hidden, I = spec_.intermediate;
    const uint64_t seed = seed_ + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(expert + 1);
    const auto stddev = [](int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); };
    ExpertWeights w;
    w.origin = fmt::format("random expert {}", expert);
    if (!format_.quantized()) {
      w13_ = fast_random_bf16({1, 2 * I, H}, stddev(H), seed, threads_);
      w2_ = fast_random_bf16({1, H, I}, stddev(I), seed + 1, threads_);
      w.w13 = w13_.view();
      w.w2 = w2_.view();
      return w;
    }
    // weight_tensors lists w13's weight and scale, then w2's.
    const std::vector<TensorSpec> stored = weight_tensors(format_, 1, H, I);
    w13_ = fast_random_e4m3(stored[0].shape, kCodeStddev, seed, threads_);
    s13_ = scales(stored[1], stddev(H), seed + 2);
    w2_ = fast_random_e4m3(stored[2].shape, kCodeStddev, seed + 1, threads_);
    s2_ = scales(stored[3], stddev(I), seed + 3);
    w.w13.weight = w13_.view();
    w.w13.scale = s13_.view();
    w.w2.weight = w2_.view();
    w.w2.scale = s2_.view();
    return w;
  }
  ExpertWeights shared(int) override { fail(Errc::internal, "bench cases have no shared experts"); }
  TensorView correction_bias() override { return {}; }
  TensorView shared_gate() override { return {}; }

 private:
  // Scales within 25% of the one that gives weights of standard deviation `stddev`, so that a
  // scale applied to the wrong block shows in the check.
  static Tensor scales(const TensorSpec& spec, float stddev, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> spread(0.75f, 1.25f);
    std::vector<float> values(static_cast<size_t>(spec.shape.numel()));
    for (float& v : values) v = stddev / kCodeStddev * spread(rng);
    Tensor t = Tensor::empty(spec.dtype, spec.shape);
    convert_from_f32(values.data(), spec.shape.numel(), t.view().data, spec.dtype);
    return t;
  }

  ModelSpec spec_;
  QuantParams format_;
  uint64_t seed_;
  int threads_;
  Tensor w13_, s13_, w2_, s2_;
};

// Some of another source's experts, renumbered 0..n-1.
class SomeExperts final : public LayerWeightSource {
 public:
  SomeExperts(LayerWeightSource& all, std::vector<int> experts)
      : all_(all), experts_(std::move(experts)) {}
  ExpertWeights routed(int expert) override { return all_.routed(experts_[expert]); }
  ExpertWeights shared(int index) override { return all_.shared(index); }
  TensorView correction_bias() override { return {}; }
  TensorView shared_gate() override { return {}; }

 private:
  LayerWeightSource& all_;
  std::vector<int> experts_;
};

// The k largest logits of a token, ties to the lower id: the experts softmax top-k selects.
void top_k(const float* logits, int experts, int k, std::vector<int>& order) {
  order.resize(static_cast<size_t>(experts));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [logits](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  order.resize(static_cast<size_t>(k));
}

int distinct_experts(const float* logits, int64_t tokens, int experts, int k) {
  std::vector<bool> seen(static_cast<size_t>(experts), false);
  std::vector<int> order;
  for (int64_t t = 0; t < tokens; ++t) {
    top_k(logits + t * experts, experts, k, order);
    for (int e : order) seen[static_cast<size_t>(e)] = true;
  }
  return static_cast<int>(std::count(seen.begin(), seen.end(), true));
}

// Hot experts get this added to their logits (as the CPU bench's skewed routing does).
constexpr float kSkewBoost = 3.0f;

Tensor repeat_logits(const ModelSpec& spec, int64_t tokens, int count, Routing routing,
                     uint64_t seed, int threads) {
  const int E = spec.n_experts;
  Tensor logits = fast_random_f32({count * tokens, E}, 1.0f, seed, threads);
  if (routing == Routing::skewed) {
    std::mt19937_64 rng(seed + 1);
    std::vector<int> experts(static_cast<size_t>(E));
    std::iota(experts.begin(), experts.end(), 0);
    const int hot = std::max(1, spec.routing.top_k / 2);
    float* values = logits.data<float>();
    for (int r = 0; r < count; ++r) {
      std::shuffle(experts.begin(), experts.end(), rng);  // a different few each repeat
      for (int64_t t = r * tokens; t < (r + 1) * tokens; ++t) {
        for (int h = 0; h < hot; ++h) values[t * E + experts[static_cast<size_t>(h)]] += kSkewBoost;
      }
    }
  }
  return logits;
}

// The check: after the timed repeats, one more forward of the same T (the graph where there is
// one) whose first kCheckedTokens tokens are routed to experts of a fixed few, against the float64
// reference runner over those few only. Routing is softmax top-k renormalised, so a token's
// experts and weights depend only on the logits of the experts it selects, and a layer of a
// subset holding them gives the same output. Building that reference once per layer, not once
// per T, matters: a layer loads about 0.2 GB/s (QuantMethod::load_expert), so DeepSeek-V3's 32
// experts of a fresh subset per T would cost 16 s each in bf16.
class CheckedExperts {
 public:
  // Pushes a checked token's chosen logits far above every other (unit-normal) logit.
  static constexpr float kBoost = 30.0f;

  CheckedExperts(const ModelSpec& spec, const QuantParams& format, const Platform& platform,
                 int threads, LayerWeightSource& experts)
      : spec_(spec) {
    const int E = spec.n_experts, k = spec.routing.top_k;
    const int count = std::min(E, 2 * k);
    for (int i = 0; i < count; ++i) chosen_.push_back(static_cast<int>(int64_t{i} * E / count));
    ModelSpec sub = spec;
    sub.n_experts = count;
    Options options;
    options.runner = RunnerKind::reference;
    options.form = BlockForm::standard;
    options.weights = format;
    options.max_tokens = kCheckedTokens;
    options.threads = threads;
    SomeExperts some(experts, chosen_);
    reference_ = std::make_unique<MoeLayer>(resolve(sub, options, platform), some);
  }

  // Router logits for the check: `logits` [T, E] with each of the first n tokens given k of the
  // chosen experts, drawn afresh per token.
  Tensor logits_for_check(const float* logits, int64_t T, int64_t n, uint64_t seed) const {
    const int E = spec_.n_experts, k = spec_.routing.top_k;
    Tensor out = Tensor::empty(DType::f32, {T, E});
    std::copy_n(logits, T * E, out.data<float>());
    std::mt19937_64 rng(seed);
    std::vector<int> order = chosen_;
    for (int64_t t = 0; t < n; ++t) {
      std::shuffle(order.begin(), order.end(), rng);
      for (int j = 0; j < k; ++j)
        out.data<float>()[t * E + order[static_cast<size_t>(j)]] += kBoost;
    }
    return out;
  }

  // The reference output of the first n tokens of `hidden` under `logits` (from logits_for_check).
  Tensor expected(const Tensor& hidden, const Tensor& logits, int64_t n) {
    const int E = spec_.n_experts;
    const auto count = static_cast<int64_t>(chosen_.size());
    Tensor sub_logits = Tensor::empty(DType::f32, {n, count});
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t j = 0; j < count; ++j) {
        sub_logits.data<float>()[t * count + j] =
            logits.data<const float>()[t * E + chosen_[static_cast<size_t>(j)]];
      }
    }
    Tensor out = Tensor::empty(DType::bf16, {n, spec_.hidden});
    reference_->forward(hidden.view().narrow(0, 0, n), sub_logits, out);
    return out;
  }

 private:
  ModelSpec spec_;
  std::vector<int> chosen_;
  std::unique_ptr<MoeLayer> reference_;
};

std::string gemm_path(const Plan& plan, int64_t tokens) {
  if (!plan.cuda_kernels) return std::string(runner_name(plan.runner));
  const CudaGemmChoice& c = CudaKernels::for_tokens(plan.cuda_kernels->routed, tokens);
  if (c.kernel == CudaGemmKernel::decode) {
    return fmt::format("decode/{}x{}", c.gemm1_slices, c.gemm2_slices);
  }
  if (c.kernel == CudaGemmKernel::one_token) return "one-token";
  std::string path = fmt::format("{}/{}", cuda_gemm_kernel_name(c.kernel), c.token_tile);
  // wgmma's narrower CTAs, GEMM1's and GEMM2's weight rows (- for the tile's widest).
  if (c.gemm1_cols != 0 || c.gemm2_cols != 0) {
    const auto cols = [](int n) { return n == 0 ? std::string("-") : std::to_string(n); };
    path += fmt::format("x{},{}", cols(c.gemm1_cols), cols(c.gemm2_cols));
  }
  // Split K: GEMM1's and GEMM2's CTAs per tile.
  if (c.gemm1_splits != 1 || c.gemm2_splits != 1) {
    path += fmt::format(" k/{},{}", c.gemm1_splits, c.gemm2_splits);
  }
  return path;
}

struct TimedCase {
  const BenchCase& bench_case;
  const Plan& plan;
  const Platform& platform;
  const BenchSettings& settings;
  const BenchLog& log;
  const GpuReport& report;
  int threads;
  void* flush;  // written between repeats: the layer's weights leave the L2
  int64_t flush_bytes;
};

GpuCaseResult time_tokens(const TimedCase& c, MoeLayer& layer, CheckedExperts& checked, int64_t T,
                          Routing routing) {
  const ModelSpec& spec = c.plan.spec;
  const int E = spec.n_experts, k = spec.routing.top_k;
  const int warmup = std::max(1, c.settings.warmup);
  const int repeats = std::max(10, c.settings.repeats);
  const int count = warmup + repeats;
  const Device device = c.plan.options.device;
  const uint64_t seed = c.settings.seed + 7919 * static_cast<uint64_t>(T) +
                        (routing == Routing::skewed ? 104729u : 0u);
  const Tensor hidden = fast_random_bf16({T, spec.hidden}, 1.0f, seed, c.threads);
  // Fresh logits for every repeat: repeating one routing would time the same experts' weights.
  const Tensor logits = repeat_logits(spec, T, count, routing, seed + 1, c.threads);
  Tensor hidden_d = Tensor::empty(DType::bf16, {T, spec.hidden}, device);
  Tensor all_logits_d = Tensor::empty(DType::f32, {count * T, E}, device);
  Tensor logits_d = Tensor::empty(DType::f32, {T, E}, device);
  Tensor output_d = Tensor::empty(DType::bf16, {T, spec.hidden}, device);
  copy(hidden_d, hidden);
  copy(all_logits_d, logits);
  const size_t logit_bytes = static_cast<size_t>(T * E) * sizeof(float);
  const size_t output_bytes = static_cast<size_t>(T * spec.hidden) * 2;

  Stream stream;
  const cudaStream_t s = stream.get();
  const auto forward = [&] { layer.forward(hidden_d, logits_d, output_d, nullptr, s); };
  // Outside the timed span: this repeat's logits, a poisoned output (a stale or unwritten one
  // must not pass the check), and a write of several L2 sizes.
  const auto prepare = [&](int r) {
    check(cudaMemcpyAsync(logits_d.view().data,
                          static_cast<const std::byte*>(all_logits_d.view().data) + r * logit_bytes,
                          logit_bytes, cudaMemcpyDeviceToDevice, s),
          "copying a repeat's logits");
    check(cudaMemsetAsync(output_d.view().data, 0xD5, output_bytes, s), "poisoning the output");
    check(cudaMemsetAsync(c.flush, r & 0xFF, static_cast<size_t>(c.flush_bytes), s), "L2 flush");
  };
  prepare(0);
  forward();  // loads the kernels before any capture
  layer.synchronize();
  GraphExec graph;
  // An exchange that waits on the host (NCCL's normal mode, the reduce form) is not capturable.
  const bool waits = c.plan.comm != CommKind::none && !(c.plan.options.a2a == A2AKind::nccl &&
                                                        c.plan.a2a_mode == A2AMode::low_latency);
  const bool graphed = T <= kGraphMaxTokens && !waits;
  if (graphed) graph.capture(s, forward);

  const std::string label = fmt::format("{} {} T={} {}", c.bench_case.name, c.plan.quant.name(), T,
                                        routing_name(routing));
  c.log.progress(fmt::format("{}: {} warm-up and {} timed forwards", label, warmup, repeats));
  EventPairs events(count);
  for (int r = 0; r < count; ++r) {
    prepare(r);
    events.start(r, s);
    if (graphed) {
      graph.launch(s);
    } else {
      forward();
    }
    events.stop(r, s);
  }
  check(cudaStreamSynchronize(s), "the timed forwards");
  layer.synchronize();
  std::vector<double> seconds;
  std::vector<int> distinct;
  for (int r = warmup; r < count; ++r) {
    seconds.push_back(events.seconds(r));
    distinct.push_back(distinct_experts(logits.data<const float>() + r * T * E, T, E, k));
  }
  std::sort(distinct.begin(), distinct.end());
  GpuCaseResult result = gpu_result(c.bench_case, c.plan.quant, T, routing, c.report.gpu,
                                    std::move(seconds), distinct[distinct.size() / 2]);
  result.path = gemm_path(c.plan, T);

  // One more forward, untimed, the same way (graph or not), on logits that route its first tokens
  // to the reference's experts.
  const int64_t n = std::min(T, kCheckedTokens);
  const Tensor check_logits =
      checked.logits_for_check(logits.data<const float>() + (count - 1) * T * E, T, n, seed + 2);
  copy(logits_d, check_logits);
  check(cudaMemsetAsync(output_d.view().data, 0xD5, output_bytes, s), "poisoning the output");
  if (graphed) {
    graph.launch(s);
  } else {
    forward();
  }
  check(cudaStreamSynchronize(s), "the checked forward");
  layer.synchronize();
  Tensor got = Tensor::empty(DType::bf16, {n, spec.hidden});
  copy(got, output_d.view().narrow(0, 0, n));
  const Tensor expected = checked.expected(hidden, check_logits, n);
  result.checked_tokens = n;
  result.error = relative_l2(got, expected);
  const double tolerance = c.plan.quant.weight_dtype == DType::f8e4m3 ? 5e-2 : kBf16Tolerance;
  result.ok = result.error <= tolerance;
  return result;
}

}  // namespace

void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    fail(Errc::internal, "bench: {}: {}", what, cudaGetErrorString(status));
}

GpuCeilings measure_gpu_ceilings(int device, int64_t read_bytes, int passes) {
  check(cudaSetDevice(device), "cudaSetDevice");
  cudaDeviceProp props{};
  check(cudaGetDeviceProperties(&props, device), "cudaGetDeviceProperties");
  Stream stream;
  GpuCeilings g;
  g.name = props.name;
  g.l2_bytes = props.l2CacheSize;
  g.read_bytes = read_bytes;
  g.read_passes = passes;
  g.read_bytes_per_s =
      gpu_read_bandwidth(read_bytes, passes, props.multiProcessorCount, stream.get());
  g.mma_bf16_flops_per_s = gpu_mma_peak(false, 5, props.multiProcessorCount, stream.get());
  g.mma_fp8_flops_per_s = gpu_mma_peak(true, 5, props.multiProcessorCount, stream.get());
  const LibraryPeak bf16 = cublaslt_peak(false, 10, stream.get());
  const LibraryPeak fp8 = cublaslt_peak(true, 10, stream.get());
  g.bf16_flops_per_s = bf16.flops_per_s > 0 ? bf16.flops_per_s : g.mma_bf16_flops_per_s;
  g.fp8_flops_per_s = fp8.flops_per_s > 0 ? fp8.flops_per_s : g.mma_fp8_flops_per_s;
  const auto method = [](const LibraryPeak& peak, const char* dtype) {
    return peak.flops_per_s > 0
               ? fmt::format("{}: cuBLASLt 8192^3, median of 10", dtype)
               : fmt::format("{}: mma.sync chains, cuBLASLt not measured ({})", dtype, peak.why);
  };
  g.peak_method = method(bf16, "bf16") + "; " + method(fp8, "fp8");
  return g;
}

void run_gpu_cases(const std::vector<BenchCase>& cases, const Options& options,
                   const Platform& platform, const BenchSettings& settings, const BenchLog& log,
                   GpuReport& report, const std::function<void(const GpuReport&)>& after_each) {
  const int threads = options.threads > 0 ? options.threads : platform.cpu_threads;
  check(cudaSetDevice(options.device.index), "cudaSetDevice");
  const int64_t flush_bytes = std::max<int64_t>(4 * report.gpu.l2_bytes, int64_t{64} << 20);
  Buffer flush = Buffer::allocate(options.device, flush_bytes);
  for (const BenchCase& c : cases) {
    const ModelSpec& spec = c.spec;
    if (spec.routing.scoring != Scoring::softmax || !spec.routing.renormalize ||
        spec.n_shared > 0) {
      fail(Errc::invalid_argument,
           "bench on cuda: case {} must be routed experts with softmax top-k renormalised (its "
           "reference checks the selected experts only)",
           c.name);
    }
  }
  const auto same_layer = [](const ModelSpec& a, const ModelSpec& b) {
    return a.n_experts == b.n_experts && a.routing.top_k == b.routing.top_k &&
           a.hidden == b.hidden && a.intermediate == b.intermediate;
  };
  // Consecutive cases of one layer shape (DeepSeek-V3's decode and prefill) share its layers:
  // building one from random experts is most of the run's time.
  for (size_t first = 0; first < cases.size();) {
    size_t last = first + 1;
    while (last < cases.size() && same_layer(cases[first].spec, cases[last].spec)) ++last;
    std::vector<QuantParams> formats;
    for (size_t i = first; i < last; ++i) {
      for (const QuantParams& f : cases[i].formats) {
        if (std::none_of(formats.begin(), formats.end(),
                         [&f](const QuantParams& g) { return g.name() == f.name(); })) {
          formats.push_back(f);
        }
      }
    }
    for (const QuantParams& format : formats) {
      struct Run {
        const BenchCase* bench_case;
        int64_t tokens;
        Routing routing;
      };
      std::vector<Run> runs;
      for (size_t i = first; i < last; ++i) {
        const BenchCase& c = cases[i];
        if (std::none_of(c.formats.begin(), c.formats.end(),
                         [&format](const QuantParams& g) { return g.name() == format.name(); })) {
          continue;
        }
        const Routing uniform =
            settings.routing == Routing::skewed ? Routing::skewed : Routing::uniform;
        for (int64_t T : c.tokens) runs.push_back({&c, T, uniform});
        for (int64_t T : c.skewed_tokens) runs.push_back({&c, T, Routing::skewed});
      }
      const BenchCase& head = *runs.front().bench_case;
      Options timed = options;
      timed.weights = format;
      timed.max_tokens = 1;
      for (const Run& r : runs) timed.max_tokens = std::max(timed.max_tokens, r.tokens);
      const Resolution resolution = try_resolve(head.spec, timed, platform);
      if (!resolution.plan) {
        for (size_t i = first; i < last; ++i) {
          report.refusals.push_back({cases[i].name, format.name(), resolution.refusal});
        }
        log.note(fmt::format("{} {}: {}", head.name, format.name(), resolution.refusal));
        continue;
      }
      const Plan& plan = *resolution.plan;
      auto start = Clock::now();
      RandomExperts experts(head.spec, plan.quant, settings.seed, threads);
      MoeLayer layer(plan, experts);
      double built = seconds_since(start);
      report.setup_s += built;
      log.note(fmt::format(
          "{} {}: {} layer of {} random experts ({:.2f} GB) built in {:.1f} s", head.name,
          format.name(), runner_name(plan.runner), head.spec.n_experts,
          1e-9 * static_cast<double>(head.spec.n_experts * expert_bytes(format, head.spec.hidden,
                                                                        head.spec.intermediate)),
          built));
      start = Clock::now();
      CheckedExperts checked(head.spec, plan.quant, platform, threads, experts);
      built = seconds_since(start);
      report.setup_s += built;
      log.note(fmt::format("{} {}: reference layer of {} experts built in {:.1f} s", head.name,
                           format.name(),
                           std::min(head.spec.n_experts, 2 * head.spec.routing.top_k), built));
      for (const Run& r : runs) {
        const TimedCase timed_case{*r.bench_case, plan,    platform,     settings,   log,
                                   report,        threads, flush.data(), flush_bytes};
        report.results.push_back(time_tokens(timed_case, layer, checked, r.tokens, r.routing));
        const GpuCaseResult& result = report.results.back();
        log.note(fmt::format("{} {} T={} {}: {:.1f} us, {:.1f}% of floor, error {:.1e} {}",
                             r.bench_case->name, format.name(), r.tokens, routing_name(r.routing),
                             result.timing.median_s * 1e6, 100.0 * result.floor_ratio(),
                             result.error, result.ok ? "ok" : "FAILED"));
        if (after_each) after_each(report);
      }
    }
    first = last;
  }
}

std::vector<double> time_on_gpu(int device, int warmup, int repeats,
                                const std::function<void(CUstream_st*)>& enqueue) {
  check(cudaSetDevice(device), "cudaSetDevice");
  Stream stream;
  for (int w = 0; w < warmup; ++w) enqueue(stream.get());
  EventPairs events(repeats);
  for (int r = 0; r < repeats; ++r) {
    events.start(r, stream.get());
    enqueue(stream.get());
    events.stop(r, stream.get());
  }
  check(cudaStreamSynchronize(stream.get()), "the timed forwards");
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) seconds.push_back(events.seconds(r));
  return seconds;
}

}  // namespace moekit::bench
