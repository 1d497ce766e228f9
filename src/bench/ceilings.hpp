#pragma once
// The machine's own ceilings, measured in the run that reports ratios to them: read bandwidth
// (a large f32 array summed by every thread) and the fp32 FMA peak (independent FMA chains that
// never touch memory). The peak is measured with AVX2+FMA, the ISA the CPU kernels use, even on
// machines with wider vectors.

#include <cstdint>
#include <string_view>

#include "moekit/platform.hpp"

namespace moekit::bench {

enum class SimdIsa { avx2_fma, portable, avx512_vnni };
std::string_view simd_isa_name(SimdIsa isa);  // "avx2+fma", "portable", "avx512-vnni"
// avx2_fma when the CPU running this has AVX2 and FMA.
SimdIsa best_simd_isa();

// How much work one measurement does.
struct CeilingSizes {
  int64_t read_bytes = 0;      // the array summed; far larger than the last-level cache
  int read_passes = 0;         // the median pass is reported
  int64_t fma_iterations = 0;  // per thread and pass
  int fma_passes = 0;

  // 1 GiB read 7 times; FMA passes of about 40 ms at 3 GHz.
  static CeilingSizes Full();
  // A few milliseconds in all, for tests: the numbers mean little.
  static CeilingSizes Tiny();
};

struct Ceilings {
  int threads = 1;
  SimdIsa isa = SimdIsa::portable;  // the ISA of both measurements
  double read_bytes_per_s = 0.0;
  double fma_flops_per_s = 0.0;
  // AVX-512 BF16 dot products (512-bit vdpbf16ps) where the CPU has them, else 0: the rate of the
  // bf16 GEMM (use_bf16_gemm), which on some CPUs is twice the FMA's.
  double bf16_dot_flops_per_s = 0.0;
  // 8-bit integer dot products, unsigned x signed bytes (a multiply-add is two ops): 512-bit
  // vpdpbusd with AVX-512 VNNI, else 256-bit pmaddubsw with AVX2, else 0. The rate of the int8
  // GEMM (int4-group-a8's prefill).
  double int8_dot_ops_per_s = 0.0;
  SimdIsa int8_isa = SimdIsa::portable;  // avx512_vnni or avx2_fma where measured
  // CPU time this process got while measuring, over threads x wall time: well below 1 means
  // other work shared the cores, and every figure of the run is low by about that much.
  double cpu_share = 1.0;

  // The dot-product peaks are those of the instructions `platform` has (the probed machine, or
  // the features a bench run restricts its plans to).
  static Ceilings Measure(int threads, const CeilingSizes& sizes,
                          const Platform& platform = Platform::probe());
  // Figures measured elsewhere (tests, or a run being re-read).
  static Ceilings Known(int threads, SimdIsa isa, double read_bytes_per_s, double fma_flops_per_s,
                        double bf16_dot_flops_per_s = 0.0);
};

// Bytes per second of summing `bytes` of f32 with `threads` threads, the median of `passes`.
double measure_read_bandwidth(int threads, int64_t bytes, int passes, SimdIsa isa);
// fp32 FLOPs per second (an FMA is two) of `threads` threads, the median of `passes`.
double measure_fma_peak(int threads, int64_t iterations, int passes, SimdIsa isa);

// bf16 dot-product FLOPs per second (each pair's two multiply-adds are four) of `threads` threads,
// the median of `passes`. Needs AVX-512 BF16 (Errc::internal on a CPU without it).
double measure_bf16_dot_peak(int threads, int64_t iterations, int passes);

// int8 dot-product ops per second (each byte pair's multiply-add is two) of `threads` threads,
// the median of `passes`: vpdpbusd (zmm) chains with isa avx512_vnni, pmaddubsw (ymm) chains
// with avx2_fma. Errc::internal on a CPU without that ISA, or for portable.
double measure_int8_dot_peak(int threads, int64_t iterations, int passes, SimdIsa isa);
// Its chains on one thread (ceilings_avx512vnni.cpp for VNNI): kDotChains accumulators.
int32_t int8_dot_chains_vnni(int64_t iterations);

// The chains of measure_bf16_dot_peak on one thread (ceilings_avx512bf16.cpp): kDotChains
// accumulators of 16 f32 lanes, `iterations` dot products each; returns their sum.
inline constexpr int kDotChains = 12;
float bf16_dot_chains(int64_t iterations);

// The sum of n floats, read once at full speed on one thread; the benchmark also uses it to
// push a layer's weights out of the caches between repeats.
float sum_floats(const float* data, int64_t n, SimdIsa isa);

}  // namespace moekit::bench
