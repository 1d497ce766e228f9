#pragma once
// An oracle for the whole layer, written apart from the library's cores: float64 throughout,
// from the stored weights and the routing the layer reports. Tests compare every path with it.

#include <algorithm>
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

// A stack of expert matrices [E, parts * N, K] as float64, read as docs/QUANTIZATION.md defines
// each format: e4m3 * scale, (q - zero) * scale for int4 (signed nibbles, low nibble first),
// float weights as they are. Written apart from the library's reader.
inline std::vector<double> dequantized(const ExpertMatrices& m, int parts, const QuantParams& q) {
  if (m.weight.dtype != DType::f8e4m3 && m.weight.dtype != DType::i4) return to_doubles(m.weight);
  const int64_t E = m.weight.dim(0), rows = m.weight.dim(1), K = m.weight.dim(2);
  const int64_t N = rows / parts;
  const int64_t per_part = q.block_rows == 0 ? 1 : (N + q.block_rows - 1) / q.block_rows;
  const int64_t SC = q.block_cols == 0 ? 1 : (K + q.block_cols - 1) / q.block_cols;
  const std::vector<double> scales = to_doubles(m.scale);
  const auto* bytes = m.weight.as<const uint8_t>();
  std::vector<double> out(static_cast<size_t>(E * rows * K));
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t n = 0; n < rows; ++n) {
      const int64_t scale_row =
          e * parts * per_part + n / N * per_part + (q.block_rows == 0 ? 0 : n % N / q.block_rows);
      for (int64_t k = 0; k < K; ++k) {
        const int64_t scale_at = scale_row * SC + (q.block_cols == 0 ? 0 : k / q.block_cols);
        const int64_t at = (e * rows + n) * K + k;
        double value;
        if (m.weight.dtype == DType::f8e4m3) {
          value = to_float(e4m3_t{bytes[at]});
        } else {
          const int nibble = at % 2 == 0 ? bytes[at / 2] & 0xF : bytes[at / 2] >> 4;
          const int zero = q.zero_points ? m.zero.as<const int8_t>()[scale_at] : 0;
          value = (nibble >= 8 ? nibble - 16 : nibble) - zero;
        }
        out[static_cast<size_t>(at)] = value * scales[static_cast<size_t>(scale_at)];
      }
    }
  }
  return out;
}

// A GEMM input as the format quantises it: f32 values; e4m3 with scale amax / 448 (amax floored
// at 1e-10) per token or per token per group, or a static scale; or int8 with scale amax / 127
// per token per group, rounded half to even.
inline std::vector<double> quantized_input(const QuantParams& q, float static_scale,
                                           const std::vector<double>& x) {
  if (q.activation == ActivationQuant::none) return x;
  const size_t n = x.size();
  const bool int8 = q.activation == ActivationQuant::int8_per_token_group;
  const size_t group = q.activation == ActivationQuant::fp8_per_token_group || int8
                           ? static_cast<size_t>(q.activation_group)
                           : n;
  std::vector<double> out(n);
  for (size_t g0 = 0; g0 < n; g0 += group) {
    const size_t g1 = std::min(n, g0 + group);
    float amax = 0.0f;
    for (size_t i = g0; i < g1; ++i) amax = std::max(amax, std::fabs(static_cast<float>(x[i])));
    const float scale = q.activation == ActivationQuant::fp8_static
                            ? static_scale
                            : std::max(amax, 1e-10f) / (int8 ? 127.0f : 448.0f);
    if (int8) {
      for (size_t i = g0; i < g1; ++i) {
        const float v =
            std::clamp(std::nearbyint(static_cast<float>(x[i]) / scale), -127.0f, 127.0f);
        out[i] = static_cast<double>(v) * scale;
      }
      continue;
    }
    for (size_t i = g0; i < g1; ++i) {
      const float v = std::clamp(static_cast<float>(x[i]) / scale, -448.0f, 448.0f);
      out[i] = static_cast<double>(to_float(to_e4m3(v))) * scale;
    }
  }
  return out;
}

// y += scale * down(act(gate x, up x)) with GEMM inputs quantised as the format says.
inline void add_quantized_mlp(const Activation& act, const QuantParams& q, float s13, float s2,
                              const double* w13, const double* w2, int64_t H, int64_t I,
                              const double* x_row, double scale, double* y) {
  const std::vector<double> x = quantized_input(q, s13, std::vector<double>(x_row, x_row + H));
  std::vector<double> a(static_cast<size_t>(I));
  for (int64_t i = 0; i < I; ++i) {
    double g = 0, u = 0;
    for (int64_t h = 0; h < H; ++h) {
      g += w13[i * H + h] * x[h];
      u += w13[(I + i) * H + h] * x[h];
    }
    a[i] = activate(act, g, u);
  }
  a = quantized_input(q, s2, a);
  for (int64_t h = 0; h < H; ++h) {
    double s = 0;
    for (int64_t i = 0; i < I; ++i) s += w2[h * I + i] * a[i];
    y[h] += scale * s;
  }
}

inline float largest(const TensorView& t) {
  float m = 0.0f;
  for (double v : to_doubles(t)) m = std::max(m, static_cast<float>(v));
  return m;
}

// The layer's output [T, H] for the given routing (logical ids and weights [T, k]), with its
// weights read and its GEMM inputs quantised as `quant` says (float weights by default).
inline std::vector<double> oracle_output(const ModelSpec& spec, const LayerWeights& w,
                                         const TensorView& hidden, const std::vector<int32_t>& ids,
                                         const std::vector<float>& weights,
                                         const QuantParams& quant = WeightFormat::f32) {
  const int64_t T = hidden.dim(0), H = spec.hidden, I = spec.intermediate, k = spec.routing.top_k;
  const std::vector<double> x = to_doubles(hidden), w13 = dequantized(w.w13, 2, quant),
                            w2 = dequantized(w.w2, 1, quant);
  float s13 = 0.0f, s2 = 0.0f;
  if (quant.activation == ActivationQuant::fp8_static) {
    s13 = std::max(largest(w.w13.input_scale), largest(w.shared_w13.input_scale));
    s2 = std::max(largest(w.w2.input_scale), largest(w.shared_w2.input_scale));
  }
  std::vector<double> out(static_cast<size_t>(T * H), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ids[t * k + j];
      add_quantized_mlp(spec.activation, quant, s13, s2, &w13[e * 2 * I * H], &w2[e * H * I], H, I,
                        &x[t * H], weights[t * k + j], &out[t * H]);
    }
  }
  if (spec.n_shared > 0) {
    const int64_t Is = spec.shared_intermediate;
    const std::vector<double> s13w = dequantized(w.shared_w13, 2, quant),
                              s2w = dequantized(w.shared_w2, 1, quant);
    const std::vector<double> gate =
        spec.shared_gate ? to_doubles(w.shared_gate) : std::vector<double>(H, 0.0);
    for (int64_t t = 0; t < T; ++t) {
      double g = 1.0;
      if (spec.shared_gate) {
        double dot = 0.0;
        for (int64_t h = 0; h < H; ++h) dot += x[t * H + h] * gate[h];
        g = 1.0 / (1.0 + std::exp(-dot));
      }
      for (int s = 0; s < spec.n_shared; ++s) {
        add_quantized_mlp(spec.activation, quant, s13, s2, &s13w[s * 2 * Is * H], &s2w[s * H * Is],
                          H, Is, &x[t * H], g, &out[t * H]);
      }
    }
  }
  return out;
}

// The layer's output against the oracle of its format, as a relative L2 error over all tokens.
// The oracle computes GEMM1 in float64, the cpu core and its decode op in f32. Where a GEMM2
// input that a format quantises to e4m3 lies within that difference of a rounding boundary,
// the two round it to neighbouring e4m3 values, and that token's output moves by a multiple of
// one column of one down matrix (the expert's, or a shared expert's). Such a token is counted,
// and compared with that column's part taken out.
struct OracleComparison {
  double error = 0.0;
  int rounded_apart = 0;  // tokens whose difference is one column of a down matrix
};

inline OracleComparison compare_with_oracle(const ModelSpec& spec, const LayerWeights& quantized,
                                            const QuantParams& quant, const TensorView& hidden,
                                            const std::vector<int32_t>& ids,
                                            const std::vector<float>& weights,
                                            const std::vector<double>& got) {
  const std::vector<double> want = oracle_output(spec, quantized, hidden, ids, weights, quant);
  const int64_t T = hidden.dim(0), H = spec.hidden, k = spec.routing.top_k;
  std::vector<double> w2, shared_w2;
  if (quant.quantizes_activations()) {
    w2 = dequantized(quantized.w2, 1, quant);
    if (spec.n_shared > 0) shared_w2 = dequantized(quantized.shared_w2, 1, quant);
  }
  OracleComparison result;
  double diff = 0.0, norm = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> d(static_cast<size_t>(H));
    double token_diff = 0.0, token_norm = 0.0;
    for (int64_t h = 0; h < H; ++h) {
      if (!std::isfinite(got[t * H + h])) return {INFINITY, result.rounded_apart};
      d[h] = got[t * H + h] - want[t * H + h];
      token_diff += d[h] * d[h];
      token_norm += want[t * H + h] * want[t * H + h];
    }
    norm += token_norm;
    if (w2.empty() || token_diff <= 1e-12 * token_norm) {
      diff += token_diff;
      continue;
    }
    // The largest part of d along one column of a down matrix [H, cols] this token used.
    double best = 0.0;
    const auto fit_columns = [&](const double* m, int64_t cols) {
      for (int64_t i = 0; i < cols; ++i) {
        double dot = 0.0, column = 0.0;
        for (int64_t h = 0; h < H; ++h) {
          dot += d[h] * m[h * cols + i];
          column += m[h * cols + i] * m[h * cols + i];
        }
        best = std::max(best, dot * dot / column);
      }
    };
    const int64_t I = spec.intermediate, Is = spec.shared_intermediate;
    for (int64_t j = 0; j < k; ++j) fit_columns(&w2[ids[t * k + j] * H * I], I);
    for (int s = 0; s < spec.n_shared; ++s) fit_columns(&shared_w2[s * H * Is], Is);
    const double residual = token_diff - best;
    if (residual < 1e-4 * token_diff) {
      ++result.rounded_apart;
      diff += residual;
    } else {
      diff += token_diff;
    }
  }
  result.error = std::sqrt(diff / norm);
  return result;
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
