// Argument checks, the heuristic, the launches and the quantisation of GEMM2's input.

#include "runner/cuda/gemm/expert_gemm.hpp"

#include <cuda_fp8.h>

#include <algorithm>
#include <stdexcept>

#include "core/cuda_launch.cuh"
#include "runner/cuda/gemm/gemm_kernels.cuh"
#include "runner/cuda/gemm/one_token.hpp"

namespace moekit::cuda_gemm {

namespace {

using detail::Elem;

constexpr int kMaxGridY = 65535;
constexpr int64_t kMaxGridX = 0x7FFFFFFF;

// The heuristic's thresholds, from the H200 measurements in bench/cuda/NOTES.md (run 3):
// - e4m3: decode (f16 mma after in-register conversion) beats prefill up to 4 rows per hit
//   expert (DeepSeek-V3 T <= 64, Qwen3-30B-A3B T <= 64), prefill beyond (Qwen3 T = 512: 3x).
// - 16-bit: prefill's cp.async pipeline streams the weights faster than decode at every batch
//   measured (DeepSeek-V3 T = 1: 189 against 198 us) except where its grid leaves SMs idle
//   (Qwen3-30B-A3B T = 1: 96 CTAs, 39.4 against 36.1 us).
// - decode's slices: e4m3 gains from them (DeepSeek-V3 T = 64: 2597 against 2906 us); 16-bit
//   loses (5537 against 5104 us), so 16-bit decode takes one slice per CTA.
constexpr int64_t kDecodeMaxRowsFp8 = 4;
// - 16-bit prefill: tiles of 128 rows (warps of 64 x 64) from about 96 rows per hit expert on
//   (DeepSeek-V3 T = 4096: 12.4 against 13.8 ms; T = 16384: 38.1 against 46.1; Qwen3-30B-A3B
//   T = 4096: 1.11 against 1.40), tiles of 64 below (Qwen3 T = 512: 355 against 373 us).
//   e4m3 keeps tiles of 64: with fp8-block's second set of accumulators a 128-row tile has
//   warps of 64 x 32 only, slower at every batch measured (DeepSeek-V3 T = 4096: 18.3 against
//   12.8 ms; Qwen3 T = 4096: 1.97 against 1.42).
constexpr int64_t kPrefill128MinRows = 96;
// - wgmma (Hopper, TMA-fed; bench/cuda/NOTES.md v5), on a GPU of compute capability 9.0:
//   16-bit wherever prefill would run (DeepSeek-V3 bf16 T = 1 / 8 / 64: 176 / 1169 / 4444 us
//   against prefill's 181 / 1185 / 4543; T = 4096: 7.9 against 12.5 ms), in tiles of 128 rows
//   from about 96 rows per hit expert (T = 4096: 7.9 against 8.9 ms with 64; Qwen3-30B-A3B
//   T = 512: 332 against 397 us with 128). e4m3 from the first row on, in tiles of 64 (its
//   128-row shape has warpgroups of 64 x 128, slower everywhere: DeepSeek-V3 T = 4096 6.1 against
//   6.5 ms): it streams faster than decode (DeepSeek-V3 T = 1 / 8 / 64: 103 / 603 / 2255 us
//   against 125 / 651 / 2499; Qwen3 T = 64: 176 against 204).
constexpr int64_t kWgmma128MinRows = 96;
// - wgmma's tiles of 64 rows take CTAs of 128 weight rows (two to an SM) in a GEMM whose expert
//   has at most 2048 weight rows (Qwen3-30B-A3B: GEMM1 1536, GEMM2 2048), 256 beyond
//   (bench/cuda/NOTES.md v7; both GEMMs, us): Qwen3 e4m3 T = 1 / 8 / 64 / 512 / 4096 27.5 / 79.5
//   / 167 / 196 / 681 against 33.5 / 106 / 188 / 224 / 759; bf16 T = 1 / 8 / 512 34.3 / 131.9 /
//   321.5 against 36.0 (decode) / 134.8 / 336.2, level at T = 64. DeepSeek-V3 (4096 and 7168
//   weight rows) loses with them: bf16 T = 1 206.5 against 176.6, e4m3 T = 8 643 against 612.
//   Where GEMM1 takes them, 16-bit runs wgmma even at the batches where its grid would have sent
//   it to decode.
constexpr int kWgmmaNarrowMaxWeightRows = 2048;
// - wgmma's decode tiles (weights on wgmma's M side, 8 token rows on N; bench/cuda/NOTES.md v8)
//   while an expert hit by the batch gets at most 2 rows on average, in CTAs of 256 weight rows
//   (for e4m3 GEMM1 then quantises GEMM2's input). Both GEMMs, us, against the tiles of 64:
//   Qwen3-30B-A3B T = 1 e4m3 22.8 against 28.1 (narrow, the tile of 128 weight rows 25.6), bf16
//   30.6 against 33.9; T = 8 e4m3 76.1 against 80.0; DeepSeek-V3 bf16 T = 8 / 64 1156 / 4425
//   against 1167 / 4528, e4m3 T = 8 590 against 610. Level at 4 rows (Qwen3 T = 64).
constexpr int64_t kWgmmaDecodeMaxRows = 2;
constexpr int kWgmmaNarrowCols = 128;
// - split K on the decode tiles (one CTA of 256 weight rows to an SM), where a batch's tiles
//   number at most half the SMs and each streams many bytes: splits = SMs / tiles (no CTA waits
//   for a second wave), each split at least kSplitMinBytes of weights and kSplitMinSteps K steps,
//   at most kMaxSplits (bench/cuda/NOTES.md v9, both GEMMs, us). Mixtral-8x7B T = 1, GEMM2's 32
//   tiles of 7.3 MB (bf16) or 3.7 MB (e4m3) in 4: bf16 178.1 against 197.4, e4m3 99.3 against
//   125.9 (3 splits 107.5). Qwen3-30B-A3B T = 1, 48 and 64 tiles of at most 1 MB, loses split in
//   2 (bf16 31.3 against 29.1, e4m3 22.5 against 22.1): there a CTA's fixed costs, not the idle
//   SMs, hold the GEMMs.
constexpr int64_t kSplitMinBytes = int64_t{768} << 10;
constexpr int kSplitMinSteps = 3;
constexpr int kMaxSplits = 8;

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

[[noreturn]] void bad(const std::string& what) {
  throw std::invalid_argument(what);
}

Elem elem_of(DType dtype, const char* who) {
  switch (dtype) {
    case DType::bf16:
      return Elem::bf16;
    case DType::f16:
      return Elem::f16;
    case DType::f8e4m3:
      return Elem::e4m3;
    default:
      bad(std::string(who) + ".dtype: DType " + std::to_string(static_cast<int>(dtype)) +
          " is not a GEMM input type (bf16, f16 or f8e4m3)");
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

struct Shape {
  const char* who;
  Elem elem;
  bool gated;
  int n;
  int k;
};

// The fp8 scale fields of Params, checked; false for per-matrix/per-channel scales.
bool fill_scales(const Shape& s, const Fp8Scales& f, detail::Params& p) {
  const std::string who = std::string(s.who) + ".scales";
  if (f.weight == nullptr || f.activation == nullptr) {
    bad(who + ": f8e4m3 needs weight and activation scales (one is null)");
  }
  if (f.weight_block_rows != 0 && f.weight_block_rows != 1 && f.weight_block_rows != 128) {
    bad(who + ".weight_block_rows: " + std::to_string(f.weight_block_rows) +
        " is not 0 (per matrix), 1 (per channel) or 128");
  }
  const bool per_block = f.weight_block_cols == 128;
  if (f.weight_block_cols != 0 && !per_block) {
    bad(who + ".weight_block_cols: " + std::to_string(f.weight_block_cols) + " is not 0 or 128");
  }
  if (per_block != (f.weight_block_rows == 128)) {
    bad(who + ": weight blocks " + std::to_string(f.weight_block_rows) + " x " +
        std::to_string(f.weight_block_cols) + " are neither 128 x 128 nor whole rows");
  }
  if (f.activation_static && f.activation_block_cols != 0) {
    bad(who + ": a static activation scale has no column blocks (activation_block_cols " +
        std::to_string(f.activation_block_cols) + ")");
  }
  if (per_block != (f.activation_block_cols == 128)) {
    bad(who + ".activation_block_cols: " + std::to_string(f.activation_block_cols) +
        (per_block ? " with 128 x 128 weight blocks; they need 128"
                   : " with per-matrix or per-channel weight scales; they need 0"));
  }
  const int kblocks = static_cast<int>(ceil_div(s.k, 128));
  p.w_scale = f.weight;
  p.a_scale = f.activation;
  p.ws_block_rows = f.weight_block_rows;
  p.ws_per_part =
      f.weight_block_rows == 0 ? 1 : static_cast<int>(ceil_div(s.n, f.weight_block_rows));
  p.ws_cols = per_block ? kblocks : 1;
  p.ws_kb_step = per_block ? 1 : 0;
  p.as_cols = f.activation_static ? 0 : (per_block ? kblocks : 1);
  p.as_kb_step = per_block ? 1 : 0;
  return per_block;
}

// The wgmma tile of GEMM1 (gated) or GEMM2 under `choice`.
detail::WgmmaTile wgmma_tile_of(const GemmChoice& choice, bool gated, bool e4m3) {
  const int cols = gated ? choice.gemm1_cols : choice.gemm2_cols;
  return {.rows = choice.token_tile,
          .cols = cols == 0 ? detail::wgmma_widest_cols(e4m3, choice.token_tile) : cols};
}

static_assert(detail::Prefill64::kCols == detail::Prefill128::kCols &&
              detail::Prefill64::kCols == detail::Prefill128Block::kCols);

// Params' split K fields, checked against the choice.
void fill_split(const Shape& s, const GemmChoice& choice, const SplitK& split, detail::Params& p) {
  const int splits = s.gated ? choice.gemm1_splits : choice.gemm2_splits;
  const std::string who = std::string(s.who) + ".choice: " + choice.str();
  if (splits < 1 || splits > kMaxSplits) {
    bad(who + " splits K in " + std::to_string(splits) + ", not 1 to " +
        std::to_string(kMaxSplits));
  }
  if (splits > 1 && !(choice.kernel == GemmKernel::wgmma && choice.token_tile < 64)) {
    bad(who + " splits K, which only the wgmma decode tiles (8 or 16 rows) do");
  }
  if (splits > 1 && (split.partials == nullptr || split.counters == nullptr)) {
    bad(std::string(s.who) + ".split: K split in " + std::to_string(splits) +
        " needs partials and counters (split_k_size)");
  }
  p.splits = splits;
  p.split_partials = split.partials;
  p.split_counters = split.counters;
}

// `rows` bounds the grid; the input's tensor map covers `a_rows` rows (the hidden states' tokens
// where GEMM1 reads them, else `rows`).
void launch(const Shape& s, detail::Params p, bool per_block, int64_t rows, int64_t a_rows,
            const GemmChoice& choice, const SplitK& split, cudaStream_t stream) {
  if (choice.kernel == GemmKernel::one_token) {
    bad(std::string(s.who) + ".choice: one-token runs both GEMMs in one launch (launch_one_token)");
  }
  fill_split(s, choice, split, p);
  const int slices = s.gated ? choice.gemm1_slices : choice.gemm2_slices;
  p.slices = choice.kernel == GemmKernel::decode ? slices : 1;
  const int bytes = s.elem == Elem::e4m3 ? 1 : 2;
  const bool vec = static_cast<int64_t>(s.k) * bytes % 16 == 0 && aligned16(p.a) &&
                   aligned16(p.w) && aligned16(p.out);
  const detail::Variant v{s.gated, vec, per_block};
  if (choice.kernel != GemmKernel::decode) {
    const bool hopper = choice.kernel == GemmKernel::wgmma;
    const bool tile_ok = choice.token_tile == 64 || choice.token_tile == 128 ||
                         (hopper && (choice.token_tile == 8 || choice.token_tile == 16));
    if (!tile_ok) {
      bad(std::string(s.who) + ".choice: " + choice.str() + " takes token_tile " +
          (hopper ? "8, 16, 64 or 128" : "64 or 128") + ", not " +
          std::to_string(choice.token_tile));
    }
    if (!vec || s.n % 2 != 0) {
      bad(std::string(s.who) + ": " + choice.str() +
          " needs 16-byte aligned rows and pointers and an even N (K = " + std::to_string(s.k) +
          ", N = " + std::to_string(s.n) + "); choose_gemm picks decode for such shapes");
    }
    const detail::WgmmaTile wgmma_tile = wgmma_tile_of(choice, s.gated, s.elem == Elem::e4m3);
    if (hopper && !detail::wgmma_builds(s.elem == Elem::e4m3, wgmma_tile)) {
      bad(std::string(s.who) + ".choice: " + choice.str() + " has no wgmma tile of " +
          std::to_string(wgmma_tile.rows) + " x " + std::to_string(wgmma_tile.cols) +
          " for this dtype");
    }
    const int cols = hopper ? wgmma_tile.cols : detail::Prefill64::kCols;
    const int64_t items =
        detail::grid_row_tiles(rows, p.num_experts, choice.token_tile, p.e_ids != nullptr) *
        ceil_div(s.n, s.gated ? cols / 2 : cols);
    if (items > kMaxGridX) {
      bad(std::string(s.who) + ": " + std::to_string(rows) + " rows need " + std::to_string(items) +
          " CTAs, more than one launch takes");
    }
    const dim3 grid(static_cast<unsigned>(items), static_cast<unsigned>(p.splits));
    const auto run = [&]<Elem kElem>() {
      if (hopper) {
        detail::launch_wgmma<kElem>(p, v, wgmma_tile, a_rows, grid, stream);
      } else {
        detail::launch_prefill<kElem>(p, v, choice.token_tile, grid.x, stream);
      }
    };
    switch (s.elem) {
      case Elem::bf16:
        run.template operator()<Elem::bf16>();
        break;
      case Elem::f16:
        run.template operator()<Elem::f16>();
        break;
      case Elem::e4m3:
        run.template operator()<Elem::e4m3>();
        break;
    }
  } else {
    if (choice.token_tile != detail::kDecodeRows) {
      bad(std::string(s.who) + ".choice: decode takes token_tile 8, not " +
          std::to_string(choice.token_tile));
    }
    const int64_t tiles = detail::max_tiles(rows, p.num_experts, detail::kDecodeRows);
    if (slices < 1 || slices > detail::kDecodeMaxSlices) {
      bad(std::string(s.who) + ".choice: decode takes 1 to " +
          std::to_string(detail::kDecodeMaxSlices) + " slices, not " + std::to_string(slices));
    }
    if (tiles > kMaxGridY) {
      bad(std::string(s.who) + ": " + std::to_string(rows) + " rows need " + std::to_string(tiles) +
          " row tiles, more than one launch takes (" + std::to_string(kMaxGridY) +
          "); use a larger tile");
    }
    const dim3 grid(static_cast<unsigned>(ceil_div(s.n, (s.gated ? 16 : 32) * slices)),
                    static_cast<unsigned>(tiles));
    switch (s.elem) {
      case Elem::bf16:
        detail::launch_decode<Elem::bf16>(p, v, grid, stream);
        break;
      case Elem::f16:
        detail::launch_decode<Elem::f16>(p, v, grid, stream);
        break;
      case Elem::e4m3:
        detail::launch_decode<Elem::e4m3>(p, v, grid, stream);
        break;
    }
  }
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string(s.who) + ": launch failed: " + cudaGetErrorString(error));
  }
}

void check_common(const char* who, const void* a, const void* w, const void* out,
                  const int32_t* offsets, int num_experts, int64_t rows, int hidden,
                  int intermediate) {
  const std::string w_ = who;
  if (num_experts <= 0) bad(w_ + ".num_experts: " + std::to_string(num_experts) + " is not > 0");
  if (hidden <= 0) bad(w_ + ".hidden: " + std::to_string(hidden) + " is not > 0");
  if (intermediate <= 0) {
    bad(w_ + ".intermediate: " + std::to_string(intermediate) + " is not > 0");
  }
  if (rows < 0) bad(w_ + ".rows: " + std::to_string(rows) + " is negative");
  if (offsets == nullptr) bad(w_ + ".offsets is null");
  if (rows > 0 && (a == nullptr || w == nullptr || out == nullptr)) {
    bad(w_ + ": an input, weight or output pointer is null");
  }
}

// Params' entry fields (DecodeEntries), checked against the choice; GEMM1 needs entry_row.
void fill_entries(const Shape& s, const GemmChoice& choice, const DecodeEntries& e, int64_t rows,
                  detail::Params& p) {
  if (e.ids == nullptr) return;
  const std::string who = std::string(s.who) + ".entries";
  if (!choice.rows_from_hidden || choice.kernel != GemmKernel::wgmma ||
      choice.token_tile != kWgmmaDecodeTile) {
    bad(who + ": " + choice.str() + " reads a sort's offsets, not the router's entries");
  }
  if (s.elem == Elem::e4m3) bad(who + ": e4m3 rows are quantised by the gather, not read as given");
  if (e.tokens < 1 || e.tokens > kWgmmaDecodeTile || e.columns < 1 ||
      e.tokens * e.columns > kMaxDecodeEntries) {
    bad(who + ": " + std::to_string(e.tokens) + " tokens of " + std::to_string(e.columns) +
        " columns; the tile holds 1 to " + std::to_string(kWgmmaDecodeTile) +
        " tokens and at most " + std::to_string(kMaxDecodeEntries) + " entries");
  }
  if (rows < int64_t{e.tokens} * e.columns) {
    bad(who + ": rows " + std::to_string(rows) + " cannot hold " +
        std::to_string(e.tokens * e.columns) + " entries");
  }
  if (e.global_to_local != nullptr && e.n_global < 1) bad(who + ": a table of no ids");
  if (s.gated && e.entry_row == nullptr) bad(who + ".entry_row is null");
  p.e_ids = e.ids;
  p.e_table = e.global_to_local;
  p.e_n_global = e.n_global;
  p.e_tokens = e.tokens;
  p.e_columns = e.columns;
  p.e_entry_row = e.entry_row;
}

}  // namespace

std::string GemmChoice::str() const {
  if (kernel == GemmKernel::one_token) return "one-token";
  if (kernel == GemmKernel::prefill) return "prefill/" + std::to_string(token_tile);
  if (kernel == GemmKernel::wgmma) {
    const auto cols = [](int c) { return c == 0 ? std::string("widest") : std::to_string(c); };
    std::string text = "wgmma/" + std::to_string(token_tile);
    if (gemm1_cols != 0 || gemm2_cols != 0) {
      text += " (cols " + cols(gemm1_cols) + "," + cols(gemm2_cols) + ")";
    }
    if (gemm1_splits != 1 || gemm2_splits != 1) {
      text +=
          " (split K " + std::to_string(gemm1_splits) + "," + std::to_string(gemm2_splits) + ")";
    }
    if (rows_from_hidden) text += " (rows from hidden)";
    return text;
  }
  return "decode/" + std::to_string(token_tile) + "x" + std::to_string(gemm1_slices) + "," +
         std::to_string(gemm2_slices);
}

GemmChoice choose_gemm(const GemmProblem& problem) {
  const int64_t token_weight_bytes = problem.rows * 3 * int64_t{problem.hidden} *
                                     problem.intermediate * dtype_storage_bytes(problem.dtype, 1);
  if (problem.tokens == 1 && token_weight_bytes <= kOneTokenMaxWeightBytes &&
      !one_token_unsupported(problem.dtype, problem.hidden, problem.intermediate, problem.rows)) {
    return {.kernel = GemmKernel::one_token, .token_tile = 1};
  }
  const int64_t rows = std::max<int64_t>(problem.rows, 1);
  const int64_t hit = std::min<int64_t>(std::max(problem.num_experts, 1), rows);
  const int64_t per_expert = ceil_div(rows, hit);
  const int64_t sms = std::max(problem.sm_count, 1);
  const bool fp8 = problem.dtype == DType::f8e4m3;
  const int per16 = fp8 ? 16 : 8;
  const bool aligned = problem.hidden % per16 == 0 && problem.intermediate % per16 == 0;
  // GEMM1's CTAs on prefill: column tiles of 64 times the experts' row tiles of 64.
  const int64_t prefill_ctas =
      ceil_div(problem.intermediate, detail::Prefill64::kCols / 2) *
      detail::max_tiles(rows, static_cast<int>(hit), detail::Prefill64::kRows);
  const bool decode = !aligned || (fp8 ? per_expert <= kDecodeMaxRowsFp8 : prefill_ctas < sms);
  const auto narrow = [](int64_t weight_rows) {
    return weight_rows <= kWgmmaNarrowMaxWeightRows ? kWgmmaNarrowCols : 0;
  };
  const int gemm1_cols = narrow(2 * int64_t{problem.intermediate});
  if (problem.compute_capability == 90 && aligned) {
    if (!fp8 && per_expert >= kWgmma128MinRows) return {GemmKernel::wgmma, 128, 1, 1};
    if (per_expert <= kWgmmaDecodeMaxRows) {
      // A hit expert's rows fit one tile; its tiles are its CTAs of the tile's widest.
      constexpr int64_t kCtaRows = detail::wgmma_widest_cols(false, kWgmmaDecodeTile);
      const auto splits = [&](int64_t weight_rows, int64_t k) {
        const int64_t tiles = hit * ceil_div(weight_rows, kCtaRows);
        const int64_t row_bytes = k * (fp8 ? 1 : 2);
        const int64_t steps = ceil_div(row_bytes, detail::kStepBytes);
        if (2 * tiles > sms) return 1;
        const int64_t most = std::clamp<int64_t>(
            std::min(steps / kSplitMinSteps, kCtaRows * row_bytes / kSplitMinBytes), 1, kMaxSplits);
        return static_cast<int>(std::min(sms / tiles, most));
      };
      return {.kernel = GemmKernel::wgmma,
              .token_tile = kWgmmaDecodeTile,
              .gemm1_splits = splits(2 * int64_t{problem.intermediate}, problem.hidden),
              .gemm2_splits = splits(problem.hidden, problem.intermediate),
              .rows_from_hidden = !fp8 && problem.tokens >= 1 &&
                                  problem.tokens <= kRowsFromHiddenMaxTokens &&
                                  problem.rows <= kMaxDecodeEntries};
    }
    return {.kernel = GemmKernel::wgmma,
            .token_tile = 64,
            .gemm1_cols = gemm1_cols,
            .gemm2_cols = narrow(problem.hidden)};
  }
  if (!decode) {
    const int tile = !fp8 && per_expert >= kPrefill128MinRows ? detail::Prefill128::kRows
                                                              : detail::Prefill64::kRows;
    return {GemmKernel::prefill, tile, 1, 1};
  }
  if (!fp8) return {GemmKernel::decode, detail::kDecodeRows, 1, 1};
  // As many slices as leave two waves of CTAs (two per SM), from the bound on the row tiles.
  const int64_t row_tiles = detail::max_tiles(rows, static_cast<int>(hit), detail::kDecodeRows);
  const auto slices = [&](int64_t cols, int slice_cols) {
    const int64_t ctas = ceil_div(cols, slice_cols) * row_tiles;
    return static_cast<int>(std::clamp<int64_t>(ctas / (4 * sms), 1, detail::kDecodeMaxSlices));
  };
  return {GemmKernel::decode, detail::kDecodeRows, slices(problem.intermediate, 16),
          slices(problem.hidden, 32)};
}

void launch_gemm1(const Gemm1Args& args, cudaStream_t stream) {
  check_common("gemm1", args.x, args.w13, args.act, args.offsets, args.num_experts, args.rows,
               args.hidden, args.intermediate);
  const Shape s{"gemm1", elem_of(args.dtype, "gemm1"), true, args.intermediate, args.hidden};
  if (args.activation.kind == ActivationKind::swiglu_oai && !(args.activation.limit > 0.0f)) {
    bad("gemm1.activation: swiglu_oai needs a positive limit");
  }
  if (args.rows == 0) return;
  detail::Params p{};
  p.a = static_cast<const uint8_t*>(args.x);
  p.w = static_cast<const uint8_t*>(args.w13);
  p.offsets = args.offsets;
  p.out = args.act;
  p.num_experts = args.num_experts;
  p.n = args.intermediate;
  p.k = args.hidden;
  p.parts = 2;
  p.activation = args.activation;
  p.out_f32 = s.elem == Elem::e4m3;
  const bool per_block = s.elem == Elem::e4m3 && fill_scales(s, args.scales, p);
  const Gemm1Quantized& q = args.quantized;
  if (q.out != nullptr) {
    const bool static_scale = q.static_scale != nullptr;
    if (s.elem != Elem::e4m3 ||
        !gemm1_quantizes(args.choice, static_scale ? 0 : 128, static_scale)) {
      bad("gemm1.quantized: " + args.choice.str() + " on " + std::string(dtype_name(args.dtype)) +
          " does not quantise its output (gemm1_quantizes); run quantize_rows_e4m3 after it");
    }
    if (!static_scale && q.scales == nullptr) bad("gemm1.quantized: dynamic scales need `scales`");
    p.q_out = q.out;
    p.q_scales = q.scales;
    p.q_static = q.static_scale;
  }
  fill_entries(s, args.choice, args.entries, args.rows, p);
  const int64_t a_rows = p.e_ids != nullptr ? args.entries.tokens : args.rows;
  launch(s, p, per_block, args.rows, a_rows, args.choice, args.split, stream);
}

bool gemm1_quantizes(const GemmChoice& choice, int activation_group, bool static_scale) {
  return choice.kernel == GemmKernel::wgmma &&
         detail::wgmma_quantizes(wgmma_tile_of(choice, true, true)) &&
         (static_scale || activation_group == 128);
}

void launch_gemm2(const Gemm2Args& args, cudaStream_t stream) {
  check_common("gemm2", args.act, args.w2, args.out, args.offsets, args.num_experts, args.rows,
               args.hidden, args.intermediate);
  const Shape s{"gemm2", elem_of(args.dtype, "gemm2"), false, args.hidden, args.intermediate};
  if (args.rows == 0) return;
  detail::Params p{};
  p.a = static_cast<const uint8_t*>(args.act);
  p.w = static_cast<const uint8_t*>(args.w2);
  p.offsets = args.offsets;
  p.out = args.out;
  p.route_weight = args.route_weight;
  p.num_experts = args.num_experts;
  p.n = args.hidden;
  p.k = args.intermediate;
  p.parts = 1;
  p.out_f32 = true;
  const bool per_block = s.elem == Elem::e4m3 && fill_scales(s, args.scales, p);
  fill_entries(s, args.choice, args.entries, args.rows, p);
  launch(s, p, per_block, args.rows, args.rows, args.choice, args.split, stream);
}

SplitKSize split_k_size(const GemmChoice& choice, bool gemm1, int64_t rows, int num_experts,
                        int n) {
  const int splits = gemm1 ? choice.gemm1_splits : choice.gemm2_splits;
  if (splits <= 1 || rows <= 0) return {};
  // The launch's grid: the bound on the row tiles times the column tiles (launch above).
  const detail::WgmmaTile tile = wgmma_tile_of(choice, gemm1, false);
  const int64_t items =
      detail::grid_row_tiles(rows, num_experts, choice.token_tile, choice.rows_from_hidden) *
      ceil_div(n, gemm1 ? tile.cols / 2 : tile.cols);
  // A CTA's accumulators: its weight rows by its token rows.
  return {.partials = items * splits * tile.cols * tile.rows, .counters = items};
}

namespace {

constexpr int kQuantizeThreads = 256;

__device__ void e4m3_round(float x, float scale, uint8_t* out) {
  const __nv_fp8_storage_t q = __nv_cvt_float_to_fp8(x / scale, __NV_SATFINITE, __NV_E4M3);
  *out = q;
}

// One CTA per row. Per 128 columns: a warp per group, 4 columns per lane. Whole row: a block
// reduction of the amax.
__global__ void __launch_bounds__(kQuantizeThreads) quantize_rows_kernel(QuantizeRowsArgs a) {
  cuda_launch::wait_for_inputs();
  cuda_launch::release_dependents();
  const int64_t row = blockIdx.x;
  if (row >= __ldg(a.offsets + a.num_experts)) return;
  const float* in = a.in + row * a.cols;
  uint8_t* out = a.out + row * a.cols;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, warp = tid >> 5;
  if (a.static_scale != nullptr) {
    const float scale = __ldg(a.static_scale);
    for (int c = tid; c < a.cols; c += kQuantizeThreads) e4m3_round(in[c], scale, out + c);
    return;
  }
  if (a.group == 128) {
    const int groups = (a.cols + 127) / 128;
    for (int grp = warp; grp < groups; grp += kQuantizeThreads / 32) {
      float v[4];
      float amax = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = grp * 128 + lane * 4 + j;
        v[j] = c < a.cols ? in[c] : 0.0f;
        amax = fmaxf(amax, fabsf(v[j]));
      }
      for (int d = 16; d > 0; d >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, d));
      const float scale = fmaxf(amax, 1e-10f) / 448.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = grp * 128 + lane * 4 + j;
        if (c < a.cols) e4m3_round(v[j], scale, out + c);
      }
      if (lane == 0) a.scales[row * groups + grp] = scale;
    }
    return;
  }
  __shared__ float warp_max[kQuantizeThreads / 32];
  float amax = 0.0f;
  for (int c = tid; c < a.cols; c += kQuantizeThreads) amax = fmaxf(amax, fabsf(in[c]));
  for (int d = 16; d > 0; d >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, d));
  if (lane == 0) warp_max[warp] = amax;
  __syncthreads();
  amax = 0.0f;
  for (int w = 0; w < kQuantizeThreads / 32; ++w) amax = fmaxf(amax, warp_max[w]);
  const float scale = fmaxf(amax, 1e-10f) / 448.0f;
  for (int c = tid; c < a.cols; c += kQuantizeThreads) e4m3_round(in[c], scale, out + c);
  if (tid == 0) a.scales[row] = scale;
}

}  // namespace

void launch_quantize_rows_e4m3(const QuantizeRowsArgs& args, cudaStream_t stream) {
  if (args.rows < 0) bad("quantize_rows.rows: " + std::to_string(args.rows) + " is negative");
  if (args.cols <= 0) bad("quantize_rows.cols: " + std::to_string(args.cols) + " is not > 0");
  if (args.group != 0 && args.group != 128) {
    bad("quantize_rows.group: " + std::to_string(args.group) + " is not 0 or 128");
  }
  if (args.num_experts <= 0 || args.offsets == nullptr) {
    bad("quantize_rows: offsets null or num_experts not > 0");
  }
  if (args.rows == 0) return;
  if (args.in == nullptr || args.out == nullptr ||
      (args.static_scale == nullptr && args.scales == nullptr)) {
    bad("quantize_rows: in, out or scales is null");
  }
  if (args.rows > 0x7FFFFFFF) bad("quantize_rows.rows: too many for one launch");
  cuda_launch::launch(quantize_rows_kernel, static_cast<unsigned>(args.rows), kQuantizeThreads, 0,
                      stream, args);
  const cudaError_t error = cudaGetLastError();
  if (error != cudaSuccess) {
    throw std::runtime_error(std::string("quantize_rows: launch failed: ") +
                             cudaGetErrorString(error));
  }
}

}  // namespace moekit::cuda_gemm
