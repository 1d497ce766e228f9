#include "bench/random_layer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/thread_pool.hpp"
#include "moekit/error.hpp"

namespace moekit::bench {
namespace {

// Elements per independently seeded block: large enough that seeding costs nothing, small
// enough that two threads share the work evenly.
constexpr int64_t kBlock = int64_t{1} << 16;

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint16_t bf16_bits(float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  bits += 0x7FFFu + ((bits >> 16) & 1u);  // round to nearest, ties to even (values are finite)
  return static_cast<uint16_t>(bits >> 16);
}

// Fills n elements, block by block on every thread, each from its own counter-based stream, so
// that the values depend on the seed only. `value` maps one 64-bit draw to an element.
template <typename T, typename Map>
void fill_blocks(T* out, int64_t n, uint64_t seed, int threads, const Map& value) {
  ThreadPool pool(threads);
  pool.parallel_for((n + kBlock - 1) / kBlock, [&](int64_t first, int64_t last) {
    for (int64_t block = first; block < last; ++block) {
      uint64_t state = seed ^ (static_cast<uint64_t>(block) * 0xD1B54A32D192ED03ull);
      const int64_t end = std::min(n, (block + 1) * kBlock);
      for (int64_t i = block * kBlock; i < end; ++i) out[i] = value(splitmix64(state));
    }
  });
}

// Four 16-bit uniforms of one draw, centred: mean 0, standard deviation kSumSigma.
constexpr double kSumMean = 4 * 32767.5;
const double kSumSigma = std::sqrt(4.0 * (65536.0 * 65536.0 - 1.0) / 12.0);
double centred_sum(uint64_t r) {
  return static_cast<double>((r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) +
                             (r >> 48)) -
         kSumMean;
}

}  // namespace

Tensor fast_random_bf16(Shape shape, float stddev, uint64_t seed, int threads) {
  Tensor tensor = Tensor::empty(DType::bf16, shape);
  const auto scale = static_cast<float>(stddev / kSumSigma);
  fill_blocks(tensor.data<uint16_t>(), shape.numel(), seed, threads, [scale](uint64_t r) {
    return bf16_bits(static_cast<float>(centred_sum(r)) * scale);
  });
  return tensor;
}

Tensor fast_random_f32(Shape shape, float stddev, uint64_t seed, int threads) {
  Tensor tensor = Tensor::empty(DType::f32, shape);
  const double scale = stddev / kSumSigma;
  fill_blocks(tensor.data<float>(), shape.numel(), seed, threads,
              [scale](uint64_t r) { return static_cast<float>(centred_sum(r) * scale); });
  return tensor;
}

Tensor fast_random_e4m3(Shape shape, float stddev, uint64_t seed, int threads) {
  // A sum of four 8-bit uniforms takes 1021 values: each one's e4m3 code, looked up, is far
  // cheaper than a conversion per element.
  constexpr int kSums = 4 * 255 + 1;
  const double sigma = std::sqrt(4.0 * (256.0 * 256.0 - 1.0) / 12.0);
  std::vector<uint8_t> codes(kSums);
  for (int s = 0; s < kSums; ++s) {
    codes[static_cast<size_t>(s)] =
        to_e4m3(static_cast<float>((s - 4 * 127.5) * stddev / sigma)).bits;
  }
  Tensor tensor = Tensor::empty(DType::f8e4m3, shape);
  fill_blocks(tensor.data<uint8_t>(), shape.numel(), seed, threads, [&codes](uint64_t r) {
    const uint64_t sum = (r & 0xFF) + ((r >> 8) & 0xFF) + ((r >> 16) & 0xFF) + ((r >> 24) & 0xFF);
    return codes[sum];
  });
  return tensor;
}

RandomWeights fast_random_weights(const ModelSpec& spec, uint64_t seed, int threads) {
  if (spec.n_shared > 0 || spec.routing.correction_bias) {
    fail(Errc::invalid_argument,
         "fast random weights: {} has shared experts or a correction bias; only routed experts "
         "are generated",
         spec.name);
  }
  const int64_t E = spec.n_experts, H = spec.hidden, I = spec.intermediate;
  const auto scale = [](int64_t fan_in) { return 1.0f / std::sqrt(static_cast<float>(fan_in)); };
  RandomWeights weights;
  weights.w13 = fast_random_bf16({E, 2 * I, H}, scale(H), seed, threads);
  weights.w2 = fast_random_bf16({E, H, I}, scale(I), seed + 1, threads);
  return weights;
}

}  // namespace moekit::bench
