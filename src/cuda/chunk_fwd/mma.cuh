// Warp-level tensor-core primitives of the chunk_kda forward kernels.
//
// mma_tf32: D += A B with mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 (sm_80+). Fragment
// ownership, with g = lane / 4 and t = lane % 4 (PTX ISA "Matrix fragments for mma.m16n8k8",
// .tf32; the same as CuTe's SM80_16x8x8_F32TF32TF32F32_TN traits):
//   A (16 x 8, row-major):  a0 (g, t)   a1 (g + 8, t)   a2 (g, t + 4)   a3 (g + 8, t + 4)
//   B (8 x 8, k x n):       b0 (t, g)   b1 (t + 4, g)
//   C (16 x 8):             c0 (g, 2t)  c1 (g, 2t + 1)  c2 (g + 8, 2t)  c3 (g + 8, 2t + 1)
// The k index of one instruction can be permuted freely as long as A and B use the same
// permutation. The kernels use k = 2t for hardware column/row t and k = 2t + 1 for t + 4
// ("paired" order): then an f32 accumulator tile C (16 x 8) is directly the A operand of the next
// product (a0 = c0... see a_from_acc), and pairs of consecutive k load as one float2.
#pragma once

#include <cstdint>

namespace openkda::cuda::chunk_forward {

// f32 -> tf32 operand bits (10-bit mantissa), round to nearest, ties away from zero: half a tf32
// ulp (0x1000) is added to the bits of a finite x, and the tensor cores (mma.sync and wgmma) ignore
// the low 13 bits of a tf32 operand, so the operand is the one cvt.rna.tf32.f32 gives, at two
// instructions (FSETP, IADD) instead of three (cvt.rna also clears the low bits; CUTLASS calls
// this rounding round_half_ulp_truncate). inf and NaN pass unchanged, as through cvt.rna. One edge
// differs in the bits only: a finite |x| >= 0x7f7ff000 (the top 2^-11 of the f32 range; no bf16 or
// f16 input gets there) becomes 0x7f800000 plus low bits, an inf to a truncating tensor core and
// a NaN pattern as an f32, where cvt.rna gives 0x7f800000.
__device__ __forceinline__ uint32_t to_tf32(float x) {
  const uint32_t bits = __float_as_uint(x);
  return fabsf(x) < __uint_as_float(0x7f800000u) ? bits + 0x1000u : bits;
}

// x as a stored tf32 operand: the bits of to_tf32(x) kept in an f32 slot. Tiles whose every reader
// is a tensor-core operand (the scan's wgmma B tiles) are stored this way, once per element by
// their producer, and their reader passes the bits on (a bulk copy into shared memory) instead of
// converting at every use: the same operand, bit for bit. The low 13 bits are not cleared (the
// tensor cores ignore them), so the f32 value is within half a tf32 ulp of the operand: never read
// it as an f32.
__device__ __forceinline__ float tf32_operand(float x) {
  return __uint_as_float(to_tf32(x));
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// A operand (paired k order) from an accumulator tile c of the previous product: c holds
// (row g, k 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1). kRound = false passes the f32 bits as
// they are, and the tensor core truncates them to tf32 (drops the low 13 bits): the scan feeds
// S^T this way (state.cuh says why); NaN and inf stay NaN and inf.
template <bool kRound = true>
__device__ __forceinline__ void a_from_acc(const float (&c)[4], uint32_t (&a)[4]) {
  const auto op = [](float x) { return kRound ? to_tf32(x) : __float_as_uint(x); };
  a[0] = op(c[0]);
  a[1] = op(c[2]);
  a[2] = op(c[1]);
  a[3] = op(c[3]);
}

// Sum over the 32 lanes; every lane gets the bitwise same value (each butterfly step adds the
// same two operands on both partners).
__device__ __forceinline__ float warp_allreduce_sum(float x) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

}  // namespace openkda::cuda::chunk_forward
