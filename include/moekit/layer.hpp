#pragma once
// One MoE layer, built from a Plan and the model's weights; forward() runs the plan.

#include <memory>
#include <string>

#include "moekit/plan.hpp"
#include "moekit/tensor.hpp"

namespace moekit {

// The model's weights for one layer, on the CPU. Expert weights come as floats (f32, bf16, f16),
// which the layer converts or quantises into the plan's weight format, or already in that format
// with their scales (see ExpertMatrices). The layer copies only what this rank holds.
struct LayerWeights {
  ExpertMatrices w13;          // [E, 2I, H]: gate rows, then up rows (2 parts)
  ExpertMatrices w2;           // [E, H, I]
  TensorView correction_bias;  // [E] f32, when spec.routing.correction_bias
  ExpertMatrices shared_w13;   // [n_shared, 2 * shared_I, H], when spec.n_shared > 0
  ExpertMatrices shared_w2;    // [n_shared, H, shared_I]
  TensorView shared_gate;      // [1, H] f32/bf16/f16, when spec.shared_gate
};

// One expert's matrices as a LayerWeightSource hands them over: w13 [1, 2I, H] (gate rows, then
// up rows) and w2 [1, H, I], as ExpertMatrices describes them. `origin` says where they come
// from ("model.layers.3.mlp.experts.7"), for error messages.
struct ExpertWeights {
  ExpertMatrices w13;
  ExpertMatrices w2;
  std::string origin;
};

// A layer's weights handed over one expert at a time, so that a rank reads only the experts it
// holds and nothing stacks every expert in memory (a checkpoint on disk, say). The views a call
// returns need to stay valid only until the next call.
class LayerWeightSource {
 public:
  virtual ~LayerWeightSource() = default;
  virtual ExpertWeights routed(int expert) = 0;  // a logical expert id
  virtual ExpertWeights shared(int index) = 0;
  virtual TensorView correction_bias() = 0;  // [E] f32, when spec.routing.correction_bias
  virtual TensorView shared_gate() = 0;      // [1, H], when spec.shared_gate
};

// A layer's float weights quantised once into a format, routed and shared experts alike, as a
// layer with that format would quantise them at load time. view() borrows the correction bias
// and input scales of the source weights, which must outlive it.
struct QuantizedLayerWeights {
  QuantizedMatrices w13, w2, shared_w13, shared_w2;
  TensorView correction_bias;
  TensorView shared_gate;
  TensorView input_scales[4];  // w13, w2, shared_w13, shared_w2
  LayerWeights view() const;
};
QuantizedLayerWeights quantize_layer(const LayerWeights& weights, const QuantParams& params);

// Where forward() may also write the routing it used (logical expert ids).
struct RoutingResult {
  TensorView ids;      // int32 [T, top_k]
  TensorView weights;  // f32 [T, top_k]
};

class MoeLayer {
 public:
  // Checks every weight's shape and dtype against the plan's spec (invalid_argument naming it),
  // allocates the weights this rank holds and all scratch memory, once.
  MoeLayer(const Plan& plan, const LayerWeights& weights);
  // The same from a source that hands over one expert at a time; only this rank's experts are
  // asked for, and each is checked as it arrives. fp8 static activation scales come with
  // LayerWeights only (they are the largest over all experts).
  MoeLayer(const Plan& plan, LayerWeightSource& source);
  ~MoeLayer();
  MoeLayer(MoeLayer&&) noexcept;
  MoeLayer& operator=(MoeLayer&&) noexcept;

  // hidden: [T, H] f32/bf16/f16; router_logits: [T, E] f32/bf16/f16; output: [T, H], hidden's
  // dtype. T may be 0 (nothing is done) and at most plan.options.max_tokens. Under expert
  // parallelism the output is this rank's partial sum; the ranks' outputs add to the layer's.
  // On a GPU this forward waits for its work and throws what the device's finite checks found.
  void forward(const TensorView& hidden, const TensorView& router_logits, const TensorView& output,
               const RoutingResult* routing = nullptr);
  // On a GPU: enqueues the whole layer on `stream` (cudaStream_t; nullptr: the default stream)
  // and returns without waiting; nothing is allocated and the host never waits, so the call can
  // be captured in a CUDA graph. The inputs must stay valid until the stream has run it. A NaN or
  // Inf in the inputs is found on the device and reported by the next synchronize(). On the CPU
  // it is the forward above (the stream is not used).
  void forward(const TensorView& hidden, const TensorView& router_logits, const TensorView& output,
               const RoutingResult* routing, CUstream_st* stream);
  // Waits for the work the last stream-ordered forward enqueued, and throws invalid_argument,
  // naming the tensor, row and column, for a non-finite input any forward since the last
  // synchronize() was given.
  void synchronize();

  const Plan& plan() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace moekit
