#pragma once
// Expert weights held twice, canonical and packed in panel16 by the quant method's hook, for the
// tests of the cpu runner's kernels; and the formats and odd shapes they run over.

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "moekit/platform.hpp"
#include "quant/quant_method.hpp"
#include "runner/cpu/panels.hpp"

namespace moekit::test {

struct KernelFormat {
  std::string name;
  QuantParams params;
};

// Every panel16 dtype, each scale grid, symmetric int4 and int4 with zero points, and int4 with
// int8 activations.
inline std::vector<KernelFormat> kernel_formats() {
  return {{"f32", QuantParams::Unquantized(WeightFormat::f32)},
          {"bf16", QuantParams::Unquantized(WeightFormat::bf16)},
          {"f16", QuantParams::Unquantized(WeightFormat::f16)},
          {"fp8_per_tensor", QuantParams::Fp8Tensor(Fp8Scaling::per_tensor)},
          {"fp8_per_channel", QuantParams::Fp8Tensor(Fp8Scaling::per_channel)},
          {"fp8_block_32", QuantParams::Fp8Block(32)},
          {"int4_32_bf16", QuantParams::Int4Group(32, DType::bf16, false)},
          {"int4_32_f16_zero_points", QuantParams::Int4Group(32, DType::f16, true)},
          {"int4_a8_32_bf16_zero_points", QuantParams::Int4GroupA8(32, DType::bf16, true)}};
}

struct KernelShape {
  std::string name;
  int64_t hidden;
  int64_t intermediate;
};

// Whole panels and groups; and I % 8 != 0 (a part-filled interleaved panel), H % 16 != 0 (a
// part-filled w2 panel), K % 32 != 0 (a partial last scale group and 128x128-style block).
inline std::vector<KernelShape> kernel_shapes() {
  return {{"aligned", 64, 32}, {"ragged", 72, 20}};
}

// `slots` experts of one format, loaded from the same random floats into a canonical and a
// panel16 quant method.
struct TwoLayouts {
  QuantMethod canonical;
  QuantMethod packed;

  TwoLayouts(const QuantParams& q, int slots, int64_t H, int64_t I, uint64_t seed)
      : canonical(q, Device::cpu(), nullptr),
        packed(q, Device::cpu(), std::make_unique<cpu::PanelPacker>(q, slots, H, I)) {
    canonical.create_weights(slots, H, I);
    packed.create_weights(slots, H, I);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 0.05f);
    std::vector<float> gate(I * H), up(I * H), down(H * I);
    const auto view = [](std::vector<float>& v, int64_t n, int64_t k) {
      return MatrixSource{TensorView::contiguous(v.data(), DType::f32, {n, k}), {}, {}};
    };
    for (int s = 0; s < slots; ++s) {
      for (auto* v : {&gate, &up, &down}) {
        for (float& x : *v) x = normal(rng);
      }
      canonical.load_expert(s, view(gate, I, H), view(up, I, H), view(down, H, I));
      packed.load_expert(s, view(gate, I, H), view(up, I, H), view(down, H, I));
    }
  }
};

inline std::vector<float> random_rows(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(rows * cols);
  for (float& x : v) x = normal(rng);
  return v;
}

// This machine with the AVX2 kernels, or nothing when it lacks them.
inline bool has_avx2() {
  const Platform p = Platform::probe();
  return p.avx2 && p.fma && p.f16c;
}

}  // namespace moekit::test
