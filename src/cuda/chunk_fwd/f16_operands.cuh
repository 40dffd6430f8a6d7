// The scan's f16 operands with f16 keys (params.h: f16_keys_apply; state.cuh's kF16Keys path):
// the range guard of the held state's rows, the packing of accumulator fragments into f16 A
// fragments, and the rare repair of the saturated v_new^T operand. CPU twin: none of its own (the
// packing rounds values that cpu/chunk_fwd.cpp fwd_state keeps exact; the GPU tests hold the
// results to the float64 reference).
//
// What it provides, for one warp's 16 rows of a 64-row wgmma A operand (this thread's rows g and
// g + 8, g = lane / 4):
//   F16RowFactors, update_f16_row_factors  the power-of-two factor inv of each row of S^T in its
//                                          f16 copy, from a carried bound of the row
//   init_f16_row_factors, row_abs_max,     the factors of the entering state; a row's maximum;
//   rescale_rows                           the held rows' move to new factors
//   pack_s_f16                             an accumulator block as m64k16 f16 A fragments
//   add_saturated_residual                 S^T and the O^T update += what v_new^T's saturated
//                                          pack dropped, by warp-local f32 FMAs
// Grid mapping: none of its own (scan_step's warps). Shared memory: reads the f16 kg and A_qk
// images (tile_image.h: half_pair_image_offset) in the repair only.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/chunk_fwd/mma.cuh"
#include "cuda/chunk_fwd/tile_image.h"

namespace openkda::cuda::chunk_forward {

// The range guard of S^T's f16 operand (kF16Keys). For this thread's rows r (g, g + 8) of S^T,
// inv[r] is the power-of-two factor of the row in its f16 copy and fwd[r] = 1 / inv[r] takes it
// back (both exact). update_f16_row_factors gets this thread's part of a bound of the row's next
// magnitudes and takes the quad's maximum (the quad's four threads share a row), kept in bound[r].
// The parts are sums, a + b, and the maximum of the sums is at least half the sum of the maxima,
// so the invariant is: the row's largest magnitude <= 2 bound[r]. While bound * inv stays in
// [2^-4, 2^14] the factor stays (1 in the common case: the packing then multiplies by nothing);
// outside it the factor moves so that bound * inv lands in [2^12, 2^13): with the factor 2 of the
// invariant the packed row stays below 2^15 (f16's largest finite value is 65504), and its largest
// elements so far above f16's smallest normal (2^-14) that every element within 2^-10 of them
// keeps f16's full 10-bit mantissa. A zero, inf or NaN bound leaves the factor alone (a zero row
// packs exactly with any factor; inf and NaN propagate as they would in f32). Factors stay in
// [2^-100, 2^100].
struct F16RowFactors {
  float inv[2] = {1.0f, 1.0f};
  float fwd[2] = {1.0f, 1.0f};
  float bound[2] = {0.0f, 0.0f};  // quad-uniform
};

__device__ __forceinline__ void update_f16_row_factors(float bound0, float bound1,
                                                       F16RowFactors& f) {
  const float bound[2] = {bound0, bound1};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float b = bound[r];
    b = fmaxf(b, __shfl_xor_sync(0xffffffffu, b, 1));
    b = fmaxf(b, __shfl_xor_sync(0xffffffffu, b, 2));
    f.bound[r] = b;
    const float scaled = b * f.inv[r];
    if (b > 0.0f && b < INFINITY && !(scaled >= 0.0625f && scaled <= 16384.0f)) {
      const int e = min(max(12 - ilogbf(b), -100), 100);  // 2^(12 - e) <= b < 2^(13 - e)
      f.inv[r] = ldexpf(1.0f, e);
      f.fwd[r] = ldexpf(1.0f, -e);
    }
  }
}

// This thread's parts of the row maxima of |s|, an accumulator block (S^T or v_new^T; rows g and
// g + 8).
template <int kNK>
__device__ __forceinline__ void row_abs_max(const float (&s)[kNK][4], float (&m)[2]) {
  m[0] = m[1] = 0.0f;
#pragma unroll
  for (int nt = 0; nt < kNK; ++nt) {
    m[0] = fmaxf(m[0], fmaxf(fabsf(s[nt][0]), fabsf(s[nt][1])));
    m[1] = fmaxf(m[1], fmaxf(fabsf(s[nt][2]), fabsf(s[nt][3])));
  }
}

// Multiplies this thread's rows g and g + 8 of S^T by r0 and r1 (powers of two: exact).
template <int kNK>
__device__ __forceinline__ void rescale_rows(float (&s)[kNK][4], float r0, float r1) {
#pragma unroll
  for (int nt = 0; nt < kNK; ++nt) {
    s[nt][0] *= r0;
    s[nt][1] *= r0;
    s[nt][2] *= r1;
    s[nt][3] *= r1;
  }
}

// An accumulator block (S^T, or v_new^T) as an f16 A operand (m64 k16: a0 = (c0, c1) of
// accumulator tile 2 kk, a1 = (c2, c3), a2 / a3 the same of tile 2 kk + 1, so the pack needs no
// permutation), the rows g and g + 8 times their factors inv; kScaled = false (every factor 1, the
// common case) multiplies by nothing. kSatFinite packs by pack_f16_satfinite (values past f16's
// range become +-65504, not inf).
template <bool kScaled, bool kSatFinite, int kNK>
__device__ __forceinline__ void pack_s_f16(const float (&s)[kNK][4], const float (&inv)[2],
                                           uint32_t (&a)[kNK / 2][4]) {
  const float f0 = kScaled ? inv[0] : 1.0f, f1 = kScaled ? inv[1] : 1.0f;
  const auto pack = [](float lo, float hi) {
    return kSatFinite ? pack_f16_satfinite(lo, hi) : pack_b16<__half>(lo, hi);
  };
#pragma unroll
  for (int kk = 0; kk < kNK / 2; ++kk) {
    a[kk][0] = pack(f0 * s[2 * kk][0], f0 * s[2 * kk][1]);
    a[kk][1] = pack(f1 * s[2 * kk][2], f1 * s[2 * kk][3]);
    a[kk][2] = pack(f0 * s[2 * kk + 1][0], f0 * s[2 * kk + 1][1]);
    a[kk][3] = pack(f1 * s[2 * kk + 1][2], f1 * s[2 * kk + 1][3]);
  }
}

// The rare repair of the f16 products that read v_new^T (scan_step) when its operand saturated:
// a row of inv v_new beyond 65504 went into them as +-65504 (pack_f16_satfinite). With the
// residual r = inv_old v_new - vh (vh: the packed operand), the held rows of S^T, already rescaled
// by ratio (the factors' move, which brings every row's inv v_new below 2^8:
// update_f16_row_factors), get ratio r kg, and (kOut) o2, which is in inv_old units, r A_qk^T,
// both by f32 FMAs: they then hold what the unsaturated products would (up to rounding).
// Warp-uniform and warp-local (no wgmma, which would need the whole warpgroup): the quad's
// residuals come by shuffles, kg [BT][K] and A_qk [BT][BT] f16 from their images
// (half_pair_image_offset). About 2 (K + BT) BT FMAs per thread: it runs only in a chunk where
// v_new jumps past the state's range.
template <bool kOut, int kBT, int kNK>
__device__ __forceinline__ void add_saturated_residual(
    float (&s)[kNK][4], float (&o2)[kBT / 8][4], const float (&vn)[kBT / 8][4],
    const uint32_t (&vh)[kBT / 16][4], const float (&inv_old)[2], const float (&ratio)[2],
    const unsigned char* kg, const unsigned char* aqk) {
  const int lane = threadIdx.x % 32, t = lane % 4;
  float r[kBT / 8][4];  // same fragment as vn: row g + 8 (e / 2), chunk row 8 nn + t + 4 (e % 2)
#pragma unroll
  for (int nn = 0; nn < kBT / 8; ++nn) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // the packed pair (e, e + 1) = (2 h, 2 h + 1)
      const uint32_t bits = vh[nn / 2][2 * (nn % 2) + h];
      const float2 packed = __half22float2(*reinterpret_cast<const __half2*>(&bits));
      r[nn][2 * h] = fmaf(inv_old[h], vn[nn][2 * h], -packed.x);
      r[nn][2 * h + 1] = fmaf(inv_old[h], vn[nn][2 * h + 1], -packed.y);
    }
  }
  const auto f16_at = [](const unsigned char* image, int row, int col) {
    return __half2float(
        *reinterpret_cast<const __half*>(image + half_pair_image_offset<kBT>(row, col)));
  };
#pragma unroll 1
  for (int j = 0; j < kBT; ++j) {  // held by the quad's thread j % 4 as r[j / 8][(j % 8) / 4]
    float rj[2] = {0.0f, 0.0f};    // selected by selp: a dynamic register index is local memory
#pragma unroll
    for (int nn = 0; nn < kBT / 8; ++nn) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const bool pick = nn == j / 8 && c == (j % 8) / 4;
        rj[0] = select_f32(pick, r[nn][c], rj[0]);
        rj[1] = select_f32(pick, r[nn][2 + c], rj[1]);
      }
    }
    const float r0 = __shfl_sync(0xffffffffu, rj[0], (lane & ~3) | (j % 4));
    const float r1 = __shfl_sync(0xffffffffu, rj[1], (lane & ~3) | (j % 4));
    const float s0 = ratio[0] * r0, s1 = ratio[1] * r1;
#pragma unroll
    for (int nt = 0; nt < kNK; ++nt) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {  // S^T column 8 nt + t + 4 e
        const float k = f16_at(kg, j, 8 * nt + t + 4 * e);
        s[nt][e] = fmaf(s0, k, s[nt][e]);
        s[nt][2 + e] = fmaf(s1, k, s[nt][2 + e]);
      }
    }
    if constexpr (kOut) {
#pragma unroll
      for (int nn = 0; nn < kBT / 8; ++nn) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {  // O^T column (chunk row) i = 8 nn + t + 4 c
          const float a = f16_at(aqk, 8 * nn + t + 4 * c, j);
          o2[nn][c] = fmaf(r0, a, o2[nn][c]);
          o2[nn][2 + c] = fmaf(r1, a, o2[nn][2 + c]);
        }
      }
    }
  }
}

// The row factors for S^T as it enters the scan (its rows' own maxima as the bound).
template <int kNK>
__device__ __forceinline__ void init_f16_row_factors(const float (&s)[kNK][4], F16RowFactors& f) {
  float m[2];
  row_abs_max(s, m);
  f = F16RowFactors{};
  update_f16_row_factors(m[0], m[1], f);
}

}  // namespace openkda::cuda::chunk_forward
