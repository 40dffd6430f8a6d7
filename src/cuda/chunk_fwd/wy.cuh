// Stage 3 of the chunk_kda forward (prep kernel): the gated keys and the WY representation.
// CPU twin: cpu/chunk_fwd.cpp fwd_wy.
//
// What it computes, for rows i < nv of one chunk (rows past the chunk are never written: the
// workspace tiles are token-indexed and those rows belong to the next chunk):
// w, qg and kg (and the w / u operands in sQ, sK) are stored rounded to tf32: only mma reads them.
//   qg_i  = scale * q_i * exp2(G_i)              -> workspace qg   (scale folded in here)
//   kg_i  = k_i * exp2(G_last - G_i)             -> workspace kg   (G_last: row nv - 1)
//   gamma = exp2(G_last)                          -> workspace gamma (one row per chunk)
//   w     = Tinv (beta k exp2(G))                 -> workspace w
//   u     = Tinv (beta v)                         -> workspace u
// Every exponent is <= 0 when g <= 0, so every factor is in [0, 1].
//
// Grid mapping: one CTA (512 threads) per (chunk, value head). Elementwise passes: thread owns
// 4 consecutive columns of a row (float4). Products: mma.sync m16n8k8 tf32 with Tinv (sA) as A in
// paired k order and [BT, N] operands (sQ, sK) as B; warp (mt, ng) owns rows 16 mt .. 16 mt + 15
// and N / 8 / (kWarps / NB) column tiles; k blocks with j > 16 mt + 15 are skipped (Tinv is lower
// triangular there, exact zeros).
// Shared memory: reads sQ, sK, sG, sBeta, sA; sQ becomes beta k exp2(G), sK becomes beta v.
#pragma once

#include <cstdint>

#include "cuda/chunk_fwd/chunk_index.cuh"
#include "cuda/chunk_fwd/gate_cumsum.cuh"
#include "cuda/chunk_fwd/io.cuh"
#include "cuda/chunk_fwd/mma.cuh"
#include "cuda/chunk_fwd/params.h"
#include "cuda/chunk_fwd/traits.h"

namespace openkda::cuda::chunk_forward {

// qg, kg and gamma to the workspace; sQ <- beta k exp2(G) in place (the same thread reads q
// first). `row0`: workspace row of the chunk's row 0; `slot`: the chunk's global index.
template <class Tr>
__device__ __forceinline__ void write_gated_keys(const ChunkFwdParams& p, const ChunkCoord& cc,
                                                 int64_t row0, int64_t slot, int hv, float* sQ,
                                                 const float* sK, const float* sG,
                                                 const float* sBeta) {
  constexpr int kC4 = Tr::kK / 4;
  constexpr int kLd = Tr::kLdX;
  const float* sGlast = sG + (cc.nv - 1) * kLd;
  float* gQg = p.qg + row0 * Tr::kK;
  float* gKg = p.kg + row0 * Tr::kK;
  for (int idx = threadIdx.x; idx < Tr::kBT * kC4; idx += Tr::kThreads) {
    const int i = idx / kC4, d = 4 * (idx % kC4);
    const float4 q4 = *reinterpret_cast<const float4*>(sQ + i * kLd + d);
    const float4 k4 = *reinterpret_cast<const float4*>(sK + i * kLd + d);
    const float4 g4 = *reinterpret_cast<const float4*>(sG + i * kLd + d);
    const float4 l4 = *reinterpret_cast<const float4*>(sGlast + d);
    const float b = sBeta[i];
    // Every factor below ends in a tf32-rounded operand: exp2_operand (math.cuh).
    const float e0 = exp2_operand(g4.x), e1 = exp2_operand(g4.y), e2 = exp2_operand(g4.z),
                e3 = exp2_operand(g4.w);
    if (i < cc.nv) {
      const float4 qg =
          make_float4(tf32_round(p.scale * q4.x * e0), tf32_round(p.scale * q4.y * e1),
                      tf32_round(p.scale * q4.z * e2), tf32_round(p.scale * q4.w * e3));
      const float4 kg = make_float4(tf32_round(k4.x * exp2_operand(l4.x - g4.x)),
                                    tf32_round(k4.y * exp2_operand(l4.y - g4.y)),
                                    tf32_round(k4.z * exp2_operand(l4.z - g4.z)),
                                    tf32_round(k4.w * exp2_operand(l4.w - g4.w)));
      *reinterpret_cast<float4*>(gQg + int64_t{i} * Tr::kK + d) = qg;
      *reinterpret_cast<float4*>(gKg + int64_t{i} * Tr::kK + d) = kg;
    }
    *reinterpret_cast<float4*>(sQ + i * kLd + d) =
        make_float4(tf32_round(b * k4.x * e0), tf32_round(b * k4.y * e1), tf32_round(b * k4.z * e2),
                    tf32_round(b * k4.w * e3));
  }
  float* gGamma = p.gamma + (int64_t{hv} * p.slots + slot) * Tr::kK;
  for (int d = threadIdx.x; d < Tr::kK; d += Tr::kThreads) gGamma[d] = exp2f(sGlast[d]);
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
    for (int m = 0; m < 4; ++m) y[m] = i < cc.nv ? tf32_round(x[r][m] * b) : 0.0f;
    *reinterpret_cast<float4*>(sK + i * Tr::kLdX + e) = make_float4(y[0], y[1], y[2], y[3]);
  }
}

// gOut[i, :] = sum_j Tinv[i, j] sB[j, :] for rows i < nv; gOut: row 0 of a [rows, kN] f32 tile.
// sB holds tf32-rounded values (write_gated_keys, load_beta_v). kRoundOut: gOut is only ever an
// mma operand (w), so it is stored tf32-rounded too; u is not (the scan subtracts in f32).
template <class Tr, int kN, bool kRoundOut>
__device__ __forceinline__ void tinv_product(const float* sA, const float* sB, float* gOut,
                                             int nv) {
  constexpr int kMT = Tr::kBT / kSubChunk;  // 16-row tiles
  constexpr int kNG = Tr::kWarps / kMT;     // column groups
  constexpr int kTiles = (kN / 8) / kNG;    // 8-column tiles per warp
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int mt = warp % kMT, ng = warp / kMT;
  const int r0 = kSubChunk * mt + g, r1 = r0 + 8;

  float acc[kTiles][4];
#pragma unroll
  for (int q = 0; q < kTiles; ++q)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[q][e] = 0.0f;

#pragma unroll
  for (int kk = 0; kk < 2 * kMT; ++kk) {
    if (kk < 2 * (mt + 1)) {  // columns j < 16 (mt + 1); Tinv is 0 beyond
      uint32_t a[4];
      a_from_pairs(*reinterpret_cast<const float2*>(sA + r0 * Tr::kLdA + 8 * kk + 2 * t),
                   *reinterpret_cast<const float2*>(sA + r1 * Tr::kLdA + 8 * kk + 2 * t), a);
      const float* b_lo = sB + (8 * kk + 2 * t) * Tr::kLdX;
      const float* b_hi = b_lo + Tr::kLdX;
#pragma unroll
      for (int q = 0; q < kTiles; ++q) {
        const int n = 8 * (ng * kTiles + q) + g;
        mma_tf32(acc[q], a, tf32_bits(b_lo[n]), tf32_bits(b_hi[n]));
      }
    }
  }
  if constexpr (kRoundOut) {
#pragma unroll
    for (int q = 0; q < kTiles; ++q)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[q][e] = tf32_round(acc[q][e]);
  }
#pragma unroll
  for (int q = 0; q < kTiles; ++q) {
    const int col = 8 * (ng * kTiles + q) + 2 * t;
    if (r0 < nv) {
      *reinterpret_cast<float2*>(gOut + int64_t{r0} * kN + col) = make_float2(acc[q][0], acc[q][1]);
    }
    if (r1 < nv) {
      *reinterpret_cast<float2*>(gOut + int64_t{r1} * kN + col) = make_float2(acc[q][2], acc[q][3]);
    }
  }
}

}  // namespace openkda::cuda::chunk_forward
