// The GPU sort/align, gather and combine against host computations: a stable counting sort, the
// CPU's activation quantisation (quantize_activation_row) and a float64 weighted sum.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "cuda/cuda_support.hpp"
#include "quant/activation_quant.hpp"
#include "runner/cuda/permute.hpp"

namespace moekit {
namespace {

using namespace cuda_testing;
namespace rc = runner::cuda;

// Each token's columns name distinct local slots, or -1 (routed elsewhere) about a third of
// the time.
std::vector<int32_t> random_slots(int64_t T, int columns, int n_slots, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(T * columns));
  std::vector<int32_t> order(static_cast<size_t>(n_slots));
  for (int64_t t = 0; t < T; ++t) {
    for (int s = 0; s < n_slots; ++s) order[s] = s;
    std::shuffle(order.begin(), order.end(), rng);
    for (int j = 0; j < columns; ++j) ids[t * columns + j] = rng() % 3 == 0 ? -1 : order[j];
  }
  return ids;
}

struct HostLayout {
  std::vector<int32_t> counts, offsets, row_source, entry_row;
};

// A serial counting sort in entry order: the layout sort_by_slot must give.
HostLayout host_sort(const std::vector<int32_t>& ids, int n_slots, int tile, int capacity) {
  HostLayout h;
  h.counts.assign(static_cast<size_t>(n_slots), 0);
  for (int32_t s : ids) {
    if (s >= 0) ++h.counts[s];
  }
  h.offsets.assign(static_cast<size_t>(n_slots + 1), 0);
  for (int s = 0; s < n_slots; ++s) {
    const int rows = capacity > 0 ? capacity : (h.counts[s] + tile - 1) / tile * tile;
    h.offsets[s + 1] = h.offsets[s] + rows;
  }
  h.row_source.assign(static_cast<size_t>(h.offsets[n_slots]), -1);
  h.entry_row.assign(ids.size(), -1);
  std::vector<int32_t> cursor(h.offsets.begin(), h.offsets.end() - 1);
  for (size_t e = 0; e < ids.size(); ++e) {
    if (ids[e] < 0) continue;
    h.entry_row[e] = cursor[ids[e]]++;
    h.row_source[h.entry_row[e]] = static_cast<int32_t>(e);
  }
  return h;
}

struct DeviceLayout {
  Tensor counts, offsets, row_source, entry_row, scratch;
  int64_t max_rows;
};

DeviceLayout device_sort(const Tensor& ids, int64_t T, int columns, int n_slots, int tile,
                         int capacity, const int32_t* global_to_local = nullptr, int n_global = 0) {
  DeviceLayout d;
  d.max_rows = rc::sort_max_rows(T * columns, n_slots, tile, capacity);
  d.counts = poisoned(DType::i32, {n_slots});
  d.offsets = poisoned(DType::i32, {n_slots + 1});
  d.row_source = poisoned(DType::i32, {d.max_rows});
  d.entry_row = poisoned(DType::i32, {T * columns});
  d.scratch = poisoned(DType::i8, {rc::sort_scratch_bytes(T * columns, n_slots)});
  rc::sort_by_slot({.ids = ids.data<int32_t>(),
                    .global_to_local = global_to_local,
                    .n_global = n_global,
                    .tokens = T,
                    .columns = columns,
                    .n_slots = n_slots,
                    .tile = tile,
                    .capacity = capacity,
                    .counts = d.counts.data<int32_t>(),
                    .offsets = d.offsets.data<int32_t>(),
                    .row_source = d.row_source.data<int32_t>(),
                    .entry_row = d.entry_row.data<int32_t>(),
                    .scratch = d.scratch.view().data},
                   nullptr);
  return d;
}

void expect_layout(const DeviceLayout& d, const HostLayout& want, int capacity) {
  EXPECT_EQ(download<int32_t>(d.counts), want.counts);
  EXPECT_EQ(download<int32_t>(d.offsets), want.offsets);
  EXPECT_EQ(download<int32_t>(d.entry_row), want.entry_row);
  const std::vector<int32_t> rows = download<int32_t>(d.row_source);
  const int n_slots = static_cast<int>(want.counts.size());
  for (int s = 0; s < n_slots; ++s) {
    // The masked layout leaves rows past a slot's count unwritten.
    const int used = capacity > 0 ? want.counts[s] : want.offsets[s + 1] - want.offsets[s];
    for (int r = want.offsets[s]; r < want.offsets[s] + used; ++r) {
      ASSERT_EQ(rows[r], want.row_source[r]) << "slot " << s << " row " << r;
    }
  }
}

// tile 0 stands for the masked layout with capacity T. 1000 slots leave room in shared memory
// for fewer placing warps in the one-block sort.
class CudaSort : public ::testing::TestWithParam<std::tuple<int64_t, int, int>> {};

TEST_P(CudaSort, GroupsEntriesBySlotInEntryOrder) {
  MOEKIT_REQUIRE_GPU();
  const auto [T, tile, n_slots] = GetParam();
  const int columns = 9;
  const int capacity = tile == 0 ? static_cast<int>(std::max<int64_t>(T, 1)) : 0;
  const std::vector<int32_t> ids = random_slots(T, columns, n_slots, 7 + static_cast<uint32_t>(T));
  const Tensor d_ids = upload(ids, DType::i32, {T * columns});
  const DeviceLayout d = device_sort(d_ids, T, columns, n_slots, std::max(tile, 1), capacity);
  expect_layout(d, host_sort(ids, n_slots, std::max(tile, 1), capacity), capacity);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaSort,
                         ::testing::Combine(::testing::Values(int64_t{0}, int64_t{1}, int64_t{3},
                                                              int64_t{257}, int64_t{1000}),
                                            ::testing::Values(0, 1, 16, 128),
                                            ::testing::Values(13, 1000)),
                         [](const auto& test) {
                           const int tile = std::get<1>(test.param);
                           return fmt::format(
                               "T{}_{}_slots{}", std::get<0>(test.param),
                               tile == 0 ? std::string("masked") : fmt::format("tile{}", tile),
                               std::get<2>(test.param));
                         });

TEST(CudaSortGlobal, MapsGlobalIdsThroughTheTableFirst) {
  MOEKIT_REQUIRE_GPU();
  // Rank 1 of 3 owns global experts 5..9 as slots 0..4, and the fused shared slot (global 15)
  // as slot 5.
  const int n_global = 16, n_slots = 6;
  std::vector<int32_t> table(n_global, -1);
  for (int s = 0; s < 5; ++s) table[5 + s] = s;
  table[15] = 5;
  const int64_t T = 700;
  const int columns = 4;
  std::mt19937 rng(3);
  std::vector<int32_t> global(static_cast<size_t>(T * columns)), local(global.size());
  for (size_t e = 0; e < global.size(); ++e) {
    global[e] = e % columns == columns - 1 ? 15 : static_cast<int32_t>(rng() % 15);
    local[e] = table[global[e]];
  }
  const Tensor d_ids = upload(global, DType::i32, {T * columns});
  const Tensor d_table = upload(table, DType::i32, {n_global});
  const DeviceLayout d =
      device_sort(d_ids, T, columns, n_slots, 8, 0, d_table.data<int32_t>(), n_global);
  expect_layout(d, host_sort(local, n_slots, 8, 0), 0);
}

// A row's width and its e4m3 groups: 300 columns move one element at a time (not a multiple of
// 8), 304 as 16-byte vectors; groups of 128 (fp8-block: two whole groups and a partial one) or
// the whole row (fp8-tensor's per-token scale).
struct GatherShape {
  int64_t hidden;
  int group;
};

class CudaGather
    : public ::testing::TestWithParam<std::tuple<DType, DType, int64_t, bool, GatherShape>> {};

TEST_P(CudaGather, WritesEachRowAsTheCpuConvertsOrQuantisesIt) {
  MOEKIT_REQUIRE_GPU();
  const auto [in_dtype, out_dtype, T, masked, shape] = GetParam();
  const int64_t H = shape.hidden;
  const int columns = 5, n_slots = 7, tile = 16, group = shape.group;
  const int capacity = masked ? static_cast<int>(std::max<int64_t>(T, 1)) : 0;
  const std::vector<int32_t> ids = random_slots(T, columns, n_slots, 21);
  std::vector<float> x = normal(T * H, 8, 3.0f);
  if (T > 0) {
    std::fill(x.begin(), x.begin() + 128, 0.0f);  // an all-zero group: the amax floor
    x[130] = 6e4f;  // one large value (finite in f16) beside small ones
  }
  const Activations hidden = as_dtype(x, in_dtype);
  const Tensor d_ids = upload(ids, DType::i32, {T * columns});
  const Tensor d_hidden = upload(hidden.bytes, in_dtype, {T, H});
  const DeviceLayout d = device_sort(d_ids, T, columns, n_slots, tile, capacity);
  const int64_t groups = (H + group - 1) / group;
  Tensor rows = poisoned(out_dtype, {std::max<int64_t>(d.max_rows, 1), H});
  Tensor scales = poisoned(DType::f32, {std::max<int64_t>(d.max_rows, 1), groups});
  rc::gather_rows({.hidden = d_hidden.view().data,
                   .hidden_dtype = in_dtype,
                   .tokens = T,
                   .hidden_size = H,
                   .columns = columns,
                   .row_source = d.row_source.data<int32_t>(),
                   .offsets = d.offsets.data<int32_t>(),
                   .counts = d.counts.data<int32_t>(),
                   .n_slots = n_slots,
                   .capacity = capacity,
                   .max_rows = d.max_rows,
                   .rows = rows.view().data,
                   .rows_dtype = out_dtype,
                   .scales = scales.data<float>(),
                   .quant_group = group},
                  nullptr);
  const HostLayout want = host_sort(ids, n_slots, tile, capacity);
  const std::vector<uint8_t> got = download<uint8_t>(rows);
  const std::vector<float> got_scales = download<float>(scales);
  const QuantParams fp8 = group == H ? QuantParams::Fp8Tensor() : QuantParams::Fp8Block(group);
  std::vector<float> got_row(static_cast<size_t>(H)), want_row(static_cast<size_t>(H));
  for (int s = 0; s < n_slots; ++s) {
    const int used = masked ? want.counts[s] : want.offsets[s + 1] - want.offsets[s];
    for (int64_t r = want.offsets[s]; r < want.offsets[s] + used; ++r) {
      const int32_t entry = want.row_source[r];
      std::vector<float> source(static_cast<size_t>(H), 0.0f);  // a padding row is zeros
      if (entry >= 0) {
        std::copy_n(hidden.values.begin() + entry / columns * H, H, source.begin());
      }
      const int64_t row_bytes = dtype_storage_bytes(out_dtype, H);
      convert_to_f32(got.data() + r * row_bytes, out_dtype, H, got_row.data());
      if (out_dtype == DType::f8e4m3) {
        for (int64_t h = 0; h < H; ++h) got_row[h] *= got_scales[r * groups + h / group];
        quantize_activation_row(fp8, 0.0f, source.data(), H, want_row.data());
      } else {
        const Activations converted = as_dtype(source, out_dtype);
        want_row = converted.values;
      }
      for (int64_t h = 0; h < H; ++h) {
        ASSERT_EQ(got_row[h], want_row[h]) << "row " << r << " column " << h;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Dtypes, CudaGather,
    ::testing::Combine(::testing::Values(DType::f32, DType::bf16, DType::f16),
                       ::testing::Values(DType::bf16, DType::f16, DType::f8e4m3),
                       ::testing::Values(int64_t{0}, int64_t{1}, int64_t{3}, int64_t{257}),
                       ::testing::Bool(),
                       ::testing::Values(GatherShape{300, 128}, GatherShape{304, 128},
                                         GatherShape{304, 304})),
    [](const auto& test) {
      const GatherShape shape = std::get<4>(test.param);
      return std::string(dtype_name(std::get<0>(test.param))) + "_to_" +
             std::string(dtype_name(std::get<1>(test.param))) + "_T" +
             std::to_string(std::get<2>(test.param)) +
             (std::get<3>(test.param) ? "_masked" : "_contiguous") + "_H" +
             std::to_string(shape.hidden) + "_group" + std::to_string(shape.group);
    });

// fp8 static activations: every value over the one scale the checkpoint gives (large values
// saturate), no amax, no scales written.
TEST(CudaGatherStatic, QuantisesEveryRowWithTheStaticScale) {
  MOEKIT_REQUIRE_GPU();
  const int64_t T = 3, H = 304;
  const int columns = 2, n_slots = 3;
  const float scale = 0.004f;  // 448 * 0.004 = 1.8: values beyond saturate
  const std::vector<int32_t> ids = random_slots(T, columns, n_slots, 41);
  const std::vector<float> x = normal(T * H, 42, 1.0f);
  const Tensor d_ids = upload(ids, DType::i32, {T * columns});
  const Tensor d_hidden = upload(x, DType::f32, {T, H});
  const Tensor d_scale = upload(std::vector<float>{scale}, DType::f32, {1});
  const DeviceLayout d = device_sort(d_ids, T, columns, n_slots, 1, 0);
  Tensor rows = poisoned(DType::f8e4m3, {d.max_rows, H});
  rc::gather_rows({.hidden = d_hidden.view().data,
                   .hidden_dtype = DType::f32,
                   .tokens = T,
                   .hidden_size = H,
                   .columns = columns,
                   .row_source = d.row_source.data<int32_t>(),
                   .offsets = d.offsets.data<int32_t>(),
                   .counts = d.counts.data<int32_t>(),
                   .n_slots = n_slots,
                   .max_rows = d.max_rows,
                   .rows = rows.view().data,
                   .rows_dtype = DType::f8e4m3,
                   .quant_group = static_cast<int>(H),
                   .static_scale = d_scale.data<float>()},
                  nullptr);
  const HostLayout want = host_sort(ids, n_slots, 1, 0);
  const std::vector<uint8_t> got = download<uint8_t>(rows);
  const QuantParams fp8 = QuantParams::Fp8Tensor(Fp8Scaling::per_tensor, Fp8Activations::static_);
  std::vector<float> got_row(static_cast<size_t>(H)), want_row(static_cast<size_t>(H));
  for (int64_t r = 0; r < want.offsets[n_slots]; ++r) {
    const int32_t entry = want.row_source[r];
    ASSERT_GE(entry, 0);
    convert_to_f32(got.data() + r * H, DType::f8e4m3, H, got_row.data());
    quantize_activation_row(fp8, scale, x.data() + entry / columns * H, H, want_row.data());
    for (int64_t h = 0; h < H; ++h) {
      ASSERT_EQ(got_row[h] * scale, want_row[h]) << "row " << r << " column " << h;
    }
  }
}

class CudaCombine : public ::testing::TestWithParam<std::tuple<DType, DType, int64_t, bool>> {};

TEST_P(CudaCombine, SumsTheEntriesInColumnOrderPlusTheSharedOutput) {
  MOEKIT_REQUIRE_GPU();
  const auto [rows_dtype, out_dtype, T, apply_weights] = GetParam();
  const int64_t H = 1100;  // more than one block of columns, not a multiple of it
  const int columns = 6, n_slots = 11;
  const std::vector<int32_t> ids = random_slots(T, columns, n_slots, 31);
  const Tensor d_ids = upload(ids, DType::i32, {T * columns});
  const DeviceLayout d = device_sort(d_ids, T, columns, n_slots, 4, 0);
  const HostLayout layout = host_sort(ids, n_slots, 4, 0);
  const int64_t rows_used = std::max<int64_t>(d.max_rows, 1);
  const Activations rows = as_dtype(normal(rows_used * H, 12), rows_dtype);
  const std::vector<float> weights = normal(T * columns, 13, 0.3f);
  const Activations shared = as_dtype(normal(T * H, 14), DType::bf16);
  const Tensor d_rows = upload(rows.bytes, rows_dtype, {rows_used, H});
  const Tensor d_weights = upload(weights, DType::f32, {T * columns});
  const Tensor d_shared = upload(shared.bytes, DType::bf16, {T, H});
  const auto run = [&](bool with_shared) {
    Tensor out = poisoned(out_dtype, {T, H});
    rc::combine({.rows = d_rows.view().data,
                 .rows_dtype = rows_dtype,
                 .entry_row = d.entry_row.data<int32_t>(),
                 .apply_weights = apply_weights,
                 .weights = d_weights.data<float>(),
                 .shared = with_shared ? d_shared.view().data : nullptr,
                 .shared_dtype = DType::bf16,
                 .tokens = T,
                 .columns = columns,
                 .hidden_size = H,
                 .output = out.view().data,
                 .output_dtype = out_dtype},
                nullptr);
    return download<uint8_t>(out);
  };
  const double tolerance = out_dtype == DType::f32 ? 1e-5 : 1e-2;
  for (const bool with_shared : {false, true}) {
    const std::vector<uint8_t> got_bytes = run(with_shared);
    EXPECT_EQ(run(with_shared), got_bytes) << "two runs differ";
    std::vector<float> got(static_cast<size_t>(T * H));
    convert_to_f32(got_bytes.data(), out_dtype, T * H, got.data());
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        double want = with_shared ? double{shared.values[t * H + h]} : 0.0;
        double magnitude = std::abs(want);
        for (int j = 0; j < columns; ++j) {
          const int32_t r = layout.entry_row[t * columns + j];
          if (r < 0) continue;
          const double w = apply_weights ? weights[t * columns + j] : 1.0;
          want += w * rows.values[r * H + h];
          magnitude += std::abs(w * rows.values[r * H + h]);
        }
        ASSERT_NEAR(got[t * H + h], want, tolerance * (1.0 + magnitude))
            << "token " << t << " column " << h;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaCombine,
                         ::testing::Combine(::testing::Values(DType::f32, DType::bf16),
                                            ::testing::Values(DType::f32, DType::bf16, DType::f16),
                                            ::testing::Values(int64_t{0}, int64_t{1}, int64_t{3},
                                                              int64_t{257}),
                                            ::testing::Bool()),
                         [](const auto& test) {
                           return std::string(dtype_name(std::get<0>(test.param))) + "_to_" +
                                  std::string(dtype_name(std::get<1>(test.param))) + "_T" +
                                  std::to_string(std::get<2>(test.param)) +
                                  (std::get<3>(test.param) ? "_weighted" : "_preweighted");
                         });

}  // namespace
}  // namespace moekit
