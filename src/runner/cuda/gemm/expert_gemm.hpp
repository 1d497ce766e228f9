#pragma once
// The expert computation of the cuda runner: grouped GEMM1 (gate and up, with the gated
// activation) and GEMM2 (down, with the router weight), over rows grouped per local expert.
//
// Layouts (canonical; no packing is needed):
//   x    [rows, H]        GEMM1 input; expert e owns rows [offsets[e], offsets[e + 1]). No
//                         padding or alignment of the groups is needed: rows past a group's end
//                         are neither read nor written, and rows past offsets[E] are left alone.
//   w13  [E, 2I, H]       rows 0..I-1 gate, I..2I-1 up, each row contiguous along H
//   act  [rows, I]        GEMM1 output, GEMM2 input
//   w2   [E, H, I]
//   out  [rows, H] f32    GEMM2 output, out[r] = route_weight[r] * (act[r] . w2 rows)
// fp8 formats: x, w13, w2 and GEMM2's act are e4m3 with f32 scales (Fp8Scales). GEMM1 writes its
// activation in f32 and quantize_rows_e4m3 quantises it for GEMM2, per row per 128 columns or
// per row, dynamic or static, as docs/QUANTIZATION.md defines; or, where gemm1_quantizes says
// the kernel can, GEMM1 writes the e4m3 codes and scales itself (Gemm1Quantized).
//
// Every launch enqueues on the given stream and returns: no allocation, no host
// synchronisation (capturable in a CUDA graph). No float atomics: the same inputs give
// bit-identical outputs. Bad arguments throw std::invalid_argument naming the argument; a
// failed launch throws std::runtime_error.

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "moekit/dtype.hpp"
#include "moekit/spec.hpp"

namespace moekit::cuda_gemm {

// decode: many CTAs per expert, each streaming 32 weight rows over all of K once for a tile of
// up to 8 rows; made for a few rows per expert.
// prefill: tensor-core tiles of 64 or 128 rows x 128 weight rows with a cp.async pipeline and
// mma.sync, on every GPU from sm_80.
// wgmma: Hopper's warpgroup MMA fed by TMA copies from a producer warp (sm_90a; 64 or 128 rows
// x 128 or 256 weight rows, or the decode tiles of 8 or 16 rows with the weights on wgmma's M
// side), e4m3 on the fp8 tensor cores; on GPUs of compute capability 9.0.
// one_token: a batch of one token, both GEMMs and the weighted sum in one kernel of CUDA-core
// dot products (one_token.hpp); launch_one_token runs it, not launch_gemm1 and launch_gemm2.
enum class GemmKernel : uint8_t { decode, prefill, wgmma, one_token };

struct GemmChoice {
  GemmKernel kernel = GemmKernel::decode;
  int token_tile = 8;  // rows of one expert per CTA: decode 8, prefill 64 or 128, wgmma 8, 16,
                       // 64 or 128
  // decode: slices of 32 weight rows each CTA takes in turn (1 to 4), for GEMM1 and GEMM2.
  int gemm1_slices = 1;
  int gemm2_slices = 1;
  // wgmma: weight rows per CTA of GEMM1 and GEMM2 with tiles of 64 rows, 256 or 128 (twice the
  // CTAs, two to an SM); 0 is the widest the token tile has (256, or 128 for e4m3's 128 rows).
  int gemm1_cols = 0;
  int gemm2_cols = 0;
  // wgmma decode tiles: CTAs sharing each tile's K steps in GEMM1 and GEMM2 (1: K not split;
  // SplitK below).
  int gemm1_splits = 1;
  int gemm2_splits = 1;
  // The wgmma decode tiles of 8 rows on 16-bit weights, for a batch of at most
  // kRowsFromHiddenMaxTokens tokens and kMaxDecodeEntries entries: the GEMMs can take the router's
  // entries as they are (DecodeEntries), GEMM1 reading every token's row straight from the hidden
  // states, so no sort and gather run before it.
  bool rows_from_hidden = false;
  std::string str() const;
};

// What the heuristic reads: the layer's shapes and format, how many rows reach the experts in
// all (T * k, counting each row once per expert it is routed to) and the device's SM count.
struct GemmProblem {
  DType dtype = DType::bf16;  // bf16, f16 or f8e4m3 (weights and GEMM inputs)
  int64_t rows = 0;           // grouped rows in all
  int num_experts = 0;        // local experts
  int hidden = 0;
  int intermediate = 0;
  int sm_count = 132;
  int compute_capability = 0;  // major * 10 + minor; 90 (Hopper) takes the wgmma kernel
  int64_t tokens = 0;          // the batch the rows come from (0: not known)
};

// The kernel and tile for a problem (measured on the H200, bench/cuda/NOTES.md):
// - one token (tokens == 1) of 16-bit weights whose shapes the one-token kernel takes
//   (one_token_unsupported) and that reads at most kOneTokenMaxWeightBytes of weights:
//   one_token, the grouped path's chain of launches gone (bench/cuda/NOTES.md v18).
// - e4m3: decode while an expert hit by the batch gets at most 4 rows on average
//   (rows / min(E, rows)), with as many slices per CTA (up to 4) as leave two waves of CTAs;
//   prefill beyond.
// - bf16/f16: prefill, unless its GEMM1 grid would give fewer CTAs than the device has SMs
//   (tiny layers at T = 1): then decode, one slice per CTA.
// - prefill's token tile: for bf16/f16 128 rows from about 96 rows per hit expert, else 64.
// - compute capability 9.0: wgmma for every aligned shape: the decode tiles of 8 rows (weights
//   on wgmma's M side) up to 2 rows per hit expert, 16-bit tiles of 128 rows from about 96,
//   else tiles of 64.
// - the decode tiles split K where a batch's few tiles each stream many bytes (Mixtral-8x7B at
//   T = 1: GEMM2's 32 tiles of 7.3 MB), into as many CTAs per tile as keep every CTA on an SM of
//   its own, each with at least 768 KB of weights; not where the tiles are small (Qwen3-30B-A3B
//   at T = 1 measured slower split).
// - rows_from_hidden wherever the decode tiles of 8 rows run 16-bit weights for a batch of at
//   most kRowsFromHiddenMaxTokens tokens and kMaxDecodeEntries entries: each CTA placing the
//   entries itself costs about what the sort + gather kernel did from 4 tokens on (H100,
//   Qwen3-30B-A3B bf16 against the sort + gather: T = 1 0.976, T = 2 0.996, T = 4 1.012).
// - rows that are not 16-byte aligned (H or I not a multiple of 8 for 16-bit formats, of 16 for
//   e4m3) run on decode, the only kernel that reads them.
GemmChoice choose_gemm(const GemmProblem& problem);

// Split K's memory (GemmChoice::gemm1_splits or gemm2_splits above 1): each CTA leaves its f32
// partial sums in `partials`, and the last of a tile's CTAs to count itself in on the tile's
// counter adds them all, in split order (the same bits whichever CTA comes last), and runs the
// epilogue. The counters must be zero before the first launch; every launch leaves them zero, so
// they are allocated once and zeroed once. One pair per GEMM: GEMM2 is launched while GEMM1 runs.
struct SplitK {
  float* partials = nullptr;     // SplitKSize::partials floats
  uint32_t* counters = nullptr;  // SplitKSize::counters
};
struct SplitKSize {
  int64_t partials = 0;
  int64_t counters = 0;
};
// What GEMM1 (gemm1) or GEMM2 needs under `choice` for up to `rows` grouped rows over
// `num_experts` experts with n output columns (GEMM1: I, GEMM2: H); zeros where K is not split.
SplitKSize split_k_size(const GemmChoice& choice, bool gemm1, int64_t rows, int num_experts, int n);

// fp8 scales. Weights: the grid docs/QUANTIZATION.md defines, [E, parts * ceil(N / block_rows),
// ceil(K / block_cols)] with 0 standing for the whole dimension: fp8-block 128 x 128, fp8-tensor
// 0 x 0 (per matrix) or 1 x 0 (per channel). Activations: [rows, ceil(K / 128)]
// (activation_block_cols 128), [rows] (0), or one static scale (activation_static).
struct Fp8Scales {
  const float* weight = nullptr;
  int weight_block_rows = 0;
  int weight_block_cols = 0;
  const float* activation = nullptr;
  int activation_block_cols = 0;
  bool activation_static = false;
};

// Where GEMM1 writes GEMM2's e4m3 input itself, in its epilogue, instead of the f32 activation
// that quantize_rows_e4m3 would read (one launch and the f32 rows' round trip fewer): the same
// codes and scales, bit for bit.
struct Gemm1Quantized {
  uint8_t* out = nullptr;               // [rows, I] e4m3; null: GEMM1 writes `act` in f32
  float* scales = nullptr;              // [rows, ceil(I / 128)] (dynamic scales)
  const float* static_scale = nullptr;  // one f32 on the device; nullptr: dynamic, per 128
};

// Whether GEMM1 with `choice` can quantise its output for GEMM2 (Gemm1Args::quantized): the
// wgmma kernel with tiles of 64 x 256, whose CTA holds 128 whole columns of its rows (one
// activation scale group), for scales per 128 columns or a static one. Not for a scale over the
// whole row (fp8-tensor, dynamic), which spans CTAs.
bool gemm1_quantizes(const GemmChoice& choice, int activation_group, bool static_scale);

// A decode step's entries as the router left them, for a choice with rows_from_hidden: every
// CTA places the entries itself (one warp; tiny_sort.cuh) instead of reading a sort's offsets,
// GEMM1 takes `x` as the hidden states [tokens, hidden] in the weights' dtype (one tile of every
// token per hit slot) and writes each entry's row to `entry_row`, as sort_by_slot would have;
// the rows of `act` and GEMM2's are the sort's. ids null: the GEMMs read the sort's offsets.
constexpr int kWgmmaDecodeTile = 8;  // token rows of the wgmma decode tile that reads them
constexpr int kMaxDecodeEntries = 32;
constexpr int kRowsFromHiddenMaxTokens = 2;  // choose_gemm's measured limit
static_assert(kRowsFromHiddenMaxTokens <= kWgmmaDecodeTile, "a token is a row of the tile");
struct DecodeEntries {
  const int32_t* ids = nullptr;  // [tokens, columns]: local slots, or global ids with the table
  const int32_t* global_to_local = nullptr;  // [n_global], -1 = not here; null: ids are slots
  int n_global = 0;
  int tokens = 0;
  int columns = 0;
  int32_t* entry_row = nullptr;  // GEMM1: [tokens * columns] out, -1 = not here
};

struct Gemm1Args {
  DType dtype = DType::bf16;  // of x and w13: bf16, f16 or f8e4m3
  const void* x = nullptr;
  const void* w13 = nullptr;
  Fp8Scales scales;                  // f8e4m3 only
  const int32_t* offsets = nullptr;  // [num_experts + 1], on the device
  int num_experts = 0;
  int64_t rows = 0;  // rows x and act hold; offsets[num_experts] <= rows
  int hidden = 0;
  int intermediate = 0;
  Activation activation;
  void* act = nullptr;       // [rows, I]: dtype for bf16/f16, f32 for f8e4m3
  Gemm1Quantized quantized;  // f8e4m3 where gemm1_quantizes(choice, ...): act is not written
  GemmChoice choice;
  SplitK split;           // where choice.gemm1_splits > 1
  DecodeEntries entries;  // where choice.rows_from_hidden: x is the hidden states
};

struct Gemm2Args {
  DType dtype = DType::bf16;  // of act and w2
  const void* act = nullptr;
  const void* w2 = nullptr;
  Fp8Scales scales;
  const int32_t* offsets = nullptr;
  int num_experts = 0;
  int64_t rows = 0;
  int hidden = 0;
  int intermediate = 0;
  const float* route_weight = nullptr;  // [rows]; nullptr: 1
  float* out = nullptr;                 // [rows, H]
  GemmChoice choice;
  SplitK split;           // where choice.gemm2_splits > 1
  DecodeEntries entries;  // where choice.rows_from_hidden and GEMM1 took them
};

// act[r] = activation(gate_r . x_r, up_r . x_r) for every grouped row r.
void launch_gemm1(const Gemm1Args& args, cudaStream_t stream);
// out[r] = route_weight[r] * (w2 . act_r) for every grouped row r.
void launch_gemm2(const Gemm2Args& args, cudaStream_t stream);

// GEMM2's input for the fp8 formats: e4m3 of in / scale with scale = max(amax, 1e-10) / 448
// over each group of `group` columns of a row (0: the whole row), or the static scale.
struct QuantizeRowsArgs {
  const float* in = nullptr;         // [rows, cols]
  const int32_t* offsets = nullptr;  // rows past offsets[num_experts] are left alone
  int num_experts = 0;
  int64_t rows = 0;
  int cols = 0;
  int group = 128;                      // 128 or 0
  const float* static_scale = nullptr;  // one f32 on the device; nullptr: dynamic
  uint8_t* out = nullptr;               // [rows, cols] e4m3
  float* scales = nullptr;              // [rows, ceil(cols / group)] (dynamic only)
};
void launch_quantize_rows_e4m3(const QuantizeRowsArgs& args, cudaStream_t stream);

}  // namespace moekit::cuda_gemm
