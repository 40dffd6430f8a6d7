// Time split of the chunk_kda forward's scan, for dense batches and single varlen sequences whose
// N * HV state chains would leave most multiprocessors idle (B = 1, T = 65536, H = 16: 16 chains
// of 2048 chunks each). A varlen sequence's segments cover the most chunks it can have,
// ceil(T / BT) (plan.h); a segment past its end is empty: its transition is the identity (Z_s = 0,
// M_s = I, the augmented state's start), the combine passes the state through it, and its output
// CTAs compute nothing and write no final state (the segment with the last chunk writes it).
// CPU twins: cpu/chunk_fwd.h fwd_segment_transition and fwd_segment_combine (the same passes;
// tests/cpp/test_chunk_segments.cpp chains them against the serial scan).
//
// Over one segment of chunks the state map is affine, S_end = M_s S_start + Z_s, with
//   Z_s = the segment's final state from S_start = 0 (the scan with the real v)
//   M_s = A_last ... A_first,  A_c = diag(gamma_c) - kg_c^T w_c  [K, K]
// (the scan's update S' = diag(gamma) S + kg^T (u - w S) is A_c S + kg^T u, with w = Tinv' ke and
// u = Tinv' v: state.cuh). Three passes:
//   1. transition (openkda_fwd_scan_kernel with kTransition): every segment at once, on the
//      augmented state [S | M] of V + K columns: M's columns start at the identity and see v = 0,
//      so each follows S' = A_c S. No outputs; (Z_s | M_s) -> seg_state.
//   2. combine (openkda_fwd_segment_combine_kernel, below): per chain, in segment order,
//      S_{s+1} = M_s S_s + Z_s from S_0 = h0, f32 FMAs (no tensor-core rounding) -> seg_init.
//   3. output (openkda_fwd_scan_kernel): every segment at once from its entering state (h0 for
//      s = 0, seg_init after): o, the h snapshots, and the final state from the last segment.
// Exactly causal (segment s reads only chunks before it) and bitwise deterministic (every sum has
// a fixed order). The work is ~2.5x the plain scan's (pass 1 carries V + K columns), spread over
// nseg times more CTAs; launch.cu picks nseg so that pass 3 fills the multiprocessors once at
// two CTAs per multiprocessor (kSplitCtasPerSm).
//
// Combine grid: one CTA of kCombineThreads per (chain n * HV + hv, block of kCombineCols value
// columns): 128 CTAs for B = 1, T = 65536, H = 16. Thread tid owns state row d = tid /
// (kCombineThreads / K) and kCombineCols / (kCombineThreads / K) consecutive columns. The chain is
// serial over the segments, so each step's loads are issued a step ahead: M_{s + 1} by cp.async
// into the other of two sM buffers, Z_{s + 1} into registers, both while step s multiplies (with
// one buffer and the loads at the top of each step, the loads' latency was most of the pass).
// Shared memory: sM [2][K][K + 1] (M_s; the +1 pad puts the rows that one warp reads in different
// banks) and sS [K][kCombineCols] (S_s of the block): 137 KB at K = 128, one CTA per SM.
#pragma once

#include <cstdint>

#include "cuda/chunk_fwd/params.h"
#include "cuda/chunk_fwd/state.cuh"
#include "cuda/common/bulk_copy.cuh"
#include "cuda/common/math.cuh"

namespace openkda::cuda::chunk_forward {

constexpr int kCombineThreads = 256;
constexpr int kCombineCols = 16;

template <int kK>
constexpr size_t combine_smem_bytes() {
  return sizeof(float) * (2 * kK * (kK + 1) + kK * kCombineCols);
}
static_assert(combine_smem_bytes<128>() <= kMaxDynamicSmem, "combine: two M_s buffers per CTA");

template <int kK>
__device__ __forceinline__ void combine_segments(const ChunkFwdParams& p) {
  constexpr int kRowThreads = kCombineThreads / kK;  // threads per state row (2 or 4)
  constexpr int kCols = kCombineCols / kRowThreads;  // columns per thread (8 or 4)
  static_assert(kCombineThreads % kK == 0 && kCombineCols % kRowThreads == 0, "thread tiling");
  extern __shared__ float4 smem_f4[];
  float* sM = reinterpret_cast<float*>(smem_f4);  // buffer b at sM + b * kMFloats
  constexpr int kMFloats = kK * (kK + 1);
  float* sS = sM + 2 * kMFloats;

  const int64_t chain = blockIdx.x;  // n * HV + hv
  const int hv = static_cast<int>(chain % p.HV);
  const int64_t n = chain / p.HV;
  const int vb = kCombineCols * static_cast<int>(blockIdx.y);
  const int tid = static_cast<int>(threadIdx.x);
  const int d = tid / kRowThreads, c0 = kCols * (tid % kRowThreads);
  const int ld_state = p.V + kK;  // seg_state rows: Z_s then M_s
  const int steps = p.nseg - 1;   // S_{s + 1} for s < steps
  const auto seg_state = [&](int s) {
    return p.seg_state + (chain * p.nseg + s) * int64_t{kK} * ld_state;
  };
  // M_s into sM buffer s % 2, as one commit group per thread.
  const auto load_m = [&](int s) {
    const float* src = seg_state(s) + p.V;
    float* dst = sM + (s % 2) * kMFloats;
    for (int i = tid; i < kK * kK; i += kCombineThreads) {
      const int r = i / kK, m = i % kK;
      cp_async_4(dst + r * (kK + 1) + m, src + int64_t{r} * ld_state + m);
    }
    cp_async_commit();
  };
  const auto load_z = [&](int s, float(&z)[kCols]) {
    const float* src = seg_state(s) + int64_t{d} * ld_state + vb + c0;
#pragma unroll
    for (int c = 0; c < kCols; ++c) z[c] = src[c];
  };

  if (steps > 0) load_m(0);
  if (steps > 1) load_m(1);
  float z[kCols];
  if (steps > 0) load_z(0, z);
  // S_0 = h0 (zeros when absent), in h0's dtype and layout.
  for (int i = tid; i < kK * kCombineCols; i += kCombineThreads) {
    const int m = i / kCombineCols, c = i % kCombineCols;
    sS[i] = p.h0 == nullptr ? 0.0f
                            : load_f32(p.h0, p.h0_dtype,
                                       state_index((n * p.HV + hv) * int64_t{kK} * p.V, kK, p.V,
                                                   p.v_first, m, vb + c));
  }
  for (int s = 0; s < steps; ++s) {
    // This thread's copies of M_s have landed (M_{s + 1}'s may still be in flight) ...
    if (s + 1 < steps) {
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // ... and everyone's, with sS of the step before
    float acc[kCols];
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[c] = z[c];
    if (s + 1 < steps) load_z(s + 1, z);  // in flight while this step multiplies
    const float* sMs = sM + (s % 2) * kMFloats;
#pragma unroll 2
    for (int m = 0; m < kK; ++m) {
      const float mdm = sMs[d * (kK + 1) + m];
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[c] = fmaf(mdm, sS[m * kCombineCols + c0 + c], acc[c]);
    }
    __syncthreads();  // every read of sS and of sM buffer s % 2 done
    if (s + 2 < steps) load_m(s + 2);
    float* init = p.seg_init + (chain * p.nseg + s + 1) * int64_t{kK} * p.V;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      sS[d * kCombineCols + c0 + c] = acc[c];
      init[int64_t{d} * p.V + vb + c0 + c] = acc[c];
    }
  }
}

}  // namespace openkda::cuda::chunk_forward
