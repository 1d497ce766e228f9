#pragma once
// An oracle for the whole layer, written apart from the library's cores: float64 throughout,
// from the stored weights and the routing the layer reports. Tests compare every path with it.

#include <cmath>
#include <vector>

#include "moekit/layer.hpp"
#include "moekit/testing.hpp"

namespace moekit::test {

inline std::vector<double> to_doubles(const TensorView& t) {
  std::vector<float> f(static_cast<size_t>(t.numel()));
  convert_to_f32(t.data, t.dtype, t.numel(), f.data());
  return {f.begin(), f.end()};
}

inline double activate(const Activation& a, double gate, double up) {
  switch (a.kind) {
    case ActivationKind::silu_gated:
      return gate / (1.0 + std::exp(-gate)) * up;
    case ActivationKind::gelu_gated:
      return 0.5 * gate * (1.0 + std::erf(gate / std::sqrt(2.0))) * up;
    case ActivationKind::swiglu_oai: {
      const double g = std::min(gate, static_cast<double>(a.limit));
      const double u =
          std::max(std::min(up, static_cast<double>(a.limit)), -static_cast<double>(a.limit));
      return (u + 1.0) * g / (1.0 + std::exp(-a.alpha * g));
    }
  }
  return NAN;
}

// y += scale * down(act(gate x, up x)) for one expert with w13 [2I, H], w2 [H, I].
inline void add_mlp(const Activation& act, const double* w13, const double* w2, int64_t H,
                    int64_t I, const double* x, double scale, double* y) {
  std::vector<double> a(static_cast<size_t>(I));
  for (int64_t i = 0; i < I; ++i) {
    double g = 0, u = 0;
    for (int64_t h = 0; h < H; ++h) {
      g += w13[i * H + h] * x[h];
      u += w13[(I + i) * H + h] * x[h];
    }
    a[i] = activate(act, g, u);
  }
  for (int64_t h = 0; h < H; ++h) {
    double s = 0;
    for (int64_t i = 0; i < I; ++i) s += w2[h * I + i] * a[i];
    y[h] += scale * s;
  }
}

// The layer's output [T, H] for the given routing (logical ids and weights [T, k]).
inline std::vector<double> oracle_output(const ModelSpec& spec, const LayerWeights& w,
                                         const TensorView& hidden, const std::vector<int32_t>& ids,
                                         const std::vector<float>& weights) {
  const int64_t T = hidden.dim(0), H = spec.hidden, I = spec.intermediate, k = spec.routing.top_k;
  const std::vector<double> x = to_doubles(hidden), w13 = to_doubles(w.w13), w2 = to_doubles(w.w2);
  std::vector<double> out(static_cast<size_t>(T * H), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids[t * k + j];
      add_mlp(spec.activation, &w13[e * 2 * I * H], &w2[e * H * I], H, I, &x[t * H],
              weights[t * k + j], &out[t * H]);
    }
  }
  if (spec.n_shared > 0) {
    const int64_t Is = spec.shared_intermediate;
    const std::vector<double> s13 = to_doubles(w.shared_w13), s2 = to_doubles(w.shared_w2);
    for (int64_t t = 0; t < T; ++t) {
      for (int s = 0; s < spec.n_shared; ++s) {
        add_mlp(spec.activation, &s13[s * 2 * Is * H], &s2[s * H * Is], H, Is, &x[t * H], 1.0,
                &out[t * H]);
      }
    }
  }
  return out;
}

// Relative L2 distance of got from want; non-finite anywhere in got gives +inf.
inline double relative_l2(const std::vector<double>& g, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) return INFINITY;
    diff += (g[i] - want[i]) * (g[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / norm);
}

inline double relative_l2(const TensorView& got, const std::vector<double>& want) {
  return relative_l2(to_doubles(got), want);
}

// The tolerance for an output stored in dtype (the oracle's float64 against a float32 core
// with float32 accumulation, then rounding of the output).
inline double tolerance(DType output) {
  return output == DType::f32 ? 1e-5 : 1e-2;
}

}  // namespace moekit::test
