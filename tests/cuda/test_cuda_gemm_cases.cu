// The expert GEMMs against float64 computations of the same numerics, on fresh random inputs.
// Each stage is checked on its own inputs (GEMM1 from the quantised x and weights, the e4m3
// quantisation of GEMM1's f32 output against the same steps on the host, GEMM2 from the input
// the device gave it), and the whole against float64 throughout.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <stdexcept>

#include "cuda/test_cuda_gemm_cases.hpp"

namespace moekit::test::cuda_gemm {

namespace {

using moekit::cuda_gemm::choose_gemm;
using moekit::cuda_gemm::Fp8Scales;
using moekit::cuda_gemm::GemmChoice;
using moekit::cuda_gemm::GemmKernel;

constexpr uint8_t kPoison = 0xD5;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    check(cudaMalloc(&data_, std::max<size_t>(bytes, 16)), "cudaMalloc");
  }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  void upload(const void* host) const {
    check(cudaMemcpy(data_, host, bytes_, cudaMemcpyHostToDevice), "upload");
  }
  void poison() const { check(cudaMemset(data_, kPoison, bytes_), "poison"); }
  std::vector<uint8_t> download() const {
    std::vector<uint8_t> out(bytes_);
    check(cudaMemcpy(out.data(), data_, bytes_, cudaMemcpyDeviceToHost), "download");
    return out;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_;
};

template <typename T>
std::unique_ptr<DeviceBuffer> to_device(const std::vector<T>& v) {
  auto b = std::make_unique<DeviceBuffer>(v.size() * sizeof(T));
  b->upload(v.data());
  return b;
}

bool is_fp8(Format f) {
  return f != Format::bf16 && f != Format::f16;
}

float e4m3_value(uint8_t q) {
  __nv_fp8_e4m3 v;
  v.__x = q;
  return static_cast<float>(v);
}

uint8_t e4m3_code(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3));
}

// A 16-bit value's bits and the value they hold.
uint16_t half_bits(float x, bool bf16) {
  if (bf16) return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(x)).x;
  return static_cast<__half_raw>(__float2half_rn(x)).x;
}

float half_value(uint16_t b, bool bf16) {
  if (bf16) {
    __nv_bfloat16_raw raw;
    raw.x = b;
    return __bfloat162float(__nv_bfloat16(raw));
  }
  __half_raw raw;
  raw.x = b;
  return __half2float(__half(raw));
}

double activate(const Activation& a, double gate, double up) {
  switch (a.kind) {
    case ActivationKind::silu_gated:
      return gate / (1.0 + std::exp(-gate)) * up;
    case ActivationKind::gelu_gated:
      return 0.5 * gate * (1.0 + std::erf(gate / std::sqrt(2.0))) * up;
    case ActivationKind::swiglu_oai: {
      const double g = std::min(gate, static_cast<double>(a.limit));
      const double u = std::clamp(up, -static_cast<double>(a.limit), static_cast<double>(a.limit));
      return (u + 1.0) * g / (1.0 + std::exp(-a.alpha * g));
    }
  }
  return NAN;
}

double relative_l2(const std::vector<double>& got, const std::vector<double>& want) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return norm == 0.0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

// A stack of matrices [E, parts * n, k] as the format stores it, and its value in float64.
struct Stack {
  std::vector<uint8_t> bytes;  // 16-bit values or e4m3 codes
  std::vector<float> scales;   // fp8: the grid of docs/QUANTIZATION.md
  std::vector<double> value;
  int block_rows = 0, block_cols = 0;
};

Stack make_stack(Format f, int experts, int parts, int n, int k, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(k)));
  const int64_t rows = static_cast<int64_t>(experts) * parts * n;
  std::vector<float> w(static_cast<size_t>(rows * k));
  for (float& v : w) v = normal(rng);
  Stack s;
  s.value.resize(w.size());
  if (!is_fp8(f)) {
    const bool bf16 = f == Format::bf16;
    s.bytes.resize(w.size() * 2);
    for (size_t i = 0; i < w.size(); ++i) {
      const uint16_t b = half_bits(w[i], bf16);
      std::memcpy(&s.bytes[2 * i], &b, 2);
      s.value[i] = half_value(b, bf16);
    }
    return s;
  }
  s.block_rows = f == Format::fp8_block ? 128 : f == Format::fp8_channel ? 1 : 0;
  s.block_cols = f == Format::fp8_block ? 128 : 0;
  const int br = s.block_rows == 0 ? n : s.block_rows, bc = s.block_cols == 0 ? k : s.block_cols;
  const int per_part = (n + br - 1) / br, cols = (k + bc - 1) / bc;
  s.scales.assign(static_cast<size_t>(experts) * parts * per_part * cols, 0.0f);
  s.bytes.resize(w.size());
  for (int m = 0; m < experts * parts; ++m) {
    for (int rb = 0; rb < per_part; ++rb) {
      for (int cb = 0; cb < cols; ++cb) {
        float amax = 0.0f;
        for (int r = rb * br; r < std::min(n, (rb + 1) * br); ++r)
          for (int c = cb * bc; c < std::min(k, (cb + 1) * bc); ++c)
            amax = std::max(amax, std::fabs(w[(static_cast<size_t>(m) * n + r) * k + c]));
        const float scale = amax == 0.0f ? 1.0f : amax / 448.0f;
        s.scales[(static_cast<size_t>(m) * per_part + rb) * cols + cb] = scale;
        for (int r = rb * br; r < std::min(n, (rb + 1) * br); ++r)
          for (int c = cb * bc; c < std::min(k, (cb + 1) * bc); ++c) {
            const size_t at = (static_cast<size_t>(m) * n + r) * k + c;
            s.bytes[at] = e4m3_code(w[at] / scale);
            s.value[at] = static_cast<double>(e4m3_value(s.bytes[at])) * scale;
          }
      }
    }
  }
  return s;
}

// Rows [rows, cols] of GEMM input as the format quantises them (the gather's job for x, the
// quantisation kernel's for GEMM2's input), in f32 steps as docs/QUANTIZATION.md defines.
struct Rows {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
  std::vector<double> value;
};

Rows quantize_rows(Format f, const std::vector<float>& x, int64_t rows, int cols,
                   float static_scale) {
  Rows out;
  out.value.resize(x.size());
  if (!is_fp8(f)) {
    const bool bf16 = f == Format::bf16;
    out.bytes.resize(x.size() * 2);
    for (size_t i = 0; i < x.size(); ++i) {
      const uint16_t b = half_bits(x[i], bf16);
      std::memcpy(&out.bytes[2 * i], &b, 2);
      out.value[i] = half_value(b, bf16);
    }
    return out;
  }
  const int group = f == Format::fp8_block ? 128 : cols;
  const int groups = (cols + group - 1) / group;
  out.bytes.resize(x.size());
  if (f != Format::fp8_static) out.scales.resize(static_cast<size_t>(rows) * groups);
  for (int64_t r = 0; r < rows; ++r) {
    for (int gi = 0; gi < groups; ++gi) {
      const int c0 = gi * group, c1 = std::min(cols, c0 + group);
      float scale = static_scale;
      if (f != Format::fp8_static) {
        float amax = 0.0f;
        for (int c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(x[r * cols + c]));
        scale = std::max(amax, 1e-10f) / 448.0f;
        out.scales[r * groups + gi] = scale;
      }
      for (int c = c0; c < c1; ++c) {
        const size_t at = static_cast<size_t>(r * cols + c);
        out.bytes[at] = e4m3_code(x[at] / scale);
        out.value[at] = static_cast<double>(e4m3_value(out.bytes[at])) * scale;
      }
    }
  }
  return out;
}

// GEMM1 in float64: act[r, i] = activation(gate_i . x_r, up_i . x_r).
std::vector<double> gemm1(const GemmCase& c, const std::vector<int>& offsets,
                          const std::vector<double>& x, const std::vector<double>& w13) {
  const int H = c.hidden, I = c.intermediate;
  std::vector<double> act(static_cast<size_t>(offsets.back()) * I);
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    const double* w = &w13[e * 2 * I * H];
    for (int r = offsets[e]; r < offsets[e + 1]; ++r) {
      for (int i = 0; i < I; ++i) {
        double g = 0.0, u = 0.0;
        for (int h = 0; h < H; ++h) {
          g += w[static_cast<size_t>(i) * H + h] * x[static_cast<size_t>(r) * H + h];
          u += w[static_cast<size_t>(I + i) * H + h] * x[static_cast<size_t>(r) * H + h];
        }
        act[static_cast<size_t>(r) * I + i] = activate(c.activation, g, u);
      }
    }
  }
  return act;
}

// GEMM2 in float64: out[r, h] = route_weight[r] * (w2_h . act_r).
std::vector<double> gemm2(const GemmCase& c, const std::vector<int>& offsets,
                          const std::vector<double>& act, const std::vector<double>& w2,
                          const std::vector<float>& route) {
  const int H = c.hidden, I = c.intermediate;
  std::vector<double> out(static_cast<size_t>(offsets.back()) * H);
  for (size_t e = 0; e + 1 < offsets.size(); ++e) {
    const double* w = &w2[e * H * I];
    for (int r = offsets[e]; r < offsets[e + 1]; ++r) {
      for (int h = 0; h < H; ++h) {
        double s = 0.0;
        for (int i = 0; i < I; ++i)
          s += w[static_cast<size_t>(h) * I + i] * act[static_cast<size_t>(r) * I + i];
        out[static_cast<size_t>(r) * H + h] = route[r] * s;
      }
    }
  }
  return out;
}

std::vector<double> values_of(const std::vector<uint8_t>& bytes, size_t n, Format f) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) {
    if (is_fp8(f)) {
      float x;
      std::memcpy(&x, &bytes[4 * i], 4);
      v[i] = x;
    } else {
      uint16_t b;
      std::memcpy(&b, &bytes[2 * i], 2);
      v[i] = half_value(b, f == Format::bf16);
    }
  }
  return v;
}

bool untouched(const std::vector<uint8_t>& bytes, size_t from) {
  return std::all_of(bytes.begin() + static_cast<std::ptrdiff_t>(from), bytes.end(),
                     [](uint8_t b) { return b == kPoison; });
}

std::string fmt(double v) {
  std::ostringstream s;
  s.precision(2);
  s << std::scientific << v;
  return s.str();
}

}  // namespace

std::string gpu_missing() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(e);
  if (count == 0) return "no CUDA device";
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  if (prop.major < 8) return "the GPU is below sm_80";
  return "";
}

int compute_capability() {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  return prop.major * 10 + prop.minor;
}

CaseResult run_case(const GemmCase& c) {
  CaseResult result;
  result.skip_reason = gpu_missing();
  if (!result.skip_reason.empty()) return result;
  const int cc = compute_capability();
  if (c.forced && c.choice.kernel == moekit::cuda_gemm::GemmKernel::wgmma && cc != 90) {
    result.skip_reason = "the wgmma kernel runs on GPUs of compute capability 9.0 only, not " +
                         std::to_string(cc / 10) + "." + std::to_string(cc % 10);
    return result;
  }
  result.ran = true;
  const auto fail = [&](const std::string& what) {
    result.failures.push_back(c.name + ": " + what);
  };

  std::mt19937 rng(std::hash<std::string>{}(c.name));
  const int E = static_cast<int>(c.counts.size()), H = c.hidden, I = c.intermediate;
  std::vector<int> offsets(1, 0);
  for (int n : c.counts) offsets.push_back(offsets.back() + n);
  const int rows = offsets.back();
  const int capacity = rows + 2;  // the last two rows belong to no expert
  const bool fp8 = is_fp8(c.format);
  const DType dtype = fp8 ? DType::f8e4m3 : c.format == Format::bf16 ? DType::bf16 : DType::f16;

  const Stack w13 = make_stack(c.format, E, 2, I, H, rng);
  const Stack w2 = make_stack(c.format, E, 1, H, I, rng);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(capacity) * H);
  for (float& v : x) v = normal(rng);
  std::uniform_real_distribution<float> uniform(0.1f, 1.0f);
  std::vector<float> route(static_cast<size_t>(capacity));
  for (float& v : route) v = uniform(rng);
  float x_max = 0.0f;
  for (float v : x) x_max = std::max(x_max, std::fabs(v));
  const float x_static = x_max / 448.0f * 0.8f;  // a few values saturate, as static scales do
  const Rows xq = quantize_rows(c.format, x, capacity, H, x_static);

  const std::vector<double> act_want = gemm1(c, offsets, xq.value, w13.value);
  double act_max = 0.0;
  for (double v : act_want) act_max = std::max(act_max, std::fabs(v));
  const float act_static = static_cast<float>(act_max / 448.0 * 1.1) + 1e-6f;

  const GemmChoice choice = c.forced ? c.choice : choose_gemm({dtype, rows, E, H, I, 132, cc});
  const int elem = fp8 ? 1 : 2;
  const auto d_x = to_device(xq.bytes);
  const auto d_w13 = to_device(w13.bytes);
  const auto d_w2 = to_device(w2.bytes);
  const auto d_offsets = to_device(offsets);
  const auto d_route = to_device(route);
  std::vector<float> a_static{x_static}, g_static{act_static};
  const auto d_x_scales = to_device(fp8 && !xq.scales.empty() ? xq.scales : a_static);
  const auto d_w13_scales = to_device(fp8 ? w13.scales : a_static);
  const auto d_w2_scales = to_device(fp8 ? w2.scales : a_static);
  const auto d_act_static = to_device(g_static);
  DeviceBuffer act(static_cast<size_t>(capacity) * I * (fp8 ? 4 : elem));
  DeviceBuffer act_q(static_cast<size_t>(capacity) * I);
  const int act_groups = c.format == Format::fp8_block ? (I + 127) / 128 : 1;
  DeviceBuffer act_scales(static_cast<size_t>(capacity) * act_groups * 4);
  DeviceBuffer out(static_cast<size_t>(capacity) * H * 4);
  // Split K's partial sums and counters (zero before the first launch, as the core keeps them).
  const auto split_k = moekit::cuda_gemm::split_k_size;
  const auto split1 = split_k(choice, true, capacity, E, I),
             split2 = split_k(choice, false, capacity, E, H);
  DeviceBuffer partials1(static_cast<size_t>(split1.partials) * 4),
      partials2(static_cast<size_t>(split2.partials) * 4);
  DeviceBuffer counters(static_cast<size_t>(split1.counters + split2.counters) * 4);
  check(cudaMemset(counters.as<void>(), 0,
                   static_cast<size_t>(split1.counters + split2.counters) * 4),
        "zero the counters");
  const moekit::cuda_gemm::SplitK gemm1_split{.partials = partials1.as<float>(),
                                              .counters = counters.as<uint32_t>()},
      gemm2_split{.partials = partials2.as<float>(),
                  .counters = counters.as<uint32_t>() + split1.counters};

  const auto scales_of = [&](const Stack& w, const DeviceBuffer& weight_scales,
                             const float* activation_scales) {
    Fp8Scales s;
    if (!fp8) return s;
    s.weight = weight_scales.as<float>();
    s.weight_block_rows = w.block_rows;
    s.weight_block_cols = w.block_cols;
    s.activation = activation_scales;
    s.activation_block_cols = c.format == Format::fp8_block ? 128 : 0;
    s.activation_static = c.format == Format::fp8_static;
    return s;
  };
  const float* gemm2_scales =
      c.format == Format::fp8_static ? d_act_static->as<float>() : act_scales.as<float>();
  // GEMM1 into `act` (f32 for fp8), or quantising its output itself into `quantized`.
  const auto launch_first_gemm = [&](const moekit::cuda_gemm::Gemm1Quantized& quantized) {
    moekit::cuda_gemm::launch_gemm1(
        {.dtype = dtype,
         .x = d_x->as<void>(),
         .w13 = d_w13->as<void>(),
         .scales = scales_of(w13, *d_w13_scales, d_x_scales->as<float>()),
         .offsets = d_offsets->as<int32_t>(),
         .num_experts = E,
         .rows = capacity,
         .hidden = H,
         .intermediate = I,
         .activation = c.activation,
         .act = act.as<void>(),
         .quantized = quantized,
         .choice = choice,
         .split = gemm1_split,
         .entries = {}},
        nullptr);
  };
  const auto run = [&]() {
    act.poison();
    act_q.poison();
    act_scales.poison();
    out.poison();
    launch_first_gemm({});  // f32 out, quantize_rows after it; GEMM1's own quantisation below
    if (fp8) {
      moekit::cuda_gemm::launch_quantize_rows_e4m3(
          {.in = act.as<float>(),
           .offsets = d_offsets->as<int32_t>(),
           .num_experts = E,
           .rows = capacity,
           .cols = I,
           .group = c.format == Format::fp8_block ? 128 : 0,
           .static_scale = c.format == Format::fp8_static ? d_act_static->as<float>() : nullptr,
           .out = act_q.as<uint8_t>(),
           .scales = act_scales.as<float>()},
          nullptr);
    }
    moekit::cuda_gemm::launch_gemm2({.dtype = dtype,
                                     .act = fp8 ? act_q.as<void>() : act.as<void>(),
                                     .w2 = d_w2->as<void>(),
                                     .scales = scales_of(w2, *d_w2_scales, gemm2_scales),
                                     .offsets = d_offsets->as<int32_t>(),
                                     .num_experts = E,
                                     .rows = capacity,
                                     .hidden = H,
                                     .intermediate = I,
                                     .route_weight = d_route->as<float>(),
                                     .out = out.as<float>(),
                                     .choice = choice,
                                     .split = gemm2_split,
                                     .entries = {}},
                                    nullptr);
    check(cudaDeviceSynchronize(), c.name.c_str());
  };

  run();
  const std::vector<uint8_t> act_bytes = act.download(), out_bytes = out.download();
  const std::vector<uint8_t> act_q_bytes = act_q.download(),
                             act_scale_bytes = act_scales.download();
  std::ostringstream summary;
  summary << choice.str();

  // GEMM1 on its own inputs: f32 sums of exact products for fp8 (the tensor cores may keep
  // fewer bits of each partial sum, hence 1e-3); 16-bit outputs add their rounding (2^-9 of
  // each value for bf16).
  const size_t act_n = static_cast<size_t>(rows) * I;
  const std::vector<double> act_got = values_of(act_bytes, act_n, c.format);
  const double e1 = relative_l2(act_got, act_want);
  summary << " gemm1 " << fmt(e1);
  if (!(e1 <= (fp8 ? 1e-3 : 1e-2))) fail("gemm1 relative L2 " + fmt(e1));
  if (!untouched(act_bytes, act_n * (fp8 ? 4 : elem))) fail("gemm1 wrote rows past the groups");

  // GEMM2's input as the device quantised it, and GEMM2 on it.
  std::vector<double> gemm2_in = act_got;
  if (fp8) {
    std::vector<float> act_f(act_got.begin(), act_got.end());
    const Rows want = quantize_rows(c.format, act_f, rows, I, act_static);
    const int64_t codes_apart =
        std::inner_product(want.bytes.begin(), want.bytes.end(), act_q_bytes.begin(), int64_t{0},
                           std::plus<>(), [](uint8_t a, uint8_t b) { return a != b ? 1 : 0; });
    if (codes_apart != 0) fail("quantize_rows: " + std::to_string(codes_apart) + " codes differ");
    if (!want.scales.empty() &&
        std::memcmp(want.scales.data(), act_scale_bytes.data(), want.scales.size() * 4) != 0) {
      fail("quantize_rows: scales differ");
    }
    if (!untouched(act_q_bytes, act_n)) fail("quantize_rows wrote rows past the groups");
    gemm2_in = want.value;
  }

  // Where GEMM1 quantises its own output (gemm1_quantizes): the codes and scales that
  // quantize_rows_e4m3 made from its f32 output, bit for bit, and nothing past the groups.
  const bool static_act = c.format == Format::fp8_static;
  const int act_group = c.format == Format::fp8_block ? 128 : 0;
  if (fp8 && moekit::cuda_gemm::gemm1_quantizes(choice, act_group, static_act)) {
    DeviceBuffer fused_q(static_cast<size_t>(capacity) * I);
    DeviceBuffer fused_scales(static_cast<size_t>(capacity) * act_groups * 4);
    fused_q.poison();
    fused_scales.poison();
    launch_first_gemm({.out = fused_q.as<uint8_t>(),
                       .scales = fused_scales.as<float>(),
                       .static_scale = static_act ? d_act_static->as<float>() : nullptr});
    check(cudaDeviceSynchronize(), c.name.c_str());
    const std::vector<uint8_t> q = fused_q.download(), q_scales = fused_scales.download();
    if (!std::equal(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(act_n),
                    act_q_bytes.begin())) {
      fail("GEMM1's own quantisation differs from quantize_rows'");
    }
    const size_t scale_bytes = static_cast<size_t>(rows) * act_groups * 4;
    if (!static_act &&
        !std::equal(q_scales.begin(), q_scales.begin() + static_cast<std::ptrdiff_t>(scale_bytes),
                    act_scale_bytes.begin())) {
      fail("GEMM1's own quantisation scales differ from quantize_rows'");
    }
    if (!untouched(q, act_n)) fail("GEMM1's own quantisation wrote rows past the groups");
    summary << " (gemm1 quantises)";
  }
  const size_t out_n = static_cast<size_t>(rows) * H;
  const std::vector<double> out_got = values_of(out_bytes, out_n, Format::fp8_block);
  const double e2 = relative_l2(out_got, gemm2(c, offsets, gemm2_in, w2.value, route));
  summary << " gemm2 " << fmt(e2);
  if (!(e2 <= (fp8 ? 1e-3 : 1e-4))) fail("gemm2 relative L2 " + fmt(e2));
  if (!untouched(out_bytes, out_n * 4)) fail("gemm2 wrote rows past the groups");

  // The whole in float64, GEMM2's input quantised from the float64 activation.
  std::vector<double> act_in = act_want;
  if (fp8) {
    std::vector<float> act_f(act_want.begin(), act_want.end());
    act_in = quantize_rows(c.format, act_f, rows, I, act_static).value;
  }
  const double e = relative_l2(out_got, gemm2(c, offsets, act_in, w2.value, route));
  summary << " whole " << fmt(e);
  if (!(e <= (fp8 ? 5e-2 : 1e-2))) fail("whole relative L2 " + fmt(e));

  run();
  if (act.download() != act_bytes || out.download() != out_bytes) {
    fail("a second run gave different bits");
  }
  const std::vector<uint8_t> counts = counters.download();
  if (!std::all_of(counts.begin(), counts.end(), [](uint8_t b) { return b == 0; })) {
    fail("split K left a counter other than zero for the next launch");
  }
  if (choice.gemm1_splits > 1 || choice.gemm2_splits > 1) summary << " (split K)";
  result.summary = summary.str();
  return result;
}

std::vector<GemmCase> all_cases() {
  using moekit::cuda_gemm::GemmKernel;
  const GemmChoice decode{GemmKernel::decode, 8}, prefill{GemmKernel::prefill, 64},
      prefill128{GemmKernel::prefill, 128}, wgmma{GemmKernel::wgmma, 64},
      wgmma128{GemmKernel::wgmma, 128}, wgmma_narrow{GemmKernel::wgmma, 64, 1, 1, 128, 128},
      wgmma_narrow2{GemmKernel::wgmma, 64, 1, 1, 256, 128}, wgmma8{GemmKernel::wgmma, 8},
      wgmma16{GemmKernel::wgmma, 16};
  const std::vector<int> few{0, 1, 3, 8, 0, 17}, many{0, 1, 64, 130, 7};
  // Tiles of 128 rows: a full one, a tail of 2 rows, three tiles with a tail past every warp's
  // first m16 tile, and one short tile.
  const std::vector<int> many128{0, 128, 130, 300, 40};
  std::vector<GemmCase> cases;
  for (Format f : {Format::bf16, Format::f16, Format::fp8_block, Format::fp8_tensor,
                   Format::fp8_channel, Format::fp8_static}) {
    const bool fp8 = is_fp8(f);
    const std::string n = f == Format::bf16          ? "bf16"
                          : f == Format::f16         ? "f16"
                          : f == Format::fp8_block   ? "fp8_block"
                          : f == Format::fp8_tensor  ? "fp8_tensor"
                          : f == Format::fp8_channel ? "fp8_channel"
                                                     : "fp8_static";
    cases.push_back({n + "_decode", f, 256, 128, few, Activation::SiluGated(), true, decode});
    cases.push_back({n + "_decode_gelu", f, 384, 256, few, Activation::GeluGated(), true, decode});
    // Groups of several tiles of 8 rows.
    cases.push_back({n + "_decode_swiglu_tiles",
                     f,
                     256,
                     384,
                     {40, 0, 33},
                     Activation::SwigluOai(),
                     true,
                     decode});
    // CTAs taking several slices of weight rows, the last one partly past N.
    cases.push_back({n + "_decode_slices",
                     f,
                     208,
                     144,
                     few,
                     Activation::SiluGated(),
                     true,
                     {GemmKernel::decode, 8, 3, 2}});
    cases.push_back({n + "_decode_slices_tiles",
                     f,
                     256,
                     384,
                     {40, 0, 33},
                     Activation::GeluGated(),
                     true,
                     {GemmKernel::decode, 8, 4, 4}});
    // Not multiples of 128 (partial fp8 blocks), 16-byte aligned rows.
    cases.push_back({n + "_decode_edges", f, 208, 144, few, Activation::SiluGated(), true, decode});
    cases.push_back({n + "_prefill", f, 384, 256, many, Activation::SiluGated(), true, prefill});
    cases.push_back(
        {n + "_prefill_edges_gelu", f, 208, 144, many, Activation::GeluGated(), true, prefill});
    cases.push_back(
        {n + "_prefill128", f, 384, 256, many128, Activation::SiluGated(), true, prefill128});
    cases.push_back({n + "_prefill128_edges_swiglu", f, 208, 144, many128, Activation::SwigluOai(),
                     true, prefill128});
    // Hopper: both warpgroups on 64 rows (half the columns each), and on 64 rows each; the last
    // column tile partly or wholly past N for one warpgroup.
    cases.push_back({n + "_wgmma", f, 384, 256, many, Activation::SiluGated(), true, wgmma});
    cases.push_back(
        {n + "_wgmma_edges_gelu", f, 208, 144, many, Activation::GeluGated(), true, wgmma});
    cases.push_back(
        {n + "_wgmma128", f, 384, 256, many128, Activation::SiluGated(), true, wgmma128});
    cases.push_back({n + "_wgmma128_edges_swiglu", f, 208, 144, many128, Activation::SwigluOai(),
                     true, wgmma128});
    // CTAs of 128 weight rows (64 per warpgroup), in both GEMMs and in GEMM2 alone (GEMM1 of
    // 256 weight rows, which quantises its output for fp8).
    cases.push_back(
        {n + "_wgmma_narrow", f, 384, 256, many, Activation::SiluGated(), true, wgmma_narrow});
    cases.push_back({n + "_wgmma_narrow_edges_swiglu", f, 208, 144, many, Activation::SwigluOai(),
                     true, wgmma_narrow});
    cases.push_back({n + "_wgmma_narrow_gemm2_edges", f, 208, 144, few, Activation::GeluGated(),
                     true, wgmma_narrow2});
    // Hopper's decode tiles (weights on wgmma's M side, 8 or 16 rows on N): groups of several
    // tiles with a tail, a tile of one row; the last CTA's weight rows partly past N.
    cases.push_back(
        {n + "_wgmma_decode8", f, 384, 256, few, Activation::SiluGated(), true, wgmma8});
    cases.push_back(
        {n + "_wgmma_decode8_edges_gelu", f, 208, 144, few, Activation::GeluGated(), true, wgmma8});
    cases.push_back({n + "_wgmma_decode16_swiglu_tiles",
                     f,
                     256,
                     384,
                     {40, 0, 16, 1},
                     Activation::SwigluOai(),
                     true,
                     wgmma16});
    cases.push_back(
        {n + "_wgmma_decode16_edges", f, 208, 144, few, Activation::SiluGated(), true, wgmma16});
    // Split K: uneven shares of the K steps, splits with no step at all (fp8 GEMM2 of 2 steps
    // in 3, a K of 1024 e4m3 in 8), the tile of 16 rows, CTAs of 128 weight rows.
    const auto split = [](int tile, int cols, int gemm1_splits, int gemm2_splits) {
      return GemmChoice{.kernel = GemmKernel::wgmma,
                        .token_tile = tile,
                        .gemm1_cols = cols,
                        .gemm2_cols = cols,
                        .gemm1_splits = gemm1_splits,
                        .gemm2_splits = gemm2_splits};
    };
    cases.push_back({n + "_wgmma_decode8_split", f, 384, 256, few, Activation::SiluGated(), true,
                     split(8, 0, 3, 2)});
    cases.push_back({n + "_wgmma_decode16_split_edges_gelu",
                     f,
                     208,
                     144,
                     {40, 0, 16, 1},
                     Activation::GeluGated(),
                     true,
                     split(16, 0, 2, 3)});
    cases.push_back({n + "_wgmma_decode8_split8_swiglu", f, 1024, 512, few, Activation::SwigluOai(),
                     true, split(8, 0, 8, 8)});
    cases.push_back({n + "_wgmma_decode8_narrow_split", f, 384, 256, few, Activation::SiluGated(),
                     true, split(8, 128, 2, 3)});
    // Rows that are not 16-byte aligned: the element-wise decode path.
    cases.push_back({n + "_unaligned",
                     f,
                     fp8 ? 200 : 134,
                     fp8 ? 90 : 70,
                     few,
                     Activation::SiluGated(),
                     false,
                     {}});
    cases.push_back(
        {n + "_auto_many", f, 256, 128, {90, 0, 1, 200}, Activation::SiluGated(), false, {}});
  }
  cases.push_back(
      {"bf16_no_rows", Format::bf16, 256, 128, {0, 0, 0}, Activation::SiluGated(), false, {}});
  return cases;
}

}  // namespace moekit::test::cuda_gemm
