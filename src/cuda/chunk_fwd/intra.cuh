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
//   Products are mma.sync m16n8k8 tf32 (fp32 accumulation), kIntraSplit warps per
//   (rb, A_qk | A_kk), each taking every kIntraSplit-th column block; the
//   exp2 factors of their operands are exp2_operand (rounded to tf32 right after).
//   A_qk goes straight to the workspace, rounded to tf32 (only the scan's mma reads it; rows
//   i < nv only: the tile is token-indexed, rows past the chunk belong to the next chunk); A_kk
//   stays in shared memory in f32 (the inverse reads it).
//
// Inverse: the diagonal blocks by forward substitution in f32 (one warp per block, lane j owns
// column j in registers: X[i][j] = -(A[i][j] + sum_{j<m<i} A[i][m] X[m][j]), the CPU order), then
// block forward substitution over the block rows r = 1 .. NB - 1:
//   P_rc = sum_{m=c}^{r-1} A_rm Tinv_mc  (c < r),   Tinv_rc = -X_rr P_rc.
// Row i of Tinv depends on rows <= i of A_kk only.
//
// Grid mapping: one CTA (512 threads) per (chunk, value head).
// Shared memory: reads sQ, sK, sG, sBeta; writes sA [BT][kLdA]; the block inverse uses
// (NB - 1) * 256 floats of sScr for P.
#pragma once

#include <cstdint>

#include "cuda/chunk_fwd/mma.cuh"
#include "cuda/chunk_fwd/params.h"
#include "cuda/chunk_fwd/traits.h"
#include "cuda/common/math.cuh"

namespace openkda::cuda::chunk_forward {

// Diagonal blocks by exact per-pair exponents: sA (A_kk) and gAqk (A_qk) rows of every block,
// including the zeros above the diagonal. gAqk points at row 0 of the chunk's A_qk tile.
template <class Tr>
__device__ __forceinline__ void intra_exact_diag(const ChunkFwdParams& p, int nv, const float* sQ,
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
      if (i < nv) gAqk[int64_t{i} * Tr::kBT + j0 + lane] = tf32_round(my_qk);
    }
  }
}

// Anchored block products (see the header): kSplit warps per (rb, A_qk | A_kk); warp part p of
// them writes the 16 x 16 blocks cb == p (mod kSplit) of its row block, except the diagonal one
// when exact_diag (intra_exact_diag owns it). Every part builds the same A fragments; the split
// shortens the longest warp's chain (row block NB - 1 has NB column blocks).
template <class Tr>
__device__ __forceinline__ void intra_products(const ChunkFwdParams& p, int nv, const float* sQ,
                                               const float* sK, const float* sG, const float* sBeta,
                                               float* sA, float* gAqk) {
  constexpr int kNB = Tr::kNB;
  constexpr int kLd = Tr::kLdX;
  constexpr int kSplit = Tr::kIntraSplit;
  const int warp = threadIdx.x / 32;
  if (warp >= 2 * kNB * kSplit) return;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int job = warp % (2 * kNB), part = warp / (2 * kNB);
  if (part >= kNB) return;  // BT = 32: more parts than column blocks
  const int rb = job / 2;
  const bool is_kk = (job % 2) == 1;
  const float* sX = is_kk ? sK : sQ;
  const int cb_last = p.exact_diag ? rb - 1 : rb;  // last column block with a product
  const int r0 = kSubChunk * rb + g, r1 = r0 + 8;
  const float* sGa = sG + kSubChunk * rb * kLd;  // anchor row a = 16 rb

  float acc[kNB][2][4];
#pragma unroll
  for (int cb = 0; cb < kNB; ++cb)
#pragma unroll
    for (int nh = 0; nh < 2; ++nh)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[cb][nh][e] = 0.0f;

#pragma unroll 2
  for (int kk = 0; kk < Tr::kK / 8; ++kk) {
    const int c0 = 8 * kk + t, c1 = c0 + 4;
    const float ga0 = sGa[c0], ga1 = sGa[c1];
    uint32_t a[4];
    a[0] = to_tf32(sX[r0 * kLd + c0] * exp2_operand(sG[r0 * kLd + c0] - ga0));
    a[1] = to_tf32(sX[r1 * kLd + c0] * exp2_operand(sG[r1 * kLd + c0] - ga0));
    a[2] = to_tf32(sX[r0 * kLd + c1] * exp2_operand(sG[r0 * kLd + c1] - ga1));
    a[3] = to_tf32(sX[r1 * kLd + c1] * exp2_operand(sG[r1 * kLd + c1] - ga1));
#pragma unroll
    for (int cb = 0; cb < kNB; ++cb) {
      if (cb <= cb_last && cb % kSplit == part) {
#pragma unroll
        for (int nh = 0; nh < 2; ++nh) {
          const int j = kSubChunk * cb + 8 * nh + g;
          const uint32_t b0 = to_tf32(sK[j * kLd + c0] * exp2_operand(ga0 - sG[j * kLd + c0]));
          const uint32_t b1 = to_tf32(sK[j * kLd + c1] * exp2_operand(ga1 - sG[j * kLd + c1]));
          mma_tf32(acc[cb][nh], a, b0, b1);
        }
      }
    }
  }

  // Masks: A_qk keeps j <= i (times scale), A_kk keeps j < i (times beta_i); blocks without a
  // product (above the diagonal) are written as zeros.
  const float beta_r[2] = {sBeta[r0], sBeta[r1]};
#pragma unroll
  for (int cb = 0; cb < kNB; ++cb) {
    if (cb % kSplit != part || (p.exact_diag && cb == rb)) continue;
#pragma unroll
    for (int nh = 0; nh < 2; ++nh) {
      const int j = kSubChunk * cb + 8 * nh + 2 * t;  // columns j, j + 1
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int i = half ? r1 : r0;
        float v0 = 0.0f, v1 = 0.0f;
        if (cb <= cb_last) {
          const float x0 = acc[cb][nh][2 * half], x1 = acc[cb][nh][2 * half + 1];
          if (is_kk) {
            v0 = j < i ? beta_r[half] * x0 : 0.0f;
            v1 = j + 1 < i ? beta_r[half] * x1 : 0.0f;
          } else {
            v0 = j <= i ? p.scale * x0 : 0.0f;
            v1 = j + 1 <= i ? p.scale * x1 : 0.0f;
          }
        }
        if (is_kk) {
          *reinterpret_cast<float2*>(sA + i * Tr::kLdA + j) = make_float2(v0, v1);
        } else if (i < nv) {  // A_qk: only ever an mma operand (scan), stored tf32-rounded
          *reinterpret_cast<float2*>(gAqk + int64_t{i} * Tr::kBT + j) =
              make_float2(tf32_round(v0), tf32_round(v1));
        }
      }
    }
  }
}

// X_bb = (I + A_bb)^-1 of every diagonal block, in place. Warp b < NB, lanes 0..15.
template <class Tr>
__device__ __forceinline__ void invert_diag_blocks(float* sA) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (warp >= Tr::kNB || lane >= kSubChunk) return;
  float* blk = sA + kSubChunk * warp * (Tr::kLdA + 1);
  const int j = lane;
  float x[kSubChunk];  // column j of X
#pragma unroll
  for (int i = 0; i < kSubChunk; ++i) {
    const float* Ai = blk + i * Tr::kLdA;
    float acc = Ai[j];
#pragma unroll
    for (int m = 0; m < i; ++m) {
      if (m > j) acc += Ai[m] * x[m];
    }
    x[i] = i > j ? -acc : (i == j ? 1.0f : 0.0f);
  }
  __syncwarp(0x0000ffffu);  // every lane has read its block before any lane overwrites it
#pragma unroll
  for (int i = 0; i < kSubChunk; ++i) blk[i * Tr::kLdA + j] = x[i];
}

// Off-diagonal blocks of Tinv by block forward substitution (see the header). Expects the
// inverted diagonal blocks to be visible (a barrier after invert_diag_blocks); ends with a barrier.
template <class Tr>
__device__ __forceinline__ void invert_offdiag_blocks(float* sA, float* sP) {
  constexpr int kBlk = kSubChunk * kSubChunk;
  constexpr int kLd = Tr::kLdA;
#pragma unroll 1
  for (int r = 1; r < Tr::kNB; ++r) {
    for (int idx = threadIdx.x; idx < r * kBlk; idx += Tr::kThreads) {
      const int c = idx / kBlk, i = (idx / kSubChunk) % kSubChunk, j = idx % kSubChunk;
      const float* a_row = sA + (kSubChunk * r + i) * kLd;
      float acc = 0.0f;
      for (int m = c; m < r; ++m) {
        const float* t_col = sA + (kSubChunk * m) * kLd + kSubChunk * c + j;
#pragma unroll
        for (int l = 0; l < kSubChunk; ++l) {
          acc += a_row[kSubChunk * m + l] * t_col[l * kLd];
        }
      }
      sP[idx] = acc;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < r * kBlk; idx += Tr::kThreads) {
      const int c = idx / kBlk, i = (idx / kSubChunk) % kSubChunk, j = idx % kSubChunk;
      const float* x_row = sA + (kSubChunk * r + i) * kLd + kSubChunk * r;
      const float* p_col = sP + c * kBlk + j;
      float acc = 0.0f;
#pragma unroll
      for (int l = 0; l < kSubChunk; ++l) acc += x_row[l] * p_col[l * kSubChunk];
      sA[(kSubChunk * r + i) * kLd + kSubChunk * c + j] = -acc;
    }
    __syncthreads();
  }
}

}  // namespace openkda::cuda::chunk_forward
