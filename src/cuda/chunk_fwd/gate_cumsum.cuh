// Stage 1 of the chunk_kda forward (prep kernel): load one chunk of one value head into shared
// memory in f32, with the token-wise activations applied, then the chunk-local gate cumsum.
// CPU twin: cpu/chunk_common.cpp prepare_inputs + cpu/chunk_fwd.cpp fwd_gate_cumsum.
//
// What it computes, for rows i < nv of the chunk (tokens t0 + i; value head hv, q/k head
// h = hv / group); rows i >= nv are zero (g = 0 there, so G stays at G_last):
//   sQ[i] = q_i * rstd(q_i), sK[i] = k_i * rstd(k_i)   rstd = 1 / sqrt(sum x^2 + 1e-6) with l2norm,
//                                                       else 1
//   sG[i] = g_i (pre-gated) | -exp(A_log) softplus(g_i + dt_bias) | L sigmoid(a (g_i + dt_bias))
//   sBeta[i] = beta_i | s sigmoid(beta_i), s = 2 with allow_neg_eigval
//   then sG[i] <- RCP_LN2 * sum_{r <= i} g_r   (G: chunk-local inclusive cumsum, log2 units)
// The cumsum is exactly monotone: with every g <= 0, G_i <= G_j for i >= j in f32 (each partial
// sum adds a non-positive term), so every exp2 argument of the later stages is <= 0.
//
// Grid mapping: one CTA (Tr::kThreads = 256) per (chunk, value head). Row passes: warp w owns rows
// w, w + 8, ...; lane l owns columns l * K / 32 .. (l + 1) * K / 32 - 1 (one vector access per
// row). Cumsum: thread (part, d) with d = tid % K scans rows part * kCumRows .. + kCumRows - 1 of
// column d in registers, then adds the sums of the parts above it, in order.
// Shared memory: sQ, sK, sG, sBeta of PrepTraits; the cumsum uses kCumParts * K floats of sScr.
#pragma once

#include <cstdint>

#include "cuda/chunk_fwd/chunk_index.cuh"
#include "cuda/chunk_fwd/io.cuh"
#include "cuda/chunk_fwd/mma.cuh"
#include "cuda/chunk_fwd/params.h"
#include "cuda/common/math.cuh"

namespace openkda::cuda::chunk_forward {

constexpr float kRcpLn2 = 1.4426950408889634f;  // 1 / ln 2, rounded to f32
constexpr float kL2NormEps = 1e-6f;

// Per-token log-decay (natural log) from x = g (+ dt_bias); `a` is the head factor exp(A_log).
__device__ __forceinline__ float gate_activation(const ChunkFwdParams& p, float x, float a) {
  switch (p.gate_mode) {
    case GateMode::kSoftplus: return -a * softplus_f32(x);
    case GateMode::kLowerBound: return p.lower_bound * sigmoid_f32(a * x);
    default: return x;
  }
}

__device__ __forceinline__ float beta_activation(const ChunkFwdParams& p, float b) {
  return p.beta_sigmoid ? p.beta_scale * sigmoid_f32(b) : b;
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

// q, k (l2-normalised when requested), the gate activation g and beta of rows [0, kBT).
template <class Tr>
__device__ __forceinline__ void load_chunk_inputs(const ChunkFwdParams& p, const ChunkCoord& cc,
                                                  int hv, float* sQ, float* sK, float* sG,
                                                  float* sBeta) {
  constexpr int kPer = Tr::kK / 32;  // columns per lane
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int h = hv / p.group;
  const int d0 = lane * kPer;

  // Gate parameters of this lane's columns (read only with the gate in kernel).
  float bias[kPer];
  float head_factor = 1.0f;
#pragma unroll
  for (int e = 0; e < kPer; ++e) bias[e] = 0.0f;
  if (p.gate_mode != GateMode::kPre) {
    if (p.dt_bias) {
#pragma unroll
      for (int e = 0; e < kPer; ++e) {
        bias[e] = load_elem(p.dt_bias, p.dt_bias_dtype, int64_t{hv} * Tr::kK + d0 + e);
      }
    }
    if (p.A_log) head_factor = exp_f32(load_elem(p.A_log, p.A_log_dtype, hv));
  }

  // Fully unrolled so that the loads of every row are issued before the first reduction.
#pragma unroll
  for (int i = warp; i < Tr::kBT; i += Tr::kWarps) {
    float xq[kPer], xk[kPer], xg[kPer];
    if (i < cc.nv) {
      const int64_t tok = cc.t0 + i;
      const int64_t qk_off = (tok * p.H + h) * Tr::kK + d0;
      const int64_t g_off = (tok * p.HV + hv) * Tr::kK + d0;
      load_run<kPer>(p.q, p.qk_dtype, qk_off, xq);
      load_run<kPer>(p.k, p.qk_dtype, qk_off, xk);
      load_run<kPer>(p.g, p.g_dtype, g_off, xg);
      if (p.l2norm) {
        float ssq = 0.0f, ssk = 0.0f;
#pragma unroll
        for (int e = 0; e < kPer; ++e) {
          ssq += xq[e] * xq[e];
          ssk += xk[e] * xk[e];
        }
        ssq = warp_allreduce_sum(ssq);
        ssk = warp_allreduce_sum(ssk);
        const float rq = 1.0f / sqrtf(ssq + kL2NormEps);
        const float rk = 1.0f / sqrtf(ssk + kL2NormEps);
#pragma unroll
        for (int e = 0; e < kPer; ++e) {
          xq[e] *= rq;
          xk[e] *= rk;
        }
      }
#pragma unroll
      for (int e = 0; e < kPer; ++e) xg[e] = gate_activation(p, xg[e] + bias[e], head_factor);
    } else {
#pragma unroll
      for (int e = 0; e < kPer; ++e) xq[e] = xk[e] = xg[e] = 0.0f;
    }
    store_run_smem<kPer>(sQ + i * Tr::kLdX + d0, xq);
    store_run_smem<kPer>(sK + i * Tr::kLdX + d0, xk);
    store_run_smem<kPer>(sG + i * Tr::kLdX + d0, xg);
  }
  for (int i = threadIdx.x; i < Tr::kBT; i += Tr::kThreads) {
    sBeta[i] = i < cc.nv ? beta_activation(p, load_elem(p.beta, p.beta_dtype,
                                                        (cc.t0 + i) * p.HV + hv))
                         : 0.0f;
  }
}

// sG <- RCP_LN2 * inclusive cumsum over the rows (in place). Starts and ends with a block barrier
// (the caller's writes of sG become visible; the result is visible to every thread on return).
template <class Tr>
__device__ __forceinline__ void chunk_cumsum(float* sG, float* sPart) {
  constexpr int kRows = Tr::kCumRows;
  const int d = threadIdx.x % Tr::kK;
  const int part = threadIdx.x / Tr::kK;
  __syncthreads();
  float x[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) x[r] = sG[(part * kRows + r) * Tr::kLdX + d];
#pragma unroll
  for (int r = 1; r < kRows; ++r) x[r] += x[r - 1];
  sPart[part * Tr::kK + d] = x[kRows - 1];
  __syncthreads();
  // Offset of this part: sum of the parts above it, in order (the same additions that produced
  // the last row of the part above, so G stays monotone across part boundaries).
  float off = 0.0f;
  for (int q = 0; q < part; ++q) off += sPart[q * Tr::kK + d];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    sG[(part * kRows + r) * Tr::kLdX + d] = (off + x[r]) * kRcpLn2;
  }
  __syncthreads();
}

}  // namespace openkda::cuda::chunk_forward
