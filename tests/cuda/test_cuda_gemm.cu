// The cuda expert GEMMs: every format, activation and kernel against float64
// (test_cuda_gemm_cases.cu), the heuristic, and the refusal of bad arguments.

#include <gtest/gtest.h>

#include <stdexcept>

#include "cuda/test_cuda_gemm_cases.hpp"
#include "runner/cuda/gemm/expert_gemm.hpp"
#include "runner/cuda/gemm/one_token.hpp"

namespace moekit::test::cuda_gemm {
namespace {

using moekit::cuda_gemm::choose_gemm;
using moekit::cuda_gemm::DecodeEntries;
using moekit::cuda_gemm::Gemm1Args;
using moekit::cuda_gemm::Gemm2Args;
using moekit::cuda_gemm::GemmChoice;
using moekit::cuda_gemm::GemmKernel;
using moekit::cuda_gemm::kMaxDecodeEntries;
using moekit::cuda_gemm::kRowsFromHiddenMaxTokens;
using moekit::cuda_gemm::kWgmmaDecodeTile;
using moekit::cuda_gemm::launch_gemm1;
using moekit::cuda_gemm::launch_gemm2;
using moekit::cuda_gemm::launch_one_token;
using moekit::cuda_gemm::OneTokenArgs;

class CudaGemm : public ::testing::TestWithParam<GemmCase> {};

TEST_P(CudaGemm, MatchesFloat64) {
  const CaseResult r = run_case(GetParam());
  if (!r.ran) GTEST_SKIP() << r.skip_reason;
  for (const std::string& f : r.failures) ADD_FAILURE() << f;
  RecordProperty("errors", r.summary);
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaGemm, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<GemmCase>& param) {
                           return param.param.name;
                         });

TEST(CudaGemmChoice, Fp8DecodesUpToFourRowsPerExpert) {
  // DeepSeek-V3 (E=256, k=8) at T = 1, 64 and 4096; Qwen3-30B-A3B (E=128) at T = 64 and 512.
  EXPECT_EQ(choose_gemm({DType::f8e4m3, 8, 256, 7168, 2048, 132}).kernel, GemmKernel::decode);
  EXPECT_EQ(choose_gemm({DType::f8e4m3, 512, 256, 7168, 2048, 132}).kernel, GemmKernel::decode);
  EXPECT_EQ(choose_gemm({DType::f8e4m3, 32768, 256, 7168, 2048, 132}).kernel, GemmKernel::prefill);
  EXPECT_EQ(choose_gemm({DType::f8e4m3, 512, 128, 2048, 768, 132}).kernel, GemmKernel::decode);
  EXPECT_EQ(choose_gemm({DType::f8e4m3, 4096, 128, 2048, 768, 132}).kernel, GemmKernel::prefill);
}

TEST(CudaGemmChoice, SixteenBitDecodesOnlyWherePrefillWouldLeaveSmsIdle) {
  // DeepSeek-V3 at T = 1: 32 column tiles x 8 experts on prefill, more CTAs than SMs.
  EXPECT_EQ(choose_gemm({DType::bf16, 8, 256, 7168, 2048, 132}).kernel, GemmKernel::prefill);
  // Qwen3-30B-A3B at T = 1: 12 x 8 = 96 CTAs.
  const auto qwen_t1 = choose_gemm({DType::bf16, 8, 128, 2048, 768, 132});
  EXPECT_EQ(qwen_t1.kernel, GemmKernel::decode);
  EXPECT_EQ(qwen_t1.gemm1_slices, 1);
  EXPECT_EQ(choose_gemm({DType::f16, 512, 128, 2048, 768, 132}).kernel, GemmKernel::prefill);
}

TEST(CudaGemmChoice, SixteenBitPrefillTakesTilesOf128RowsFromAbout96RowsPerExpert) {
  // DeepSeek-V3 at T = 512 (16 rows per expert) and 4096 (128); Qwen3-30B-A3B at T = 4096 (256).
  EXPECT_EQ(choose_gemm({DType::bf16, 4096, 256, 7168, 2048, 132}).token_tile, 64);
  EXPECT_EQ(choose_gemm({DType::bf16, 32768, 256, 7168, 2048, 132}).token_tile, 128);
  EXPECT_EQ(choose_gemm({DType::f16, 32768, 128, 2048, 768, 132}).token_tile, 128);
  EXPECT_EQ(choose_gemm({DType::f8e4m3, 32768, 256, 7168, 2048, 132}).token_tile, 64);
}

TEST(CudaGemmChoice, HopperTakesWgmmaWherePrefillWouldRun) {
  // The same batches on a GPU of compute capability 9.0 and on one of 8.0.
  const auto on = [](DType dtype, int64_t rows, int E, int H, int I, int cc) {
    return choose_gemm({dtype, rows, E, H, I, 132, cc});
  };
  EXPECT_EQ(on(DType::bf16, 32768, 256, 7168, 2048, 90).kernel, GemmKernel::wgmma);
  EXPECT_EQ(on(DType::bf16, 32768, 256, 7168, 2048, 80).kernel, GemmKernel::prefill);
  EXPECT_EQ(on(DType::bf16, 32768, 256, 7168, 2048, 90).token_tile, 128);
  EXPECT_EQ(on(DType::bf16, 4096, 128, 2048, 768, 90).token_tile, 64);
  // e4m3 takes wgmma from one row per expert on; beyond the decode tiles, in tiles of 64.
  EXPECT_EQ(on(DType::f8e4m3, 8, 256, 7168, 2048, 90).kernel, GemmKernel::wgmma);
  EXPECT_EQ(on(DType::f8e4m3, 8, 256, 7168, 2048, 80).kernel, GemmKernel::decode);
  EXPECT_EQ(on(DType::f8e4m3, 32768, 256, 7168, 2048, 90).token_tile, 64);
  // Decode stays where rows are not 16-byte aligned.
  EXPECT_EQ(on(DType::bf16, 32768, 256, 7166, 2048, 90).kernel, GemmKernel::decode);
  EXPECT_EQ(on(DType::f8e4m3, 8, 256, 7168, 2056, 90).kernel, GemmKernel::decode);
}

TEST(CudaGemmChoice, HopperTakesTheDecodeTilesUpToTwoRowsPerHitExpertInCtasOf256WeightRows) {
  const auto on = [](DType dtype, int64_t rows, int E, int H, int I) {
    return choose_gemm({dtype, rows, E, H, I, 132, 90});
  };
  for (DType dtype : {DType::f8e4m3, DType::bf16}) {
    // DeepSeek-V3 T = 1, 8, 64 (1, 1, 2 rows per hit expert); Qwen3-30B-A3B T = 1 and 8.
    for (int64_t rows : {8, 64, 512}) {
      const auto c = on(dtype, rows, 256, 7168, 2048);
      EXPECT_EQ(c.kernel, GemmKernel::wgmma);
      EXPECT_EQ(c.token_tile, 8);
      EXPECT_EQ(c.gemm1_cols, 0);
      EXPECT_EQ(c.gemm2_cols, 0);
    }
    for (int64_t rows : {8, 64}) {
      const auto c = on(dtype, rows, 128, 2048, 768);
      EXPECT_EQ(c.token_tile, 8);
      EXPECT_EQ(c.gemm1_cols, 0) << "e4m3's GEMM1 quantises in CTAs of 256 weight rows";
    }
    // Past 2 rows per hit expert: tiles of 64 (Qwen3 T = 64: 4 rows).
    EXPECT_EQ(on(dtype, 512, 128, 2048, 768).token_tile, 64);
  }
  // The e4m3 GEMM1 of the decode tile quantises its output; its narrow CTAs do not.
  EXPECT_TRUE(moekit::cuda_gemm::gemm1_quantizes({GemmKernel::wgmma, 8, 1, 1}, 128, false));
  EXPECT_TRUE(moekit::cuda_gemm::gemm1_quantizes({GemmKernel::wgmma, 16, 1, 1}, 0, true));
  EXPECT_FALSE(
      moekit::cuda_gemm::gemm1_quantizes({GemmKernel::wgmma, 8, 1, 1, 128, 128}, 128, false));
}

TEST(CudaGemmChoice, DecodeTilesSplitKWhereFewTilesEachStreamManyBytes) {
  const auto on = [](DType dtype, int64_t rows, int E, int H, int I) {
    return choose_gemm({dtype, rows, E, H, I, 132, 90});
  };
  struct Case {
    const char* what;
    DType dtype;
    int64_t rows;
    int E, H, I;
    int gemm1_splits, gemm2_splits;
  };
  for (const Case& c : {
           // 48 and 64 tiles of at most 1 MB: not split (measured slower split).
           Case{"Qwen3-30B-A3B T = 1", DType::bf16, 8, 128, 2048, 768, 1, 1},
           Case{"Qwen3-30B-A3B T = 1", DType::f8e4m3, 8, 128, 2048, 768, 1, 1},
           // 128 and 224 tiles: not split.
           Case{"DeepSeek-V3 T = 1", DType::bf16, 8, 256, 7168, 2048, 1, 1},
           // Its shared expert alone: GEMM1 16 tiles of 3.7 MB (bf16) or 1.8 MB (e4m3).
           Case{"DeepSeek-V3's shared expert T = 1", DType::bf16, 1, 1, 7168, 2048, 4, 1},
           Case{"DeepSeek-V3's shared expert T = 1", DType::f8e4m3, 1, 1, 7168, 2048, 2, 1},
           // Mixtral-8x7B T = 1: GEMM1 224 tiles, GEMM2 32 tiles of 7.3 MB (bf16), 3.7 (e4m3).
           Case{"Mixtral-8x7B T = 1", DType::bf16, 2, 8, 4096, 14336, 1, 4},
           Case{"Mixtral-8x7B T = 1", DType::f8e4m3, 2, 8, 4096, 14336, 1, 4},
           // Two tokens on different experts double the tiles: 64 of 132 SMs, still split.
           Case{"Mixtral-8x7B T = 2", DType::bf16, 4, 8, 4096, 14336, 1, 2},
       }) {
    const auto choice = on(c.dtype, c.rows, c.E, c.H, c.I);
    EXPECT_EQ(choice.token_tile, 8) << c.what;
    EXPECT_EQ(choice.gemm1_splits, c.gemm1_splits) << c.what << " " << dtype_name(c.dtype);
    EXPECT_EQ(choice.gemm2_splits, c.gemm2_splits) << c.what << " " << dtype_name(c.dtype);
  }
  // The tiles of 64 rows never split.
  EXPECT_EQ(on(DType::bf16, 512, 8, 4096, 14336).gemm2_splits, 1);
}

TEST(CudaGemmChoice, HopperTilesOf64RowsTakeNarrowCtasWhereAnExpertHasFewWeightRows) {
  const auto on = [](DType dtype, int64_t rows, int E, int H, int I) {
    return choose_gemm({dtype, rows, E, H, I, 132, 90});
  };
  // Qwen3-30B-A3B: GEMM1's 1536 and GEMM2's 2048 weight rows per expert, at T = 64 and 512.
  for (DType dtype : {DType::f8e4m3, DType::bf16}) {
    for (int64_t rows : {512, 4096}) {
      const auto c = on(dtype, rows, 128, 2048, 768);
      EXPECT_EQ(c.kernel, GemmKernel::wgmma);
      EXPECT_EQ(c.gemm1_cols, 128);
      EXPECT_EQ(c.gemm2_cols, 128);
    }
  }
  // DeepSeek-V3: 4096 and 7168, the widest CTAs.
  const auto dsv3 = on(DType::f8e4m3, 4096, 256, 7168, 2048);
  EXPECT_EQ(dsv3.gemm1_cols, 0);
  EXPECT_EQ(dsv3.gemm2_cols, 0);
  // A hidden size past 2048 keeps GEMM2 wide while GEMM1 narrows.
  const auto mixed = on(DType::f8e4m3, 4096, 128, 4096, 768);
  EXPECT_EQ(mixed.gemm1_cols, 128);
  EXPECT_EQ(mixed.gemm2_cols, 0);
  // Tiles of 128 rows have one width.
  EXPECT_EQ(on(DType::bf16, 32768, 128, 2048, 768).token_tile, 128);
  EXPECT_EQ(on(DType::bf16, 32768, 128, 2048, 768).gemm1_cols, 0);
}

TEST(CudaGemmChoice, Fp8DecodeSlicesGrowWithTheCtasABatchGives) {
  // DeepSeek-V3 GEMM1 at T = 1: 128 column tiles x 9 row tiles bound 1152 CTAs, two waves of
  // 264 twice over; at T = 8 (64 rows) more than enough for 4.
  EXPECT_EQ(choose_gemm({DType::f8e4m3, 8, 256, 7168, 2048, 132}).gemm1_slices, 2);
  EXPECT_EQ(choose_gemm({DType::f8e4m3, 64, 256, 7168, 2048, 132}).gemm1_slices, 4);
}

TEST(CudaGemmChoice, SixteenBitDecodeTilesReadTheHiddenStatesOfTheSmallestBatches) {
  // Qwen3-30B-A3B on Hopper: rows = tokens x top-k columns.
  const auto reads_hidden = [](DType dtype, int64_t tokens, int capability, int64_t top_k = 8,
                               int intermediate = 768) {
    return choose_gemm({.dtype = dtype,
                        .rows = tokens * top_k,
                        .num_experts = 128,
                        .hidden = 2048,
                        .intermediate = intermediate,
                        .compute_capability = capability,
                        .tokens = tokens})
        .rows_from_hidden;
  };
  // One token runs the one-token kernel, unless its activations outgrow that kernel's shared
  // memory (8 entries of I = 8192).
  EXPECT_TRUE(reads_hidden(DType::bf16, 1, 90, 8, 8192));
  EXPECT_TRUE(reads_hidden(DType::f16, kRowsFromHiddenMaxTokens, 90));
  EXPECT_FALSE(reads_hidden(DType::bf16, kRowsFromHiddenMaxTokens + 1, 90));  // measured slower
  EXPECT_FALSE(reads_hidden(DType::bf16, 2, 90, kMaxDecodeEntries / 2 + 1));  // more entries
  EXPECT_FALSE(reads_hidden(DType::f8e4m3, 1, 90));  // the gather quantises e4m3 rows
  EXPECT_FALSE(reads_hidden(DType::bf16, 1, 80));    // no wgmma decode tiles
  EXPECT_FALSE(reads_hidden(DType::bf16, 0, 90));    // a batch of unknown tokens
}

TEST(CudaGemmChoice, OneTokenOfSixteenBitWeightsRunsTheOneTokenKernelWhereItFits) {
  // Qwen3-30B-A3B-shaped: rows = entries of the one token.
  const auto kernel = [](DType dtype, int64_t tokens, int64_t entries, int hidden,
                         int intermediate) {
    return choose_gemm({.dtype = dtype,
                        .rows = tokens * entries,
                        .num_experts = 128,
                        .hidden = hidden,
                        .intermediate = intermediate,
                        .compute_capability = 90,
                        .tokens = tokens})
        .kernel;
  };
  EXPECT_EQ(kernel(DType::bf16, 1, 8, 2048, 768), GemmKernel::one_token);
  EXPECT_EQ(kernel(DType::f16, 1, 4, 2048, 2048), GemmKernel::one_token);
  // DeepSeek-V3 (792 MB a token) and Mixtral-8x7B (705 MB) stream faster on the grouped path.
  EXPECT_NE(kernel(DType::bf16, 1, 9, 7168, 2048), GemmKernel::one_token);
  EXPECT_NE(kernel(DType::bf16, 1, 2, 4096, 14336), GemmKernel::one_token);
  EXPECT_NE(kernel(DType::bf16, 2, 8, 2048, 768), GemmKernel::one_token);
  EXPECT_NE(kernel(DType::bf16, 0, 8, 2048, 768), GemmKernel::one_token);  // tokens unknown
  EXPECT_NE(kernel(DType::f8e4m3, 1, 8, 2048, 768), GemmKernel::one_token);
  EXPECT_NE(kernel(DType::bf16, 1, 8, 2044, 768), GemmKernel::one_token);  // rows not 16 bytes
  EXPECT_NE(kernel(DType::bf16, 1, 33, 2048, 768), GemmKernel::one_token);
  EXPECT_NE(kernel(DType::bf16, 1, 8, 2048, 8192), GemmKernel::one_token);  // 128 KB staged
}

TEST(CudaGemmChoice, RowsThatAreNotSixteenByteAlignedRunOnDecode) {
  EXPECT_EQ(choose_gemm({DType::bf16, 32768, 256, 7166, 2048, 132}).kernel, GemmKernel::decode);
  EXPECT_EQ(choose_gemm({DType::f8e4m3, 32768, 256, 7168, 2056, 132}).kernel, GemmKernel::decode);
}

// Arguments that would launch, but for the one field a test changes (nothing is launched: the
// pointers are never read).
Gemm1Args gemm1_args() {
  Gemm1Args a;
  a.dtype = DType::bf16;
  a.x = a.w13 = a.act = reinterpret_cast<void*>(256);
  a.offsets = reinterpret_cast<const int32_t*>(256);
  a.num_experts = 2;
  a.rows = 4;
  a.hidden = a.intermediate = 64;
  return a;
}

Gemm2Args gemm2_args() {
  Gemm2Args a;
  a.dtype = DType::bf16;
  a.act = a.w2 = reinterpret_cast<void*>(256);
  a.out = reinterpret_cast<float*>(256);
  a.offsets = reinterpret_cast<const int32_t*>(256);
  a.num_experts = 2;
  a.rows = 4;
  a.hidden = a.intermediate = 64;
  return a;
}

bool names(const std::string& message, const std::string& argument) {
  return message.find(argument) != std::string::npos;
}

template <typename Launch>
std::string refusal(Launch&& launch) {
  try {
    launch();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no error";
}

TEST(CudaGemmArguments, ANonGemmDtypeIsRefused) {
  Gemm1Args a = gemm1_args();
  a.dtype = DType::f32;
  EXPECT_PRED2(names, refusal([&] { launch_gemm1(a, nullptr); }), "gemm1.dtype");
}

TEST(CudaGemmArguments, Fp8WithoutScalesIsRefused) {
  Gemm2Args a = gemm2_args();
  a.dtype = DType::f8e4m3;
  EXPECT_PRED2(names, refusal([&] { launch_gemm2(a, nullptr); }), "gemm2.scales");
}

TEST(CudaGemmArguments, APrefillTileOtherThan64Or128IsRefused) {
  Gemm2Args a = gemm2_args();
  a.choice = {GemmKernel::prefill, 32};
  EXPECT_PRED2(names, refusal([&] { launch_gemm2(a, nullptr); }), "gemm2.choice");
}

TEST(CudaGemmArguments, TheOneTokenChoiceIsRefusedByTheGroupedLaunches) {
  Gemm1Args a = gemm1_args();
  a.choice = {.kernel = GemmKernel::one_token, .token_tile = 1};
  EXPECT_PRED2(names, refusal([&] { launch_gemm1(a, nullptr); }), "launch_one_token");
}

TEST(CudaGemmArguments, AWgmmaTileOtherThan64Or128IsRefused) {
  Gemm1Args a = gemm1_args();
  a.choice = {GemmKernel::wgmma, 256};
  EXPECT_PRED2(names, refusal([&] { launch_gemm1(a, nullptr); }), "gemm1.choice");
}

TEST(CudaGemmArguments, AWgmmaTileThatIsNotBuiltIsRefused) {
  Gemm1Args a = gemm1_args();
  a.choice = {GemmKernel::wgmma, 128, 1, 1, 128, 128};  // 128 x 128 is e4m3's alone
  EXPECT_PRED2(names, refusal([&] { launch_gemm1(a, nullptr); }), "gemm1.choice");
}

TEST(CudaGemmArguments, NoExpertsIsRefused) {
  Gemm1Args a = gemm1_args();
  a.num_experts = 0;
  EXPECT_PRED2(names, refusal([&] { launch_gemm1(a, nullptr); }), "gemm1.num_experts");
}

TEST(CudaGemmArguments, MixedFp8ScaleBlocksAreRefused) {
  Gemm1Args a = gemm1_args();
  a.dtype = DType::f8e4m3;
  a.scales.weight = a.scales.activation = reinterpret_cast<const float*>(256);
  a.scales.weight_block_rows = a.scales.weight_block_cols = 128;
  a.scales.activation_block_cols = 0;
  EXPECT_PRED2(names, refusal([&] { launch_gemm1(a, nullptr); }),
               "gemm1.scales.activation_block_cols");
}

// A decode step's entries for the GEMMs to place themselves (DecodeEntries), on the choice that
// reads them: the wgmma decode tile of 8 rows with rows_from_hidden.
DecodeEntries two_tokens_of_two(int32_t* entry_row) {
  return {.ids = reinterpret_cast<const int32_t*>(256),
          .tokens = 2,
          .columns = 2,
          .entry_row = entry_row};
}

GemmChoice reads_entries() {
  GemmChoice c{GemmKernel::wgmma, kWgmmaDecodeTile};
  c.rows_from_hidden = true;
  return c;
}

TEST(CudaGemmArguments, EntriesOnAChoiceThatReadsASortsOffsetsAreRefused) {
  Gemm1Args a = gemm1_args();
  a.choice = {GemmKernel::wgmma, kWgmmaDecodeTile};
  a.entries = two_tokens_of_two(reinterpret_cast<int32_t*>(256));
  EXPECT_PRED2(names, refusal([&] { launch_gemm1(a, nullptr); }), "gemm1.entries");
}

TEST(CudaGemmArguments, MoreEntriesThanTheDecodeTileHoldsAreRefused) {
  Gemm1Args a = gemm1_args();
  a.choice = reads_entries();
  a.entries = two_tokens_of_two(reinterpret_cast<int32_t*>(256));
  a.entries.tokens = kWgmmaDecodeTile + 1;
  a.entries.columns = 1;
  a.rows = kWgmmaDecodeTile + 1;
  EXPECT_PRED2(names, refusal([&] { launch_gemm1(a, nullptr); }), "gemm1.entries");
}

TEST(CudaGemmArguments, Gemm1EntriesWithoutTheirRowsOutAreRefused) {
  Gemm1Args a = gemm1_args();
  a.choice = reads_entries();
  a.entries = two_tokens_of_two(nullptr);
  EXPECT_PRED2(names, refusal([&] { launch_gemm1(a, nullptr); }), "gemm1.entries.entry_row");
}

TEST(CudaGemmArguments, E4m3EntriesAreRefused) {
  Gemm2Args a = gemm2_args();
  a.dtype = DType::f8e4m3;
  a.scales.weight = a.scales.activation = reinterpret_cast<const float*>(256);
  a.scales.weight_block_rows = a.scales.weight_block_cols = 128;
  a.scales.activation_block_cols = 128;
  a.choice = reads_entries();
  a.entries = two_tokens_of_two(nullptr);
  EXPECT_PRED2(names, refusal([&] { launch_gemm2(a, nullptr); }), "gemm2.entries");
}

}  // namespace
}  // namespace moekit::test::cuda_gemm

namespace moekit::test::cuda_gemm {
namespace {

// One-token arguments that would launch, but for the one field a test changes.
OneTokenArgs one_token_args() {
  void* p = reinterpret_cast<void*>(256);
  OneTokenArgs a;
  a.hidden = a.w13 = a.w2 = a.output = p;
  a.hidden_size = 64;
  a.intermediate = 32;
  a.ids = static_cast<const int32_t*>(p);
  a.columns = 8;
  a.weights = static_cast<const float*>(p);
  a.act = p;
  a.counters = static_cast<uint32_t*>(p);
  a.grid = {.blocks = 132, .shared_bytes = 1 << 16};
  return a;
}

struct OneTokenRefusal {
  const char* name;
  void (*change)(OneTokenArgs&);
  const char* names;
};

TEST(CudaOneTokenArguments, AreRefusedNamingWhatIsWrong) {
  const OneTokenRefusal refusals[] = {
      {"e4m3 weights", [](OneTokenArgs& a) { a.dtype = DType::f8e4m3; }, "bf16 or f16"},
      {"rows of 62 columns", [](OneTokenArgs& a) { a.hidden_size = 62; }, "multiples of 8"},
      {"no entries", [](OneTokenArgs& a) { a.columns = 0; }, "entries per token"},
      {"33 entries", [](OneTokenArgs& a) { a.columns = 33; }, "entries per token"},
      {"no output", [](OneTokenArgs& a) { a.output = nullptr; }, "null"},
      {"unaligned w2", [](OneTokenArgs& a) { a.w2 = reinterpret_cast<void*>(258); }, "aligned"},
      {"unaligned act", [](OneTokenArgs& a) { a.act = reinterpret_cast<void*>(258); }, "aligned"},
      {"i32 hidden states", [](OneTokenArgs& a) { a.hidden_dtype = DType::i32; }, "hidden"},
      {"no grid", [](OneTokenArgs& a) { a.grid = {}; }, "one_token_grid"},
      {"a grid of another layer", [](OneTokenArgs& a) { a.grid.shared_bytes = 64; },
       "another layer"},
      {"an empty table", [](OneTokenArgs& a) { a.global_to_local = a.ids; }, "table"},
      {"no ids and no route", [](OneTokenArgs& a) { a.ids = nullptr; }, "route"},
      {"a route of two tokens",
       [](OneTokenArgs& a) {
         static const routing::cuda::RouteArgs two_tokens = [] {
           routing::cuda::RouteArgs route;
           route.tokens = 2;
           return route;
         }();
         a.route = &two_tokens;
       },
       "one token"},
  };
  for (const OneTokenRefusal& r : refusals) {
    SCOPED_TRACE(r.name);
    OneTokenArgs a = one_token_args();
    r.change(a);
    EXPECT_PRED2(names, refusal([&] { launch_one_token(a, nullptr); }), r.names);
  }
}

}  // namespace
}  // namespace moekit::test::cuda_gemm
