#include "bench/ceilings.hpp"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <ctime>
#include <vector>

#include "core/thread_pool.hpp"
#include "moekit/error.hpp"
#include "moekit/platform.hpp"
#include "moekit/tensor.hpp"

namespace moekit::bench {
namespace {

// Independent accumulators per thread: an FMA has a latency of 4-5 cycles and two issue
// ports, so at least 10 chains must be in flight to keep both ports busy every cycle.
constexpr int kChains = 12;
constexpr int kLanes = 8;  // f32 lanes of a ymm register

__attribute__((target("avx2,fma"))) float sum_avx2(const float* data, int64_t n) {
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    for (int j = 0; j < 4; ++j) {
      acc[j] = _mm256_add_ps(acc[j], _mm256_loadu_ps(data + i + j * kLanes));
    }
  }
  const __m256 both = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
  alignas(32) float lanes[kLanes];
  _mm256_store_ps(lanes, both);
  float sum = 0.0f;
  for (float v : lanes) sum += v;
  for (; i < n; ++i) sum += data[i];
  return sum;
}

float sum_portable(const float* data, int64_t n) {
  std::array<float, 4 * kLanes> acc{};
  int64_t i = 0;
  for (; i + 4 * kLanes <= n; i += 4 * kLanes) {
    for (int j = 0; j < 4 * kLanes; ++j) acc[j] += data[i + j];
  }
  float sum = 0.0f;
  for (float v : acc) sum += v;
  for (; i < n; ++i) sum += data[i];
  return sum;
}

// c = c * a + b converges to b / (1 - a) = 1, so no chain overflows or turns subnormal however
// long it runs, and the compiler cannot fold the chains away.
constexpr float kFmaA = 0.999f;
constexpr float kFmaB = 0.001f;

// pmaddubsw chains: each product of one is the bytes of the next, so none can be hoisted (the
// values saturate and mean nothing).
__attribute__((target("avx2"))) int32_t int8_dot_chains_avx2(int64_t iterations) {
  const __m256i b = _mm256_set1_epi8(-5);
  __m256i c[kDotChains];
  for (int j = 0; j < kDotChains; ++j) c[j] = _mm256_set1_epi8(static_cast<char>(j + 1));
  for (int64_t it = 0; it < iterations; ++it) {
    for (int j = 0; j < kDotChains; ++j) c[j] = _mm256_maddubs_epi16(c[j], b);
  }
  __m256i total = c[0];
  for (int j = 1; j < kDotChains; ++j) total = _mm256_add_epi32(total, c[j]);
  alignas(32) int32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), total);
  int32_t sum = 0;
  for (int32_t v : lanes) sum ^= v;
  return sum;
}

__attribute__((target("avx2,fma"))) float fma_chains_avx2(int64_t iterations) {
  const __m256 a = _mm256_set1_ps(kFmaA);
  const __m256 b = _mm256_set1_ps(kFmaB);
  __m256 c[kChains];
  for (int j = 0; j < kChains; ++j) c[j] = _mm256_set1_ps(static_cast<float>(j) * 0.1f);
  for (int64_t it = 0; it < iterations; ++it) {
    for (int j = 0; j < kChains; ++j) c[j] = _mm256_fmadd_ps(c[j], a, b);
  }
  __m256 total = c[0];
  for (int j = 1; j < kChains; ++j) total = _mm256_add_ps(total, c[j]);
  alignas(32) float lanes[kLanes];
  _mm256_store_ps(lanes, total);
  float sum = 0.0f;
  for (float v : lanes) sum += v;
  return sum;
}

float fma_chains_portable(int64_t iterations) {
  std::array<float, kChains * kLanes> c{};
  for (int j = 0; j < kChains * kLanes; ++j) c[j] = static_cast<float>(j) * 0.01f;
  for (int64_t it = 0; it < iterations; ++it) {
    for (float& v : c) v = v * kFmaA + kFmaB;
  }
  float sum = 0.0f;
  for (float v : c) sum += v;
  return sum;
}

double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

template <typename Pass>
std::vector<double> time_passes(int passes, Pass pass) {
  std::vector<double> seconds;
  for (int p = 0; p < passes; ++p) {
    const auto start = std::chrono::steady_clock::now();
    pass();
    seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return seconds;
}

// A result nobody reads could be optimised away with the work that made it.
void consume(double total, const char* what) {
  if (!std::isfinite(total)) fail(Errc::internal, "{}: the measurement summed to {}", what, total);
}

double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

}  // namespace

std::string_view simd_isa_name(SimdIsa isa) {
  switch (isa) {
    case SimdIsa::avx2_fma:
      return "avx2+fma";
    case SimdIsa::avx512_vnni:
      return "avx512-vnni";
    case SimdIsa::portable:
      break;
  }
  return "portable";
}

SimdIsa best_simd_isa() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? SimdIsa::avx2_fma
                                                                         : SimdIsa::portable;
}

CeilingSizes CeilingSizes::Full() {
  return {.read_bytes = int64_t{1} << 30,
          .read_passes = 7,
          .fma_iterations = 20'000'000,
          .fma_passes = 5};
}

CeilingSizes CeilingSizes::Tiny() {
  return {
      .read_bytes = int64_t{1} << 20, .read_passes = 3, .fma_iterations = 10'000, .fma_passes = 3};
}

Ceilings Ceilings::Measure(int threads, const CeilingSizes& sizes, const Platform& platform) {
  const SimdIsa isa = best_simd_isa();
  const double cpu_start = process_cpu_seconds();
  const auto start = std::chrono::steady_clock::now();
  Ceilings c =
      Known(threads, isa, measure_read_bandwidth(threads, sizes.read_bytes, sizes.read_passes, isa),
            measure_fma_peak(threads, sizes.fma_iterations, sizes.fma_passes, isa));
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  c.cpu_share = (process_cpu_seconds() - cpu_start) / (wall * threads);
  // Measured after the CPU share: wider than the FMA's, a gap in it would not change the share.
  if (platform.avx512_bf16) {
    c.bf16_dot_flops_per_s = measure_bf16_dot_peak(threads, sizes.fma_iterations, sizes.fma_passes);
  }
  // The int8 GEMM's instruction: vpdpbusd with VNNI, else AVX2's pmaddubsw (choose_cpu_kernels).
  c.int8_isa = platform.avx512_vnni ? SimdIsa::avx512_vnni : isa;
  if (c.int8_isa != SimdIsa::portable) {
    c.int8_dot_ops_per_s =
        measure_int8_dot_peak(threads, sizes.fma_iterations, sizes.fma_passes, c.int8_isa);
  }
  return c;
}

Ceilings Ceilings::Known(int threads, SimdIsa isa, double read_bytes_per_s, double fma_flops_per_s,
                         double bf16_dot_flops_per_s) {
  return {threads, isa, read_bytes_per_s, fma_flops_per_s, bf16_dot_flops_per_s};
}

float sum_floats(const float* data, int64_t n, SimdIsa isa) {
  return isa == SimdIsa::avx2_fma ? sum_avx2(data, n) : sum_portable(data, n);
}

double measure_read_bandwidth(int threads, int64_t bytes, int passes, SimdIsa isa) {
  require(threads >= 1 && passes >= 1 && bytes >= 4,
          "read bandwidth: needs threads >= 1, passes >= 1 and 4 bytes or more (got {}, {}, {})",
          threads, passes, bytes);
  const int64_t n = bytes / 4;
  const Tensor array = Tensor::empty(DType::f32, {n});
  float* data = array.data<float>();
  ThreadPool pool(threads);
  // Each thread writes the part it will read, so its pages are faulted in before timing and,
  // on a multi-socket machine, sit near the thread that reads them.
  pool.parallel_for(n,
                    [&](int64_t begin, int64_t end) { std::fill(data + begin, data + end, 1.0f); });
  std::vector<float> partial(static_cast<size_t>(threads));
  const auto pass = [&] {
    pool.parallel_chunks(n, [&](int64_t begin, int64_t end, int chunk) {
      partial[chunk] = sum_floats(data + begin, end - begin, isa);
    });
  };
  pass();  // warms the TLB and the pool's threads
  const double seconds = median_of(time_passes(passes, pass));
  double total = 0.0;
  for (float v : partial) total += v;
  consume(total, "read bandwidth");
  return static_cast<double>(n) * 4.0 / seconds;
}

double measure_fma_peak(int threads, int64_t iterations, int passes, SimdIsa isa) {
  require(threads >= 1 && passes >= 1 && iterations >= 1,
          "fma peak: needs threads, passes and iterations >= 1 (got {}, {}, {})", threads, passes,
          iterations);
  ThreadPool pool(threads);
  std::vector<float> partial(static_cast<size_t>(threads));
  const auto pass = [&] {
    pool.parallel_chunks(threads, [&](int64_t, int64_t, int chunk) {
      partial[chunk] =
          isa == SimdIsa::avx2_fma ? fma_chains_avx2(iterations) : fma_chains_portable(iterations);
    });
  };
  pass();  // lets the clock ramp up under load
  const double seconds = median_of(time_passes(passes, pass));
  double total = 0.0;
  for (float v : partial) total += v;
  consume(total, "fma peak");
  const double flops = 2.0 * kChains * kLanes * static_cast<double>(iterations) * threads;
  return flops / seconds;
}

double measure_bf16_dot_peak(int threads, int64_t iterations, int passes) {
  require(threads >= 1 && passes >= 1 && iterations >= 1,
          "bf16 dot peak: needs threads, passes and iterations >= 1 (got {}, {}, {})", threads,
          passes, iterations);
  // Without the instructions the chains would die on SIGILL; an error names the caller's bug.
  if (!Platform::probe().avx512_bf16) {
    fail(Errc::internal, "bf16 dot peak: this CPU has no AVX-512 BF16");
  }
  ThreadPool pool(threads);
  std::vector<float> partial(static_cast<size_t>(threads));
  const auto pass = [&] {
    pool.parallel_chunks(threads, [&](int64_t, int64_t, int chunk) {
      partial[chunk] = bf16_dot_chains(iterations);
    });
  };
  pass();  // lets the clock ramp up under load
  const double seconds = median_of(time_passes(passes, pass));
  double total = 0.0;
  for (float v : partial) total += v;
  consume(total, "bf16 dot peak");
  constexpr double kFlopsPerDot = 16 * 2 * 2;  // 16 lanes, two multiply-adds each
  return kFlopsPerDot * kDotChains * static_cast<double>(iterations) * threads / seconds;
}

double measure_int8_dot_peak(int threads, int64_t iterations, int passes, SimdIsa isa) {
  require(threads >= 1 && passes >= 1 && iterations >= 1,
          "int8 dot peak: needs threads, passes and iterations >= 1 (got {}, {}, {})", threads,
          passes, iterations);
  const Platform machine = Platform::probe();
  const bool vnni = isa == SimdIsa::avx512_vnni;
  if (vnni ? !machine.avx512_vnni : isa != SimdIsa::avx2_fma || !machine.avx2) {
    fail(Errc::internal, "int8 dot peak: this CPU cannot run {}", simd_isa_name(isa));
  }
  ThreadPool pool(threads);
  std::vector<int32_t> partial(static_cast<size_t>(threads));
  const auto pass = [&] {
    pool.parallel_chunks(threads, [&](int64_t, int64_t, int chunk) {
      partial[chunk] = vnni ? int8_dot_chains_vnni(iterations) : int8_dot_chains_avx2(iterations);
    });
  };
  pass();  // lets the clock ramp up under load
  const double seconds = median_of(time_passes(passes, pass));
  int32_t total = 0;
  for (int32_t v : partial) total ^= v;
  consume(static_cast<double>(total), "int8 dot peak");
  // Byte pairs per instruction: 64 (zmm) or 32 (ymm), a multiply-add each.
  const double ops_per_dot = vnni ? 64 * 2 : 32 * 2;
  return ops_per_dot * kDotChains * static_cast<double>(iterations) * threads / seconds;
}

}  // namespace moekit::bench
