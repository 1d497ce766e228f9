#include "bench/bench.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <optional>
#include <random>

#include <fmt/format.h>

#include "bench/random_layer.hpp"
#include "core/thread_pool.hpp"
#include "moekit/error.hpp"
#include "moekit/layer.hpp"
#include "moekit/testing.hpp"

namespace moekit::bench {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// A real decode step runs every other layer of the model between two visits to this one, so
// this layer's weights come from memory, not from the last-level cache. Reading a buffer several
// times that cache's size between repeats puts them back there. The read, on every thread, is
// also timed: the memory bandwidth of a shared machine moves from one minute to the next, and a
// ceiling measured next to each repeat keeps floor / time honest when it does.
class CacheFlusher {
 public:
  CacheFlusher(SimdIsa isa, int64_t bytes, int threads)
      : isa_(isa), pool_(ThreadPool::shared(threads)) {
    constexpr int64_t kAtLeast = int64_t{64} << 20;
    const int64_t last_level = std::max<int64_t>(0, sysconf(_SC_LEVEL3_CACHE_SIZE));
    const int64_t n =
        std::max<int64_t>(1, bytes > 0 ? bytes / 4 : std::max(kAtLeast, 4 * last_level) / 4);
    buffer_ = Tensor::empty(DType::f32, {n});
    std::fill_n(buffer_.data<float>(), n, 1.0f);
    partial_.resize(static_cast<size_t>(threads));
  }
  // Reads the whole buffer; returns the bandwidth the read achieved, bytes per second.
  double flush() {
    const float* data = buffer_.data<float>();
    const int64_t n = buffer_.view().numel();
    const auto start = Clock::now();
    pool_.parallel_chunks(n, [&](int64_t begin, int64_t end, int chunk) {
      partial_[chunk] = sum_floats(data + begin, end - begin, isa_);
    });
    const double seconds = seconds_since(start);
    last_sum_ = std::accumulate(partial_.begin(), partial_.end(), 0.0f);
    return static_cast<double>(n) * 4.0 / seconds;
  }

 private:
  SimdIsa isa_;
  // The pool the layers run on (ThreadPool::shared), as a model's other layers would use it: its
  // workers come out of the read spinning, ready for the layer, not spinning beside it.
  ThreadPool& pool_;
  Tensor buffer_;
  std::vector<float> partial_;
  volatile float last_sum_ = 0.0f;  // read by nobody; keeps the reads from being elided
};

// Hot experts get this added to their logits: with unit-normal logits the top 8 of 128 start
// near 1.5, so a hot expert is among nearly every token's choices.
constexpr float kSkewBoost = 3.0f;

Tensor router_logits(const ModelSpec& spec, int64_t tokens, Routing routing, std::mt19937_64& rng) {
  const int E = spec.n_experts;
  Tensor logits = random_tensor({tokens, E}, DType::f32, rng);
  if (routing == Routing::skewed) {
    std::vector<int> experts(static_cast<size_t>(E));
    std::iota(experts.begin(), experts.end(), 0);
    std::shuffle(experts.begin(), experts.end(), rng);
    const int hot = std::max(1, spec.routing.top_k / 2);
    float* values = logits.data<float>();
    for (int64_t t = 0; t < tokens; ++t) {
      for (int h = 0; h < hot; ++h) values[t * E + experts[h]] += kSkewBoost;
    }
  }
  return logits;
}

int median_int(std::vector<int> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

std::string plan_path(const Plan& plan) {
  if (plan.fused_op) return *plan.fused_op;
  return fmt::format("{} core", runner_format_name(plan.core_format));
}

struct TimedRun {
  const BenchCase& bench_case;
  const BenchSettings& settings;
  const BenchLog& log;
  const Ceilings& machine;
  CacheFlusher& flusher;
};

CaseResult time_layer(const TimedRun& run, const Plan& plan, MoeLayer& layer, MoeLayer& reference,
                      int64_t T) {
  const ModelSpec& spec = plan.spec;
  const BenchSettings& settings = run.settings;
  const int k = spec.routing.top_k;
  std::mt19937_64 rng(settings.seed + static_cast<uint64_t>(T));
  const Tensor hidden = random_tensor({T, spec.hidden}, DType::bf16, rng);
  // Fresh routing for every run, made before timing: repeating one routing would leave the
  // same experts' weights in the cache for the next repeat.
  std::vector<Tensor> logits;
  for (int i = 0; i < settings.warmup + settings.repeats; ++i) {
    logits.push_back(router_logits(spec, T, settings.routing, rng));
  }
  Tensor output = Tensor::empty(DType::bf16, {T, spec.hidden});
  const Tensor ids = Tensor::empty(DType::i32, {T, k});
  const Tensor weights = Tensor::empty(DType::f32, {T, k});
  const RoutingResult routing{ids.view(), weights.view()};

  const std::string label = fmt::format("{} {} T={}", run.bench_case.name, plan.quant.name(), T);
  for (int w = 0; w < settings.warmup; ++w) {
    run.log.progress(fmt::format("{}: warm-up {}/{}", label, w + 1, settings.warmup));
    layer.forward(hidden, logits[w], output);
  }
  std::vector<double> seconds;
  std::vector<double> read_bandwidth;
  std::vector<int> distinct;
  const Tensor* last_logits = nullptr;
  for (int r = 0; r < settings.repeats; ++r) {
    run.log.progress(fmt::format("{}: repeat {}/{}", label, r + 1, settings.repeats));
    last_logits = &logits[settings.warmup + r];
    read_bandwidth.push_back(run.flusher.flush());
    output.fill_bytes(0xD5);  // a stale or unwritten output must not pass the check below
    const auto start = Clock::now();
    layer.forward(hidden, *last_logits, output, &routing);
    seconds.push_back(seconds_since(start));
    distinct.push_back(count_distinct_experts(
        {ids.data<const int32_t>(), static_cast<size_t>(T * k)}, spec.n_experts));
    const double spent = std::accumulate(seconds.begin(), seconds.end(), 0.0);
    if (r + 1 >= kMinRepeats && r + 1 < settings.repeats && spent > settings.budget_s) {
      run.log.note(fmt::format("{}: stopped after {} of {} repeats ({:.0f} s budget)", label, r + 1,
                               settings.repeats, settings.budget_s));
      break;
    }
  }

  CaseResult result;
  result.case_name = run.bench_case.name;
  result.spec = spec;
  result.format = plan.quant;
  result.tokens = T;
  result.runner = std::string(runner_name(plan.runner));
  result.path = plan_path(plan);
  result.routing = settings.routing;
  result.timing = Timing::Of(seconds);
  result.distinct_experts = median_int(distinct);
  result.expected_distinct_experts = expected_distinct_experts(spec.n_experts, k, T);
  Ceilings here = run.machine;
  here.read_bytes_per_s = Timing::Of(read_bandwidth).median_s;
  result.read_bytes_per_s = here.read_bytes_per_s;
  result.read_before_bytes_per_s = read_bandwidth.front();
  result.read_after_bytes_per_s = run.flusher.flush();
  // The GEMM the plan's kernels take sets the compute ceiling: bf16 or int8 dot products where
  // they do.
  ComputePeak peak = ComputePeak::fma;
  if (plan.cpu_kernels && plan.cpu_kernels->bf16_rows(DType::bf16)) peak = ComputePeak::bf16_dot;
  if (plan.cpu_kernels && plan.cpu_kernels->int8_gemm) peak = ComputePeak::int8_dot;
  result.roofline =
      Roofline::Of(spec, plan.quant, T, result.distinct_experts, DType::bf16, here, peak);
  // Tokens are routed and computed independently, so the reference layer, planned for a few
  // tokens, checks the first rows of the last timed batch.
  const int64_t n = std::min(T, kCheckedTokens);
  const Tensor expected = Tensor::empty(DType::bf16, {n, spec.hidden});
  reference.forward(hidden.view().narrow(0, 0, n), last_logits->view().narrow(0, 0, n), expected);
  result.error = relative_l2(output.view().narrow(0, 0, n), expected);
  result.ok = result.error <= kBf16Tolerance;
  return result;
}

}  // namespace

Timing Timing::Of(std::vector<double> seconds) {
  if (seconds.empty()) fail(Errc::internal, "Timing::Of: no repeats");
  std::sort(seconds.begin(), seconds.end());
  return {seconds[seconds.size() / 2], seconds.front(), seconds.back(),
          static_cast<int>(seconds.size())};
}

bool BenchReport::all_ok() const {
  return std::all_of(results.begin(), results.end(), [](const CaseResult& r) { return r.ok; });
}

void run_case(const BenchCase& bench_case, const Options& options, const Platform& platform,
              const BenchSettings& settings, const BenchLog& log, BenchReport& report) {
  require(settings.repeats >= 1 && settings.warmup >= 0,
          "bench: --repeats must be at least 1 and --warmup at least 0 (got {} and {})",
          settings.repeats, settings.warmup);
  require(!bench_case.tokens.empty(), "bench: case {} has no token counts", bench_case.name);
  const ModelSpec& spec = bench_case.spec;
  const int threads = report.machine.threads;
  std::optional<RandomWeights> source;  // made once, read by every format
  std::optional<CacheFlusher> flusher;
  const auto setup_done = [&report](Clock::time_point start) {
    const double seconds = seconds_since(start);
    report.setup_s += seconds;
    return seconds;
  };
  for (const QuantParams& format : bench_case.formats) {
    const std::string format_name = format.name();
    if (format.activation == ActivationQuant::fp8_static) {
      fail(Errc::invalid_argument,
           "bench: fp8 static activations need input scales calibrated from a checkpoint; use "
           "--activations dynamic");
    }
    Options timed = options;
    timed.weights = format;
    timed.max_tokens = *std::max_element(bench_case.tokens.begin(), bench_case.tokens.end());
    const Resolution resolution = try_resolve(spec, timed, platform);
    if (!resolution.plan) {
      report.refusals.push_back({bench_case.name, format_name, resolution.refusal});
      log.note(fmt::format("{} {}: {}", bench_case.name, format_name, resolution.refusal));
      continue;
    }
    if (options.device.kind != DeviceKind::cpu) {
      // Its roofline would need the GPU's own bandwidth and peak, which come with the GPU
      // runners; against the CPU's ceilings the ratios would mean nothing.
      const std::string why = fmt::format(
          "refused: moekit bench measures CPU ceilings only; timing on {} comes with the GPU "
          "runners",
          options.device.str());
      report.refusals.push_back({bench_case.name, format_name, why});
      log.note(fmt::format("{} {}: {}", bench_case.name, format_name, why));
      continue;
    }
    if (!source) {
      const auto start = Clock::now();
      source = fast_random_weights(spec, settings.seed, threads);
      const int64_t count = source->w13.view().numel() + source->w2.view().numel();
      log.note(fmt::format("{}: {} random bf16 expert weights ({:.2f} GB) in {:.1f} s",
                           bench_case.name, count, 2e-9 * static_cast<double>(count),
                           setup_done(start)));
      flusher.emplace(report.machine.isa, settings.flush_bytes, threads);
    }
    LayerWeights given = source->view();
    QuantizedLayerWeights quantized;
    if (format.quantized()) {
      const auto start = Clock::now();
      quantized = quantize_layer(given, format);
      given = quantized.view();
      log.note(fmt::format("{} {}: quantised ({}) in {:.1f} s", bench_case.name, format_name,
                           format.describe(), setup_done(start)));
    }
    Options checking = timed;
    checking.runner = RunnerKind::reference;
    checking.form = BlockForm::standard;
    checking.max_tokens = kCheckedTokens;
    auto start = Clock::now();
    MoeLayer reference(resolve(spec, checking, platform), given);
    log.note(fmt::format("{} {}: reference layer built in {:.1f} s", bench_case.name, format_name,
                         setup_done(start)));
    const TimedRun run{bench_case, settings, log, report.machine, *flusher};
    for (const int64_t T : bench_case.tokens) {
      timed.max_tokens = T;
      const Plan plan = resolve(spec, timed, platform);
      start = Clock::now();
      MoeLayer layer(plan, given);
      log.note(fmt::format("{} {} T={}: {} layer ({}) built in {:.1f} s", bench_case.name,
                           format_name, T, runner_name(plan.runner), plan_path(plan),
                           setup_done(start)));
      report.results.push_back(time_layer(run, plan, layer, reference, T));
    }
  }
}

}  // namespace moekit::bench
