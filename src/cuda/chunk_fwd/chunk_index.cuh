// Sequence and chunk geometry of chunk_kda forward, built on the device (no host read of
// cu_seqlens, so the op is CUDA-graph capturable).
//
// What it computes:
//   sequence_span(n)    tokens [bos, bos + len) of sequence n: dense (bos = n T, len = T) or
//                       from cu_seqlens, clamped to 0 <= bos <= bos + len <= T so that no token
//                       access leaves the inputs and outputs (the core validates host-side
//                       cu_seqlens; device-side ones should be non-decreasing: decreasing ones
//                       give overlapping sequences, computed only up to the workspace's slots,
//                       launch_chunk_fwd.h).
//   chunk_offsets[n]    varlen: first global chunk of sequence n, the exclusive prefix sum of
//                       ceil(len / BT) (chunk_offsets[N] = chunks over all sequences), capped at
//                       the workspace's slots; FLA's prepare_chunk_offsets. Global chunk c0 + c
//                       indexes the chunk's workspace tiles (tile_image.h).
//   h_offsets[n]        varlen with h snapshots every h_every > 1 chunks: the same prefix sum of
//                       ceil(len / (BT h_every)), the caller's chunk_size (h's row index).
//   snapshot_base(n)    first row of h of sequence n: dense n NT_h, varlen h_offsets[n].
//   chunk_table[slot]   varlen: global chunk `slot`'s first token and valid rows, packed
//                       (kChunkEntryShift), 0 past the last chunk: every slot's (sequence, chunk)
//                       by binary search over chunk_offsets (empty sequences never match), once
//                       per slot here instead of once per (slot, value head) prep CTA.
//   seq_order[rank]     varlen: the sequences by chunk count, longest first (ties by index; the
//                       identity order when N > kMaxOrderedSeqs), the scan's CTA order: the
//                       block scheduler starts CTAs in index order as multiprocessors free up,
//                       so the longest chains start first and short ones fill in behind them
//                       (longest-processing-time-first list scheduling). Only where each chain
//                       runs changes, never what it computes.
//   resolve_chunk(slot) the token range of global chunk `slot`: dense by division, varlen from
//                       chunk_table.
//   zero_padding_rows   varlen: o = 0 on the rows outside [cu_seqlens[0], cu_seqlens[N]) (no
//                       sequence's, FLA's zero-filled output), spread over every thread of the
//                       grid that calls it.
// Grid mapping: openkda_fwd_chunk_index_kernel is one CTA of kIndexThreads threads; for the
// offsets thread i owns the contiguous sequences [i * per, (i + 1) * per), for the table the slots
// i, i + kIndexThreads, ...
// Shared memory: kIndexThreads / 32 int64 for the block scan, kMaxOrderedSeqs int32 chunk counts
// for the order (4 KB).
#pragma once

#include <cstdint>

#include "cuda/chunk_fwd/params.h"
#include "cuda/common/math.cuh"

namespace openkda::cuda::chunk_forward {

constexpr int kIndexThreads = 256;
// Sequences ranked for the scan's order at most (O(N^2 / kIndexThreads) comparisons per call: 4096
// per thread at the cap); more keep their index order.
constexpr int kMaxOrderedSeqs = 1024;

struct SeqSpan {
  int64_t bos = 0;
  int64_t len = 0;
};

__device__ __forceinline__ int64_t load_cu(const ChunkFwdParams& p, int64_t i) {
  return p.cu_i64 ? static_cast<const int64_t*>(p.cu_seqlens)[i]
                  : static_cast<int64_t>(static_cast<const int32_t*>(p.cu_seqlens)[i]);
}

__device__ __forceinline__ SeqSpan sequence_span(const ChunkFwdParams& p, int64_t n) {
  if (p.cu_seqlens == nullptr) return SeqSpan{n * p.T, p.T};
  const int64_t a = min(max(load_cu(p, n), int64_t{0}), p.T);
  const int64_t b = min(max(load_cu(p, n + 1), a), p.T);
  return SeqSpan{a, b - a};
}

// First global chunk of sequence n.
__device__ __forceinline__ int64_t chunk_base(const ChunkFwdParams& p, int64_t n) {
  return p.cu_seqlens == nullptr ? n * p.NT_b : static_cast<int64_t>(p.chunk_offsets[n]);
}

// The sequence of the scan's rank-th chain group (dense: rank itself).
__device__ __forceinline__ int64_t scan_sequence(const ChunkFwdParams& p, int64_t rank) {
  return p.cu_seqlens == nullptr ? rank : static_cast<int64_t>(p.seq_order[rank]);
}

// First row of h (the state entering every h_every-th chunk) of sequence n.
__device__ __forceinline__ int64_t snapshot_base(const ChunkFwdParams& p, int64_t n) {
  return p.cu_seqlens == nullptr ? n * p.NT_h : static_cast<int64_t>(p.h_offsets[n]);
}

// Chunks of sequence n: ceil(len / BT), or with cu_seqlens the offsets' difference, which equals
// it unless the device cu_seqlens decrease (sequences then overlap and build_chunk_offsets caps
// the offsets at the workspace's slots: the tail of such a sequence is not computed, but no slot
// past the workspace is touched).
__device__ __forceinline__ int64_t sequence_chunks(const ChunkFwdParams& p, int64_t n,
                                                   const SeqSpan& span) {
  if (p.cu_seqlens == nullptr) return (span.len + p.BT - 1) / p.BT;
  return static_cast<int64_t>(p.chunk_offsets[n + 1]) - p.chunk_offsets[n];
}

// One chunk: packed token rows t0 .. t0 + nv - 1 (1 <= nv <= BT).
struct ChunkCoord {
  int64_t t0 = 0;  // first packed token
  int nv = 0;      // valid rows
};

// chunk_table entries: t0 << kChunkEntryShift | nv (the kernels' chunk has at most 63 rows:
// plan.h's kKernelChunk); 0, nv = 0, for a slot past the last chunk.
constexpr int kChunkEntryShift = 6;

// Rows of chunk c of sequence n (nv <= 0 when the sequence has no chunk c).
__device__ __forceinline__ ChunkCoord chunk_rows(const ChunkFwdParams& p, int64_t n, int64_t c) {
  const SeqSpan s = sequence_span(p, n);
  return ChunkCoord{s.bos + c * p.BT,
                    static_cast<int>(min(static_cast<int64_t>(p.BT), s.len - c * p.BT))};
}

// Varlen: the rows of global chunk `slot` by binary search over chunk_offsets (nv = 0 past the
// last chunk).
__device__ __forceinline__ ChunkCoord locate_varlen_chunk(const ChunkFwdParams& p, int64_t slot) {
  if (slot >= p.chunk_offsets[p.N]) return ChunkCoord{};
  // Largest n with chunk_offsets[n] <= slot; then chunk_offsets[n + 1] > slot.
  int64_t lo = 0, hi = p.N;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (p.chunk_offsets[mid] <= slot)
      lo = mid;
    else
      hi = mid;
  }
  return chunk_rows(p, lo, slot - p.chunk_offsets[lo]);
}

// false when `slot` is past the last chunk (the prep grid is an upper bound in varlen mode).
__device__ __forceinline__ bool resolve_chunk(const ChunkFwdParams& p, int64_t slot,
                                              ChunkCoord& cc) {
  if (p.cu_seqlens != nullptr) {
    const int64_t e = p.chunk_table[slot];
    cc.t0 = e >> kChunkEntryShift;
    cc.nv = static_cast<int>(e & ((1 << kChunkEntryShift) - 1));
    return cc.nv > 0;
  }
  if (p.NT_b == 0) return false;
  // 32-bit: slot and NT_b are below the prep grid's 2^31 CTAs (launch.cu's can_implement), and
  // a 64-bit division is a subroutine of ~70 instructions in every prep CTA.
  const uint32_t nt = static_cast<uint32_t>(p.NT_b), s = static_cast<uint32_t>(slot);
  const uint32_t n = s / nt;
  if (n >= p.B) return false;
  cc = chunk_rows(p, n, s - n * nt);
  return cc.nv > 0;
}

// Varlen (B = 1): element e of the padding rows [0, lo) and [hi, T) (lo, hi: cu_seqlens[0] and
// cu_seqlens[N], clamped as in sequence_span) goes to the grid's thread e (mod its threads).
__device__ __forceinline__ void zero_padding_rows(const ChunkFwdParams& p) {
  const int64_t lo = min(max(load_cu(p, 0), int64_t{0}), p.T);
  const int64_t hi = min(max(load_cu(p, p.N), lo), p.T);
  if (lo == 0 && hi == p.T) return;  // no padding (the usual case): no grid-wide indices
  const int64_t row = int64_t{p.HV} * p.V;
  const int64_t pad = (lo + p.T - hi) * row;
  const int64_t threads = int64_t{gridDim.x} * gridDim.y * blockDim.x;
  const int64_t tid = (int64_t{blockIdx.y} * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t e = tid; e < pad; e += threads) {
    const int64_t r = e / row;
    store_f32(p.o, p.o_dtype, (r < lo ? r : hi + r - lo) * row + e % row, 0.0f);
  }
}

// out[0 .. N] = exclusive prefix sum of ceil(len_n / 2^shift) (varlen: the chunk lengths are
// powers of two, and shifts keep the 64-bit divisions' subroutine calls, which spilled, out of
// the loops), capped at `cap`. One CTA of kIndexThreads threads; ends with a block barrier, so it
// can be called again.
__device__ __forceinline__ void build_offsets(const ChunkFwdParams& p, int shift, int64_t cap,
                                              int32_t* out) {
  const int64_t round_up = (int64_t{1} << shift) - 1;
  // NOTE: 64-bit sums, capped only at the store: decreasing device cu_seqlens (overlapping
  // sequences) can sum to more than 2^31 chunks, which 32-bit sums would wrap to negative offsets.
  __shared__ int64_t sWarpSum[kIndexThreads / 32];
  const int tid = threadIdx.x;
  const int lane = tid % 32, warp = tid / 32;
  const int64_t per = (p.N + kIndexThreads - 1) / kIndexThreads;
  const int64_t first = tid * per;
  const int64_t last = min(first + per, p.N);

  int64_t local = 0;
  for (int64_t n = first; n < last; ++n) local += (sequence_span(p, n).len + round_up) >> shift;
  // Exclusive scan of the per-thread totals: inclusive within the warp, then over warp totals.
  int64_t incl = local;
#pragma unroll
  for (int m = 1; m < 32; m <<= 1) {
    const int64_t y = __shfl_up_sync(0xffffffffu, incl, m);
    if (lane >= m) incl += y;
  }
  if (lane == 31) sWarpSum[warp] = incl;
  __syncthreads();
  if (tid == 0) {
    int64_t run = 0;
    for (int w = 0; w < kIndexThreads / 32; ++w) {
      const int64_t s = sWarpSum[w];
      sWarpSum[w] = run;
      run += s;
    }
  }
  __syncthreads();
  // Capped (slots < 2^31 by chunk_fwd_can_implement; h's rows fit an int32 for any h that fits in
  // memory): more chunks than the cap only come from decreasing device cu_seqlens; the cap keeps
  // every index inside its buffer.
  int64_t off = sWarpSum[warp] + incl - local;
  if (tid == 0) out[0] = 0;
  for (int64_t n = first; n < last; ++n) {
    off += (sequence_span(p, n).len + round_up) >> shift;
    out[n + 1] = static_cast<int32_t>(min(off, cap));
  }
  __syncthreads();  // sWarpSum is free again
}

// seq_order: sequence n goes to rank #{m : c_m > c_n or (c_m = c_n and m < n)} (c: chunk counts
// from chunk_offsets, which the caller's block barrier made visible), a permutation; the identity
// past kMaxOrderedSeqs sequences. Ends with no barrier: nothing after it in the CTA reads it.
__device__ __forceinline__ void build_seq_order(const ChunkFwdParams& p) {
  if (p.N > kMaxOrderedSeqs) {
    for (int64_t n = threadIdx.x; n < p.N; n += kIndexThreads)
      p.seq_order[n] = static_cast<int32_t>(n);
    return;
  }
  __shared__ int32_t sChunks[kMaxOrderedSeqs];
  const int N = static_cast<int>(p.N);
  for (int n = threadIdx.x; n < N; n += kIndexThreads)
    sChunks[n] = p.chunk_offsets[n + 1] - p.chunk_offsets[n];
  __syncthreads();
  for (int n = threadIdx.x; n < N; n += kIndexThreads) {
    const int32_t c = sChunks[n];
    int rank = 0;
    for (int m = 0; m < N; ++m) rank += sChunks[m] > c || (sChunks[m] == c && m < n);
    p.seq_order[rank] = n;
  }
}

// chunk_offsets (capped at the workspace's slots), chunk_table and, with h snapshots every
// h_every > 1 chunks, h_offsets (capped at h's rows: writes past them are dropped anyway).
__device__ __forceinline__ void build_chunk_index(const ChunkFwdParams& p) {
  build_offsets(p, __ffs(p.BT) - 1, p.slots, p.chunk_offsets);  // ends with a block barrier
  for (int64_t slot = threadIdx.x; slot < p.slots; slot += kIndexThreads) {
    const ChunkCoord cc = locate_varlen_chunk(p, slot);
    p.chunk_table[slot] = cc.nv > 0 ? cc.t0 << kChunkEntryShift | cc.nv : 0;
  }
  build_seq_order(p);
  if (p.h_offsets != nullptr && p.h_offsets != p.chunk_offsets) {
    build_offsets(p, __ffs(p.BT * p.h_every) - 1, p.h_chunks, p.h_offsets);
  }
}

}  // namespace openkda::cuda::chunk_forward
