// A standalone benchmark of the expert GEMMs (GEMM1 with the activation, the fp8 quantisation
// of its output, GEMM2) on the DeepSeek-V3 and Qwen3-30B-A3B shapes with uniform random routing.
// Each case is captured into CUDA graphs (both GEMMs, and each GEMM alone) for 8 routings drawn
// afresh and timed with CUDA events, the routings rotated so that consecutive runs hit other
// experts (the weights of a whole layer are far larger than L2); the median of 30 runs after 5
// warm-ups, all enqueued before the first is waited for.
// floor = max(bytes of the distinct experts' weights / 4.44 TB/s, FLOPs / tensor peak).
//
//   gemm_bench [--quick | --prefill] [--no-others] [--json FILE]
//     --quick      T <= 64 only
//     --prefill    T >= 512 only
//     --no-others  only the heuristic's choice (not also the other kernels on each case, nor, for
//                  fp8, the quantisation kernel in place of GEMM1's own quantisation)
//     --json FILE  the results as JSON
// prints one line per case, a table, and a one-line summary last.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "runner/cuda/gemm/expert_gemm.hpp"

namespace {

using namespace moekit;
using namespace moekit::cuda_gemm;

constexpr double kBandwidth = 4.44e12;  // H200 HBM3e, bytes/s
constexpr double kPeakBf16 = 989e12;    // dense, H200 datasheet
constexpr double kPeakFp8 = 1979e12;
constexpr int kRoutings = 8, kWarmup = 5, kRuns = 30;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Fills n bytes with random 16-bit values of about 1/sqrt(k), or e4m3 codes (no NaN).
__global__ void fill_random(uint8_t* p, int64_t n, uint32_t seed, int kind, float scale) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n / (kind == 2 ? 1 : 2);
       i += int64_t{gridDim.x} * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float u = (static_cast<float>(h & 0xFFFFFF) / 16777216.0f - 0.5f) * 2.0f * scale;
    if (kind == 2) {
      p[i] = static_cast<uint8_t>((h >> 24) % 0x7E) | static_cast<uint8_t>(h & 0x80);
    } else if (kind == 0) {
      const uint32_t b = __float_as_uint(u);
      reinterpret_cast<uint16_t*>(p)[i] = static_cast<uint16_t>(b >> 16);
    } else {
      reinterpret_cast<__half*>(p)[i] = __float2half(u);
    }
  }
}

__global__ void fill_value(float* p, int64_t n, float v) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    p[i] = v;
}

void* device_random(int64_t bytes, DType dtype, uint32_t seed, float scale) {
  void* p = nullptr;
  check(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(bytes, 16))), "cudaMalloc");
  fill_random<<<1024, 256>>>(static_cast<uint8_t*>(p), bytes, seed,
                             dtype == DType::f8e4m3 ? 2
                             : dtype == DType::bf16 ? 0
                                                    : 1,
                             scale);
  return p;
}

float* device_floats(int64_t n, float v) {
  float* p = nullptr;
  check(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(n, 4)) * 4), "cudaMalloc");
  fill_value<<<256, 256>>>(p, n, v);
  return p;
}

struct Model {
  const char* name;
  int E, k, H, I;
};

struct Result {
  std::string label;
  double ms_total, ms_gemm1, ms_gemm2, floor_ms, tbps, tflops;
  std::string choice;
};

double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// own_quantization: fp8's GEMM1 quantises GEMM2's input itself (where gemm1_quantizes allows),
// else quantize_rows_e4m3 runs after it.
Result run_case(const Model& m, DType dtype, int T, const GemmChoice& choice, bool own_quantization,
                void* w13, void* w2, float* w13_scales, float* w2_scales) {
  const bool fp8 = dtype == DType::f8e4m3;
  const int eb = fp8 ? 1 : 2;
  const int64_t rows = static_cast<int64_t>(T) * m.k;
  std::mt19937 rng(1234u + static_cast<uint32_t>(T));
  std::vector<int32_t*> offsets(kRoutings);
  std::vector<double> hit_bytes(kRoutings);
  for (int r = 0; r < kRoutings; ++r) {
    std::vector<int> counts(m.E, 0), ids(m.E);
    std::iota(ids.begin(), ids.end(), 0);
    for (int t = 0; t < T; ++t) {
      for (int j = 0; j < m.k; ++j) {  // k distinct experts, uniformly
        std::uniform_int_distribution<int> pick(j, m.E - 1);
        std::swap(ids[j], ids[pick(rng)]);
        ++counts[ids[j]];
      }
    }
    std::vector<int32_t> off(m.E + 1, 0);
    int hit = 0;
    for (int e = 0; e < m.E; ++e) {
      off[e + 1] = off[e] + counts[e];
      hit += counts[e] > 0;
    }
    hit_bytes[r] = static_cast<double>(hit) * 3.0 * m.I * m.H * eb;
    check(cudaMalloc(&offsets[r], off.size() * 4), "cudaMalloc");
    check(cudaMemcpy(offsets[r], off.data(), off.size() * 4, cudaMemcpyHostToDevice), "copy");
  }
  void* x = device_random(rows * m.H * eb, fp8 ? DType::f8e4m3 : dtype, 99u, 1.0f);
  const int kb_h = (m.H + 127) / 128, kb_i = (m.I + 127) / 128;
  float* x_scales = device_floats(rows * kb_h, 1.0f / 448.0f);
  void* act = nullptr;
  check(cudaMalloc(&act, static_cast<size_t>(rows) * m.I * (fp8 ? 4 : 2)), "cudaMalloc");
  uint8_t* act_q = nullptr;
  check(cudaMalloc(&act_q, static_cast<size_t>(rows) * m.I), "cudaMalloc");
  float* act_scales = device_floats(rows * kb_i, 0.0f);
  float* route = device_floats(rows, 0.5f);
  float* out = device_floats(rows * m.H, 0.0f);
  // Split K's partial sums and its counters, zero before the first launch.
  const SplitKSize split1 = split_k_size(choice, true, rows, m.E, m.I),
                   split2 = split_k_size(choice, false, rows, m.E, m.H);
  float* partials1 = device_floats(split1.partials, 0.0f);
  float* partials2 = device_floats(split2.partials, 0.0f);
  auto* counters =
      reinterpret_cast<uint32_t*>(device_floats(split1.counters + split2.counters, 0.0f));

  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  std::vector<cudaGraphExec_t> g1(kRoutings), g2(kRoutings), both(kRoutings);
  const Fp8Scales s13{w13_scales, 128, 128, x_scales, 128, false};
  const Fp8Scales s2{w2_scales, 128, 128, act_scales, 128, false};
  const bool quantizes = fp8 && own_quantization && gemm1_quantizes(choice, 128, false);
  Gemm1Quantized quantized{};
  if (quantizes) quantized = {.out = act_q, .scales = act_scales};
  const auto first_gemm = [&](int r) {
    launch_gemm1({.dtype = dtype,
                  .x = x,
                  .w13 = w13,
                  .scales = fp8 ? s13 : Fp8Scales{},
                  .offsets = offsets[r],
                  .num_experts = m.E,
                  .rows = rows,
                  .hidden = m.H,
                  .intermediate = m.I,
                  .activation = Activation::SiluGated(),
                  .act = act,
                  .quantized = quantized,
                  .choice = choice,
                  .split = {.partials = partials1, .counters = counters},
                  .entries = {}},
                 stream);
    if (fp8 && !quantizes) {
      launch_quantize_rows_e4m3({.in = static_cast<float*>(act),
                                 .offsets = offsets[r],
                                 .num_experts = m.E,
                                 .rows = rows,
                                 .cols = m.I,
                                 .group = 128,
                                 .static_scale = nullptr,
                                 .out = act_q,
                                 .scales = act_scales},
                                stream);
    }
  };
  const auto second_gemm = [&](int r) {
    launch_gemm2({.dtype = dtype,
                  .act = fp8 ? static_cast<void*>(act_q) : act,
                  .w2 = w2,
                  .scales = fp8 ? s2 : Fp8Scales{},
                  .offsets = offsets[r],
                  .num_experts = m.E,
                  .rows = rows,
                  .hidden = m.H,
                  .intermediate = m.I,
                  .route_weight = route,
                  .out = out,
                  .choice = choice,
                  .split = {.partials = partials2, .counters = counters + split1.counters},
                  .entries = {}},
                 stream);
  };
  const auto capture = [&](cudaGraphExec_t& exec, auto&& body) {
    cudaGraph_t graph;
    check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
    body();
    check(cudaStreamEndCapture(stream, &graph), "end capture");
    check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
    cudaGraphDestroy(graph);
  };
  for (int r = 0; r < kRoutings; ++r) {
    capture(g1[r], [&] { first_gemm(r); });
    capture(g2[r], [&] { second_gemm(r); });
    capture(both[r], [&] {
      first_gemm(r);
      second_gemm(r);
    });
  }
  // All runs enqueued before the first is waited for, so that the GPU never waits for the host
  // between them: the whole layer's GEMMs as one graph, then each GEMM as its own.
  constexpr int kIterations = kWarmup + kRuns;
  std::vector<cudaEvent_t> ev(3 * kIterations + 1);
  for (auto& e : ev) check(cudaEventCreate(&e), "event");
  for (int it = 0; it < kIterations; ++it) {
    check(cudaEventRecord(ev[2 * it], stream), "record");
    check(cudaGraphLaunch(both[it % kRoutings], stream), "launch");
    check(cudaEventRecord(ev[2 * it + 1], stream), "record");
  }
  check(cudaStreamSynchronize(stream), "sync");
  std::vector<float> total, first, second;
  for (int it = kWarmup; it < kIterations; ++it) {
    float t = 0;
    check(cudaEventElapsedTime(&t, ev[2 * it], ev[2 * it + 1]), "elapsed");
    total.push_back(t);
  }
  for (int it = 0; it < kIterations; ++it) {
    check(cudaEventRecord(ev[3 * it], stream), "record");
    check(cudaGraphLaunch(g1[it % kRoutings], stream), "launch");
    check(cudaEventRecord(ev[3 * it + 1], stream), "record");
    check(cudaGraphLaunch(g2[it % kRoutings], stream), "launch");
    check(cudaEventRecord(ev[3 * it + 2], stream), "record");
  }
  check(cudaStreamSynchronize(stream), "sync");
  double bytes = 0.0;
  for (int it = kWarmup; it < kIterations; ++it) {
    float a = 0, b = 0;
    check(cudaEventElapsedTime(&a, ev[3 * it], ev[3 * it + 1]), "elapsed");
    check(cudaEventElapsedTime(&b, ev[3 * it + 1], ev[3 * it + 2]), "elapsed");
    first.push_back(a);
    second.push_back(b);
    bytes += hit_bytes[it % kRoutings];
  }
  bytes /= kRuns;
  const double flops = 2.0 * static_cast<double>(rows) * 3.0 * m.I * m.H;
  const double floor_ms = std::max(bytes / kBandwidth, flops / (fp8 ? kPeakFp8 : kPeakBf16)) * 1e3;
  Result res;
  res.label = std::string(m.name) + " " + (fp8 ? "fp8-block" : "bf16") + " T=" + std::to_string(T);
  res.ms_total = median(total);
  res.ms_gemm1 = median(first);
  res.ms_gemm2 = median(second);
  res.floor_ms = floor_ms;
  res.tbps = bytes / (res.ms_total * 1e-3) / 1e12;
  res.tflops = flops / (res.ms_total * 1e-3) / 1e12;
  res.choice = choice.str() + (quantizes ? "+q" : "");
  std::printf(
      "%-28s %-11s total %9.1f us  gemm1 %9.1f  gemm2 %9.1f  floor %9.1f us  %5.1f%%  "
      "%5.2f TB/s  %6.1f TFLOP/s\n",
      res.label.c_str(), res.choice.c_str(), res.ms_total * 1e3, res.ms_gemm1 * 1e3,
      res.ms_gemm2 * 1e3, floor_ms * 1e3, 100.0 * floor_ms / res.ms_total, res.tbps, res.tflops);
  std::fflush(stdout);
  for (int r = 0; r < kRoutings; ++r) {
    cudaGraphExecDestroy(g1[r]);
    cudaGraphExecDestroy(g2[r]);
    cudaGraphExecDestroy(both[r]);
    cudaFree(offsets[r]);
  }
  for (auto& e : ev) cudaEventDestroy(e);
  cudaStreamDestroy(stream);
  for (void* p :
       {x, act, static_cast<void*>(act_q), static_cast<void*>(act_scales),
        static_cast<void*>(route), static_cast<void*>(out), static_cast<void*>(x_scales),
        static_cast<void*>(partials1), static_cast<void*>(partials2), static_cast<void*>(counters)})
    cudaFree(p);
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, prefill = false, others = true;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      quick = true;
    } else if (arg == "--prefill") {
      prefill = true;
    } else if (arg == "--no-others") {
      others = false;
    } else if (arg == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      std::fprintf(stderr, "gemm_bench: unknown argument '%s'\n", arg.c_str());
      return 2;
    }
  }
  int sm_count = 0, major = 0, minor = 0;
  check(cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0), "SM count");
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), "capability");
  check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0), "capability");
  const int cc = major * 10 + minor;
  const Model dsv3{"DeepSeek-V3", 256, 8, 7168, 2048}, qwen{"Qwen3-30B-A3B", 128, 8, 2048, 768},
      mixtral{"Mixtral-8x7B", 8, 2, 4096, 14336};
  std::vector<Result> results;
  for (const Model& m : {dsv3, qwen, mixtral}) {
    const std::vector<int> ts = m.E == dsv3.E   ? std::vector<int>{1, 8, 64, 4096, 16384}
                                : m.E == qwen.E ? std::vector<int>{1, 8, 64, 512, 4096}
                                                : std::vector<int>{1, 2, 64, 1024};
    for (DType dtype : {DType::bf16, DType::f8e4m3}) {
      const bool fp8 = dtype == DType::f8e4m3;
      const int eb = fp8 ? 1 : 2;
      const int64_t n13 = int64_t{m.E} * 2 * m.I * m.H, n2 = int64_t{m.E} * m.H * m.I;
      void* w13 = device_random(n13 * eb, dtype, 1u, 1.0f / std::sqrt(float(m.H)));
      void* w2 = device_random(n2 * eb, dtype, 2u, 1.0f / std::sqrt(float(m.I)));
      const int kb_h = (m.H + 127) / 128, kb_i = (m.I + 127) / 128;
      float* w13_scales = device_floats(int64_t{m.E} * 2 * kb_i * kb_h, 1e-3f);
      float* w2_scales = device_floats(int64_t{m.E} * kb_h * kb_i, 1e-3f);
      check(cudaDeviceSynchronize(), "init");
      for (int T : ts) {
        if ((quick && T > 64) || (prefill && T < 512)) continue;
        const GemmChoice chosen =
            choose_gemm({dtype, int64_t{T} * m.k, m.E, m.H, m.I, sm_count, cc});
        // As the runner does: GEMM1 quantises GEMM2's input itself where its kernel can.
        results.push_back(run_case(m, dtype, T, chosen, true, w13, w2, w13_scales, w2_scales));
        // The other kernels and tiles on the same case, to check the heuristic against, and
        // for fp8 the quantisation kernel instead of GEMM1's own.
        if (!others) continue;
        if (fp8 && gemm1_quantizes(chosen, 128, false)) {
          std::printf("  other: ");
          run_case(m, dtype, T, chosen, false, w13, w2, w13_scales, w2_scales);
        }
        for (const GemmChoice& other :
             {GemmChoice{GemmKernel::decode, 8, 1, 1}, GemmChoice{GemmKernel::prefill, 64, 1, 1},
              GemmChoice{GemmKernel::prefill, 128, 1, 1}, GemmChoice{GemmKernel::wgmma, 64, 1, 1},
              GemmChoice{GemmKernel::wgmma, 128, 1, 1},
              // wgmma's CTAs of 128 weight rows: both GEMMs, GEMM2 alone, GEMM1 alone.
              GemmChoice{GemmKernel::wgmma, 64, 1, 1, 128, 128},
              GemmChoice{GemmKernel::wgmma, 64, 1, 1, 256, 128},
              GemmChoice{GemmKernel::wgmma, 64, 1, 1, 128, 256},
              // The decode tiles (weights on wgmma's M side), wide and narrow.
              GemmChoice{GemmKernel::wgmma, 8, 1, 1}, GemmChoice{GemmKernel::wgmma, 16, 1, 1},
              GemmChoice{GemmKernel::wgmma, 8, 1, 1, 128, 128},
              GemmChoice{GemmKernel::wgmma, 16, 1, 1, 128, 128},
              // Split K on the decode tile of 8, against the heuristic's count.
              GemmChoice{.kernel = GemmKernel::wgmma,
              .token_tile = 8,
              .gemm1_splits = 2,
              .gemm2_splits = 2},
              GemmChoice{.kernel = GemmKernel::wgmma, .token_tile = 8, .gemm2_splits = 2},
              GemmChoice{.kernel = GemmKernel::wgmma, .token_tile = 8, .gemm2_splits = 4},
              GemmChoice{.kernel = GemmKernel::wgmma,
              .token_tile = 8,
              .gemm1_splits = 3,
              .gemm2_splits = 2},
              GemmChoice{.kernel = GemmKernel::wgmma,
              .token_tile = 8,
              .gemm1_splits = 4,
              .gemm2_splits = 4},
              GemmChoice{.kernel = GemmKernel::wgmma,
              .token_tile = 8,
              .gemm1_cols = 128,
              .gemm2_cols = 128,
              .gemm1_splits = 2,
              .gemm2_splits = 2}}) {
          if (other.str() == chosen.str()) continue;
          if (other.kernel == GemmKernel::wgmma && cc != 90) continue;
          // Decode past a few dozen rows per expert is far behind and slow to run.
          if (other.kernel == GemmKernel::decode && int64_t{T} * m.k > 32 * m.E) continue;
          if (other.token_tile < 64 && int64_t{T} * m.k > 16 * m.E) continue;
          std::printf("  other: ");
          run_case(m, dtype, T, other, true, w13, w2, w13_scales, w2_scales);
        }
      }
      cudaFree(w13);
      cudaFree(w2);
      cudaFree(w13_scales);
      cudaFree(w2_scales);
    }
  }
  std::printf(
      "\n| case | kernel | GEMM1+GEMM2 us | GEMM1 us | GEMM2 us | floor us | %% of floor |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- |\n");
  for (const Result& r : results) {
    std::printf("| %s | %s | %.1f | %.1f | %.1f | %.1f | %.1f%% |\n", r.label.c_str(),
                r.choice.c_str(), r.ms_total * 1e3, r.ms_gemm1 * 1e3, r.ms_gemm2 * 1e3,
                r.floor_ms * 1e3, 100.0 * r.floor_ms / r.ms_total);
  }
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "gemm_bench: cannot write %s\n", json_path.c_str());
      return 1;
    }
    std::fprintf(f,
                 "{\"bandwidth_tbps\": %.2f, \"peak_bf16_tflops\": %.0f, "
                 "\"peak_fp8_tflops\": %.0f, \"cases\": [\n",
                 kBandwidth / 1e12, kPeakBf16 / 1e12, kPeakFp8 / 1e12);
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      std::fprintf(f,
                   "  {\"case\": \"%s\", \"kernel\": \"%s\", \"us\": %.2f, \"gemm1_us\": %.2f, "
                   "\"gemm2_us\": %.2f, \"floor_us\": %.2f, \"percent_of_floor\": %.1f, "
                   "\"tbps\": %.3f, \"tflops\": %.1f}%s\n",
                   r.label.c_str(), r.choice.c_str(), r.ms_total * 1e3, r.ms_gemm1 * 1e3,
                   r.ms_gemm2 * 1e3, r.floor_ms * 1e3, 100.0 * r.floor_ms / r.ms_total, r.tbps,
                   r.tflops, i + 1 < results.size() ? "," : "");
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  double lowest = 100.0, highest = 0.0;
  for (const Result& r : results) {
    lowest = std::min(lowest, 100.0 * r.floor_ms / r.ms_total);
    highest = std::max(highest, 100.0 * r.floor_ms / r.ms_total);
  }
  std::printf("gemm_bench: %zu cases, %.1f%% to %.1f%% of floor\n", results.size(), lowest,
              highest);
  return 0;
}
