#pragma once
// Random layers and comparisons, for the demo, the benchmarks and the tests.

#include <cstdint>
#include <random>

#include "moekit/layer.hpp"
#include "moekit/options.hpp"
#include "moekit/spec.hpp"
#include "moekit/tensor.hpp"

namespace moekit {

// Owns the weights of one layer of `spec`, random with the scales of a trained layer (so that
// activations stay of order one), stored in `dtype`.
struct RandomWeights {
  Tensor w13;
  Tensor w2;
  Tensor correction_bias;
  Tensor shared_w13;
  Tensor shared_w2;
  Tensor shared_gate;

  static RandomWeights make(const ModelSpec& spec, DType dtype, uint64_t seed);
  LayerWeights view() const;
};

// The dtype to make random weights in for a plan's weight format: the format's own for f32, f16
// and bf16, so the layer holds them exactly; bf16, the usual source of online quantization,
// for the others.
DType random_weights_dtype(WeightFormat format);

// A tensor of normal(0, stddev) values stored in dtype.
Tensor random_tensor(Shape shape, DType dtype, std::mt19937_64& rng, float stddev = 1.0f);

// ||got - want|| / ||want|| over all elements, in double; NaN or Inf anywhere in got gives +inf.
double relative_l2(const TensorView& got, const TensorView& want);

}  // namespace moekit
