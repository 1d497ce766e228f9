#pragma once
// Random layers big enough to benchmark (Qwen3-30B-A3B has 604M expert weights per layer),
// made in about a second: bf16 written directly from a counter-based generator on every thread.

#include <cstdint>

#include "moekit/spec.hpp"
#include "moekit/tensor.hpp"
#include "moekit/testing.hpp"

namespace moekit::bench {

// bf16 values of mean 0 and standard deviation `stddev`, shaped roughly like a normal
// distribution (a sum of four uniforms, so within 3.5 standard deviations). The values depend
// on `seed` only, not on `threads`.
Tensor fast_random_bf16(Shape shape, float stddev, uint64_t seed, int threads);

// The same distribution in f32 (router logits: far fewer ties than bf16 values would give).
Tensor fast_random_f32(Shape shape, float stddev, uint64_t seed, int threads);
// e4m3 codes of values of standard deviation `stddev` (a sum of four 8-bit uniforms, rounded to
// e4m3): weights already in an fp8 format's stored form. Keep 3.5 * stddev below 448.
Tensor fast_random_e4m3(Shape shape, float stddev, uint64_t seed, int threads);

// The routed experts of `spec` in bf16, scaled as RandomWeights::make scales them (1/sqrt of
// the fan-in, so activations stay of order one). Specs with shared experts or a correction bias
// are refused: the benchmark cases have neither.
RandomWeights fast_random_weights(const ModelSpec& spec, uint64_t seed, int threads);

}  // namespace moekit::bench
