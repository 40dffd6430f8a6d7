// Warpgroup tensor-core products (wgmma, sm_90a) of the chunk_kda scan: D[64 x N] += A[64 x 8] B
// with tf32 operands, or A[64 x 16] B with f16 ones; f32 accumulators, A from registers and B
// from shared memory (K-major, or for f16 also MN-major: wgmma_desc_mn).
//
// Fragments, with warp w of the warpgroup owning rows 16 w .. 16 w + 15, g = lane / 4,
// t = lane % 4 (PTX ISA "Register fragments and shared memory matrix layouts" for wgmma .tf32;
// CuTe's GMMA::ALayout_64x8 and CLayout_64xN):
//   A (64 x 8):   a0 (g, t)  a1 (g + 8, t)  a2 (g, t + 4)  a3 (g + 8, t + 4)   (as mma.m16n8k8)
//   D (64 x N):   d[4 j + e] = (g + 8 (e / 2), 8 j + 2 t + e % 2)                (as mma.m16n8)
// B tiles use the 128-byte swizzle, K-major: a tile of N rows x kCols tf32 is kCols / 32 regions
// of N rows x 128 bytes; in a region, 16-byte chunk c of row r sits at r * 128 + ((c ^ r % 8) *
// 16), and 8-row groups are 1024 bytes apart (the descriptor's stride byte offset). The k step kk
// (8 tf32 = 32 bytes) starts at region kk / 4, byte (kk % 4) * 32. Regions are 1024-byte aligned.
//
// Ordering: wgmma_fence() after the registers it reads (A, D) were written by other instructions;
// wgmma_commit() + wgmma_wait<0>() before D is read; shared memory written by the threads needs
// fence_proxy_async_shared() in every writer and a barrier before the wgmma, shared memory written
// by a bulk copy (the scan's tiles) a wait on its mbarrier (the copy engine is the async proxy).
// The tiles' image layout (swizzled_offset, pair order) is in tile_image.h.
#pragma once

#include <cstdint>

#include "cuda/chunk_fwd/tile_image.h"

namespace openkda::cuda::chunk_forward {

// Shared-memory matrix descriptor of the first k step of a swizzled K-major tile at shared
// address `tile` (1024-byte aligned): start address / 16 in bits 0-13, 128-byte swizzle (mode 1),
// stride byte offset 1024, leading byte offset unused (1). Built once per tile (per chunk at
// most), not per product: wgmma_desc_step derives each k step from it.
__device__ __forceinline__ uint64_t wgmma_desc_base(uint32_t tile) {
  uint64_t desc = (tile & 0x3FFFFu) >> 4;
  desc |= uint64_t{1} << 16;          // leading byte offset (unused with swizzling)
  desc |= uint64_t{1024 >> 4} << 32;  // stride byte offset: 8 rows x 128 bytes
  desc |= uint64_t{1} << 62;          // 128-byte swizzle
  return desc;
}

// The descriptor of k step kk of a tile of kRows rows: its byte offset / 16 added to the start
// address field, in the low 32 bits only (one uniform add per product instead of the address
// arithmetic, masking and flag assembly of a fresh descriptor). Shared addresses stay below
// 2^18 bytes (228 KB), so the 14-bit field never carries into bit 14 or beyond.
template <int kRows>
__device__ __forceinline__ uint64_t wgmma_desc_step(uint64_t base, int kk) {
  const uint32_t step = static_cast<uint32_t>((kk / 4) * (kRows * 128) + (kk % 4) * 32) >> 4;
  return (base & 0xFFFFFFFF00000000ull) | (static_cast<uint32_t>(base) + step);
}

// The descriptor of an f16 tile read MN-major (N contiguous; the instruction's B transposed) from
// an image in the K-major f16 layout of swizzled_offset (tile_image.h: half_pair_image_offset) of
// kRows rows = the product's K: the canonical 128-byte-swizzled MN-major layout, 64 N values (128
// bytes) by 8 K rows per 1024-byte atom, with N's next 64 values kRows x 128 bytes on (the
// leading byte offset: the image's next region) and K's next 8 rows 1024 bytes on (the stride
// byte offset). Step kk (16 rows of K) starts kk x 2048 bytes on.
template <int kRows>
__device__ __forceinline__ uint64_t wgmma_desc_mn(uint32_t tile, int kk) {
  uint64_t desc = ((tile + static_cast<uint32_t>(kk) * kMnStepBytes) & 0x3FFFFu) >> 4;
  desc |= uint64_t{kMnLeadingBytes<kRows> >> 4} << 16;  // the next 64 N values
  desc |= uint64_t{kMnStrideBytes >> 4} << 32;          // the next 8 K rows
  desc |= uint64_t{1} << 62;                            // 128-byte swizzle
  return desc;
}

// Pins accumulator registers in place around the asynchronous products (the compiler must not
// read or move them between a wgmma and its wait).
template <int kN>
__device__ __forceinline__ void wgmma_fence_operands(float* d) {
#pragma unroll
  for (int i = 0; i < kN; ++i) asm volatile("" : "+f"(d[i])::"memory");
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

// The accumulator operands of the wrappers below: N / 2 f32 registers per thread, named %0 ..
// %(N / 2 - 1) in the instruction, then the four A registers and the descriptor.
#define OPENKDA_WGMMA_D64_NAMES                                                                 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68"
#define OPENKDA_WGMMA_D32_NAMES                                                                 \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36"
#define OPENKDA_WGMMA_D16_NAMES                                                              \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, " \
  "%19}, %20"
#define OPENKDA_WGMMA_D16_OUT(d)                                                                  \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15])
#define OPENKDA_WGMMA_D32_OUT(d)                                                                 \
  OPENKDA_WGMMA_D16_OUT(d), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),     \
      "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
      "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define OPENKDA_WGMMA_D64_OUT(d)                                                                 \
  OPENKDA_WGMMA_D32_OUT(d), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),     \
      "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
      "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), \
      "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), \
      "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define OPENKDA_WGMMA_A_DESC(a, desc) "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc)
// One specialisation fn<kN> of a wrapper: `shape` the instruction's shape and types, `regs` the
// accumulator count (16, 32 or 64), `tail` its immediate operands (scale-d, scale-a, scale-b, and
// for 16-bit B the transpose flag).
#define OPENKDA_WGMMA_SPECIALISATION(fn, kN, shape, regs, tail)                               \
  template <>                                                                                 \
  __device__ __forceinline__ void fn<kN>(float* d, const uint32_t(&a)[4], uint64_t desc) {    \
    asm volatile("wgmma.mma_async.sync.aligned." shape " " OPENKDA_WGMMA_D##regs##_NAMES tail \
                 ";\n"                                                                        \
                 : OPENKDA_WGMMA_D##regs##_OUT(d)                                             \
                 : OPENKDA_WGMMA_A_DESC(a, desc));                                            \
  }

// d[N / 2] += A (registers, tf32 bits) x B (descriptor, K-major); N = 128, 64 or 32.
template <int kN>
__device__ __forceinline__ void wgmma_tf32(float* d, const uint32_t (&a)[4], uint64_t desc);
OPENKDA_WGMMA_SPECIALISATION(wgmma_tf32, 128, "m64n128k8.f32.tf32.tf32", 64, ", 1, 1, 1")
OPENKDA_WGMMA_SPECIALISATION(wgmma_tf32, 64, "m64n64k8.f32.tf32.tf32", 32, ", 1, 1, 1")
OPENKDA_WGMMA_SPECIALISATION(wgmma_tf32, 32, "m64n32k8.f32.tf32.tf32", 16, ", 1, 1, 1")

// d[N / 2] += A (registers, four f16x2: the m64k16 fragment) x B (descriptor, f16, K-major);
// N = 32.
template <int kN>
__device__ __forceinline__ void wgmma_f16(float* d, const uint32_t (&a)[4], uint64_t desc);
OPENKDA_WGMMA_SPECIALISATION(wgmma_f16, 32, "m64n32k16.f32.f16.f16", 16, ", 1, 1, 1, 0")

// d[N / 2] += A (registers, four f16x2) x B (descriptor, f16, MN-major: wgmma_desc_mn, the
// instruction's B transposed); N = 128 or 64.
template <int kN>
__device__ __forceinline__ void wgmma_f16_mn(float* d, const uint32_t (&a)[4], uint64_t desc);
OPENKDA_WGMMA_SPECIALISATION(wgmma_f16_mn, 128, "m64n128k16.f32.f16.f16", 64, ", 1, 1, 1, 1")
OPENKDA_WGMMA_SPECIALISATION(wgmma_f16_mn, 64, "m64n64k16.f32.f16.f16", 32, ", 1, 1, 1, 1")

// The helper macros stay local to this header.
#undef OPENKDA_WGMMA_SPECIALISATION
#undef OPENKDA_WGMMA_A_DESC
#undef OPENKDA_WGMMA_D64_OUT
#undef OPENKDA_WGMMA_D32_OUT
#undef OPENKDA_WGMMA_D16_OUT
#undef OPENKDA_WGMMA_D16_NAMES
#undef OPENKDA_WGMMA_D32_NAMES
#undef OPENKDA_WGMMA_D64_NAMES

}  // namespace openkda::cuda::chunk_forward
