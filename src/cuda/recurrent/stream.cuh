// openkda_fwd_recurrent_stream_kernel: fused_recurrent_kda forward (decode and speculative
// verify) for an fp32 state, the whole state of one (sequence, value head) streamed through
// shared memory by the bulk-copy engine.
//
// Why: decode moves the state (read once, written after every token in pool mode) and little
// else, so its speed is the share of HBM bandwidth it keeps busy. A state held in registers
// (kernel.cuh) costs ~160 registers a thread, which caps an SM at 12 warps, and every 16-byte
// move of the state is a thread's instruction. Here the contiguous K x V head (64 KB at K = V =
// 128) is one bulk load, completing on an mbarrier while the CTA loads the token inputs and
// computes the gate, and one bulk store per state written; the threads only compute, in two passes
// over the shared tile. Three CTAs fit per SM, so two heads stream while one computes.
//
// Grid: N * HV CTAs of StreamTraits::kThreads = 256 threads; CTA -> (hv, n), hv fastest. Thread
// tile: StreamTraits (traits.h), conflict-free 16-byte accesses on the unpadded tile.
//
// Per token t (tok = bos + t):
//   prologue  threads tid < K own row d = tid: alpha_d = exp(g_d) after the gate, alpha_d k_d,
//             alpha_d q_d and k_d (raw q, k), per-warp (q.q, k.k, q.k)           -> barrier A
//   (t = 0)   wait for the bulk load (or zero the thread's runs without an initial state)
//   pass 1    a = S^T (alpha k), b = S^T (alpha q) over the thread's runs, reduced over the lanes
//             that share columns ([K, V]: partials per row group into shared memory); thread 0
//             waits until the previous bulk store has read the tile                -> barrier B
//   combine   a *= rk, b *= rq scale (l2norm, scale); v' = beta (v - a); o = b + v' (k . q)
//   pass 2    S <- alpha S + k v'^T in place (k normalised); fence.proxy.async     -> barrier C
//   store     thread 0: bulk store of the tile to pool slot state_indices[n, t] (in place) or
//             final_state[tok] (pool mode)
// Without a pool: one bulk store of the final state into final_state[n] after the last token
// (also for an empty sequence: its initial state). In pool mode an empty sequence is untouched;
// a slot outside [0, num_slots) is neither read (zero state) nor written.
//
// Inputs / outputs: RecurrentParams (params.h); q/k/v/g/beta/o in any float dtype through
// run-time dtype loads; the state source and destination f32, 16-byte aligned (launch.cu).
// Shared memory: StreamSmem<Traits>, the tile (kHeadBytes) + 4 K token rows + per-warp sums +
// [K, V] partial sums: 69,712 bytes at K = V = 128 (three CTAs per SM).
// No atomics, no allocation; deterministic (fixed reduction order).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/bulk_copy.cuh"
#include "cuda/common/device.cuh"
#include "cuda/recurrent/token_inputs.cuh"
#include "cuda/recurrent/traits.h"

namespace openkda::cuda::recurrent {

template <class Tr>
struct StreamSmem {
  float4 state[Tr::kHeadElems / 4];  // S of the head in its memory layout (bulk-copy target)
  alignas(16) float alpha[Tr::kK];   // exp(g_d) after the gate
  alignas(16) float ak[Tr::kK];      // alpha_d k_d (raw k)
  alignas(16) float aq[Tr::kK];      // alpha_d q_d (raw q)
  alignas(16) float k[Tr::kK];       // raw k_d
  float4 sums[Tr::kPrologueWarps];   // per-warp (q.q, k.k, q.k, 0)
  // [K, V]: per row group, the warp-reduced (a, b) of 4 columns per run; kRowGroups = 1 and
  // unused for [V, K].
  float4 partial[Tr::kRowGroups][2][Tr::kV / 4];
  uint64_t bar;  // mbarrier of the state's bulk load
};

// One thread's place in the tile (StreamTraits): its first tile row, its first run (16-byte
// index into the tile) and, for [K, V], its segment and row group.
template <class Tr>
struct StreamLane {
  int row0;
  int run0;
  int seg;    // [K, V]: segment (32 columns); [V, K]: 0
  int group;  // [K, V]: row group; [V, K]: 0
  int seg_lane;
  int row_lane;

  __device__ __forceinline__ explicit StreamLane(int tid) {
    const int lane = tid & 31, warp = tid >> 5;
    seg_lane = lane & 7;
    row_lane = lane >> 3;
    seg = Tr::kVFirst ? 0 : warp % Tr::kSegments;
    group = Tr::kVFirst ? 0 : warp / Tr::kSegments;
    row0 = (Tr::kVFirst ? warp : group) * Tr::kWarpRows + row_lane;
    run0 = row0 * Tr::kRowRuns + seg * 8 + seg_lane;
  }

  // Run j < kRuns: row step j / kThreadSegments, segment j % kThreadSegments.
  __device__ __forceinline__ int run(int j) const {
    return run0 + (j / Tr::kThreadSegments) * 4 * Tr::kRowRuns + (j % Tr::kThreadSegments) * 8;
  }

  // Value column of the thread's column i < kColumns.
  __device__ __forceinline__ int column(int i) const {
    return Tr::kVFirst ? row0 + 4 * i : seg * 32 + seg_lane * 4 + i;
  }

  // [V, K]: first row d of segment s (4 consecutive d per run).
  __device__ __forceinline__ int d_of_segment(int s) const { return s * 32 + seg_lane * 4; }
};

__device__ __forceinline__ float dot4(const float4& x, const float4& y, float acc) {
  acc = fmaf(x.x, y.x, acc);
  acc = fmaf(x.y, y.y, acc);
  acc = fmaf(x.z, y.z, acc);
  return fmaf(x.w, y.w, acc);
}

// Prologue of one token: row d = tid writes alpha_d, alpha_d k_d, alpha_d q_d, k_d and the
// warp's partial dot products.
template <class Tr>
__device__ __forceinline__ void stream_prologue(const RecurrentParams& p, const RowInputs& in,
                                                float bias, float a_coef, int tid,
                                                StreamSmem<Tr>& sm) {
  if (tid >= Tr::kK) return;  // whole warps: K is a multiple of 32
  const RowValues r = row_values(p, in, bias, a_coef);
  sm.alpha[tid] = r.alpha;
  sm.ak[tid] = r.alpha * r.k;
  sm.aq[tid] = r.alpha * r.q;
  sm.k[tid] = r.k;
  store_row_sums(r.q, r.k, tid, sm.sums);
}

// Pass 1: a[i] = sum_d S[d, e_i] alpha_d k_d, b[i] likewise with q (raw q, k), over all d. For
// [K, V] the thread's rows are summed, then the row lanes; the row groups meet in combine_partials.
template <class Tr>
__device__ __forceinline__ void reduce_pass(const StreamSmem<Tr>& sm, const StreamLane<Tr>& ln,
                                            float (&a)[Tr::kColumns], float (&b)[Tr::kColumns]) {
  if constexpr (Tr::kVFirst) {
    // Segment-major: one segment's alpha k, alpha q in registers at a time (register budget).
#pragma unroll
    for (int r = 0; r < Tr::kRowSteps; ++r) a[r] = b[r] = 0.0f;
#pragma unroll
    for (int s = 0; s < Tr::kSegments; ++s) {
      const float4 ak4 = *reinterpret_cast<const float4*>(&sm.ak[ln.d_of_segment(s)]);
      const float4 aq4 = *reinterpret_cast<const float4*>(&sm.aq[ln.d_of_segment(s)]);
#pragma unroll
      for (int r = 0; r < Tr::kRowSteps; ++r) {
        const float4 x = sm.state[ln.run(r * Tr::kSegments + s)];
        a[r] = dot4(x, ak4, a[r]);
        b[r] = dot4(x, aq4, b[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < Tr::kRowSteps; ++r)
#pragma unroll
      for (int m = 1; m < 8; m <<= 1) {  // the 8 seg lanes of the row
        a[r] += __shfl_xor_sync(kFullMask, a[r], m);
        b[r] += __shfl_xor_sync(kFullMask, b[r], m);
      }
  } else {
#pragma unroll
    for (int m = 0; m < 4; ++m) a[m] = b[m] = 0.0f;
#pragma unroll
    for (int i = 0; i < Tr::kRowSteps; ++i) {
      const int d = ln.row0 + 4 * i;
      const float ak = sm.ak[d], aq = sm.aq[d];
      const float4 x = sm.state[ln.run(i)];
      const float xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        a[m] = fmaf(xs[m], ak, a[m]);
        b[m] = fmaf(xs[m], aq, b[m]);
      }
    }
#pragma unroll
    for (int m = 0; m < 4; ++m)
#pragma unroll
      for (int x = 8; x < 32; x <<= 1) {  // the 4 row lanes of the columns
        a[m] += __shfl_xor_sync(kFullMask, a[m], x);
        b[m] += __shfl_xor_sync(kFullMask, b[m], x);
      }
  }
}

// [K, V]: this warp's (a, b) of its row group into shared memory (row lane 0 of each column run).
template <class Tr>
__device__ __forceinline__ void store_partials(StreamSmem<Tr>& sm, const StreamLane<Tr>& ln,
                                               const float (&a)[Tr::kColumns],
                                               const float (&b)[Tr::kColumns]) {
  if constexpr (!Tr::kVFirst) {
    if (ln.row_lane == 0) {
      sm.partial[ln.group][0][ln.seg * 8 + ln.seg_lane] = make_float4(a[0], a[1], a[2], a[3]);
      sm.partial[ln.group][1][ln.seg * 8 + ln.seg_lane] = make_float4(b[0], b[1], b[2], b[3]);
    }
  }
}

// [K, V]: the sum over row groups, in group order (the same on every thread of the columns).
template <class Tr>
__device__ __forceinline__ void combine_partials(const StreamSmem<Tr>& sm, const StreamLane<Tr>& ln,
                                                 float (&a)[Tr::kColumns],
                                                 float (&b)[Tr::kColumns]) {
  if constexpr (!Tr::kVFirst) {
    float4 sa = sm.partial[0][0][ln.seg * 8 + ln.seg_lane];
    float4 sb = sm.partial[0][1][ln.seg * 8 + ln.seg_lane];
#pragma unroll
    for (int g = 1; g < Tr::kRowGroups; ++g) {
      const float4 xa = sm.partial[g][0][ln.seg * 8 + ln.seg_lane];
      const float4 xb = sm.partial[g][1][ln.seg * 8 + ln.seg_lane];
      sa = make_float4(sa.x + xa.x, sa.y + xa.y, sa.z + xa.z, sa.w + xa.w);
      sb = make_float4(sb.x + xb.x, sb.y + xb.y, sb.z + xb.z, sb.w + xb.w);
    }
    a[0] = sa.x, a[1] = sa.y, a[2] = sa.z, a[3] = sa.w;
    b[0] = sb.x, b[1] = sb.y, b[2] = sb.z, b[3] = sb.w;
  }
}

// Pass 2: S[d, e] <- alpha_d S[d, e] + (k_d rk) v'_e on the thread's runs.
template <class Tr>
__device__ __forceinline__ void update_pass(StreamSmem<Tr>& sm, const StreamLane<Tr>& ln, float rk,
                                            const float (&vn)[Tr::kColumns]) {
  if constexpr (Tr::kVFirst) {
#pragma unroll
    for (int s = 0; s < Tr::kSegments; ++s) {
      const float4 al4 = *reinterpret_cast<const float4*>(&sm.alpha[ln.d_of_segment(s)]);
      const float4 k4 = *reinterpret_cast<const float4*>(&sm.k[ln.d_of_segment(s)]);
      const float4 kn4 = make_float4(k4.x * rk, k4.y * rk, k4.z * rk, k4.w * rk);
#pragma unroll
      for (int r = 0; r < Tr::kRowSteps; ++r) {
        float4& x = sm.state[ln.run(r * Tr::kSegments + s)];
        float4 y = x;
        y.x = fmaf(al4.x, y.x, kn4.x * vn[r]);
        y.y = fmaf(al4.y, y.y, kn4.y * vn[r]);
        y.z = fmaf(al4.z, y.z, kn4.z * vn[r]);
        y.w = fmaf(al4.w, y.w, kn4.w * vn[r]);
        x = y;
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < Tr::kRowSteps; ++i) {
      const int d = ln.row0 + 4 * i;
      const float al = sm.alpha[d], kn = sm.k[d] * rk;
      float4& x = sm.state[ln.run(i)];
      float4 y = x;
      y.x = fmaf(al, y.x, kn * vn[0]);
      y.y = fmaf(al, y.y, kn * vn[1]);
      y.z = fmaf(al, y.z, kn * vn[2]);
      y.w = fmaf(al, y.w, kn * vn[3]);
      x = y;
    }
  }
}

extern __shared__ float4 openkda_recurrent_stream_smem[];  // StreamSmem<Traits>, dynamic

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocksPerSm)
    openkda_fwd_recurrent_stream_kernel(const __grid_constant__ RecurrentParams p) {
  StreamSmem<Tr>& sm = *reinterpret_cast<StreamSmem<Tr>*>(openkda_recurrent_stream_smem);
  const int tid = threadIdx.x;
  const int hv = static_cast<int>(blockIdx.x % static_cast<unsigned>(p.HV));
  const int n = static_cast<int>(blockIdx.x / static_cast<unsigned>(p.HV));
  const int h = hv / p.group;

  const TokenSpan span = token_span(p, n);
  const int64_t bos = span.bos, len = span.len;
  // Pool mode: an empty slot is untouched. Without a pool an empty sequence still writes its
  // final state (the initial one).
  if (len <= 0 && !p.store_final) return;

  const uint32_t tile = smem_address(sm.state), bar = smem_address(&sm.bar);
  const int64_t src_row = initial_state_row(p, n);  // uniform over the CTA
  if (tid == 0) {
    mbarrier_init(bar, 1);
    fence_mbarrier_init();
    if (src_row >= 0) {
      mbarrier_expect_tx(bar, Tr::kHeadBytes);
      bulk_load(tile, static_cast<const float*>(p.h0) + (src_row * p.HV + hv) * Tr::kHeadElems,
                Tr::kHeadBytes, bar);
    }
  }

  const StreamLane<Tr> ln(tid);
  const auto column_of = [&](int i) { return ln.column(i); };
  RowInputs row{};
  ColumnInputs<Tr::kColumns> col{};
  if (len > 0) {
    row = load_row_inputs<Tr>(p, bos, 0, n, h, hv, tid);
    col = load_column_inputs<Tr::kV, Tr::kColumns>(p, bos, hv, column_of);
  }
  uint32_t bias_bits = 0, A_bits = 0;
  if (p.gate_in_kernel) {
    if (p.dt_bias != nullptr && tid < Tr::kK)
      bias_bits = load_bits(p.dt_bias, p.dt_bias_dtype, static_cast<int64_t>(hv) * Tr::kK + tid);
    if (p.A_log != nullptr) A_bits = load_bits(p.A_log, p.A_log_dtype, hv);
  }
  const float bias = p.dt_bias != nullptr ? bits_to_f32(bias_bits, p.dt_bias_dtype) : 0.0f;
  const float a_coef =
      p.A_log != nullptr ? exp_f32(bits_to_f32(A_bits, p.A_log_dtype)) : p.a_default;

  // After a barrier that follows the mbarrier's initialisation: the initial state in the tile.
  const auto acquire_state = [&] {
    if (src_row >= 0) {
      mbarrier_wait(bar, 0);
    } else {
#pragma unroll
      for (int j = 0; j < Tr::kRuns; ++j) sm.state[ln.run(j)] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };

  bool store_pending = false;  // thread 0: a bulk store may still be reading the tile
  for (int64_t t = 0; t < len; ++t) {
    // Prefetch token t + 1 (its latency overlaps this token).
    RowInputs next_row = row;
    ColumnInputs<Tr::kColumns> next_col = col;
    if (t + 1 < len) {
      next_row = load_row_inputs<Tr>(p, bos + t + 1, t + 1, n, h, hv, tid);
      next_col = load_column_inputs<Tr::kV, Tr::kColumns>(p, bos + t + 1, hv, column_of);
    }
    // NOTE: the token rows and partial sums are single-buffered: their last reads (pass 2 and
    // combine of token t - 1) precede barrier C of token t - 1.
    stream_prologue<Tr>(p, row, bias, a_coef, tid, sm);
    __syncthreads();  // A
    if (t == 0) acquire_state();
    const TokenNorms nm = token_norms<Tr::kPrologueWarps>(p, sm.sums);

    float a[Tr::kColumns], b[Tr::kColumns];
    reduce_pass<Tr>(sm, ln, a, b);
    store_partials<Tr>(sm, ln, a, b);
    if (tid == 0 && store_pending) bulk_wait_read();  // pass 2 rewrites the tile
    __syncthreads();                                  // B
    combine_partials<Tr>(sm, ln, a, b);

    float vn[Tr::kColumns];
#pragma unroll
    for (int i = 0; i < Tr::kColumns; ++i) {
      a[i] *= nm.rk;
      b[i] *= nm.q_scale;
    }
    delta_values(p, col, a, vn);
    const bool writes_o = Tr::kVFirst ? ln.seg_lane == 0 : ln.group == 0 && ln.row_lane == 0;
    if (writes_o) {
      const int64_t row_v = ((bos + t) * p.HV + hv) * Tr::kV;
#pragma unroll
      for (int i = 0; i < Tr::kColumns; ++i)
        store_f32(p.o, p.o_dtype, row_v + ln.column(i), fmaf(vn[i], nm.kq, b[i]));
    }
    update_pass<Tr>(sm, ln, nm.rk, vn);
    fence_proxy_async_shared();
    __syncthreads();  // C

    if (tid == 0 && p.store_each_token) {
      const int64_t dst = p.inplace ? index_from_bits(row.slot, p.idx_dtype) : bos + t;
      if (!p.inplace || (dst >= 0 && dst < p.num_slots)) {
        bulk_store(static_cast<float*>(p.ht) + (dst * p.HV + hv) * Tr::kHeadElems, tile,
                   Tr::kHeadBytes);
        bulk_commit();
        store_pending = true;
      }
    }
    row = next_row;
    col = next_col;
  }
  if (p.store_final) {
    if (len <= 0) {
      __syncthreads();  // the mbarrier's initialisation
      acquire_state();
      fence_proxy_async_shared();
      __syncthreads();
    }
    if (tid == 0) {
      bulk_store(static_cast<float*>(p.ht) + (static_cast<int64_t>(n) * p.HV + hv) * Tr::kHeadElems,
                 tile, Tr::kHeadBytes);
      bulk_commit();
      store_pending = true;
    }
  }
  if (tid == 0 && store_pending) bulk_wait_read();  // the tile outlives its last bulk store
}

// Enqueues the kernel for p (N * HV CTAs; the caller checked the grid fits) after raising its
// dynamic shared-memory limit (once per device).
template <class Tr>
cudaError_t launch_recurrent_stream(const RecurrentParams& p, cudaStream_t stream) {
  const long long blocks = static_cast<long long>(p.N) * p.HV;
  if (blocks == 0) return cudaSuccess;
  const auto kernel = &openkda_fwd_recurrent_stream_kernel<Tr>;
  constexpr int kSmem = static_cast<int>(sizeof(StreamSmem<Tr>));
  const cudaError_t err = set_max_dynamic_smem_once<StreamSmem<Tr>>(kernel, kSmem, true);
  if (err != cudaSuccess) return err;
  kernel<<<static_cast<unsigned>(blocks), Tr::kThreads, kSmem, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace openkda::cuda::recurrent

// Explicit instantiation of the streaming launcher for one compiled configuration.
#define OPENKDA_INSTANTIATE_RECURRENT_STREAM(K, V, V_FIRST)               \
  template cudaError_t openkda::cuda::recurrent::launch_recurrent_stream< \
      openkda::cuda::recurrent::StreamTraits<K, V, V_FIRST>>(             \
      const openkda::cuda::recurrent::RecurrentParams&, cudaStream_t)
