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

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace openkda::cuda::chunk_forward {

// f32 -> tf32 operand bits (10-bit mantissa), round to nearest even, low 13 bits cleared:
// cvt.rn.tf32.f32 (PTX ISA 7.8, sm_90), one F2FP.TF32 instruction on sm_90 (the ties-away add
// of half an ulp with its inf / NaN test took two, FSETP and IADD). inf and NaN stay inf and NaN.
__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rn.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// x as a stored tf32 operand: the bits of to_tf32(x) kept in an f32 slot. Tiles whose every reader
// is a tensor-core operand (the scan's wgmma B tiles) are stored this way, once per element by
// their producer, and their reader passes the bits on (a bulk copy into shared memory) instead of
// converting at every use: the same operand, bit for bit (an f32 value exactly representable in
// tf32).
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

// Two f32 values as one 32-bit pair of 16-bit T (__half or __nv_bfloat16), `lo` in the low half,
// rounded to nearest even: one cvt.rn.{f16,bf16}x2.f32. The f16 wgmma operands (state.cuh), the
// f16 key tiles (wy.cuh) and the packed 16-bit o stores (scan_io.cuh).
template <typename T>
__device__ __forceinline__ uint32_t pack_b16(float lo, float hi) {
  static_assert(std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>, "a 16-bit float");
  uint32_t r;
  if constexpr (std::is_same_v<T, __half>) {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  } else {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  }
  return r;
}

// As pack_b16<__half>, but a value beyond f16's largest finite value (65504) becomes +-65504
// instead of +-inf (cvt.rn.satfinite: the same one instruction). The f16 v_new^T operand of the
// state and O^T updates (state.cuh), whose rare overflow the scan repairs after the products.
__device__ __forceinline__ uint32_t pack_f16_satfinite(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.satfinite.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// p ? a : b by one selp, which the compiler cannot turn into a dynamically indexed array (local
// memory) when a loop selects one register of an array by a run-time index.
__device__ __forceinline__ float select_f32(bool p, float a, float b) {
  float r;
  asm("{\n\t.reg .pred p;\n\tsetp.ne.u32 p, %3, 0;\n\tselp.f32 %0, %1, %2, p;\n\t}"
      : "=f"(r)
      : "f"(a), "f"(b), "r"(static_cast<uint32_t>(p)));
  return r;
}

// Sum over the 32 lanes; every lane gets the bitwise same value (each butterfly step adds the
// same two operands on both partners).
__device__ __forceinline__ float warp_allreduce_sum(float x) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
  return x;
}

// Sums of kN values (kN a power of two, 2 .. 32) over the 32 lanes: each butterfly step with
// mask m halves the values a lane holds, keeping the half that its bit m selects and sending the
// other half to its partner, so the kN sums take kN - 1 + log2(32 / kN) shuffles instead of
// 5 kN. On return value v's sum is held by the lanes l with l / (32 / kN) == v, in x[0] (the
// other entries are garbage); all of those lanes hold the bitwise same sum (each step adds the
// same two operands on both partners). Every sum adds its own value index only.
template <int kN>
__device__ __forceinline__ void warp_transpose_sums(float (&x)[kN]) {
  static_assert(kN >= 2 && kN <= 32 && (kN & (kN - 1)) == 0, "a power of two up to 32 values");
  const unsigned lane = threadIdx.x % 32;
#pragma unroll
  for (int n = kN, m = 16; n > 1; n /= 2, m /= 2) {  // halving steps: masks 16, 8, ...
    const bool upper = (lane & m) != 0;
#pragma unroll
    for (int j = 0; j < n / 2; ++j) {
      const float keep = upper ? x[j + n / 2] : x[j];
      const float send = upper ? x[j] : x[j + n / 2];
      x[j] = keep + __shfl_xor_sync(0xffffffffu, send, m);
    }
  }
#pragma unroll
  for (int m = 32 / kN / 2; m > 0; m /= 2)  // the lanes that share a value: full sums
    x[0] += __shfl_xor_sync(0xffffffffu, x[0], m);
}

}  // namespace openkda::cuda::chunk_forward
