// Kernels of fused_kda_gate. Stages are in gate.cuh, the launch plan in traits.h.
//
//   openkda_fwd_gate_kernel         y = gate(g)                       grid (col blocks, row blocks)
//   openkda_bwd_gate_kernel         dg = gate'(g) * dy, and per-column partial sums of ddt_bias
//                                   and dA_log per row block -> workspace [grid_y, C] f32
//   openkda_bwd_gate_reduce_kernel  fixed-order sums of the partials -> ddt_bias [C], dA_log [HV]
//
// No atomics: every sum runs in an order fixed by the launch plan (which depends only on the
// shapes), so the backward pass is bitwise deterministic.
#pragma once

#include <cstdint>

#include "cuda/common/math.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/gate/gate.cuh"
#include "cuda/gate/traits.h"

namespace openkda::cuda {

// dt_bias of a thread's kVec columns (0 when undefined).
template <int kVec>
__device__ __forceinline__ void load_bias(const GateParams& p, int64_t c0, float (&bias)[kVec]) {
#pragma unroll
  for (int v = 0; v < kVec; ++v) {
    bias[v] = p.dt_bias ? load_f32(p.dt_bias, p.dt_bias_dtype, c0 + v) : 0.0f;
  }
}

// ---- forward ----------------------------------------------------------------------------------
// Block: block_x x block_y threads (traits.h). Shared memory: none.
template <typename TIn, typename TOut, int kVec>
__global__ void __launch_bounds__(GateTraits::kThreads)
    openkda_fwd_gate_kernel(const GateParams p) {
  constexpr int kUnroll = GateTraits::kUnroll;
  const int64_t c0 = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) * kVec;
  if (c0 >= p.cols) return;

  const float head_factor = gate_head_factor(p, c0 / p.head_dim);
  float bias[kVec];
  load_bias<kVec>(p, c0, bias);

  const TIn* __restrict__ gG = static_cast<const TIn*>(p.g);
  TOut* __restrict__ gY = static_cast<TOut*>(p.y);
  const int64_t step = int64_t{gridDim.y} * blockDim.y;
  for (int64_t r = int64_t{blockIdx.y} * blockDim.y + threadIdx.y; r < p.rows;
       r += step * kUnroll) {
    // Issue every row's load before the first use: kUnroll independent requests in flight.
    Pack<TIn, kVec> rG[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t row = r + u * step;
      if (row < p.rows) rG[u] = load_pack<TIn, kVec>(gG + row * p.cols + c0);
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t row = r + u * step;
      if (row >= p.rows) break;
      Pack<TOut, kVec> rY;
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        rY.v[v] = from_f32<TOut>(gate_fwd(p, to_f32(rG[u].v[v]) + bias[v], head_factor));
      }
      store_pack<TOut, kVec>(gY + row * p.cols + c0, rY);
    }
  }
}

// ---- backward, pass 1 -------------------------------------------------------------------------
// Block: block_x x block_y threads; gridDim.y == p.partial_rows.
// Shared memory: 2 x kThreads x kVec f32 (16 KB for kVec = 8), laid out [y][v][x] so that a warp's
// consecutive x hit consecutive banks.
template <typename TG, typename TDy, int kVec>
__global__ void __launch_bounds__(GateTraits::kThreads, GateTraits::kBwdMinBlocksPerSm)
    openkda_bwd_gate_kernel(const GateParams p) {
  constexpr int kUnroll = GateTraits::kBwdUnroll<TG, TDy, kVec>;
  __shared__ float sDdtBias[GateTraits::kThreads * kVec];
  __shared__ float sDALog[GateTraits::kThreads * kVec];

  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  const int64_t c0 = (int64_t{blockIdx.x} * blockDim.x + tx) * kVec;
  const bool active = c0 < p.cols;  // inactive threads still join the block reduction

  // Running sums over this thread's rows, per column, in row order.
  float rDdtBias[kVec];
  float rDALog[kVec];
#pragma unroll
  for (int v = 0; v < kVec; ++v) rDdtBias[v] = rDALog[v] = 0.0f;

  if (active) {
    const float head_factor = gate_head_factor(p, c0 / p.head_dim);
    float bias[kVec];
    load_bias<kVec>(p, c0, bias);

    const TG* __restrict__ gG = static_cast<const TG*>(p.g);
    const TDy* __restrict__ gDy = static_cast<const TDy*>(p.dy);
    TG* __restrict__ gDg = static_cast<TG*>(p.dg);
    const int64_t step = int64_t{gridDim.y} * blockDim.y;
    for (int64_t r = int64_t{blockIdx.y} * blockDim.y + ty; r < p.rows; r += step * kUnroll) {
      Pack<TG, kVec> rG[kUnroll];
      Pack<TDy, kVec> rDy[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t row = r + u * step;
        if (row < p.rows) {
          rG[u] = load_pack<TG, kVec>(gG + row * p.cols + c0);
          rDy[u] = load_pack<TDy, kVec>(gDy + row * p.cols + c0);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t row = r + u * step;
        if (row >= p.rows) break;
        Pack<TG, kVec> rDg;
#pragma unroll
        for (int v = 0; v < kVec; ++v) {
          const float x = to_f32(rG[u].v[v]) + bias[v];
          float dA_term;
          const float dx = gate_bwd(p, x, to_f32(rDy[u].v[v]), head_factor, dA_term);
          rDg.v[v] = from_f32<TG>(dx);
          rDdtBias[v] += dx;
          rDALog[v] += dA_term;
        }
        store_pack<TG, kVec>(gDg + row * p.cols + c0, rDg);
      }
    }
  }

  if (p.ws_ddt_bias == nullptr && p.ws_dA_log == nullptr) return;  // uniform: no reduction

  // Tree over the block's rows (y), fixed order: y += y + s for s = block_y / 2, ..., 1.
  const int bx = blockDim.x;
  const auto at = [&](int y, int v) { return (y * kVec + v) * bx + tx; };
#pragma unroll
  for (int v = 0; v < kVec; ++v) {
    sDdtBias[at(ty, v)] = rDdtBias[v];
    sDALog[at(ty, v)] = rDALog[v];
  }
  __syncthreads();
  for (int s = blockDim.y / 2; s > 0; s /= 2) {
    if (ty < s) {
#pragma unroll
      for (int v = 0; v < kVec; ++v) {
        sDdtBias[at(ty, v)] += sDdtBias[at(ty + s, v)];
        sDALog[at(ty, v)] += sDALog[at(ty + s, v)];
      }
    }
    __syncthreads();
  }
  if (ty == 0 && active) {
    const int64_t base = int64_t{blockIdx.y} * p.cols + c0;
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      if (p.ws_ddt_bias) p.ws_ddt_bias[base + v] = sDdtBias[at(0, v)];
      if (p.ws_dA_log) p.ws_dA_log[base + v] = sDALog[at(0, v)];
    }
  }
}

// ---- backward, pass 2 -------------------------------------------------------------------------
// Blocks [0, n_bias): ddt_bias for kReduceCols columns each; thread (x, y) sums partial rows
// y, y + kReduceRows, ... of column x in order, then a tree over y.
// Blocks [n_bias, n_bias + HV): dA_log[h]; thread t sums the head's [partial_rows, K] partials at
// flat positions t, t + kReduceThreads, ... in order, then a tree over the block.
// Shared memory: kReduceThreads f32 (1 KB).
__global__ void __launch_bounds__(GateTraits::kReduceThreads)
    openkda_bwd_gate_reduce_kernel(const GateParams p) {
  using Tr = GateTraits;
  __shared__ float sSum[Tr::kReduceThreads];
  const int t = threadIdx.x;
  const int64_t n_bias = p.ws_ddt_bias ? (p.cols + Tr::kReduceCols - 1) / Tr::kReduceCols : 0;

  if (int64_t{blockIdx.x} < n_bias) {
    const int x = t % Tr::kReduceCols;
    const int y = t / Tr::kReduceCols;
    const int64_t c = int64_t{blockIdx.x} * Tr::kReduceCols + x;
    float acc = 0.0f;
    if (c < p.cols) {
      for (int64_t r = y; r < p.partial_rows; r += Tr::kReduceRows) {
        acc += p.ws_ddt_bias[r * p.cols + c];
      }
    }
    sSum[t] = acc;
    __syncthreads();
    for (int s = Tr::kReduceRows / 2; s > 0; s /= 2) {
      if (y < s) sSum[t] += sSum[t + s * Tr::kReduceCols];
      __syncthreads();
    }
    if (y == 0 && c < p.cols) store_f32(p.ddt_bias, p.ddt_bias_dtype, c, sSum[t]);
    return;
  }

  const int64_t head = int64_t{blockIdx.x} - n_bias;
  const int64_t n = p.partial_rows * p.head_dim;
  const float* __restrict__ ws = p.ws_dA_log + head * p.head_dim;
  float acc = 0.0f;
  for (int64_t e = t; e < n; e += Tr::kReduceThreads) {
    const int64_t r = e / p.head_dim;
    acc += ws[r * p.cols + (e - r * p.head_dim)];
  }
  sSum[t] = acc;
  __syncthreads();
  for (int s = Tr::kReduceThreads / 2; s > 0; s /= 2) {
    if (t < s) sSum[t] += sSum[t + s];
    __syncthreads();
  }
  if (t == 0) store_f32(p.dA_log, p.dA_log_dtype, head, sSum[0]);
}

}  // namespace openkda::cuda
