// Stage 3 of the chunk_kda forward (prep kernel): the gated keys and the WY representation.
// CPU twin: cpu/chunk_fwd.cpp fwd_wy.
//
// What it computes, for rows i < nv of one chunk; every tile goes to the workspace whole, as the
// scan's shared-memory image (tile_image.h), rows (columns of kg^T) past the chunk from the
// zero rows of q, k, beta there:
// w, qg and kg (and the w / u operands in sQ, sK) are stored as tf32 operands (tf32_operand,
// mma.cuh): only tensor cores read them.
//   qg_i  = scale * q_i * exp2(G_i)              -> workspace qg   (scale folded in here)
//   kg_i  = k_i * exp2(G_last - G_i)             -> workspace kg^T (G_last: row nv - 1; stored
//                                                   transposed per chunk slot, params.h)
//   gamma = exp2(G_last)                          -> workspace gamma (one row per chunk)
//   w     = Tinv (beta k exp2(G))                 -> workspace w
//   u     = Tinv (beta v)                         -> workspace u
// Every exponent is <= 0 when g <= 0, so every factor is in [0, 1].
//
// Grid mapping: one CTA (Tr::kThreads) per (chunk, value head). Elementwise passes: thread owns
// 4 consecutive columns of a row (float4), except the kg^T pass (write_gated_keys). Products:
// mma.sync m16n8k8 tf32 with Tinv (sA) as A in paired k order and [BT, N] operands (sQ, sK) as B;
// warp (mt, ng) owns rows 16 mt .. 16 mt + 15 and N / 8 / (kWarps / NB) column tiles; k blocks with
// j > 16 mt + 15 are skipped (Tinv is lower triangular there, exact zeros).
// Shared memory: reads sQ, sK, sG, sBeta, sA; sQ becomes beta k exp2(G), sK becomes beta v.
#pragma once

#include <cstdint>

#include "cuda/chunk_fwd/chunk_index.cuh"
#include "cuda/chunk_fwd/gate_cumsum.cuh"
#include "cuda/chunk_fwd/mma.cuh"
#include "cuda/chunk_fwd/params.h"
#include "cuda/chunk_fwd/tile_image.h"
#include "cuda/chunk_fwd/traits.h"
#include "cuda/common/vec.cuh"

namespace openkda::cuda::chunk_forward {

// qg, kg^T and gamma to the workspace, by `threads` threads (`tid` in [0, threads); threads is a
// multiple of 32): the warps the intra products leave free, while those still read sQ, sK and sG
// (read-only here). `tile`: the index of the chunk's workspace tiles (hv * slots + slot). Each
// thread keeps its columns and steps over rows, in unsigned arithmetic: no per-element division
// or sign fix-up (the index math was most of these loops' instructions).
//   qg: thread (rows i0 + step r, 4 columns d): float4 row reads, one 16-byte chunk of the image
//     per store.
//   kg^T: the scan's wgmma B operand of the state update (K-major, so transposed here). Thread
//     (half, d, 4 columns j .. j + 3, j % 4 = 0), a warp 16 consecutive d times both halves of an
//     8-column group: each store instruction writes one 32-byte sector of 16 image rows (the two
//     halves stay adjacent under the swizzle), and the column reads of sK and sG hit 32 distinct
//     banks (rows 4 apart, kLdX = 4 mod 32).
template <class Tr>
__device__ __forceinline__ void write_gated_keys(const ChunkFwdParams& p, const ChunkCoord& cc,
                                                 int64_t tile, const float* sQ, const float* sK,
                                                 const float* sG, int tid, int threads) {
  constexpr unsigned kC4 = Tr::kK / 4;  // 16-byte chunks per row (16 or 32: divides a warp)
  constexpr unsigned kLd = Tr::kLdX;
  static_assert(32 % kC4 == 0 && Tr::kBT == 32, "whole rows per warp; kg^T: one 32-row region");
  const unsigned utid = static_cast<unsigned>(tid), uthreads = static_cast<unsigned>(threads);
  const float* sGlast = sG + (cc.nv - 1) * kLd;
  char* gQg = reinterpret_cast<char*>(p.qg + tile * Tr::kBT * Tr::kK);
  {
    const unsigned c16 = utid % kC4, d = 4 * c16, step = uthreads / kC4;
    for (unsigned i = utid / kC4; i < Tr::kBT; i += step) {
      const float4 q4 = *reinterpret_cast<const float4*>(sQ + i * kLd + d);
      const float4 g4 = *reinterpret_cast<const float4*>(sG + i * kLd + d);
      // Every factor below ends in a tf32 operand: exp2_operand (math.cuh).
      *reinterpret_cast<float4*>(gQg + pair_image_offset<Tr::kBT>(i, d)) =
          make_float4(tf32_operand(p.scale * q4.x * exp2_operand(g4.x)),
                      tf32_operand(p.scale * q4.y * exp2_operand(g4.y)),
                      tf32_operand(p.scale * q4.z * exp2_operand(g4.z)),
                      tf32_operand(p.scale * q4.w * exp2_operand(g4.w)));
    }
  }
  char* gKgT = reinterpret_cast<char*>(p.kgT + tile * Tr::kK * Tr::kBT);
  {
    // f = d + K * (j / 8) over the K * BT / 8 (d, 8-column group) pairs; step = threads / 2, a
    // multiple of 16, so a warp's 16 d never straddle a group.
    const unsigned half = utid % 2, step = uthreads / 2;
    for (unsigned f = utid / 2; f < Tr::kK * (Tr::kBT / 8); f += step) {
      const unsigned d = f % Tr::kK, j = 8 * (f / Tr::kK) + 4 * half;
      const float gl = sGlast[d];
      float y[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const unsigned at = (j + e) * kLd + d;
        y[e] = tf32_operand(sK[at] * exp2_operand(gl - sG[at]));
      }
      *reinterpret_cast<float4*>(gKgT + pair_image_offset<Tr::kK>(d, j)) =
          make_float4(y[0], y[1], y[2], y[3]);
    }
  }
  float* gGamma = p.gamma + tile * Tr::kK;
  for (int d = tid; d < Tr::kK; d += threads) gGamma[d] = exp2f(sGlast[d]);
}

// sQ <- beta k exp2(G) in place (the w operand; rows past the chunk: beta = 0), once the intra
// products and write_gated_keys have read q for the last time. Thread: 4 fixed columns, rows
// i0, i0 + kThreads / (K / 4), ...
template <class Tr>
__device__ __forceinline__ void gate_w_operand(float* sQ, const float* sK, const float* sG,
                                               const float* sBeta) {
  constexpr unsigned kC4 = Tr::kK / 4;
  constexpr unsigned kLd = Tr::kLdX;
  static_assert(Tr::kThreads % kC4 == 0, "fixed columns per thread");
  const unsigned d = 4 * (threadIdx.x % kC4);
  for (unsigned i = threadIdx.x / kC4; i < Tr::kBT; i += Tr::kThreads / kC4) {
    const float4 k4 = *reinterpret_cast<const float4*>(sK + i * kLd + d);
    const float4 g4 = *reinterpret_cast<const float4*>(sG + i * kLd + d);
    const float b = sBeta[i];
    *reinterpret_cast<float4*>(sQ + i * kLd + d) = make_float4(
        tf32_operand(b * k4.x * exp2_operand(g4.x)), tf32_operand(b * k4.y * exp2_operand(g4.y)),
        tf32_operand(b * k4.z * exp2_operand(g4.z)), tf32_operand(b * k4.w * exp2_operand(g4.w)));
  }
}

// sK <- beta_i v_i (rows past the chunk: 0). Thread owns 4 consecutive columns of rows
// idx / (V / 4), idx = tid + kThreads r; all its loads are issued as one batch (load_runs; the
// rows were prefetched to L2 at the start of the kernel). Rows past the chunk load row 0 and are
// zeroed.
template <class Tr>
__device__ __forceinline__ void load_beta_v(const ChunkFwdParams& p, const ChunkCoord& cc, int hv,
                                            float* sK, const float* sBeta) {
  constexpr int kC4 = Tr::kV / 4;
  constexpr int kIters = Tr::kBT * kC4 / Tr::kThreads;
  static_assert(Tr::kBT * kC4 % Tr::kThreads == 0, "whole float4 runs per thread");
  int64_t off[kIters];
#pragma unroll
  for (int r = 0; r < kIters; ++r) {
    const int idx = static_cast<int>(threadIdx.x) + Tr::kThreads * r;
    const int i = idx / kC4, e = 4 * (idx % kC4);
    off[r] = ((cc.t0 + (i < cc.nv ? i : 0)) * p.HV + hv) * Tr::kV + e;
  }
  float x[kIters][4];
  load_runs<kIters, 4>(p.v, p.v_dtype, off, x);
#pragma unroll
  for (int r = 0; r < kIters; ++r) {
    const int idx = static_cast<int>(threadIdx.x) + Tr::kThreads * r;
    const int i = idx / kC4, e = 4 * (idx % kC4);
    const float b = i < cc.nv ? sBeta[i] : 0.0f;
    float y[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) y[m] = i < cc.nv ? tf32_operand(x[r][m] * b) : 0.0f;
    *reinterpret_cast<float4*>(sK + i * Tr::kLdX + e) = make_float4(y[0], y[1], y[2], y[3]);
  }
}

// w = Tinv sQ and u = Tinv sK, in one pass over the Tinv fragments (each A fragment is read and
// converted once for both products), to the chunk's w and u images gW, gU (every row: those past
// the chunk are 0, beta is 0 there). sQ, sK hold tf32 operands (gate_w_operand, load_beta_v). w
// is only ever an mma operand (the scan), so it is stored as a tf32 operand too; u is not (the
// scan subtracts it in f32).
template <class Tr>
__device__ __forceinline__ void wy_products(const float* sA, const float* sQ, const float* sK,
                                            float* gW, float* gU) {
  constexpr int kMT = Tr::kBT / kSubChunk;     // 16-row tiles
  constexpr int kNG = Tr::kWarps / kMT;        // column groups
  constexpr int kTilesW = (Tr::kK / 8) / kNG;  // 8-column tiles per warp
  constexpr int kTilesU = (Tr::kV / 8) / kNG;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int mt = warp % kMT, ng = warp / kMT;
  const int r0 = kSubChunk * mt + g, r1 = r0 + 8;

  float acc_w[kTilesW][4], acc_u[kTilesU][4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
#pragma unroll
    for (int q = 0; q < kTilesW; ++q) acc_w[q][e] = 0.0f;
#pragma unroll
    for (int q = 0; q < kTilesU; ++q) acc_u[q][e] = 0.0f;
  }

#pragma unroll
  for (int kk = 0; kk < 2 * kMT; ++kk) {
    if (kk < 2 * (mt + 1)) {  // columns j < 16 (mt + 1); Tinv is 0 beyond
      uint32_t a[4];
      a_from_pairs(*reinterpret_cast<const float2*>(sA + r0 * Tr::kLdA + 8 * kk + 2 * t),
                   *reinterpret_cast<const float2*>(sA + r1 * Tr::kLdA + 8 * kk + 2 * t), a);
      const int j = (8 * kk + 2 * t) * Tr::kLdX;  // B rows 8 kk + 2t and 8 kk + 2t + 1
#pragma unroll
      for (int q = 0; q < kTilesW; ++q) {
        const int n = 8 * (ng * kTilesW + q) + g;
        mma_tf32(acc_w[q], a, tf32_bits(sQ[j + n]), tf32_bits(sQ[j + Tr::kLdX + n]));
      }
#pragma unroll
      for (int q = 0; q < kTilesU; ++q) {
        const int n = 8 * (ng * kTilesU + q) + g;
        mma_tf32(acc_u[q], a, tf32_bits(sK[j + n]), tf32_bits(sK[j + Tr::kLdX + n]));
      }
    }
  }
  char* gWimg = reinterpret_cast<char*>(gW);
#pragma unroll
  for (int q = 0; q < kTilesW; ++q) {  // columns (col, col + 1) share a 16-byte chunk: col % 4 < 3
    const int col = 8 * (ng * kTilesW + q) + 2 * t;
    store_f32x2(reinterpret_cast<float*>(gWimg + pair_image_offset<Tr::kBT>(r0, col)),
                tf32_operand(acc_w[q][0]), tf32_operand(acc_w[q][1]));
    store_f32x2(reinterpret_cast<float*>(gWimg + pair_image_offset<Tr::kBT>(r1, col)),
                tf32_operand(acc_w[q][2]), tf32_operand(acc_w[q][3]));
  }
#pragma unroll
  for (int q = 0; q < kTilesU; ++q) {  // the XOR of u_image_index keeps (col, col + 1) adjacent
    const int col = 8 * (ng * kTilesU + q) + 2 * t;
    store_f32x2(gU + u_image_index<Tr::kBT>(r0, col), acc_u[q][0], acc_u[q][1]);
    store_f32x2(gU + u_image_index<Tr::kBT>(r1, col), acc_u[q][2], acc_u[q][3]);
  }
}

}  // namespace openkda::cuda::chunk_forward
