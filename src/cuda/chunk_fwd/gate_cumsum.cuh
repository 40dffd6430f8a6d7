// Stage 1 of the chunk_kda forward (prep kernel): load one chunk of one value head into shared
// memory in f32, with the token-wise activations applied, then the chunk-local gate cumsum.
// CPU twin: cpu/chunk_common.cpp prepare_inputs + cpu/chunk_fwd.cpp fwd_gate_cumsum.
//
// What it computes, for rows i < nv of the chunk (tokens t0 + i; value head hv, q/k head
// h = hv / group); rows i >= nv are zero (g = 0 there, so G stays at G_last):
//   sQ[i] = q_i * rstd(q_i), sK[i] = k_i * rstd(k_i)   rstd = rsqrt(sum x^2 + 1e-6) with l2norm,
//                                                       else 1
//   sG[i] = g_i (pre-gated) | -exp(A_log) softplus(g_i + dt_bias) | L sigmoid(a (g_i + dt_bias))
//           (softplus: accurate expf / log1pf; lower bound: inv_one_plus_exp2_fast, math.cuh),
//           times log2(e): the cumsum's units
//   sBeta[i] = beta_i | s sigmoid(beta_i), s = 2 with allow_neg_eigval
//   then sG[i] <- sum_{r <= i} sG[r]   (G: chunk-local inclusive cumsum, log2 units)
// The cumsum is exactly monotone: with every g <= 0, G_i <= G_j for i >= j in f32 (each partial
// sum adds a non-positive term), so every exp2 argument of the later stages is <= 0.
//
// Grid mapping: one CTA (Tr::kThreads, 256 at BT = 32) per (chunk, value head). Warp w owns the
// kRows = BT / kWarps consecutive rows kRows w .. kRows w + kRows - 1; lane l owns columns
// l * K / 32 .. (l + 1) * K / 32 - 1 (one vector access per row). The cumsum runs on the same
// registers: each warp scans its rows, publishes its column totals in sPart (the A tile's space,
// free until stage 2), and after one block barrier adds the totals of the warps above it, in
// order. So stage 1 needs no second pass over sG, and two block barriers after the loads instead
// of four.
// Shared memory: sQ, sK, sG, sBeta of PrepTraits, kWarps * K floats of sPart. Unless an input is
// f64, q, k and g arrive by one tensor-map box each (BT rows x K columns, their dtype) at the
// start of sQ, sK and sG, on the mbarrier at kOffBar (issue_input_boxes).
#pragma once

#include <cstdint>

#include "cuda/chunk_fwd/chunk_index.cuh"
#include "cuda/chunk_fwd/mma.cuh"
#include "cuda/chunk_fwd/params.h"
#include "cuda/common/bulk_copy.cuh"
#include "cuda/common/math.cuh"
#include "cuda/common/vec.cuh"

namespace openkda::cuda::chunk_forward {

// Per-token log-decay in log2 units (the cumsum's) of the lane's kRows x kPer gate values x (in
// place), for one gate mode fixed at compile time (load_chunk_inputs switches once per CTA, not
// per element):
//   kPre         log2(e) x
//   kSoftplus    -log2(e) a softplus(x + dt_bias)        (CUDA's accurate expf / log1pf: any
//                                                         raw gate)
//   kLowerBound  log2(e) L sigmoid(a (x + dt_bias))      (the safe gate's hot path:
//                = log2(e) L / (1 + 2^(c x + c dt_bias)), c = -log2(e) a: one FFMA, two MUFU,
//                an FADD and an FMUL per element)
// `a` is the head factor exp(A_log) (1 without A_log).
template <GateMode kMode, int kRows, int kPer>
__device__ __forceinline__ void gate_log2_rows(float lower_bound, float a,
                                               const float (&bias)[kPer], float (&x)[kRows][kPer]) {
  if constexpr (kMode == GateMode::kLowerBound) {
    const float c = -kLog2e * a, l = kLog2e * lower_bound;
    float cb[kPer];
#pragma unroll
    for (int e = 0; e < kPer; ++e) cb[e] = c * bias[e];
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int e = 0; e < kPer; ++e) x[r][e] = l * inv_one_plus_exp2_fast(fmaf(c, x[r][e], cb[e]));
  } else {
    const float s = kMode == GateMode::kSoftplus ? -kLog2e * a : kLog2e;
#pragma unroll
    for (int r = 0; r < kRows; ++r)
#pragma unroll
      for (int e = 0; e < kPer; ++e)
        x[r][e] = kMode == GateMode::kSoftplus ? s * softplus_f32(x[r][e] + bias[e]) : s * x[r][e];
  }
}

// kPer (2 or 4) consecutive floats as one 8- or 16-byte shared store (conflict-free per warp).
template <int kPer>
__device__ __forceinline__ void store_run_smem(float* dst, const float (&x)[kPer]) {
  static_assert(kPer == 2 || kPer == 4, "K / 32 columns per lane");
  if constexpr (kPer == 4) {
    *reinterpret_cast<float4*>(dst) = make_float4(x[0], x[1], x[2], x[3]);
  } else {
    *reinterpret_cast<float2*>(dst) = make_float2(x[0], x[1]);
  }
}

// kRows runs of kPer elements (at element offsets off[r]) of one run-time dtype, converted to f32.
// The dtype switch sits outside the row loop so that every load of the batch is issued before the
// first conversion waits on one (one memory round trip per batch instead of one per row). Off:
// int64_t for global memory, int for shared memory (the input boxes: 32-bit address arithmetic).
template <typename T, int kRows, int kPer, typename Off>
__device__ __forceinline__ void load_runs_as(const void* base, const Off (&off)[kRows],
                                             float (&out)[kRows][kPer]) {
  Pack<T, kPer> pk[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) pk[r] = load_pack<T, kPer>(static_cast<const T*>(base) + off[r]);
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int e = 0; e < kPer; ++e) out[r][e] = to_f32(pk[r].v[e]);
}

template <int kRows, int kPer, typename Off>
__device__ __forceinline__ void load_runs(const void* base, DType dtype, const Off (&off)[kRows],
                                          float (&out)[kRows][kPer]) {
  switch (dtype) {
    case DType::kBF16: load_runs_as<__nv_bfloat16, kRows, kPer>(base, off, out); break;
    case DType::kF16: load_runs_as<__half, kRows, kPer>(base, off, out); break;
    case DType::kF64: load_runs_as<double, kRows, kPer>(base, off, out); break;
    default: load_runs_as<float, kRows, kPer>(base, off, out); break;
  }
}

// The same for two tensors of one dtype at the same offsets (q and k): one batch of 2 kRows loads.
template <typename T, int kRows, int kPer, typename Off>
__device__ __forceinline__ void load_runs2_as(const void* base_a, const void* base_b,
                                              const Off (&off)[kRows], float (&out_a)[kRows][kPer],
                                              float (&out_b)[kRows][kPer]) {
  Pack<T, kPer> pa[kRows], pb[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    pa[r] = load_pack<T, kPer>(static_cast<const T*>(base_a) + off[r]);
    pb[r] = load_pack<T, kPer>(static_cast<const T*>(base_b) + off[r]);
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r)
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      out_a[r][e] = to_f32(pa[r].v[e]);
      out_b[r][e] = to_f32(pb[r].v[e]);
    }
}

template <int kRows, int kPer, typename Off>
__device__ __forceinline__ void load_runs2(const void* base_a, const void* base_b, DType dtype,
                                           const Off (&off)[kRows], float (&out_a)[kRows][kPer],
                                           float (&out_b)[kRows][kPer]) {
  switch (dtype) {
    case DType::kBF16:
      load_runs2_as<__nv_bfloat16, kRows, kPer>(base_a, base_b, off, out_a, out_b);
      break;
    case DType::kF16: load_runs2_as<__half, kRows, kPer>(base_a, base_b, off, out_a, out_b); break;
    case DType::kF64: load_runs2_as<double, kRows, kPer>(base_a, base_b, off, out_a, out_b); break;
    default: load_runs2_as<float, kRows, kPer>(base_a, base_b, off, out_a, out_b); break;
  }
}

// The 16-bit element type of q, k and g on a safe prep path (traits.h: PrepPath).
template <PrepPath kPath>
struct SafeInput {
  static_assert(kPath == PrepPath::kSafeBF16, "kSafeF16 has its own specialisation");
  using type = __nv_bfloat16;
};
template <>
struct SafeInput<PrepPath::kSafeF16> {
  using type = __half;
};

// L2 prefetch of the chunk's beta (thread i < nv: row i) and, unless g comes by a tensor-map box,
// its g lines (rows < nv), issued before the q / k loads so that the later g and beta loads hit
// L2. One 128-byte line per prefetch (K in {64, 128}: whole lines for every dtype). g: thread (row
// i, j), kThreads / BT threads per row, takes the row's lines j, j + kThreads / BT, ...
template <class Tr>
__device__ __forceinline__ void prefetch_chunk_inputs(const ChunkFwdParams& p, const ChunkCoord& cc,
                                                      int hv) {
  constexpr int kPerRow = Tr::kThreads / Tr::kBT;
  static_assert(Tr::kThreads % Tr::kBT == 0, "whole threads per row");
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < cc.nv) {
    prefetch_l2(static_cast<const char*>(p.beta) +
                ((cc.t0 + tid) * p.HV + hv) * static_cast<int64_t>(dtype_size(p.beta_dtype)));
  }
  if (prep_inputs_by_tensor_map<Tr>(p)) return;  // g comes by a tensor-map box
  const int i = tid / kPerRow, j = tid % kPerRow;
  if (i >= cc.nv) return;
  const int row_bytes = Tr::kK * static_cast<int>(dtype_size(p.g_dtype));
  const char* row = static_cast<const char*>(p.g) + ((cc.t0 + i) * p.HV + hv) * row_bytes;
  for (int l = j; l < row_bytes / 128; l += kPerRow) prefetch_l2(row + 128 * l);
}

// The chunk's rows of q, k and g as dense boxes [kBT][kK] of their dtype at the start of sQ, sK
// and sG (inputs_by_tensor_map), on the mbarrier `bar` (initialised once per CTA; one phase per
// chunk); by thread 0. Rows past the tokens read as zero; rows past the chunk are whatever follows
// (load_chunk_inputs zeroes them).
template <class Tr>
__device__ __forceinline__ void issue_input_boxes(const ChunkFwdParams& p, const ChunkCoord& cc,
                                                  int hv, float* sQ, float* sK, float* sG,
                                                  uint32_t bar) {
  const uint32_t qk_bytes = Tr::kBT * Tr::kK * static_cast<uint32_t>(dtype_size(p.qk_dtype));
  const uint32_t g_bytes = Tr::kBT * Tr::kK * static_cast<uint32_t>(dtype_size(p.g_dtype));
  const int h = hv / p.group, row = static_cast<int>(cc.t0);  // int32 rows: can_implement
  mbarrier_expect_tx(bar, 2 * qk_bytes + g_bytes);
  tma_load_2d(smem_address(sQ), &p.q_map, h * Tr::kK, row, bar);
  tma_load_2d(smem_address(sK), &p.k_map, h * Tr::kK, row, bar);
  tma_load_2d(smem_address(sG), &p.g_map, hv * Tr::kK, row, bar);
}

// q, k (l2-normalised when requested), beta, and G (the gate activation's chunk-local cumsum,
// log2 units) of rows [0, kBT). Warp w owns rows kRows w + r (r < kRows). With
// inputs_by_tensor_map, thread 0 has issued the input boxes on `bar` (issue_input_boxes) before
// this call: a first block barrier here publishes the mbarrier's initialisation (the CTA's first
// chunk) and every thread reads its values from the boxes once phase `parity` completes. Otherwise
// (an f64 input) all its q and k loads are issued as one batch, then all its g loads (prefetched to
// L2 by prefetch_chunk_inputs). Then the per-row math and the warp's part of the cumsum; a block
// barrier (every read of the boxes done, every warp's column totals in sPart); the offsets of the
// warps above; the f32 rows over the boxes; beta (also prefetched). Rows past the chunk load row 0
// (always valid, nv >= 1; with the boxes, their own rows) and are zeroed, so every load is
// unconditional. Ends with a block barrier: sQ, sK, sG and sBeta are visible to every thread on
// return, and sPart is free again.
template <class Tr>
__device__ __forceinline__ void load_chunk_inputs(const ChunkFwdParams& p, const ChunkCoord& cc,
                                                  int hv, float* sQ, float* sK, float* sG,
                                                  float* sBeta, float* sPart, uint32_t bar,
                                                  uint32_t parity) {
  constexpr int kPer = Tr::kK / 32;            // columns per lane
  constexpr int kRows = Tr::kBT / Tr::kWarps;  // rows per warp
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int d0 = lane * kPer;

  // Gate parameters of this lane's columns (read only with the gate in kernel).
  float bias[kPer];
  float head_factor = 1.0f;
#pragma unroll
  for (int e = 0; e < kPer; ++e) bias[e] = 0.0f;
  if (prep_gate_mode<Tr>(p) != GateMode::kPre) {
    if (p.dt_bias) load_scalars(p.dt_bias, p.dt_bias_dtype, int64_t{hv} * Tr::kK + d0, bias);
    if (p.A_log) head_factor = exp_f32(load_f32(p.A_log, p.A_log_dtype, hv));
  }

  const bool by_boxes = prep_inputs_by_tensor_map<Tr>(p);
  float xq[kRows][kPer], xk[kRows][kPer], xg[kRows][kPer];
  if (by_boxes) {
    int box_off[kRows];  // element offsets in the boxes
#pragma unroll
    for (int r = 0; r < kRows; ++r) box_off[r] = (kRows * warp + r) * Tr::kK + d0;
    __syncthreads();  // the mbarrier's initialisation (thread 0) before any wait on it
    mbarrier_wait(bar, parity);
    if constexpr (Tr::kSafePath) {  // the path's dtype, fixed at compile time
      using T = typename SafeInput<Tr::kPath>::type;
      load_runs2_as<T, kRows, kPer>(sQ, sK, box_off, xq, xk);
      load_runs_as<T, kRows, kPer>(sG, box_off, xg);
    } else {
      load_runs2<kRows, kPer>(sQ, sK, p.qk_dtype, box_off, xq, xk);
      load_runs<kRows, kPer>(sG, p.g_dtype, box_off, xg);
    }
  } else {
    const int h = hv / p.group;
    int64_t qk_off[kRows], g_off[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int i = kRows * warp + r;
      const int64_t tok = cc.t0 + (i < cc.nv ? i : 0);
      qk_off[r] = (tok * p.H + h) * Tr::kK + d0;
      g_off[r] = (tok * p.HV + hv) * Tr::kK + d0;
    }
    load_runs2<kRows, kPer>(p.q, p.k, p.qk_dtype, qk_off, xq, xk);
    load_runs<kRows, kPer>(p.g, p.g_dtype, g_off, xg);
  }

  // l2norm (rstd = rsqrt(sum x^2 + eps), MUFU.RSQ: 2 ulp), then the gate of every row with one
  // compile-time gate mode; rows past the chunk become zero in all three tiles. The warp's 2 kRows
  // sums of squares (q rows, then k rows) are reduced together (warp_transpose_sums: 9 shuffles
  // for 8 sums instead of 40), each lane takes the rstd of the sum it holds, and every lane then
  // fetches the 2 kRows factors of its rows from the lanes that hold them.
  if (prep_l2norm<Tr>(p)) {
    constexpr int kSums = 2 * kRows;
    constexpr int kLanesPerSum = 32 / kSums;
    float ss[kSums];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      ss[r] = ss[kRows + r] = 0.0f;
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        ss[r] += xq[r][e] * xq[r][e];
        ss[kRows + r] += xk[r][e] * xk[r][e];
      }
    }
    warp_transpose_sums<kSums>(ss);
    const float rstd = rsqrtf(ss[0] + kL2NormEps);  // of sum lane / kLanesPerSum
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float rq = __shfl_sync(0xffffffffu, rstd, kLanesPerSum * r);
      const float rk = __shfl_sync(0xffffffffu, rstd, kLanesPerSum * (kRows + r));
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        xq[r][e] *= rq;
        xk[r][e] *= rk;
      }
    }
  }
  if (prep_gate_mode<Tr>(p) == GateMode::kLowerBound) {
    gate_log2_rows<GateMode::kLowerBound>(p.lower_bound, head_factor, bias, xg);
  } else if (prep_gate_mode<Tr>(p) == GateMode::kSoftplus) {
    gate_log2_rows<GateMode::kSoftplus>(p.lower_bound, head_factor, bias, xg);
  } else {
    gate_log2_rows<GateMode::kPre>(p.lower_bound, head_factor, bias, xg);
  }
  if (cc.nv < Tr::kBT) {  // a tail chunk (block-uniform branch: full chunks skip the selects)
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (kRows * warp + r >= cc.nv) {
#pragma unroll
        for (int e = 0; e < kPer; ++e) xq[r][e] = xk[r][e] = xg[r][e] = 0.0f;
      }
    }
  }

  // G = inclusive cumsum over the rows (log2 units): the warp's rows in registers, then the column
  // totals of the warps above, added in order (the same additions that produced the last row of
  // the warp above, so G stays monotone across warp boundaries).
#pragma unroll
  for (int r = 1; r < kRows; ++r)
#pragma unroll
    for (int e = 0; e < kPer; ++e) xg[r][e] += xg[r - 1][e];
  store_run_smem<kPer>(sPart + warp * Tr::kK + d0, xg[kRows - 1]);
  __syncthreads();  // the totals; and every read of the boxes before the rows overwrite them
#pragma unroll
  for (int r = 0; r < kRows; ++r) {  // q and k first: their registers are free for the offsets
    const int i = kRows * warp + r;
    store_run_smem<kPer>(sQ + i * Tr::kLdX + d0, xq[r]);
    store_run_smem<kPer>(sK + i * Tr::kLdX + d0, xk[r]);
  }
  float off[kPer];
#pragma unroll
  for (int e = 0; e < kPer; ++e) off[e] = 0.0f;
  for (int w = 0; w < warp; ++w) {
    const Pack<float, kPer> part = load_pack<float, kPer>(sPart + w * Tr::kK + d0);
#pragma unroll
    for (int e = 0; e < kPer; ++e) off[e] += part.v[e];
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
#pragma unroll
    for (int e = 0; e < kPer; ++e) xg[r][e] += off[e];
    store_run_smem<kPer>(sG + (kRows * warp + r) * Tr::kLdX + d0, xg[r]);
  }
  // beta last: its line was prefetched to L2 at the start, so this is a short round trip.
  if (static_cast<int>(threadIdx.x) < Tr::kBT) {
    sBeta[threadIdx.x] =
        static_cast<int>(threadIdx.x) < cc.nv
            ? beta_activation(load_f32(p.beta, p.beta_dtype, (cc.t0 + threadIdx.x) * p.HV + hv),
                              p.beta_sigmoid, p.beta_scale)
            : 0.0f;
  }
  __syncthreads();
}

}  // namespace openkda::cuda::chunk_forward
