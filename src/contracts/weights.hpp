#pragma once
// What the quant method (layer 5) hands a runner core (layer 4): the weight tensors in the
// format's canonical layout, how to read them, and, where the runner asked for one, its own
// packing of them. The runner supplies that packing as a WeightPacker when the layer is built,
// so layer 5 stores whatever layout a runner reads without knowing any of them.

#include <memory>

#include "moekit/quant.hpp"
#include "moekit/tensor.hpp"

namespace moekit {

// One stack of expert matrices as a core reads it, in the plan's format: the weights and, when
// quantised, their scale grid and zero points (see QuantParams and docs/QUANTIZATION.md).
struct StoredMatrices {
  TensorView weight;  // [slots, parts * N, K]
  TensorView scale;   // [slots, parts * scale_rows(N), scale_cols(K)]
  TensorView zero;    // the scale's shape, i8; only int4-group with zero points
  int parts = 1;      // separately scaled matrices stacked along the rows (w13: gate, up)
};

// A runner's own layout of a layer's expert weights; only that runner reads inside it.
class PackedWeights {
 public:
  virtual ~PackedWeights() = default;
};

// A runner's hook into layer 5: given each expert in the canonical layout as it loads, it keeps
// the expert in its own layout, and the quant method keeps no canonical copy.
class WeightPacker {
 public:
  virtual ~WeightPacker() = default;
  // Called once per slot, with that slot's w13 [1, 2I, H] and w2 [1, H, I] (host memory).
  virtual void pack(int slot, const StoredMatrices& w13, const StoredMatrices& w2) = 0;
  virtual const PackedWeights& packed() const = 0;
};

struct CoreWeights {
  StoredMatrices w13;  // [slots, 2I, H], gate rows then up rows; empty when packed
  StoredMatrices w2;   // [slots, H, I]; empty when packed
  const PackedWeights* packed = nullptr;  // the runner's own layout, when it supplied a packer
  QuantParams quant;
  float w13_input_scale = 0.0f;  // fp8_static: the scale of GEMM1's input
  float w2_input_scale = 0.0f;   // fp8_static: the scale of GEMM2's input
  // fp8_static on a GPU: {w13_input_scale, w2_input_scale} in the device's memory, where the
  // kernels read them; null elsewhere.
  const float* device_input_scales = nullptr;
};

}  // namespace moekit
