#pragma once
// An oracle for the whole layer, written apart from the library: float64 throughout, from the
// stored weights, the router logits and the correction bias. It routes by itself
// (support/oracle_routing.hpp), checks the routing the layer reports against its own, and
// computes the output from its own routing. Tests compare every path with it.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "moekit/layer.hpp"
#include "moekit/testing.hpp"
#include "support/oracle_routing.hpp"

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

// A GEMM input as the format quantises it, element by element: the value the GEMM reads, and
// for quantised inputs the element before rounding (x / scale, in float), its scale, and how far
// a float32 computation of the input could move that unrounded element (its reach: zero for
// inputs given exactly).
struct QuantizedInput {
  std::vector<double> value;
  std::vector<float> unrounded;
  std::vector<float> scale;
  std::vector<double> reach;
};

inline constexpr double kFloat32Roundoff = 0x1p-24;

// f32 values; e4m3 with scale amax / 448 (amax floored at 1e-10) per token or per token per
// group, or a static scale; or int8 with scale amax / 127 per token per group, rounded half to
// even. `error`: a bound on how far a float32 computation of each element of x could be from it
// (none: x is exact).
inline QuantizedInput quantize_input(const QuantParams& q, float static_scale,
                                     const std::vector<double>& x,
                                     const std::vector<double>* error = nullptr) {
  if (q.activation == ActivationQuant::none) return {x, {}, {}, {}};
  const size_t n = x.size();
  const bool int8 = q.activation == ActivationQuant::int8_per_token_group;
  const size_t group = q.activation == ActivationQuant::fp8_per_token_group || int8
                           ? static_cast<size_t>(q.activation_group)
                           : n;
  QuantizedInput out{std::vector<double>(n), std::vector<float>(n), std::vector<float>(n),
                     std::vector<double>(n, 0.0)};
  for (size_t g0 = 0; g0 < n; g0 += group) {
    const size_t g1 = std::min(n, g0 + group);
    float amax = 0.0f;
    double largest_error = 0.0;
    for (size_t i = g0; i < g1; ++i) {
      amax = std::max(amax, std::fabs(static_cast<float>(x[i])));
      if (error) largest_error = std::max(largest_error, (*error)[i]);
    }
    const bool dynamic = q.activation != ActivationQuant::fp8_static;
    const float scale = dynamic ? std::max(amax, 1e-10f) / (int8 ? 127.0f : 448.0f) : static_scale;
    // A dynamic scale moves with the group's largest element.
    const double scale_error =
        dynamic ? largest_error / std::max(static_cast<double>(amax), 1e-10) : 0.0;
    for (size_t i = g0; i < g1; ++i) {
      const float v = static_cast<float>(x[i]) / scale;
      const float rounded = int8 ? std::clamp(std::nearbyint(v), -127.0f, 127.0f)
                                 : to_float(to_e4m3(std::clamp(v, -448.0f, 448.0f)));
      out.value[i] = static_cast<double>(rounded) * scale;
      out.unrounded[i] = v;
      out.scale[i] = scale;
      if (error) {
        out.reach[i] = (*error)[i] / scale + std::fabs(v) * (scale_error + 4.0 * kFloat32Roundoff);
      }
    }
  }
  return out;
}

inline std::vector<double> quantized_input(const QuantParams& q, float static_scale,
                                           const std::vector<double>& x) {
  return quantize_input(q, static_scale, x).value;
}

// Every finite e4m3 value, ascending, zero once.
inline const std::vector<double>& e4m3_values() {
  static const std::vector<double> values = [] {
    std::vector<double> v;
    for (int bits = 0; bits < 256; ++bits) {
      const float f = to_float(e4m3_t{static_cast<uint8_t>(bits)});
      if (std::isfinite(f) && !(f == 0.0f && std::signbit(f))) v.push_back(f);
    }
    std::sort(v.begin(), v.end());
    return v;
  }();
  return values;
}

// The quantised value next to `rounded` on the side of `unrounded` (x / scale): what a GEMM2
// input rounds to instead when a slightly different GEMM1 puts it on the other side of the
// rounding boundary. Nothing when `unrounded` does not lie within 1% of a step of that boundary
// or no such value exists.
struct Neighbour {
  double value;
  double distance;  // of `unrounded` from the boundary between the two
};

inline std::optional<Neighbour> rounded_apart_neighbour(const QuantParams& q, float unrounded,
                                                        double rounded) {
  if (unrounded == rounded) return std::nullopt;
  const bool up = unrounded > rounded;
  double neighbour;
  if (q.activation == ActivationQuant::int8_per_token_group) {
    neighbour = rounded + (up ? 1.0 : -1.0);
    if (std::fabs(neighbour) > 127.0) return std::nullopt;
  } else {
    const std::vector<double>& v = e4m3_values();
    const auto at = std::lower_bound(v.begin(), v.end(), rounded);
    if (at == v.end() || *at != rounded) return std::nullopt;  // saturated
    if (up ? at + 1 == v.end() : at == v.begin()) return std::nullopt;
    neighbour = up ? *(at + 1) : *(at - 1);
  }
  const double distance = std::fabs(unrounded - (rounded + neighbour) / 2.0);
  if (distance > 0.01 * std::fabs(neighbour - rounded)) return std::nullopt;
  return Neighbour{neighbour, distance};
}

// One MLP's part of one token's output: the down matrix [H, cols] it went through, its weight
// (routing weight, or the shared gate) and its GEMM2 input.
struct MlpPart {
  const double* down;
  int64_t cols;
  double weight;
  QuantizedInput act;
};

// How far a float32 computation of act(gate, up) could be from the float64 one, where float32
// gate and up dot products may each be off by their bounds: the activation at the corners of
// that box, plus a few ulps for the activation's own float32 arithmetic.
inline double activation_reach(const Activation& act, double gate, double up, double gate_error,
                               double up_error) {
  const double a = activate(act, gate, up);
  double reach = 0.0;
  for (double g : {gate - gate_error, gate + gate_error}) {
    for (double u : {up - up_error, up + up_error}) {
      reach = std::max(reach, std::fabs(activate(act, g, u) - a));
    }
  }
  return reach + 16.0 * kFloat32Roundoff * std::fabs(a);
}

// y += scale * down(act(gate x, up x)) with GEMM inputs quantised as the format says; returns
// the GEMM2 input, with the reach of a float32 GEMM1: a dot product of H terms summed in any
// order is within gamma_H * sum |w x| of the exact one (gamma_H = H u / (1 - H u)).
inline QuantizedInput add_quantized_mlp(const Activation& act, const QuantParams& q, float s13,
                                        float s2, const double* w13, const double* w2, int64_t H,
                                        int64_t I, const double* x_row, double scale, double* y) {
  const std::vector<double> x = quantized_input(q, s13, std::vector<double>(x_row, x_row + H));
  const double gamma =
      static_cast<double>(H) * kFloat32Roundoff / (1.0 - static_cast<double>(H) * kFloat32Roundoff);
  std::vector<double> a(static_cast<size_t>(I)), error(static_cast<size_t>(I));
  for (int64_t i = 0; i < I; ++i) {
    double g = 0, u = 0, g_abs = 0, u_abs = 0;
    for (int64_t h = 0; h < H; ++h) {
      g += w13[i * H + h] * x[h];
      u += w13[(I + i) * H + h] * x[h];
      g_abs += std::fabs(w13[i * H + h] * x[h]);
      u_abs += std::fabs(w13[(I + i) * H + h] * x[h]);
    }
    a[i] = activate(act, g, u);
    error[i] = activation_reach(act, g, u, gamma * g_abs, gamma * u_abs);
  }
  QuantizedInput quantized = quantize_input(q, s2, a, &error);
  for (int64_t h = 0; h < H; ++h) {
    double s = 0;
    for (int64_t i = 0; i < I; ++i) s += w2[h * I + i] * quantized.value[i];
    y[h] += scale * s;
  }
  return quantized;
}

// The largest of a stack's input scales; 0 for a stack that has none (a layer without shared
// experts).
inline float largest(const TensorView& t) {
  float m = 0.0f;
  if (t.data == nullptr) return m;
  for (double v : to_doubles(t)) m = std::max(m, static_cast<float>(v));
  return m;
}

// The layer in float64 with its weights read and its GEMM inputs quantised as `quant` says:
// the output [T, H] for a routing, and each token's parts.
class OracleLayer {
 public:
  OracleLayer(const ModelSpec& spec, const LayerWeights& w, const QuantParams& quant)
      : spec_(spec),
        quant_(quant),
        w13_(dequantized(w.w13, 2, quant)),
        w2_(dequantized(w.w2, 1, quant)) {
    if (quant.activation == ActivationQuant::fp8_static) {
      s13_ = std::max(largest(w.w13.input_scale), largest(w.shared_w13.input_scale));
      s2_ = std::max(largest(w.w2.input_scale), largest(w.shared_w2.input_scale));
    }
    if (spec.n_shared > 0) {
      shared_w13_ = dequantized(w.shared_w13, 2, quant);
      shared_w2_ = dequantized(w.shared_w2, 1, quant);
    }
    if (spec.shared_gate) shared_gate_ = to_doubles(w.shared_gate);
  }

  std::vector<double> output(const TensorView& hidden, const OracleRouting& routing,
                             std::vector<std::vector<MlpPart>>* parts = nullptr) const {
    const int64_t T = hidden.dim(0), H = spec_.hidden, I = spec_.intermediate;
    const int64_t k = routing.top_k, Is = spec_.shared_intermediate;
    const std::vector<double> x = to_doubles(hidden);
    std::vector<double> out(static_cast<size_t>(T * H), 0.0);
    if (parts) parts->assign(static_cast<size_t>(T), {});
    for (int64_t t = 0; t < T; ++t) {
      const auto add = [&](const double* w13, const double* w2, int64_t cols, double weight) {
        QuantizedInput act = add_quantized_mlp(spec_.activation, quant_, s13_, s2_, w13, w2, H,
                                               cols, &x[t * H], weight, &out[t * H]);
        if (parts) (*parts)[t].push_back({w2, cols, weight, std::move(act)});
      };
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = routing.ids[t * k + j];
        add(&w13_[e * 2 * I * H], &w2_[e * H * I], I, routing.weights[t * k + j]);
      }
      double gate = 1.0;
      if (spec_.shared_gate) {
        double dot = 0.0;
        for (int64_t h = 0; h < H; ++h) dot += x[t * H + h] * shared_gate_[h];
        gate = 1.0 / (1.0 + std::exp(-dot));
      }
      for (int s = 0; s < spec_.n_shared; ++s) {
        add(&shared_w13_[s * 2 * Is * H], &shared_w2_[s * H * Is], Is, gate);
      }
    }
    return out;
  }

  const ModelSpec& spec() const { return spec_; }
  const QuantParams& quant() const { return quant_; }

 private:
  ModelSpec spec_;
  QuantParams quant_;
  std::vector<double> w13_, w2_, shared_w13_, shared_w2_, shared_gate_;
  float s13_ = 0.0f, s2_ = 0.0f;
};

// The layer's output [T, H] for the oracle's routing, with its weights read and its GEMM inputs
// quantised as `quant` says (float weights by default).
inline std::vector<double> oracle_output(const ModelSpec& spec, const LayerWeights& w,
                                         const TensorView& hidden, const OracleRouting& routing,
                                         const QuantParams& quant = WeightFormat::f32) {
  return OracleLayer(spec, w, quant).output(hidden, routing);
}

// Values as an output of `dtype` holds them: what a layer that rounds only at the end writes.
inline std::vector<double> rounded_to(DType dtype, std::vector<double> values) {
  for (double& v : values) {
    const float f = static_cast<float>(v);
    if (dtype == DType::bf16) v = to_float(to_bf16(f));
    if (dtype == DType::f16) v = to_float(to_f16(f));
  }
  return values;
}

// How many tokens of a batch of T may have a GEMM2 input rounded apart from the oracle's beyond
// the reach of float32 (see compare_with_oracle): one in 64, rounded down, so none below 64
// tokens. The issue allows "at most 1 in 64, at least 0 for T < 8"; floor(T / 64) is the
// stricter reading of both, used everywhere.
inline int rounded_apart_allowance(int64_t T) {
  return static_cast<int>(T / 64);
}

// The layer's output against the oracle of its format, as a relative L2 error over all tokens,
// with the oracle rounded to the output's dtype first.
//
// The oracle computes GEMM1 in float64, the cpu cores in float32. Where a GEMM2 input that a
// format quantises (e4m3 or int8) lies near a rounding boundary, the two can round it to
// neighbouring values, and that token's output then moves by exactly one quantisation step of
// that element's scale, times its column of the down matrix, times the part's weight. A token
// whose difference is that step (what is left of it after taking the step out is float32
// noise) is compared with the step taken out:
// - a tie, when the element lies within the reach of a float32 GEMM1 of the boundary (an error
//   bound of the dot products and the activation, see add_quantized_mlp): either rounding is
//   right, as with routing ties, so these are not limited in number;
// - rounded apart, when it lies further (but within 1% of a step): at most
//   rounded_apart_allowance(T) such tokens are forgiven.
// Any other difference counts in full.
struct OracleComparison {
  double error = 0.0;
  int ties = 0;           // tokens with one GEMM2 input on the other side of a boundary it ties
  int rounded_apart = 0;  // tokens with one GEMM2 input one step apart, beyond float32's reach
  int allowed = 0;

  ::testing::AssertionResult within(double tolerance) const {
    if (error < tolerance && rounded_apart <= allowed) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << "relative L2 error " << error << " (tolerance " << tolerance << "), " << rounded_apart
           << " tokens with a GEMM2 input one step apart beyond float32's reach "
           << "(at most " << allowed << "), " << ties << " ties";
  }
};

inline OracleComparison compare_with_oracle(const OracleLayer& oracle, const TensorView& hidden,
                                            const OracleRouting& routing,
                                            const std::vector<double>& got, DType output) {
  const ModelSpec& spec = oracle.spec();
  const QuantParams& quant = oracle.quant();
  std::vector<std::vector<MlpPart>> parts;
  const std::vector<double> want = rounded_to(output, oracle.output(hidden, routing, &parts));
  const int64_t T = hidden.dim(0), H = spec.hidden;
  OracleComparison result;
  result.allowed = rounded_apart_allowance(T);
  double diff = 0.0, norm = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> d(static_cast<size_t>(H));
    double token_diff = 0.0, token_norm = 0.0;
    for (int64_t h = 0; h < H; ++h) {
      if (!std::isfinite(got[t * H + h])) {
        result.error = INFINITY;
        return result;
      }
      d[h] = got[t * H + h] - want[t * H + h];
      token_diff += d[h] * d[h];
      token_norm += want[t * H + h] * want[t * H + h];
    }
    norm += token_norm;
    // float32 noise: what a token's difference is when nothing rounded apart.
    const double noise = 1e-12 * token_norm;
    if (!quant.quantizes_activations() || token_diff <= noise) {
      diff += token_diff;
      continue;
    }
    // The smallest difference left after taking out one element's step.
    double best = token_diff;
    bool tie = false;
    for (const MlpPart& part : parts[t]) {
      for (int64_t i = 0; i < part.cols; ++i) {
        const double rounded = part.act.value[i] / part.act.scale[i];
        const std::optional<Neighbour> neighbour =
            rounded_apart_neighbour(quant, part.act.unrounded[i], rounded);
        if (!neighbour) continue;
        const double step = part.weight * (neighbour->value - rounded) * part.act.scale[i];
        double residual = 0.0;
        for (int64_t h = 0; h < H; ++h) {
          const double r = d[h] - step * part.down[h * part.cols + i];
          residual += r * r;
        }
        if (residual < best) {
          best = residual;
          tie = neighbour->distance <= part.act.reach[i];
        }
      }
    }
    if (best > std::max(noise, 1e-4 * token_diff)) {
      diff += token_diff;
    } else if (tie) {
      ++result.ties;
      diff += best;
    } else if (++result.rounded_apart <= result.allowed) {
      diff += best;
    } else {
      diff += token_diff;
    }
  }
  result.error = norm > 0.0 ? std::sqrt(diff / norm) : diff > 0.0 ? INFINITY : 0.0;
  return result;
}

inline OracleComparison compare_with_oracle(const ModelSpec& spec, const LayerWeights& quantized,
                                            const QuantParams& quant, const TensorView& hidden,
                                            const OracleRouting& routing,
                                            const std::vector<double>& got, DType output) {
  return compare_with_oracle(OracleLayer(spec, quantized, quant), hidden, routing, got, output);
}

// Relative L2 distance of got from want; non-finite anywhere in got gives +inf.
inline double relative_l2(const std::vector<double>& g, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) return INFINITY;
    diff += (g[i] - want[i]) * (g[i] - want[i]);
    norm += want[i] * want[i];
  }
  return norm > 0.0 ? std::sqrt(diff / norm) : diff > 0.0 ? INFINITY : 0.0;
}

inline double relative_l2(const TensorView& got, const std::vector<double>& want) {
  return relative_l2(to_doubles(got), want);
}

// The tolerance for an output stored in dtype, against the oracle rounded to that dtype: the
// oracle's float64 against a float32 core with float32 accumulation, plus what the cores may
// round inside at the precision of 16-bit activations (docs/ARCHITECTURE.md: bf16 GEMM inputs,
// int16 rows). bf16 keeps 8 significant bits, a unit roundoff of 2^-8 = 3.9e-3: 1e-2. f16 keeps
// 11, 2^-11 = 4.9e-4: 2e-3, four of its roundoffs (an output that rounds apart on a boundary,
// an f16 GEMM input rounded inside) and a fifth of bf16's tolerance, so that an f16 path
// computing at bf16 precision fails.
inline double tolerance(DType output) {
  switch (output) {
    case DType::f32:
      return 1e-5;
    case DType::f16:
      return 2e-3;
    default:
      return 1e-2;
  }
}

}  // namespace moekit::test
