// Stage 2 of the chunk_kda forward (prep kernel): the intra-chunk matrices and the inverse.
// CPU twins: cpu/chunk_fwd.cpp fwd_intra and fwd_inverse.
//
// What it computes, for one chunk (rows i, j < BT; G from stage 1, all exponents <= 0 when g <= 0):
//   A_qk[i, j] = scale * sum_d q_i[d] k_j[d] exp2(G_i[d] - G_j[d])        j <= i, else 0
//   A_kk[i, j] = beta_i * sum_d k_i[d] k_j[d] exp2(G_i[d] - G_j[d])       j <  i, else 0
//   Tinv       = (I + A_kk)^-1   (unit lower triangular), in place of A_kk
//
// The BT x BT matrices are built from 16 x 16 blocks (row block rb, column block cb):
//   * cb < rb (off-diagonal), anchored at a = 16 rb, the first row of the row block:
//       (x_i * exp2(G_i - G_a)) . (k_j * exp2(G_a - G_j)),  x = q (A_qk) or k (A_kk);
//     both factors are <= 1 since j < a <= i, so nothing can overflow (spec 10.1).
//   * cb == rb (diagonal):
//       exact_diag (any gate): one warp per row i, every pair (i, j) with its own exponent
//         G_i - G_j <= 0, summed over d by the lanes (fixed butterfly order);
//       otherwise (in-kernel lower-bound gate, L >= -5): the same anchored product; now
//         G_a - G_j >= 0 but at most 15 * 5 / ln 2 < 109, so the factor stays below 2^109.
//     The anchor is the block's first row (never a midpoint), so row i only ever sees rows <= i:
//     later tokens cannot change earlier outputs, not even by rounding.
//   Products are mma.sync m16n8k8 tf32 (fp32 accumulation), one warp per block pair (rb, cb)
//   computing both matrices' blocks (shared anchor factors and B operand); the exp2 factors of
//   their operands are exp2_operand (rounded to tf32 right after).
//   A_qk goes straight to the workspace as tf32 operands (f16 with f16 keys: store_aqk), as the
//   scan's shared-memory image of the tile (tile_image.h; every row, those past the chunk from
//   q = 0); A_kk stays in shared memory in f32 (the inverse reads it).
//
// Inverse, by one warp (invert_chunk_warp): the diagonal blocks by forward substitution in f32
// (lane j of a half warp owns column j in registers: X[i][j] = -(A[i][j] + sum_{j<m<i} A[i][m]
// X[m][j]), the CPU order), then block forward substitution over the block rows r = 1 .. NB - 1:
//   P_rc = sum_{m=c}^{r-1} A_rm Tinv_mc  (c < r),   Tinv_rc = -X_rr P_rc.
// Row i of Tinv depends on rows <= i of A_kk only.
//
// Grid mapping: one CTA (Tr::kThreads) per (chunk, value head).
// Shared memory: reads sQ, sK, sG, sBeta; writes sA [BT][kLdA]; the block inverse uses
// (NB - 1) * 256 floats of sScr for P.
#pragma once

#include <cstdint>

#include "cuda/chunk_fwd/mma.cuh"
#include "cuda/chunk_fwd/params.h"
#include "cuda/chunk_fwd/tile_image.h"
#include "cuda/chunk_fwd/traits.h"
#include "cuda/common/math.cuh"

namespace openkda::cuda::chunk_forward {

// Element (i, j) of the chunk's A_qk image at gAqk, stored as the scan's operand: a tf32 operand
// (pair_image_offset), or with f16 keys an f16 value (half_pair_image_offset: the f16 B operand of
// O^T += v_new^T A_qk^T, whose A is the state update's f16 v_new^T; |A_qk| <= |scale| <= 2^14
// under f16_keys_apply). The f16 tile keeps the f32 tile's 128-byte rows: BT columns fill half of
// each (the descriptors' 128-byte swizzle), and the scan reads only those.
template <class Tr>
__device__ __forceinline__ void store_aqk(const ChunkFwdParams& p, float* gAqk, unsigned i,
                                          unsigned j, float a) {
  char* base = reinterpret_cast<char*>(gAqk);
  if (prep_f16_keys<Tr>(p)) {
    *reinterpret_cast<__half*>(base + half_pair_image_offset<Tr::kBT>(i, j)) = __float2half_rn(a);
  } else {
    *reinterpret_cast<float*>(base + pair_image_offset<Tr::kBT>(i, j)) = tf32_operand(a);
  }
}

// Elements (i, j) and (i, j + 1) of an mma accumulator pair, called by whole warps with
// j = 8 m + 2 (lane % 4) (the pairs of one row i in a quad cover 8 columns): one 8-byte store in
// the tf32 image; in the f16 one, whose pair order puts the two columns two slots apart, lanes t
// and t ^ 2 swap one value so that each stores one physically adjacent pair, 4 bytes
// (tile_image.h: f16_pair_first / f16_pair_second).
template <class Tr>
__device__ __forceinline__ void store_aqk_pair(const ChunkFwdParams& p, float* gAqk, unsigned i,
                                               unsigned j, float a0, float a1) {
  char* base = reinterpret_cast<char*>(gAqk);
  if (prep_f16_keys<Tr>(p)) {
    const bool lo = (j % 8) < 4;
    const float other = __shfl_xor_sync(0xffffffffu, lo ? a1 : a0, 2);
    *reinterpret_cast<uint32_t*>(base + half_pair_image_offset<Tr::kBT>(i, f16_pair_first(j))) =
        lo ? pack_b16<__half>(a0, other) : pack_b16<__half>(other, a1);
  } else {
    *reinterpret_cast<float2*>(base + pair_image_offset<Tr::kBT>(i, j)) =
        make_float2(tf32_operand(a0), tf32_operand(a1));
  }
}

// Diagonal blocks by exact per-pair exponents: sA (A_kk) and gAqk (A_qk) rows of every block,
// including the zeros above the diagonal. gAqk points at the chunk's A_qk image.
template <class Tr>
__device__ __forceinline__ void intra_exact_diag(const ChunkFwdParams& p, const float* sQ,
                                                 const float* sK, const float* sG,
                                                 const float* sBeta, float* sA, float* gAqk) {
  constexpr int kPer = Tr::kK / 32;
  constexpr int kLd = Tr::kLdX;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int i = warp; i < Tr::kBT; i += Tr::kWarps) {
    float qi[kPer], ki[kPer], gi[kPer];
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int d = lane + 32 * e;
      qi[e] = sQ[i * kLd + d];
      ki[e] = sK[i * kLd + d];
      gi[e] = sG[i * kLd + d];
    }
    const int j0 = i & ~(kSubChunk - 1);
    float my_qk = 0.0f, my_kk = 0.0f;  // column j0 + lane of row i (lanes < 16)
    for (int jj = 0; jj <= i - j0; ++jj) {
      const int j = j0 + jj;
      float sq = 0.0f, sk = 0.0f;
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        const int d = lane + 32 * e;
        const float kj = sK[j * kLd + d];
        const float ex = exp2f(gi[e] - sG[j * kLd + d]);  // G_i - G_j <= 0
        sq += qi[e] * kj * ex;
        sk += ki[e] * kj * ex;
      }
      sq = warp_allreduce_sum(sq);
      sk = warp_allreduce_sum(sk);
      if (lane == jj) {
        my_qk = p.scale * sq;
        my_kk = j < i ? sBeta[i] * sk : 0.0f;
      }
    }
    if (lane < kSubChunk) {
      sA[i * Tr::kLdA + j0 + lane] = my_kk;
      store_aqk<Tr>(p, gAqk, i, j0 + lane, my_qk);
    }
  }
}

// Warps with a block pair in intra_products: NB (NB - 1) / 2 off-diagonal pairs, plus the NB
// diagonal ones unless exact_diag.
template <class Tr>
__device__ __forceinline__ int intra_pairs(const ChunkFwdParams& p) {
  return Tr::kNB * (Tr::kNB - 1) / 2 + (prep_exact_diag<Tr>(p) ? 0 : Tr::kNB);
}

// The zeros above the diagonal blocks (sA, and gAqk: the scan reads the whole tile), by `threads`
// threads (`tid` in [0, threads)): 16-byte chunks, 4 columns j of sA and of a tf32 image, 8 of an
// f16 one (the chunks of store_aqk's layouts hold whole groups of 4 or 8 columns).
template <class Tr>
__device__ __forceinline__ void intra_zero_upper(const ChunkFwdParams& p, float* sA, float* gAqk,
                                                 int tid, int threads) {
  constexpr unsigned kRowF4 = Tr::kBT / 4;  // float4 columns per row
  const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  char* image = reinterpret_cast<char*>(gAqk);
  for (unsigned idx = tid; idx < Tr::kBT * kRowF4; idx += threads) {
    const unsigned i = idx / kRowF4, j = 4 * (idx % kRowF4);
    if (j < kSubChunk * (i / kSubChunk + 1)) continue;  // on or below the diagonal block
    *reinterpret_cast<float4*>(sA + i * Tr::kLdA + j) = zero;
    if (prep_f16_keys<Tr>(p)) {
      if (j % 8 == 0)
        *reinterpret_cast<float4*>(image + half_pair_image_offset<Tr::kBT>(i, j)) = zero;
    } else {
      *reinterpret_cast<float4*>(image + pair_image_offset<Tr::kBT>(i, j)) = zero;
    }
  }
}

// Anchored block products (see the header). One warp per block pair (rb, cb), cb <= rb (cb < rb
// when exact_diag: intra_exact_diag owns the diagonal), computing both the A_qk and the A_kk block:
// they share the anchor, the exp2 factors exp2(G_i - G_a) of the A operands (q_i and k_i of the
// same row) and the whole B operand k_j exp2(G_a - G_j). Warps w < intra_pairs only; pairs in
// row-major order: warp w -> the w-th pair of rows rb = 0, 1, ... (rb + 1 pairs per row, rb with
// exact_diag). The kernel gives the other warps intra_zero_upper and write_gated_keys meanwhile.
template <class Tr>
__device__ __forceinline__ void intra_products(const ChunkFwdParams& p, const float* sQ,
                                               const float* sK, const float* sG, const float* sBeta,
                                               float* sA, float* gAqk) {
  constexpr int kLd = Tr::kLdX;
  const int warp = threadIdx.x / 32;
  const int diag = prep_exact_diag<Tr>(p) ? 0 : 1;  // 1: the diagonal block is a pair too
  int rb = 0, cb = warp;
  while (cb >= rb + diag) {
    cb -= rb + diag;
    ++rb;
  }
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = kSubChunk * rb + g, r1 = r0 + 8;
  const int j0 = kSubChunk * cb + g, j1 = j0 + 8;  // B rows of the two 8-column halves
  const float* sGa = sG + kSubChunk * rb * kLd;    // anchor row a = 16 rb

  float aqk[2][4], akk[2][4];
#pragma unroll
  for (int nh = 0; nh < 2; ++nh)
#pragma unroll
    for (int e = 0; e < 4; ++e) aqk[nh][e] = akk[nh][e] = 0.0f;

  // The mma's k index t takes column c and t + 4 column c + 1 (a product that sums over the
  // columns is the same under any one-to-one map of them to k slots, up to the order of the
  // tensor core's additions): each operand pair is one 8-byte load, and the quad's offsets
  // 2 (t % 2) + 16 (t / 2) keep the 16 lanes of each half-warp on 32 distinct banks (rows g,
  // kLdX = 4 mod 32: banks 4 g + {0 .. 3, 16 .. 19} + 4 (kk % 4)). Before, two 4-byte loads.
  const auto ld2 = [](const float* at) { return *reinterpret_cast<const float2*>(at); };
#pragma unroll 4
  for (int kk = 0; kk < Tr::kK / 8; ++kk) {
    const int c = 32 * (kk / 4) + 4 * (kk % 4) + 2 * (t % 2) + 16 * (t / 2);
    const float2 ga = ld2(sGa + c);
    const float2 q0 = ld2(sQ + r0 * kLd + c), q1 = ld2(sQ + r1 * kLd + c);
    const float2 k0 = ld2(sK + r0 * kLd + c), k1 = ld2(sK + r1 * kLd + c);
    const float2 g0 = ld2(sG + r0 * kLd + c), g1 = ld2(sG + r1 * kLd + c);
    // A operands in mma order (r0, c), (r1, c), (r0, c + 1), (r1, c + 1); one factor for q and k.
    const float f[4] = {exp2_operand(g0.x - ga.x), exp2_operand(g1.x - ga.x),
                        exp2_operand(g0.y - ga.y), exp2_operand(g1.y - ga.y)};
    const uint32_t aq[4] = {to_tf32(q0.x * f[0]), to_tf32(q1.x * f[1]), to_tf32(q0.y * f[2]),
                            to_tf32(q1.y * f[3])};
    const uint32_t ak[4] = {to_tf32(k0.x * f[0]), to_tf32(k1.x * f[1]), to_tf32(k0.y * f[2]),
                            to_tf32(k1.y * f[3])};
#pragma unroll
    for (int nh = 0; nh < 2; ++nh) {
      const int j = nh ? j1 : j0;
      const float2 kj = ld2(sK + j * kLd + c), gj = ld2(sG + j * kLd + c);
      const uint32_t b0 = to_tf32(kj.x * exp2_operand(ga.x - gj.x));
      const uint32_t b1 = to_tf32(kj.y * exp2_operand(ga.y - gj.y));
      mma_tf32(aqk[nh], aq, b0, b1);
      mma_tf32(akk[nh], ak, b0, b1);
    }
  }

  // Masks: A_qk keeps j <= i (times scale), A_kk keeps j < i (times beta_i).
  const float beta_r[2] = {sBeta[r0], sBeta[r1]};
#pragma unroll
  for (int nh = 0; nh < 2; ++nh) {
    const int j = kSubChunk * cb + 8 * nh + 2 * t;  // columns j, j + 1
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = half ? r1 : r0;
      const float q0 = aqk[nh][2 * half], q1 = aqk[nh][2 * half + 1];
      const float k0 = akk[nh][2 * half], k1 = akk[nh][2 * half + 1];
      *reinterpret_cast<float2*>(sA + i * Tr::kLdA + j) =
          make_float2(j < i ? beta_r[half] * k0 : 0.0f, j + 1 < i ? beta_r[half] * k1 : 0.0f);
      // A_qk: only ever an mma operand (scan), stored as its operand (store_aqk).
      store_aqk_pair<Tr>(p, gAqk, i, j, j <= i ? p.scale * q0 : 0.0f,
                         j + 1 <= i ? p.scale * q1 : 0.0f);
    }
  }
}

// Barrier `id` (1 .. 15; 0 is __syncthreads) over the first `threads` threads of the CTA (a
// multiple of 32): orders their shared-memory accesses as __syncthreads does for the whole CTA.
__device__ __forceinline__ void named_barrier_sync(unsigned id, unsigned threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Tinv = (I + A_kk)^-1 in place of A_kk (sA), by one warp (the kernel's warp 0, once every A_kk
// block is in sA), in the order of the CPU twin:
//   * the diagonal blocks X_bb = (I + A_bb)^-1 by forward substitution: lane l owns column
//     j = l % 16 of block b = l / 16 in registers, X[i][j] = -(A[i][j] + sum_{j<m<i} A[i][m]
//     X[m][j]);
//   * then block forward substitution over the block rows r = 1 .. NB - 1:
//     P_rc = sum_{m=c}^{r-1} A_rm Tinv_mc (c < r, into sP), Tinv_rc = -X_rr P_rc; each lane owns
//     4 consecutive columns j of one row i of one block (r, c) per step (float4 reads of the right
//     operand, the left operand's row 4 values at a time); every element sums in the order m, l
//     (f32 fma).
// One warp keeps the inverse off the block barriers: the other warps write the gated keys
// meanwhile (kernels.cuh).
template <class Tr>
__device__ __forceinline__ void invert_chunk_warp(float* sA, float* sP) {
  static_assert(Tr::kNB * kSubChunk == 32, "one lane per column of every diagonal block");
  constexpr int kBlk = kSubChunk * kSubChunk;
  constexpr int kLd = Tr::kLdA;
  constexpr int kQuads = kSubChunk / 4;  // float4 columns per block row
  const int lane = threadIdx.x % 32;
  {
    float* blk = sA + kSubChunk * (lane / kSubChunk) * (kLd + 1);
    const int j = lane % kSubChunk;
    float x[kSubChunk];  // column j of X
#pragma unroll
    for (int i = 0; i < kSubChunk; ++i) {
      const float* Ai = blk + i * kLd;
      float acc = Ai[j];
#pragma unroll
      for (int m = 0; m < i; ++m) {
        if (m > j) acc += Ai[m] * x[m];
      }
      x[i] = i > j ? -acc : (i == j ? 1.0f : 0.0f);
    }
    __syncwarp();  // every lane has read its block before any lane overwrites it
#pragma unroll
    for (int i = 0; i < kSubChunk; ++i) blk[i * kLd + j] = x[i];
  }
  __syncwarp();
  const auto fma4 = [](float4& acc, float a, const float4& b) {
    acc.x += a * b.x;
    acc.y += a * b.y;
    acc.z += a * b.z;
    acc.w += a * b.w;
  };
#pragma unroll 1
  for (int r = 1; r < Tr::kNB; ++r) {
    // P_rc = sum_{m=c}^{r-1} A_rm Tinv_mc.
    for (int idx = lane; idx < r * kSubChunk * kQuads; idx += 32) {
      const int c = idx / (kSubChunk * kQuads), i = (idx / kQuads) % kSubChunk,
                j = 4 * (idx % kQuads);
      const float* a_row = sA + (kSubChunk * r + i) * kLd;
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int m = c; m < r; ++m) {
        const float* t = sA + (kSubChunk * m) * kLd + kSubChunk * c + j;
#pragma unroll
        for (int l4 = 0; l4 < kSubChunk; l4 += 4) {
          const float4 a = *reinterpret_cast<const float4*>(a_row + kSubChunk * m + l4);
          fma4(acc, a.x, *reinterpret_cast<const float4*>(t + (l4 + 0) * kLd));
          fma4(acc, a.y, *reinterpret_cast<const float4*>(t + (l4 + 1) * kLd));
          fma4(acc, a.z, *reinterpret_cast<const float4*>(t + (l4 + 2) * kLd));
          fma4(acc, a.w, *reinterpret_cast<const float4*>(t + (l4 + 3) * kLd));
        }
      }
      *reinterpret_cast<float4*>(sP + c * kBlk + i * kSubChunk + j) = acc;
    }
    __syncwarp();
    // Tinv_rc = -X_rr P_rc.
    for (int idx = lane; idx < r * kSubChunk * kQuads; idx += 32) {
      const int c = idx / (kSubChunk * kQuads), i = (idx / kQuads) % kSubChunk,
                j = 4 * (idx % kQuads);
      const float* x_row = sA + (kSubChunk * r + i) * kLd + kSubChunk * r;
      const float* p_blk = sP + c * kBlk + j;
      float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int l4 = 0; l4 < kSubChunk; l4 += 4) {
        const float4 x = *reinterpret_cast<const float4*>(x_row + l4);
        fma4(acc, x.x, *reinterpret_cast<const float4*>(p_blk + (l4 + 0) * kSubChunk));
        fma4(acc, x.y, *reinterpret_cast<const float4*>(p_blk + (l4 + 1) * kSubChunk));
        fma4(acc, x.z, *reinterpret_cast<const float4*>(p_blk + (l4 + 2) * kSubChunk));
        fma4(acc, x.w, *reinterpret_cast<const float4*>(p_blk + (l4 + 3) * kSubChunk));
      }
      *reinterpret_cast<float4*>(sA + (kSubChunk * r + i) * kLd + kSubChunk * c + j) =
          make_float4(-acc.x, -acc.y, -acc.z, -acc.w);
    }
    __syncwarp();
  }
}

}  // namespace openkda::cuda::chunk_forward
