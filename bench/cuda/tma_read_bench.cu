// How fast TMA streams an expert's weights into shared memory, by the shape of the copies alone:
// no tensor cores, no epilogue. Each CTA is one tile of the wgmma kernel's weight rows (or, in
// the persistent patterns, a run of K steps across tiles), a producer thread issuing every copy
// and one consumer warp handing each stage back as soon as it is full. What it separates: the
// DRAM side (the order and size of the boxes) from the rest of a GEMM's K loop.
//
//   tma_read_bench [--json FILE]
//
// Shapes: DeepSeek-V3's GEMM1 (8 experts x 4096 rows x 7168 bytes, fp8) and GEMM2 (8 x 7168 rows
// x 2048 bytes). Patterns:
//   slices     the wgmma kernel's copies: per K step, boxes of 128 bytes x 128 rows (rows a
//              whole K apart), plus the A box of the token rows (64 or 8 rows, or none)
//   multistep  one box covers J K steps of 8-row groups (a 4-D view of the same bytes), so a
//              row's J x 128 bytes are requested together; the shared-memory layout per K step
//              is the one wgmma reads (8-row atoms J x 1024 bytes apart)
//   tiled      the same bytes stored tile by tile (each box 16 KB contiguous): a repacked layout
//   evict      slices with an L2 evict-first hint on the weights
//   persistent 132 CTAs, each streaming an equal run of (tile, K step) units
// The last line is a one-line summary. Read bandwidth of a plain vector-load kernel over the
// same bytes is printed first, as the ceiling.

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "runner/cuda/gemm/gemm_device.cuh"
#include "runner/cuda/gemm/wgmma_ops.cuh"

namespace {

using namespace moekit::cuda_gemm::detail;

constexpr int kStep = 128;  // bytes of K per step, as in the wgmma kernel
constexpr int kRuns = 10;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void* map, int x, int y, int z,
                                            int w, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3, %4, %5}], [%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(z), "r"(w), "r"(bar)
      : "memory");
}

__device__ __forceinline__ void tma_load_2d_evict_first(uint32_t dst, const void* map, int x, int y,
                                                        uint32_t bar, uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
      "[%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar), "l"(policy)
      : "memory");
}

enum class Pattern { slices, multistep, tiled, evict };

struct Job {
  Pattern pattern;
  int tile_rows;  // weight rows per tile (boxes of 128 rows)
  int steps;      // K steps per row
  int tiles;      // tiles in all
  int stages;
  int j;           // K steps per stage (multistep); 1 otherwise
  int a_rows;      // rows of the A box per step; 0: none
  int persistent;  // 1: units of (tile, step) spread evenly over the grid
};

struct Maps {
  CUtensorMap w;
  CUtensorMap a;
};

__global__ void __launch_bounds__(64, 1) read_kernel(const __grid_constant__ Maps maps, Job job) {
  extern __shared__ uint4 smem[];
  __shared__ uint64_t full[8], empty[8];
  const int tid = static_cast<int>(threadIdx.x);
  if (tid == 0) {
    for (int s = 0; s < job.stages; ++s) {
      mbarrier_init(smem_address(&full[s]), 1);
      mbarrier_init(smem_address(&empty[s]), 1);
    }
    fence_mbarrier_init();
  }
  __syncthreads();
  const uint32_t base = (smem_address(smem) + 1023u) & ~1023u;
  const int w_stage = job.tile_rows * kStep * job.j;
  const int a_stage = job.a_rows * kStep;
  const int stage_bytes = w_stage + a_stage;
  // The (tile, step-group) units this CTA streams.
  const int groups = job.steps / job.j;
  const int64_t units = int64_t{job.tiles} * groups;
  int64_t first = blockIdx.x, last = blockIdx.x + 1;
  if (job.persistent) {
    first = units * blockIdx.x / gridDim.x;
    last = units * (blockIdx.x + 1) / gridDim.x;
  } else {
    first *= groups;
    last *= groups;
  }
  const int count = static_cast<int>(last - first);
  if (tid == 32) {
    uint64_t policy = 0;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
    for (int i = 0; i < count; ++i) {
      const int stage = i % job.stages;
      if (i >= job.stages) mbarrier_wait(smem_address(&empty[stage]), (i / job.stages - 1) & 1);
      const uint32_t bar = smem_address(&full[stage]);
      mbarrier_expect_tx(bar, stage_bytes);
      const int64_t unit = first + i;
      const int tile = static_cast<int>(unit / groups), group = static_cast<int>(unit % groups);
      const uint32_t dst = base + stage * stage_bytes;
      for (int b = 0; b < job.tile_rows / 128; ++b) {
        const int row = tile * job.tile_rows + b * 128;
        const uint32_t box_dst = dst + b * 128 * kStep * job.j;
        switch (job.pattern) {
          case Pattern::slices:
            tma_load_2d(box_dst, &maps.w, group * kStep, row, bar);
            break;
          case Pattern::evict:
            tma_load_2d_evict_first(box_dst, &maps.w, group * kStep, row, bar, policy);
            break;
          case Pattern::tiled:
            tma_load_2d(
                box_dst, &maps.w, 0,
                static_cast<int>((int64_t{tile} * groups + group) * job.tile_rows) + b * 128, bar);
            break;
          case Pattern::multistep:
            tma_load_4d(box_dst, &maps.w, 0, 0, group * job.j, row / 8, bar);
            break;
        }
      }
      if (job.a_rows > 0) tma_load_2d(dst + w_stage, &maps.a, group * kStep, 0, bar);
    }
  } else if (tid == 0) {
    for (int i = 0; i < count; ++i) {
      const int stage = i % job.stages;
      mbarrier_wait(smem_address(&full[stage]), (i / job.stages) & 1);
      mbarrier_arrive(smem_address(&empty[stage]));
    }
  }
}

__global__ void vector_read(const uint4* p, int64_t n, uint4* sink) {
  uint4 acc = make_uint4(0, 0, 0, 0);
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const uint4 v = __ldg(p + i);
    acc.x ^= v.x;
    acc.y ^= v.y;
    acc.z ^= v.z;
    acc.w ^= v.w;
  }
  if (acc.x == 0x12345678u) *sink = acc;
}

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  check(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found),
        "cuTensorMapEncodeTiled");
  return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
}

CUtensorMap make_map(void* base, int rank, const cuuint64_t* dims, const cuuint64_t* strides,
                     const cuuint32_t* box) {
  CUtensorMap map{};
  const cuuint32_t ones[4] = {1, 1, 1, 1};
  const CUresult r =
      encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, rank, base, dims, strides, box, ones,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled (rank %d): CUresult %d\n", rank,
                 static_cast<int>(r));
    std::exit(1);
  }
  return map;
}

struct Shape {
  const char* name;
  int64_t rows;  // weight rows of all experts
  int64_t k;     // bytes per row
};

struct Result {
  std::string shape, label;
  double us, tbs;
};

float time_ms(cudaEvent_t start, cudaEvent_t stop) {
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, start, stop), "elapsed");
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--json" && i + 1 < argc) json_path = argv[++i];
  }
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "SM count");
  const Shape shapes[] = {{"dsv3-gemm1-fp8", 8 * 4096, 7168}, {"dsv3-gemm2-fp8", 8 * 7168, 2048}};
  int64_t most = 0;
  for (const Shape& s : shapes) most = std::max(most, s.rows * s.k);
  uint8_t* w = nullptr;
  uint8_t* a = nullptr;
  uint4* sink = nullptr;
  check(cudaMalloc(&w, most), "weights");
  check(cudaMalloc(&a, 64 * 7168), "rows");
  check(cudaMalloc(&sink, sizeof(uint4)), "sink");
  check(cudaMemset(w, 1, most), "fill");
  check(cudaMemset(a, 1, 64 * 7168), "fill");
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "event");
  check(cudaEventCreate(&stop), "event");
  std::vector<Result> results;

  for (const Shape& s : shapes) {
    const int64_t bytes = s.rows * s.k;
    {
      vector_read<<<sms * 4, 512>>>(reinterpret_cast<const uint4*>(w), bytes / 16, sink);
      check(cudaEventRecord(start), "record");
      for (int r = 0; r < kRuns; ++r) {
        vector_read<<<sms * 4, 512>>>(reinterpret_cast<const uint4*>(w), bytes / 16, sink);
      }
      check(cudaEventRecord(stop), "record");
      check(cudaEventSynchronize(stop), "sync");
      const double us = time_ms(start, stop) * 1e3 / kRuns;
      results.push_back({s.name, "ld.global.v4 (ceiling)", us, bytes / us * 1e-6});
    }
    struct Config {
      const char* label;
      Job job;
    };
    const int steps = static_cast<int>(s.k / kStep);
    const auto tiles = [&](int rows) { return static_cast<int>(s.rows / rows); };
    const Config configs[] = {
        {"slices 256r A64 5st (wgmma 64x256)",
         {Pattern::slices, 256, steps, tiles(256), 5, 1, 64, 0}},
        {"slices 256r A8 5st", {Pattern::slices, 256, steps, tiles(256), 5, 1, 8, 0}},
        {"slices 256r noA 5st", {Pattern::slices, 256, steps, tiles(256), 5, 1, 0, 0}},
        {"slices 256r noA 6st", {Pattern::slices, 256, steps, tiles(256), 6, 1, 0, 0}},
        {"slices 256r noA 3st", {Pattern::slices, 256, steps, tiles(256), 3, 1, 0, 0}},
        {"evict 256r noA 5st", {Pattern::evict, 256, steps, tiles(256), 5, 1, 0, 0}},
        {"multistep 256r J2 3st", {Pattern::multistep, 256, steps, tiles(256), 3, 2, 0, 0}},
        {"multistep 128r J4 3st", {Pattern::multistep, 128, steps, tiles(128), 3, 4, 0, 0}},
        {"multistep 128r J2 6st", {Pattern::multistep, 128, steps, tiles(128), 6, 2, 0, 0}},
        {"tiled 256r noA 5st", {Pattern::tiled, 256, steps, tiles(256), 5, 1, 0, 0}},
        {"slices 128r noA 6st", {Pattern::slices, 128, steps, tiles(128), 6, 1, 0, 0}},
        {"persistent slices 256r 5st", {Pattern::slices, 256, steps, tiles(256), 5, 1, 0, 1}},
        {"persistent slices 128r 8st", {Pattern::slices, 128, steps, tiles(128), 8, 1, 0, 1}},
        {"persistent multistep 128r J2 6st",
         {Pattern::multistep, 128, steps, tiles(128), 6, 2, 0, 1}},
        {"persistent tiled 256r 5st", {Pattern::tiled, 256, steps, tiles(256), 5, 1, 0, 1}},
    };
    for (const Config& c : configs) {
      const Job& job = c.job;
      Maps maps{};
      if (job.pattern == Pattern::tiled) {
        const cuuint64_t dims[2] = {kStep, static_cast<cuuint64_t>(bytes / kStep)};
        const cuuint64_t strides[1] = {kStep};
        const cuuint32_t box[2] = {kStep, 128};
        maps.w = make_map(w, 2, dims, strides, box);
      } else if (job.pattern == Pattern::multistep) {
        const cuuint64_t dims[4] = {kStep, 8, static_cast<cuuint64_t>(steps),
                                    static_cast<cuuint64_t>(s.rows / 8)};
        const cuuint64_t strides[3] = {static_cast<cuuint64_t>(s.k), kStep,
                                       static_cast<cuuint64_t>(8 * s.k)};
        const cuuint32_t box[4] = {kStep, 8, static_cast<cuuint32_t>(job.j), 16};
        maps.w = make_map(w, 4, dims, strides, box);
      } else {
        const cuuint64_t dims[2] = {static_cast<cuuint64_t>(s.k), static_cast<cuuint64_t>(s.rows)};
        const cuuint64_t strides[1] = {static_cast<cuuint64_t>(s.k)};
        const cuuint32_t box[2] = {kStep, 128};
        maps.w = make_map(w, 2, dims, strides, box);
      }
      {
        const cuuint64_t dims[2] = {static_cast<cuuint64_t>(s.k), 64};
        const cuuint64_t strides[1] = {static_cast<cuuint64_t>(s.k)};
        const cuuint32_t box[2] = {kStep, static_cast<cuuint32_t>(std::max(job.a_rows, 8))};
        maps.a = make_map(a, 2, dims, strides, box);
      }
      const int smem_bytes =
          job.stages * (job.tile_rows * kStep * job.j + job.a_rows * kStep) + 1024;
      check(cudaFuncSetAttribute(read_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 smem_bytes),
            "smem attribute");
      const int grid = job.persistent ? sms : job.tiles;
      read_kernel<<<grid, 64, smem_bytes>>>(maps, job);
      check(cudaGetLastError(), c.label);
      check(cudaEventRecord(start), "record");
      for (int r = 0; r < kRuns; ++r) read_kernel<<<grid, 64, smem_bytes>>>(maps, job);
      check(cudaEventRecord(stop), "record");
      check(cudaEventSynchronize(stop), c.label);
      const double us = time_ms(start, stop) * 1e3 / kRuns;
      results.push_back({s.name, c.label, us, bytes / us * 1e-6});
    }
  }
  std::printf("| shape | pattern | us | TB/s |\n|---|---|---|---|\n");
  for (const Result& r : results) {
    std::printf("| %s | %s | %.1f | %.2f |\n", r.shape.c_str(), r.label.c_str(), r.us, r.tbs);
  }
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f != nullptr) {
      std::fprintf(f, "[\n");
      for (size_t i = 0; i < results.size(); ++i) {
        std::fprintf(f,
                     "  {\"shape\": \"%s\", \"pattern\": \"%s\", \"us\": %.2f, \"tbs\": %.3f}%s\n",
                     results[i].shape.c_str(), results[i].label.c_str(), results[i].us,
                     results[i].tbs, i + 1 < results.size() ? "," : "");
      }
      std::fprintf(f, "]\n");
      std::fclose(f);
    }
  }
  double best = 0.0;
  for (const Result& r : results) best = std::max(best, r.tbs);
  std::printf("tma_read_bench: %zu patterns, best %.2f TB/s\n", results.size(), best);
  return 0;
}
