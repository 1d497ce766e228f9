#include "moekit/testing.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "moekit/error.hpp"

namespace moekit {

DType random_weights_dtype(WeightFormat format) {
  switch (format) {
    case WeightFormat::f32:
      return DType::f32;
    case WeightFormat::f16:
      return DType::f16;
    default:
      return DType::bf16;
  }
}

Tensor random_tensor(Shape shape, DType dtype, std::mt19937_64& rng, float stddev) {
  Tensor tensor = Tensor::empty(dtype, shape);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> values(static_cast<size_t>(shape.numel()));
  for (float& v : values) v = normal(rng);
  convert_from_f32(values.data(), shape.numel(), tensor.view().data, dtype);
  return tensor;
}

RandomWeights RandomWeights::make(const ModelSpec& spec, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int64_t E = spec.n_experts, H = spec.hidden, I = spec.intermediate;
  const auto scale = [](int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); };
  RandomWeights w;
  w.w13 = random_tensor({E, 2 * I, H}, dtype, rng, scale(H));
  w.w2 = random_tensor({E, H, I}, dtype, rng, scale(I));
  if (spec.routing.correction_bias) w.correction_bias = random_tensor({E}, DType::f32, rng, 0.1f);
  if (spec.n_shared > 0) {
    const int64_t Is = spec.shared_intermediate;
    w.shared_w13 = random_tensor({spec.n_shared, 2 * Is, H}, dtype, rng, scale(H));
    w.shared_w2 = random_tensor({spec.n_shared, H, Is}, dtype, rng, scale(Is));
  }
  if (spec.shared_gate) w.shared_gate = random_tensor({1, H}, dtype, rng, scale(H));
  return w;
}

LayerWeights RandomWeights::view() const {
  return {w13.view(),        w2.view(),        correction_bias.view(),
          shared_w13.view(), shared_w2.view(), shared_gate.view()};
}

double relative_l2(const TensorView& got, const TensorView& want) {
  if (got.numel() != want.numel()) {
    fail(Errc::invalid_argument, "relative_l2: {} and {} differ in size", got.describe(),
         want.describe());
  }
  std::vector<float> a(static_cast<size_t>(got.numel())), b(static_cast<size_t>(want.numel()));
  convert_to_f32(got.data, got.dtype, got.numel(), a.data());
  convert_to_f32(want.data, want.dtype, want.numel(), b.data());
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return std::numeric_limits<double>::infinity();
    const double d = static_cast<double>(a[i]) - b[i];
    diff += d * d;
    norm += static_cast<double>(b[i]) * b[i];
  }
  if (norm == 0.0) return diff == 0.0 ? 0.0 : std::numeric_limits<double>::infinity();
  return std::sqrt(diff / norm);
}

}  // namespace moekit
