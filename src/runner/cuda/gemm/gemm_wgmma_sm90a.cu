// The Hopper kernel's launches (wgmma_gemm.cuh). This file alone is built for sm_90a (the
// arch-specific target that wgmma needs, src/CMakeLists.txt); choose_gemm picks the kernel only
// on a GPU of compute capability 9.0.

#include <cudaTypedefs.h>

#include <stdexcept>
#include <string>

#include "runner/cuda/gemm/gemm_kernels.cuh"
#include "runner/cuda/gemm/wgmma_decode_gemm.cuh"
#include "runner/cuda/gemm/wgmma_gemm.cuh"

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "gemm_wgmma_sm90a.cu is built for sm_90a alone (-gencode arch=compute_90a,code=sm_90a)"
#endif

namespace moekit::cuda_gemm::detail {

static_assert(wgmma_quantizes({Wgmma64x256::kRows, Wgmma64x256::kCols}) &&
                  Wgmma64x256::kGroupsM == 1 && Wgmma64x256::kCols / 2 == 128,
              "the quantising 64-row GEMM1 tile holds 128 whole columns of its rows");
static_assert(WgmmaDecode8::kCols == 256 && WgmmaDecode16::kCols == 256 &&
                  WgmmaDecode8x128::kCols == 128 && WgmmaDecode16x128::kCols == 128,
              "wgmma_builds names the decode tiles' widths");
static_assert(wgmma_quantizes({WgmmaDecode8::kRows, WgmmaDecode8::kCols}) &&
                  wgmma_quantizes({WgmmaDecode16::kRows, WgmmaDecode16::kCols}) &&
                  WgmmaDecode8::kCols / 2 == 128 && WgmmaDecode16::kCols / 2 == 128,
              "the quantising decode GEMM1 tiles hold 128 whole columns of their rows");

namespace {

// cuTensorMapEncodeTiled from the driver, through the runtime: the binary links no libcuda.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                           cudaEnableDefault, &found);
    return e == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)
               : nullptr;
  }();
  return encode;
}

// A [rows, row_bytes] byte matrix read in boxes of 128 bytes x box_rows, swizzled as wgmma
// reads it; boxes past the matrix are filled with zeros.
CUtensorMap byte_matrix_map(const void* base, int64_t rows, int64_t row_bytes, int box_rows,
                            const char* what) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) {
    throw std::runtime_error(std::string("wgmma: the driver has no cuTensorMapEncodeTiled (") +
                             what + ")");
  }
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(row_bytes), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_bytes)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(kStepBytes),
                             static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r =
      encode(&map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    throw std::runtime_error(std::string("wgmma: cuTensorMapEncodeTiled refused the ") + what +
                             " (" + std::to_string(rows) + " rows of " + std::to_string(row_bytes) +
                             " bytes): CUresult " + std::to_string(static_cast<int>(r)));
  }
  return map;
}

// The decode shapes (tiles of 8 or 16 token rows on wgmma's N side) run wgmma_decode_kernel.
template <class S>
inline constexpr bool kDecodeShape = S::kRows < 64;

template <class S, Elem kElem, bool kGated, bool kPerBlock>
void launch_shape(const Params& p, int64_t rows, dim3 grid, cudaStream_t stream) {
  const auto kernel = [] {
    if constexpr (kDecodeShape<S>) {
      return wgmma_decode_kernel<S, kElem, kGated, kPerBlock>;
    } else {
      return wgmma_kernel<S, kElem, kGated, kPerBlock>;
    }
  }();
  // Set once per variant: the attribute outlives the call and is no stream operation.
  static const cudaError_t attribute =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmemBytes);
  (void)attribute;
  const int64_t row_bytes = int64_t{p.k} * kElemBytes<kElem>;
  const int64_t weight_rows = int64_t{p.num_experts} * (kGated ? 2 : 1) * p.n;
  const WgmmaArgs args{
      .a_map = byte_matrix_map(p.a, rows, row_bytes, S::kRows, "GEMM input rows"),
      .w_map = byte_matrix_map(p.w, weight_rows, row_bytes, S::box_rows(kGated), "weights"),
      .p = p};
  cuda_launch::launch(kernel, grid, S::kThreads, S::kSmemBytes, stream, args);
}

template <Elem kElem, bool kGated, bool kPerBlock>
void launch_variant(const Params& p, WgmmaTile tile, int64_t rows, dim3 grid, cudaStream_t stream) {
  const bool narrow = tile.cols == 128;
  if (tile.rows == WgmmaDecode8::kTokens) {
    narrow ? launch_shape<WgmmaDecode8x128, kElem, kGated, kPerBlock>(p, rows, grid, stream)
           : launch_shape<WgmmaDecode8, kElem, kGated, kPerBlock>(p, rows, grid, stream);
  } else if (tile.rows == WgmmaDecode16::kTokens) {
    narrow ? launch_shape<WgmmaDecode16x128, kElem, kGated, kPerBlock>(p, rows, grid, stream)
           : launch_shape<WgmmaDecode16, kElem, kGated, kPerBlock>(p, rows, grid, stream);
  } else if (tile.rows == 64 && tile.cols == 128) {
    launch_shape<Wgmma64x128, kElem, kGated, kPerBlock>(p, rows, grid, stream);
  } else if (tile.rows == 64) {
    launch_shape<Wgmma64x256, kElem, kGated, kPerBlock>(p, rows, grid, stream);
  } else if constexpr (kElem == Elem::e4m3) {
    launch_shape<Wgmma128x128, kElem, kGated, kPerBlock>(p, rows, grid, stream);
  } else {
    launch_shape<Wgmma128x256, kElem, kGated, kPerBlock>(p, rows, grid, stream);
  }
}

}  // namespace

bool wgmma_builds(bool e4m3, WgmmaTile tile) {
  if (tile.rows == WgmmaDecode8::kTokens || tile.rows == WgmmaDecode16::kTokens) {
    return tile.cols == 256 || tile.cols == 128;
  }
  if (tile.rows == 64) return tile.cols == 256 || tile.cols == 128;
  return tile.rows == 128 && tile.cols == wgmma_widest_cols(e4m3, 128);
}

template <Elem kElem>
void launch_wgmma(const Params& p, const Variant& v, WgmmaTile tile, int64_t rows, dim3 grid,
                  cudaStream_t stream) {
  if constexpr (kElem == Elem::e4m3) {
    if (v.per_block) {
      v.gated ? launch_variant<kElem, true, true>(p, tile, rows, grid, stream)
              : launch_variant<kElem, false, true>(p, tile, rows, grid, stream);
      return;
    }
  }
  v.gated ? launch_variant<kElem, true, false>(p, tile, rows, grid, stream)
          : launch_variant<kElem, false, false>(p, tile, rows, grid, stream);
}

template void launch_wgmma<Elem::bf16>(const Params&, const Variant&, WgmmaTile, int64_t, dim3,
                                       cudaStream_t);
template void launch_wgmma<Elem::f16>(const Params&, const Variant&, WgmmaTile, int64_t, dim3,
                                      cudaStream_t);
template void launch_wgmma<Elem::e4m3>(const Params&, const Variant&, WgmmaTile, int64_t, dim3,
                                       cudaStream_t);

}  // namespace moekit::cuda_gemm::detail
