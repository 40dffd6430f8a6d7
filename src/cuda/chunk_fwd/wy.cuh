// Stage 3 of the chunk_kda forward (prep kernel): the gated keys and the WY factor.
// CPU twin: cpu/chunk_fwd.cpp fwd_wy (its w and u are Tinv' ke and Tinv' v).
//
// What it computes, for rows i < nv of one chunk; every tile goes to the workspace whole, as the
// scan's shared-memory image (tile_image.h), rows (columns of kg^T) past the chunk from the
// zero rows of q, k, beta there. qg, ke, kg^T and Tinv' are only ever tensor-core operands, so they
// are stored as tf32 operands (tf32_operand, mma.cuh), qg and ke as f16 with f16 keys (params.h:
// f16_keys_apply; half_pair_image_offset; each row anchored, below); gamma and the copy of an
// f32 / f64 v stay f32 (a bf16 / f16 v is not copied: the scan reads it from v by tensor-map
// boxes):
//   qg_i  = scale * q_i * exp2(G_i)              -> workspace qg   (scale folded in here)
//   ke_i  = k_i * exp2(G_i)                      -> workspace ke
//     with f16 keys: qg_i, ke_i times exp2(-A_i), A_i = floor(max_d G_id) (the row's anchor,
//     clamped to [-126, 0]), and exp2(A_i) -> workspace ka (pair order; the scan multiplies back)
//   kg_i  = k_i * exp2(G_last - G_i)             -> workspace kg^T (G_last: row nv - 1; stored
//                                                   transposed per chunk slot, params.h; with f16
//                                                   keys kg itself, f16 in ke's image)
//   gamma = exp2(G_last)                          -> workspace gamma (one row per chunk; f32)
//   Tinv' = Tinv diag(beta)                       -> workspace tinv
//   v (rows of the chunk, f32 / f64 v only)      -> workspace v_img
// Every exponent is <= 0 when g <= 0, so every factor is in [0, 1]. The WY products w = Tinv' ke
// and u = Tinv' v are not formed: the scan computes v_new = u - w S as Tinv' (v - ke S), one
// BT x BT product per chunk on its side instead of two BT x BT x (K | V) products here. A 16-bit v
// reaches the scan by one tensor-map box per 64 value columns and chunk, straight from v (per
// thread or per row it was slower than a copy here: chunk_fwd README, fourteenth session); an f32
// / f64 v goes through the workspace as an f32 copy (one bulk copy per scan chunk).
//
// Grid mapping: one CTA (Tr::kThreads) per (chunk, value head); write_gated_keys runs on the warps
// that the intra products leave free, write_tinv_image and write_v_image on all threads after the
// inverse.
// Shared memory: reads sQ, sK, sG, sBeta, sA.
#pragma once

#include <cstdint>

#include "cuda/chunk_fwd/chunk_index.cuh"
#include "cuda/chunk_fwd/gate_cumsum.cuh"
#include "cuda/chunk_fwd/mma.cuh"
#include "cuda/chunk_fwd/params.h"
#include "cuda/chunk_fwd/tile_image.h"
#include "cuda/chunk_fwd/traits.h"

namespace openkda::cuda::chunk_forward {

// qg, ke, kg^T and gamma to the workspace, by `threads` threads (`tid` in [0, threads); threads
// is a multiple of 32): the warps the intra products leave free, while those still read sQ, sK
// and sG (read-only here). `tile`: the index of the chunk's workspace tiles (hv * slots + slot).
// Each thread keeps its columns and steps over rows, in unsigned arithmetic: no per-element
// division or sign fix-up (the index math was most of these loops' instructions).
//   qg, ke: thread (rows i0 + step r, 4 columns d): float4 row reads, one exp2 per element for
//     both, one 16-byte chunk of each image per store.
//   kg^T: the scan's tf32 wgmma B operand of the state update (K-major, so transposed here).
//     Thread (half, d, 4 columns j .. j + 3, j % 4 = 0), a warp 16 consecutive d times both halves
//     of an 8-column group: each store instruction writes one 32-byte sector of 16 image rows (the
//     two halves stay adjacent under the swizzle), and the column reads of sK and sG hit 32
//     distinct banks (rows 4 apart, kLdX = 4 mod 32).
//   With f16 keys kg is the f16 B operand of the state update, which f16 wgmma reads MN-major
//     (N = d contiguous), so it is stored untransposed in ke's image, by the ke / qg threads: one
//     more exp2 per element, and no column reads.
template <class Tr>
__device__ __forceinline__ void write_gated_keys(const ChunkFwdParams& p, const ChunkCoord& cc,
                                                 int64_t tile, const float* sQ, const float* sK,
                                                 const float* sG, int tid, int threads) {
  constexpr unsigned kC4 = Tr::kK / 4;  // 16-byte chunks per row (16 or 32: divides a warp)
  constexpr unsigned kLd = Tr::kLdX;
  static_assert(32 % kC4 == 0 && Tr::kBT == 32, "whole rows per warp; kg^T: one 32-row region");
  const unsigned utid = static_cast<unsigned>(tid), uthreads = static_cast<unsigned>(threads);
  const float* sGlast = sG + (cc.nv - 1) * kLd;
  if (prep_f16_keys<Tr>(p)) {
    // f16 images (params.h: f16_keys_apply): thread (rows i0 + step r, one 16-byte chunk of 8
    // columns d, stored in the pair order of half_pair_image_offset), two float4 row reads per
    // tensor, one exp2 per element for both; the lanes of a warp take its 32 / kC8 rows by
    // f16_writer_row / f16_writer_chunk (tile_image.h: conflict-free row reads).
    constexpr unsigned kC8 = Tr::kK / 8, kRowsPerWarp = 32 / kC8;
    char* gQg = reinterpret_cast<char*>(p.qg) + tile * Tr::kBT * Tr::kK * 2;
    char* gKe = reinterpret_cast<char*>(p.ke) + tile * Tr::kBT * Tr::kK * 2;
    char* gKg = reinterpret_cast<char*>(p.kgT) + tile * Tr::kBT * Tr::kK * 2;
    const unsigned lane = utid % 32, c8 = f16_writer_chunk<Tr::kK>(lane);
    const unsigned d = 8 * c8, step = uthreads / kC8;
    float gl[8];  // G_last of this thread's columns
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float4 g4 = *reinterpret_cast<const float4*>(sGlast + d + 4 * h);
      gl[4 * h] = g4.x;
      gl[4 * h + 1] = g4.y;
      gl[4 * h + 2] = g4.z;
      gl[4 * h + 3] = g4.w;
    }
    for (unsigned i = kRowsPerWarp * (utid / 32) + f16_writer_row<Tr::kK>(lane); i < Tr::kBT;
         i += step) {
      // The row's anchor A = floor(max over d of G) (the kC8 lanes of the row, which differ in
      // lane bits 0, 1 and 3 .. 2 + log2(kK / 32): tile_image.h; every lane of a warp makes the
      // same number of steps: the writer threads are whole warps and BT = 32, so step and BT are
      // multiples of the rows a warp holds). ke and qg are stored times exp2(G - A) (each row's
      // largest factor in [1, 2), however far the chunk has decayed: f16's exponent range ends at
      // 2^-24), and the scan multiplies the products' columns by exp2(A) (ka, pair order),
      // exactly: a power of two, a normal f32 built from its exponent bits (A in [-126, 0]:
      // ldexpf's general path cost ~30 instructions per row). The clamp keeps A finite for rows
      // whose G is -inf or NaN everywhere (their factors are 0 or NaN either way); a row whose
      // every G is below -126 keeps only terms the decay made negligible (below 2^-126 of the
      // chunk's undecayed ones), at f16's subnormal precision.
      float gv[8];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float4 g4 = *reinterpret_cast<const float4*>(sG + i * kLd + d + 4 * h);
        gv[4 * h] = g4.x;
        gv[4 * h + 1] = g4.y;
        gv[4 * h + 2] = g4.z;
        gv[4 * h + 3] = g4.w;
      }
      float a = gv[0];
#pragma unroll
      for (int c = 1; c < 8; ++c) a = fmaxf(a, gv[c]);
      a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 1));
      a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 2));
#pragma unroll
      for (unsigned lanes = 8; lanes < Tr::kK / 4; lanes *= 2)
        a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, lanes));
      a = fminf(fmaxf(floorf(a), -126.0f), 0.0f);
      if (c8 == 0)
        p.ka[tile * Tr::kBT + pair_row(i)] = __int_as_float((static_cast<int>(a) + 127) << 23);
      // kg = k exp2(G_last - G) <= |k| needs no anchor (underflow only where the decay has made
      // the term negligible against the row's later ones).
      float qv[8], kv[8], kgv[8];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float4 q4 = *reinterpret_cast<const float4*>(sQ + i * kLd + d + 4 * h);
        const float4 k4 = *reinterpret_cast<const float4*>(sK + i * kLd + d + 4 * h);
        const float qq[4] = {q4.x, q4.y, q4.z, q4.w}, kk[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const float e = exp2_operand(gv[4 * h + c] - a);
          qv[4 * h + c] = p.scale * qq[c] * e;
          kv[4 * h + c] = kk[c] * e;
          kgv[4 * h + c] = kk[c] * exp2_operand(gl[4 * h + c] - gv[4 * h + c]);
        }
      }
      uint32_t qp[4], kp[4], kgp[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {  // physical columns 2c, 2c + 1 hold d + scan_row(2c), + 1
        qp[c] = pack_b16<__half>(qv[scan_row(2 * c)], qv[scan_row(2 * c + 1)]);
        kp[c] = pack_b16<__half>(kv[scan_row(2 * c)], kv[scan_row(2 * c + 1)]);
        kgp[c] = pack_b16<__half>(kgv[scan_row(2 * c)], kgv[scan_row(2 * c + 1)]);
      }
      const uint32_t at = half_pair_image_offset<Tr::kBT>(i, d);
      *reinterpret_cast<uint4*>(gQg + at) = make_uint4(qp[0], qp[1], qp[2], qp[3]);
      *reinterpret_cast<uint4*>(gKe + at) = make_uint4(kp[0], kp[1], kp[2], kp[3]);
      *reinterpret_cast<uint4*>(gKg + at) = make_uint4(kgp[0], kgp[1], kgp[2], kgp[3]);
    }
  } else {
    char* gQg = reinterpret_cast<char*>(p.qg + tile * Tr::kBT * Tr::kK);
    char* gKe = reinterpret_cast<char*>(p.ke + tile * Tr::kBT * Tr::kK);
    const unsigned c16 = utid % kC4, d = 4 * c16, step = uthreads / kC4;
    for (unsigned i = utid / kC4; i < Tr::kBT; i += step) {
      const float4 q4 = *reinterpret_cast<const float4*>(sQ + i * kLd + d);
      const float4 k4 = *reinterpret_cast<const float4*>(sK + i * kLd + d);
      const float4 g4 = *reinterpret_cast<const float4*>(sG + i * kLd + d);
      // Every factor below ends in a tf32 operand: exp2_operand (math.cuh).
      const float e0 = exp2_operand(g4.x), e1 = exp2_operand(g4.y), e2 = exp2_operand(g4.z),
                  e3 = exp2_operand(g4.w);
      const uint32_t at = pair_image_offset<Tr::kBT>(i, d);
      *reinterpret_cast<float4*>(gQg + at) =
          make_float4(tf32_operand(p.scale * q4.x * e0), tf32_operand(p.scale * q4.y * e1),
                      tf32_operand(p.scale * q4.z * e2), tf32_operand(p.scale * q4.w * e3));
      *reinterpret_cast<float4*>(gKe + at) =
          make_float4(tf32_operand(k4.x * e0), tf32_operand(k4.y * e1), tf32_operand(k4.z * e2),
                      tf32_operand(k4.w * e3));
    }
  }
  if (!prep_f16_keys<Tr>(p)) {  // kg^T (tf32 keys; the f16 branch above wrote kg)
    char* gKgT = reinterpret_cast<char*>(p.kgT + tile * Tr::kK * Tr::kBT);
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

// The WY factor's image: Tinv'[i][j] = Tinv[i][j] beta_j for the whole BT x BT tile (sA holds
// Tinv with its zeros above the diagonal; rows past the chunk are identity rows of Tinv and beta
// is 0 there, so they store 0), as the scan's B operand of v_new^T = R^T Tinv'^T (tf32 operands,
// pair order: store_aqk's tf32 layout). Thread: one 16-byte chunk of the image, row tid / (BT / 4),
// columns 4 (tid % (BT / 4)) .. + 3. Expects Tinv visible (the barrier that ends the inverse).
template <class Tr>
__device__ __forceinline__ void write_tinv_image(const float* sA, const float* sBeta,
                                                 float* gTinv) {
  constexpr unsigned kRowF4 = Tr::kBT / 4;
  const unsigned i = threadIdx.x / kRowF4, j = 4 * (threadIdx.x % kRowF4);
  const float4 t4 = *reinterpret_cast<const float4*>(sA + i * Tr::kLdA + j);
  const float4 b4 = *reinterpret_cast<const float4*>(sBeta + j);
  *reinterpret_cast<float4*>(reinterpret_cast<char*>(gTinv) + pair_image_offset<Tr::kBT>(i, j)) =
      make_float4(tf32_operand(t4.x * b4.x), tf32_operand(t4.y * b4.y), tf32_operand(t4.z * b4.z),
                  tf32_operand(t4.w * b4.w));
}

// The chunk's v rows (value head hv) as the scan's f32 v image (tile_image.h: v_image_index),
// rows past the chunk as 0. Thread: 4 consecutive columns of rows idx / (V / 4), idx = tid +
// kThreads r, r < kRuns (kRuns = BT (V / 4) / kThreads: 2 or 4, one per compiled V); all its loads
// are issued as one batch (load_runs) before the first store waits on them.
template <class Tr, int kV>
__device__ __forceinline__ void write_v_image_v(const ChunkFwdParams& p, const ChunkCoord& cc,
                                                int hv, float* gV) {
  constexpr int kC4 = kV / 4;
  constexpr int kRuns = Tr::kBT * kC4 / Tr::kThreads;
  static_assert(Tr::kBT * kC4 % Tr::kThreads == 0, "whole float4 runs per thread");
  int64_t off[kRuns];
#pragma unroll
  for (int r = 0; r < kRuns; ++r) {
    const int idx = static_cast<int>(threadIdx.x) + Tr::kThreads * r;
    const int i = idx / kC4, e = 4 * (idx % kC4);
    off[r] = ((cc.t0 + (i < cc.nv ? i : 0)) * p.HV + hv) * kV + e;
  }
  float x[kRuns][4];
  load_runs<kRuns, 4>(p.v, p.v_dtype, off, x);
#pragma unroll
  for (int r = 0; r < kRuns; ++r) {
    const int idx = static_cast<int>(threadIdx.x) + Tr::kThreads * r;
    const int i = idx / kC4, e = 4 * (idx % kC4);
    const bool in = i < cc.nv;
    *reinterpret_cast<float4*>(gV + v_image_index<Tr::kBT>(i, e)) =
        in ? make_float4(x[r][0], x[r][1], x[r][2], x[r][3]) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}

// The chunk's copy of v for the scan at its tile of the workspace: an f32 / f64 v only; the scan
// loads a bf16 / f16 v's rows from v itself (tensor-map boxes, scan_io.cuh; v_by_tensor_map).
template <class Tr>
__device__ __forceinline__ void write_v_image(const ChunkFwdParams& p, const ChunkCoord& cc, int hv,
                                              int64_t tile) {
  if (prep_v_by_tensor_map<Tr>(p)) return;
  float* gV = p.v_img + tile * Tr::kBT * p.V;
  if (p.V == 64) {
    write_v_image_v<Tr, 64>(p, cc, hv, gV);
  } else {
    write_v_image_v<Tr, 128>(p, cc, hv, gV);
  }
}

}  // namespace openkda::cuda::chunk_forward
