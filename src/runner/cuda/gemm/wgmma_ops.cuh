#pragma once
// Hopper's warpgroup MMA (wgmma, sm_90a) and what it needs: shared-memory matrix descriptors for
// the 128-byte swizzle that TMA writes, mbarriers, TMA copies, the fences, and one wrapper per
// instruction shape the Hopper kernel issues. Each wrapper is one
// `wgmma.mma_async` with its accumulators listed as registers: PTX has no array operands.

#include <cstdint>

namespace moekit::cuda_gemm::detail {

// A K-major operand tile in shared memory: rows of 128 bytes whose 16-byte pieces are XOR-
// swizzled by (row % 8), in groups of 8 rows (1024 bytes, aligned to 1024). The stride between
// groups is 1024 bytes; the leading offset is unused by the 128-byte swizzle (1 by convention).
// Adding 2 steps the descriptor 32 bytes along K: the next k16 (16-bit) or k32 (e4m3) slice.
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t address) {
  return static_cast<uint64_t>((address & 0x3FFFFu) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// mbarriers (shared memory, CTA scope): a stage's "full" barrier counts the producer's arrival
// and the bytes its copies bring; its "empty" barrier the consumer warps handing it back.
__device__ __forceinline__ void mbarrier_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Makes the initialisations visible to the copy engine; a block barrier then to the threads.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

__device__ __forceinline__ void mbarrier_expect_tx(uint32_t bar, int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

// More bytes this phase waits for, without an arrival: a stage whose copies are issued in two
// rounds (the weights before the kernel's inputs are ready, the rows after).
__device__ __forceinline__ void mbarrier_add_tx(uint32_t bar, int bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Waits until the barrier's phase of the given parity has completed.
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, int parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// A TMA copy of the box at (x, y) of a 2-D tensor map into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* map, int x, int y,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// A 4-byte copy from global to shared memory that completes asynchronously (cp.async), and an
// arrival on an mbarrier once every earlier cp.async of this thread has completed, without
// raising the barrier's expected count (`noinc`: its init count includes it).
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ void cp_async_mbarrier_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// Keeps the compiler from moving reads or writes of accumulators across a wgmma fence or wait:
// they are registers the asm statements above do not name.
template <int kN>
__device__ __forceinline__ void fence_registers(float (&d)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// A wgmma's accumulators: PTX has no array operands, so each is a register operand of its own,
// "+f"(d[i]) listed in order, and the instruction names them %0 to %(n - 1) (MOEKIT_WGMMA_Dn).
#define MOEKIT_WGMMA_ACC8(d, i)                                                               \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])
#define MOEKIT_WGMMA_ACC4(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
#define MOEKIT_WGMMA_ACC32_FROM(d, i)                                                 \
  MOEKIT_WGMMA_ACC8(d, i), MOEKIT_WGMMA_ACC8(d, i + 8), MOEKIT_WGMMA_ACC8(d, i + 16), \
      MOEKIT_WGMMA_ACC8(d, i + 24)
#define MOEKIT_WGMMA_ACC32(d) MOEKIT_WGMMA_ACC32_FROM(d, 0)
#define MOEKIT_WGMMA_ACC64(d) MOEKIT_WGMMA_ACC32_FROM(d, 0), MOEKIT_WGMMA_ACC32_FROM(d, 32)
#define MOEKIT_WGMMA_ACC128(d)                                                                   \
  MOEKIT_WGMMA_ACC32_FROM(d, 0), MOEKIT_WGMMA_ACC32_FROM(d, 32), MOEKIT_WGMMA_ACC32_FROM(d, 64), \
      MOEKIT_WGMMA_ACC32_FROM(d, 96)
#define MOEKIT_WGMMA_D4 "{%0, %1, %2, %3}"
#define MOEKIT_WGMMA_D8 "{%0, %1, %2, %3, %4, %5, %6, %7}"
#define MOEKIT_WGMMA_D32                                                           \
  "{"                                                                              \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "         \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31" \
  "}"
#define MOEKIT_WGMMA_D64                                                             \
  "{"                                                                                \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "           \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"   \
  "}"
#define MOEKIT_WGMMA_D128                                                                          \
  "{"                                                                                              \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                         \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "               \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "               \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "               \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "               \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "               \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "   \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
  "}"

// D[64 x 256] (+)= A[64 x 16] * B[256 x 16]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_bf16_n256(float (&d)[128], uint64_t a, uint64_t b,
                                                int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " MOEKIT_WGMMA_D128
      ", %128, %129, p, 1, 1, 0, 0;\n}\n"
      : MOEKIT_WGMMA_ACC128(d)
      : "l"(a), "l"(b), "r"(accumulate));
}

// D[64 x 128] (+)= A[64 x 16] * B[128 x 16]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_bf16_n128(float (&d)[64], uint64_t a, uint64_t b,
                                                int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " MOEKIT_WGMMA_D64
      ", %64, %65, p, 1, 1, 0, 0;\n}\n"
      : MOEKIT_WGMMA_ACC64(d)
      : "l"(a), "l"(b), "r"(accumulate));
}

// D[64 x 64] (+)= A[64 x 16] * B[64 x 16]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_bf16_n64(float (&d)[32], uint64_t a, uint64_t b,
                                               int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " MOEKIT_WGMMA_D32
      ", %32, %33, p, 1, 1, 0, 0;\n}\n"
      : MOEKIT_WGMMA_ACC32(d)
      : "l"(a), "l"(b), "r"(accumulate));
}

// D[64 x 256] (+)= A[64 x 16] * B[256 x 16]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_f16_n256(float (&d)[128], uint64_t a, uint64_t b,
                                               int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 " MOEKIT_WGMMA_D128
      ", %128, %129, p, 1, 1, 0, 0;\n}\n"
      : MOEKIT_WGMMA_ACC128(d)
      : "l"(a), "l"(b), "r"(accumulate));
}

// D[64 x 128] (+)= A[64 x 16] * B[128 x 16]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_f16_n128(float (&d)[64], uint64_t a, uint64_t b,
                                               int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 " MOEKIT_WGMMA_D64
      ", %64, %65, p, 1, 1, 0, 0;\n}\n"
      : MOEKIT_WGMMA_ACC64(d)
      : "l"(a), "l"(b), "r"(accumulate));
}

// D[64 x 64] (+)= A[64 x 16] * B[64 x 16]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_f16_n64(float (&d)[32], uint64_t a, uint64_t b,
                                              int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 " MOEKIT_WGMMA_D32
      ", %32, %33, p, 1, 1, 0, 0;\n}\n"
      : MOEKIT_WGMMA_ACC32(d)
      : "l"(a), "l"(b), "r"(accumulate));
}

// D[64 x 256] (+)= A[64 x 32] * B[256 x 32]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_e4m3_n256(float (&d)[128], uint64_t a, uint64_t b,
                                                int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 " MOEKIT_WGMMA_D128
      ", %128, %129, p, 1, 1;\n}\n"
      : MOEKIT_WGMMA_ACC128(d)
      : "l"(a), "l"(b), "r"(accumulate));
}

// D[64 x 128] (+)= A[64 x 32] * B[128 x 32]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_e4m3_n128(float (&d)[64], uint64_t a, uint64_t b,
                                                int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " MOEKIT_WGMMA_D64
      ", %64, %65, p, 1, 1;\n}\n"
      : MOEKIT_WGMMA_ACC64(d)
      : "l"(a), "l"(b), "r"(accumulate));
}

// D[64 x 64] (+)= A[64 x 32] * B[64 x 32]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_e4m3_n64(float (&d)[32], uint64_t a, uint64_t b,
                                               int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 " MOEKIT_WGMMA_D32
      ", %32, %33, p, 1, 1;\n}\n"
      : MOEKIT_WGMMA_ACC32(d)
      : "l"(a), "l"(b), "r"(accumulate));
}

// D[64 x 8] (+)= A[64 x 16] * B[8 x 16]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_bf16_n8(float (&d)[4], uint64_t a, uint64_t b,
                                              int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 " MOEKIT_WGMMA_D4
      ", %4, %5, p, 1, 1, 0, 0;\n}\n"
      : MOEKIT_WGMMA_ACC4(d)
      : "l"(a), "l"(b), "r"(accumulate));
}

// D[64 x 8] (+)= A[64 x 16] * B[8 x 16]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_f16_n8(float (&d)[4], uint64_t a, uint64_t b,
                                             int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 " MOEKIT_WGMMA_D4
      ", %4, %5, p, 1, 1, 0, 0;\n}\n"
      : MOEKIT_WGMMA_ACC4(d)
      : "l"(a), "l"(b), "r"(accumulate));
}

// D[64 x 8] (+)= A[64 x 32] * B[8 x 32]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_e4m3_n8(float (&d)[4], uint64_t a, uint64_t b,
                                              int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 " MOEKIT_WGMMA_D4
      ", %4, %5, p, 1, 1;\n}\n"
      : MOEKIT_WGMMA_ACC4(d)
      : "l"(a), "l"(b), "r"(accumulate));
}

// D[64 x 16] (+)= A[64 x 16] * B[16 x 16]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_bf16_n16(float (&d)[8], uint64_t a, uint64_t b,
                                               int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 " MOEKIT_WGMMA_D8
      ", %8, %9, p, 1, 1, 0, 0;\n}\n"
      : MOEKIT_WGMMA_ACC8(d, 0)
      : "l"(a), "l"(b), "r"(accumulate));
}

// D[64 x 16] (+)= A[64 x 16] * B[16 x 16]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_f16_n16(float (&d)[8], uint64_t a, uint64_t b,
                                              int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 " MOEKIT_WGMMA_D8
      ", %8, %9, p, 1, 1, 0, 0;\n}\n"
      : MOEKIT_WGMMA_ACC8(d, 0)
      : "l"(a), "l"(b), "r"(accumulate));
}

// D[64 x 16] (+)= A[64 x 32] * B[16 x 32]^T, both K-major in shared memory.
__device__ __forceinline__ void wgmma_e4m3_n16(float (&d)[8], uint64_t a, uint64_t b,
                                               int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 " MOEKIT_WGMMA_D8
      ", %8, %9, p, 1, 1;\n}\n"
      : MOEKIT_WGMMA_ACC8(d, 0)
      : "l"(a), "l"(b), "r"(accumulate));
}

}  // namespace moekit::cuda_gemm::detail
