// Kernels of the chunk_kda forward: compositions of the stages in chunk_index.cuh,
// gate_cumsum.cuh, intra.cuh, wy.cuh, state.cuh and scan_io.cuh (docs/design.md section 3). Their
// launchers and explicit instantiations are in launchers.cuh.
//
//   openkda_fwd_chunk_index_kernel  varlen only: chunk_offsets = exclusive cumsum of
//                                   ceil(len / BT), every slot's token range
//                                   (chunk_table), and h_offsets of ceil(len /
//                                   chunk_size) when h is taken every second
//                                   chunk                                       grid (1)
//   openkda_fwd_prep_kernel         stages 1-3 per (chunk, value head): l2norm, gate, beta,
//                                   G cumsum, A_qk, A_kk, Tinv, Tinv', ke, qg, kg^T, gamma
//                                   (and an f32 copy of an f32 / f64 v) -> workspace;
//                                   varlen: o = 0 on the padding rows; three compiled
//                                   paths (traits.h: PrepPath)
//                                  grid (slots * HV), hv fastest; with the hand-off prep_ctas
//                                  persistent CTAs over the same items (handoff.cuh)
//   openkda_fwd_scan_kernel         stages 4-5 per (sequence, value head, segment, V slice): h
//                                   snapshots, v_new = Tinv' (v - ke S), o, state update,
//                                   final state
//                                                                grid (N * HV * nseg * vsplit)
//   time split only (nseg > 1, segments.cuh), before the scan above:
//     openkda_fwd_scan_kernel<.., kTransition>  per segment: (Z_s | M_s) -> workspace
//                                                                grid (N * HV * nseg * (V + K) /
//                                                                64)
//     openkda_fwd_segment_combine_kernel        per chain: the state entering every segment
//                                                                grid (N * HV, V / 16)
//
// All of them run on the caller's stream in this order; nothing synchronises the host. With the
// prep / scan hand-off (handoff.cuh) the scan runs beside the prep, waiting on per-tile ready
// marks. Every reduction has a fixed order (the hand-off's atomics only hand out items), so
// results are bitwise reproducible.
//
// Precision map (README.md in this folder has the whole of it): inputs are read in their dtype
// and converted to f32; every intermediate (G, A_qk, A_kk, Tinv, Tinv', ke, qg, kg, R, v_new, the
// state) is f32 in shared memory, registers and the workspace (a bf16 / f16 v reaches the scan
// unchanged, by tensor-map boxes, and is widened exactly there); products are tf32 tensor-core mma
// / wgmma with f32 accumulation (operands rounded to nearest to 10 mantissa bits, except the scan's
// S^T operand of X^T and O^T, which the tensor core truncates: state.cuh), or, with f16 keys
// (params.h: f16_keys_apply), X^T, O^T, the O^T update and the state update f16 wgmma on f16 ke /
// qg / kg / A_qk tiles and row-scaled f16 copies of S^T and v_new^T (10 mantissa bits, rounded
// to nearest; f16_operands.cuh's range guard); exp2 factors
// that become tensor-core operands use ex2.approx (exp2_operand), the lower-bound gate
// inv_one_plus_exp2_fast, everything else CUDA's accurate f32 functions; the state update scales S
// by gamma in f32 and accumulates v_new^T kg in the wgmma. Outputs are rounded once, to o's and h's
// dtypes; the final state is f32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/chunk_fwd/chunk_index.cuh"
#include "cuda/chunk_fwd/gate_cumsum.cuh"
#include "cuda/chunk_fwd/handoff.cuh"
#include "cuda/chunk_fwd/intra.cuh"
#include "cuda/chunk_fwd/params.h"
#include "cuda/chunk_fwd/segments.cuh"
#include "cuda/chunk_fwd/state.cuh"
#include "cuda/chunk_fwd/traits.h"
#include "cuda/chunk_fwd/wy.cuh"
#include "cuda/common/device.cuh"

namespace openkda::cuda::chunk_forward {

// ---- chunk index (varlen) -----------------------------------------------------------------------
template <int kThreads>
__global__ void __launch_bounds__(kThreads) openkda_fwd_chunk_index_kernel(const ChunkFwdParams p) {
  static_assert(kThreads == kIndexThreads, "one thread per sequence range");
  build_chunk_index(p);
}

// ---- prep: one CTA per (chunk, value head), or a persistent grid with the hand-off ------------
// Shared memory lifetimes (PrepTraits), per chunk:
//   load (+ cumsum)                 sQ = q, sK = k, sG = G, sBeta; sA = the warps' column totals
//   intra + inverse                 sA = A_kk, then (warp 0) sA <- Tinv (diagonal blocks, then
//                                   sScr = P_rc); qg, ke, kg, gamma -> workspace (free warps)
//   WY factor                       Tinv' = Tinv diag(beta) -> workspace; v -> workspace (with
//                                   the hand-off the next item's input boxes land in sQ, sK, sG)

// Stages 1-3 of one (chunk, value head): its input boxes (inputs_by_tensor_map) are issued before,
// on phase `parity` of the mbarrier `bar`. `at_mid` runs after the block barrier past the last
// reads of sQ, sK and sG. (The tiles come as separate pointers: a struct of them cost 16 more
// shared-memory stores in the fixed K = 128 prep, SASS.)
template <class Tr, class AtMid>
__device__ __forceinline__ void prep_chunk(const ChunkFwdParams& p, const ChunkCoord& cc, int hv,
                                           int64_t tile, float* sQ, float* sK, float* sG, float* sA,
                                           float* sBeta, float* sScr, uint32_t bar, uint32_t parity,
                                           AtMid&& at_mid) {
  float* gAqk = p.aqk + tile * Tr::kBT * Tr::kBT;
  // Stage 1: inputs, activations, G (q, k and g by tensor-map boxes; else g and beta rows
  // prefetched to L2 first).
  prefetch_chunk_inputs<Tr>(p, cc, hv);
  load_chunk_inputs<Tr>(p, cc, hv, sQ, sK, sG, sBeta, sA, bar, parity);  // sA: totals

  // Stage 2: A_qk (-> workspace), A_kk (-> sA) by the warps with a block pair, then stage 3's
  // Tinv in place of A_kk by warp 0 once they have all stored their blocks (a barrier among them
  // only); meanwhile the other warps write the zero blocks and qg, ke, kg^T, gamma (q, k, G read
  // for the last time). exact_diag: every warp computes the diagonal blocks first, published by a
  // block barrier before warp 0 inverts them.
  if (prep_exact_diag<Tr>(p)) {
    intra_exact_diag<Tr>(p, sQ, sK, sG, sBeta, sA, gAqk);
    __syncthreads();
  }
  const int pairs = intra_pairs<Tr>(p);
  if (static_cast<int>(threadIdx.x) < 32 * pairs) {
    intra_products<Tr>(p, sQ, sK, sG, sBeta, sA, gAqk);
    named_barrier_sync(1, 32 * pairs);
    if (threadIdx.x < 32) invert_chunk_warp<Tr>(sA, sScr);
  } else {
    const int tid = static_cast<int>(threadIdx.x) - 32 * pairs, threads = Tr::kThreads - 32 * pairs;
    intra_zero_upper<Tr>(p, sA, gAqk, tid, threads);
    write_gated_keys<Tr>(p, cc, tile, sQ, sK, sG, tid, threads);
    // NOTE: no data needs this barrier. compute-sanitizer's racecheck pairs each warp's block
    // barriers by their count, so without a barrier here to match the product warps' named one it
    // reports the __syncthreads-ordered reads of Tinv below as hazards (a 256-thread repro: a
    // write before bar.sync 1, 96 and __syncthreads, read after it by another warp, is flagged
    // unless the other warps also pass one barrier; a real race is still flagged).
    named_barrier_sync(2, Tr::kThreads - 32 * pairs);
  }
  __syncthreads();
  at_mid();

  // Stage 3's WY factor: Tinv' = Tinv diag(beta) -> workspace.
  write_tinv_image<Tr>(sA, sBeta, p.tinv + tile * Tr::kBT * Tr::kBT);

  // An f32 / f64 v's copy for the scan (independent of everything above; none for a 16-bit v).
  write_v_image<Tr>(p, cc, hv, tile);
}

// kHandoff = false: CTA blockIdx.x = slot * HV + hv (value heads vary fastest along the grid: the
// CTAs resident together read the same tokens' q, k, g and v rows, so their loads fall on the same
// DRAM pages and share q / k rows under GQA). kHandoff = true (dense only, plan.h: plan_prep):
// prep_ctas persistent CTAs claim the items slot * HV + hv in that order and mark each one ready
// for the scan beside them (handoff.cuh); each claims its next item while the current one runs and
// issues its input boxes once sQ, sK and sG are free.
template <int kK, int kBT, bool kHandoff, PrepPath kPath>
__global__ void __launch_bounds__(PrepTraits<kK, kBT, kPath>::kThreads,
                                  PrepTraits<kK, kBT, kPath>::kMinBlocks)
    openkda_fwd_prep_kernel(const __grid_constant__ ChunkFwdParams p) {
  using Tr = PrepTraits<kK, kBT, kPath>;
  extern __shared__ float4 smem_f4[];
  // The input boxes need 128-byte aligned destinations (kSmemBytes has the slack); an offset from
  // smem_f4, so that the compiler still knows these are shared-memory pointers.
  const uint32_t misalign = smem_address(smem_f4) % Tr::kAlign;
  float* smem = reinterpret_cast<float*>(smem_f4) + (misalign ? Tr::kAlign - misalign : 0) / 4;
  float* sQ = smem + Tr::kOffQ;
  float* sK = smem + Tr::kOffK;
  float* sG = smem + Tr::kOffG;
  float* sA = smem + Tr::kOffA;
  float* sBeta = smem + Tr::kOffBeta;
  float* sScr = smem + Tr::kOffScr;
  int32_t* sItem = reinterpret_cast<int32_t*>(smem + Tr::kOffItem);
  const uint32_t bar = smem_address(smem + Tr::kOffBar);
  const bool boxes = prep_inputs_by_tensor_map<Tr>(p);
  const auto init_boxes_barrier = [&] {  // thread 0, once per CTA
    mbarrier_init(bar, 1);
    fence_mbarrier_init();
  };
  if constexpr (!kHandoff) {
    const int hv = static_cast<int>(blockIdx.x % p.HV);
    const int64_t slot = blockIdx.x / p.HV;
    if (p.cu_seqlens != nullptr) zero_padding_rows(p);  // before any CTA can return below
    ChunkCoord cc;
    if (!resolve_chunk(p, slot, cc)) return;  // past the last chunk (varlen grid bound)
    if (boxes && threadIdx.x == 0) {
      init_boxes_barrier();
      issue_input_boxes<Tr>(p, cc, hv, sQ, sK, sG, bar);
    }
    prep_chunk<Tr>(p, cc, hv, int64_t{hv} * p.slots + slot, sQ, sK, sG, sA, sBeta, sScr, bar, 0,
                   [] {});
  } else {
    launch_dependents();  // the scan is placed as multiprocessors empty (handoff.cuh)
    const int32_t items = static_cast<int32_t>(p.slots * p.HV);  // < 2^31: can_implement
    // The current and next items live in sItem (slot n % 2 holds the CTA's item n), not in
    // registers across the loop: the body needs all of them.
    if (threadIdx.x == 0) {
      if (boxes) init_boxes_barrier();
      sItem[0] = handoff_first_item(p, handoff_keeper(p));
    }
    __syncthreads();
    for (uint32_t n = 0;; ++n) {  // n: the CTA's items so far (the boxes' mbarrier phase)
      const int32_t item = sItem[n & 1];
      ChunkCoord cc;
      if (item >= items || !resolve_chunk(p, item / p.HV, cc)) break;
      const int hv = item % p.HV;
      const int64_t tile = int64_t{hv} * p.slots + item / p.HV;
      if (threadIdx.x == 0) {
        if (n == 0 && boxes) issue_input_boxes<Tr>(p, cc, hv, sQ, sK, sG, bar);
        sItem[(n + 1) & 1] = handoff_next_item(p, item, handoff_keeper(p), items);
      }
      prep_chunk<Tr>(p, cc, hv, tile, sQ, sK, sG, sA, sBeta, sScr, bar, n & 1, [&] {
        const int32_t next = sItem[(n + 1) & 1];
        ChunkCoord next_cc;
        if (boxes && threadIdx.x == 0 && next < items && resolve_chunk(p, next / p.HV, next_cc))
          issue_input_boxes<Tr>(p, next_cc, next % p.HV, sQ, sK, sG, bar);
      });
      __syncthreads();  // every store of the item done; sA and sBeta free for the next one
      if (threadIdx.x == 0) handoff_publish(p, tile);
    }
  }
}

// ---- scan: one CTA per (sequence, value head, segment, V slice) --------------------------------
// kWarps = vs / 16 (4 or 8: one or two warpgroups), a compile-time value so that the tile loaders
// unroll (launch_scan picks it from p.vs). kTransition: the time split's first pass
// (segments.cuh): 4 warps per 64 columns of the augmented state [S | M]. 4-warp CTAs (either
// pass) are built to fit two per SM (<= 256 registers), which the time split's plan counts on.
// blockIdx.x = ((rank * HV + hv) * nseg + segment) * slices + slice; sequence n of rank: n = rank
// dense, seq_order[rank] varlen (longest first: chunk_index.cuh).
template <int kK, int kBT, int kWarps, bool kTransition, bool kHandoff, bool kF16Keys, ScanIo kIo>
__global__ void __launch_bounds__(32 * kWarps, kWarps == 4 ? 2 : 1)
    openkda_fwd_scan_kernel(const __grid_constant__ ChunkFwdParams p) {
  using Tr = ScanTraits<kK, kBT, kTransition, kF16Keys, kIo>;
  static_assert(!kTransition || kWarps == 4, "transition pass: 64 columns per CTA");
  static_assert(!kHandoff || (!kTransition && kWarps == 8), "hand-off: 8-warp output scans");
  extern __shared__ float4 smem_f4[];
  // The swizzled wgmma tiles need a 1024-byte aligned base (smem_bytes has the slack). The base
  // is an offset from smem_f4, not an integer round trip, so that the compiler still knows that it
  // points into shared memory: its plain reads (sV, sGamma) are then LDS, not generic loads.
  const uint32_t misalign = smem_address(smem_f4) % Tr::kAlign;
  unsigned char* smem =
      reinterpret_cast<unsigned char*>(smem_f4) + (misalign ? Tr::kAlign - misalign : 0);

  const int slices = kTransition ? (p.V + kK) / 64 : p.vsplit;
  const int64_t cta = blockIdx.x;
  const int slice = static_cast<int>(cta % slices);
  const int64_t seq_seg = cta / slices;
  const int seg = static_cast<int>(seq_seg % p.nseg);
  const int64_t rank_head = seq_seg / p.nseg;  // (rank * HV + hv): varlen ranks longest first
  const int hv = static_cast<int>(rank_head % p.HV);
  const int64_t n = scan_sequence(p, rank_head / p.HV);
  const int64_t seq_head = n * p.HV + hv;
  const int v0 = slice * 16 * kWarps;
  const bool m_part = kTransition && v0 >= p.V;  // columns of M: identity start, u = 0
  const int vcol = v0 + Tr::kWarpRows * static_cast<int>(threadIdx.x / 32) +
                   static_cast<int>(threadIdx.x % 32) / 4;  // v of this thread's fragment row g

  const SeqSpan span = sequence_span(p, n);
  const int64_t nchunks = sequence_chunks(p, n, span);
  const int64_t first_chunk = chunk_base(p, n);
  const int64_t h_base = scan_h_snapshots<Tr>(p) ? snapshot_base(p, n) : 0;
  const int64_t head_state = int64_t{kK} * p.V;
  const int64_t c_begin = p.nseg > 1 ? seg * p.seg_chunks : 0;
  const int64_t c_end = p.nseg > 1 ? min(nchunks, c_begin + p.seg_chunks) : nchunks;
  const int64_t seg_index = seq_head * p.nseg + seg;  // (n * HV + hv) * nseg + seg
  // The combine reads (Z_s | M_s) of segments s < nseg - 1 only: the last one's transition CTAs
  // leave at once (the output pass computes its state from the state entering it).
  if (kTransition && seg == p.nseg - 1) return;

  // Hand-off (handoff.cuh): thread 0 issues a tile's copies only once warp 0 has seen it ready
  // (sReady: the tiles tile0 + [0, *sReady) known to be). The prologue's tiles are waited for
  // here, before the state is loaded, while few registers are live.
  int* sReady = reinterpret_cast<int*>(smem + Tr::ready_offset(16 * kWarps));
  if (kHandoff && threadIdx.x < 32) {
    if (threadIdx.x == 0) *sReady = 0;
    __syncwarp();
    const int nk = static_cast<int>(c_end - c_begin);
    if (nk > 0) {
      handoff_wait(p, int64_t{hv} * p.slots + first_chunk + c_begin,
                   min(Tr::copy_lead(16 * kWarps), nk) - 1, nk, sReady);
    }
  }

  float s[kK / 8][4];  // S^T fragment, f32
  if constexpr (kTransition) {
    const int t = static_cast<int>(threadIdx.x % 4);
#pragma unroll
    for (int nt = 0; nt < kK / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        s[nt][e] = m_part && 8 * nt + t + 4 * (e % 2) == vcol + 8 * (e / 2) - p.V ? 1.0f : 0.0f;
  } else if (seg == 0) {
    load_state<kK>(p.h0, p.h0_dtype, seq_head * head_state, p.V, p.v_first, vcol, s);
  } else {
    load_state<kK>(p.seg_init, DType::kF32, seg_index * head_state, p.V, false, vcol, s);
  }

  // Pipeline over the chunks, two groups of bulk copies per chunk c (k = c - c_begin), each issued
  // by thread 0:
  //   WQ(c)   sKe, sQg (, sKa)             WQ buffer w = k % kWq (kWq = Tr::wq_buffers: 1 or 2),
  //                                        on bar_wq(w) (phase k / kWq)
  //   REST(c) sA, sTinv, sKgT, sGamma, sV  REST buffer b = k % kRest (kRest = Tr::rest_buffers:
  //                                        2 or 3), on bar_rest(b) (phase k / kRest)
  // The prologue issues WQ(0 .. kWq - 1) and REST(0 .. kRest - 2). Right after chunk c's
  // mid-chunk block barrier every warp is done with WQ buffer w (chunk c's sKe / sQg) and, having
  // finished chunk c - 1, with REST buffer (k - 1) % kRest (write-after-read), so thread 0 then
  // issues WQ(c + kWq) and REST(c + kRest - 1) into them, the one read first first; that barrier
  // is the only one per chunk. A thread waits on the phase parity of a group before its first
  // read of it (the engine's writes are then visible to it and to its wgmma): WQ(c) at the top of
  // chunk c, REST(c) in the mid-chunk hook. Nothing is in flight at exit.
  constexpr int kVs = 16 * kWarps;
  constexpr int kWq = Tr::wq_buffers(kVs);
  constexpr int kRest = Tr::rest_buffers(kVs);
  const uint32_t bar0 = smem_address(smem + Tr::bar_offset(kVs));
  const bool with_v = !m_part;
  const auto bar_wq = [&](int b) { return bar0 + 8 * b; };
  const auto bar_rest = [&](int b) { return bar0 + 8 * (Tr::kMaxBuffers + b); };
  if (threadIdx.x == 0) {
    if (v_by_tensor_map(scan_v_dtype<Tr>(p))) prefetch_tensor_map(&p.v_map);
    for (int b = 0; b < kWq; ++b) mbarrier_init(bar_wq(b), 1);
    for (int b = 0; b < kRest; ++b) mbarrier_init(bar_rest(b), 1);
    fence_mbarrier_init();
  }
  __syncthreads();  // the initialised barriers, before any thread issues or waits

  // With f16 keys: the power-of-two factors of this thread's two rows of S^T in its f16 operand
  // copy (f16_operands.cuh: update_f16_row_factors), from the entering state's row maxima.
  // The scan then holds inv S^T: its rows times their factors (exact), so that the f16 operands
  // of X^T, O^T and the state update need no multiply; the stores take the rows back by fwd.
  F16RowFactors rf;
  if constexpr (kF16Keys) {
    init_f16_row_factors(s, rf);
    rescale_rows(s, rf.inv[0], rf.inv[1]);
  }

  // k: chunks since c_begin (an int: chunk_fwd_can_implement bounds the slots by 2^31 - 1).
  const int nk = static_cast<int>(c_end - c_begin);
  const int64_t tile0 = int64_t{hv} * p.slots + first_chunk + c_begin;
  if (threadIdx.x == 0 && nk > 0) {  // the prologue
    for (int k = 0; k < kWq && k < nk; ++k)
      scan_load_wq<Tr>(p, tile0 + k, smem + Tr::wq_offset(k), bar_wq(k));
    for (int k = 0; k < kRest - 1 && k < nk; ++k)
      scan_load_rest<Tr, kVs>(p, tile0 + k, span.bos + (c_begin + k) * kBT, hv, v0, with_v,
                              smem + Tr::rest_offset(k, kVs), bar_rest(k));
  }
  // With two warpgroups (vs = 128) chunk c's o is stored while chunk c + 1's X^T / O^T products
  // run (their stores contend for the LSU; scan -4 % at B1-T8192-H96); with one it is stored at
  // once (the stores then wait on nothing else, and holding o costs 16 registers).
  constexpr bool kLateO = !kTransition && kVs == 128;
  float o_prev[kBT / 8][4];  // with kLateO: the previous chunk's o
  for (int k = 0; k < nk; ++k) {
    const int64_t c = c_begin + k;
    const int64_t t0 = span.bos + c * kBT;
    const int nv = static_cast<int>(min(int64_t{kBT}, span.len - c * kBT));
    const int64_t tile = tile0 + k;
    const int b = k % kRest, w = k % kWq;
    if (!kTransition && scan_h_snapshots<Tr>(p) && c % p.h_every == 0) {  // a snapshot chunk
      const int64_t row = h_base + c / p.h_every;
      if (row < p.h_chunks)
        store_state<kK>(p.h, p.h_dtype, (row * p.HV + hv) * head_state, p.V, p.v_first, vcol, s,
                        rf.fwd);
    }
    mbarrier_wait(bar_wq(w), static_cast<uint32_t>((k / kWq) & 1));  // WQ(c)
    float o[kBT / 8][4];
    scan_step<Tr, kVs>(
        p, t0, nv, v0, m_part, smem, Tr::wq_offset(w), Tr::rest_offset(b, kVs), s, o, rf,
        k % Tr::kF16BoundRefresh == 0,
        [&]() {  // chunk c - 1's o, while chunk c's X^T / O^T products run
          if (kLateO && k > 0) store_o<Tr, kVs>(p, hv, t0 - kBT, kBT, v0, o_prev);
        },
        [&]() {
          __syncthreads();  // WQ buffer w and REST buffer (k - 1) % kRest are free (see above)
          // Hand-off: the tiles copied below (chunks up to k + copy_lead) must be ready. Here,
          // past a block barrier, the wait's ordering constraints cost the chunk's code no
          // schedule.
          if (kHandoff && threadIdx.x < 32 && k + 1 < nk)
            handoff_wait(p, tile0, min(k + Tr::copy_lead(kVs), nk - 1), nk, sReady);
          if (threadIdx.x == 0) {
            // In the order of their first reads: WQ(c + kWq) at the top of chunk c + kWq,
            // REST(c + kRest - 1) in the middle of chunk c + kRest - 1.
            constexpr int kAheadRest = kRest - 1;
            const bool wq = k + kWq < nk, rest = k + kAheadRest < nk;
            const int rb = (k + kAheadRest) % kRest;
            const auto load_wq = [&] {
              if (wq) scan_load_wq<Tr>(p, tile + kWq, smem + Tr::wq_offset(w), bar_wq(w));
            };
            if constexpr (kWq < kRest) load_wq();
            if (rest)
              scan_load_rest<Tr, kVs>(p, tile + kAheadRest, t0 + kAheadRest * kBT, hv, v0, with_v,
                                      smem + Tr::rest_offset(rb, kVs), bar_rest(rb));
            if constexpr (kWq >= kRest) load_wq();
          }
          mbarrier_wait(bar_rest(b), static_cast<uint32_t>((k / kRest) & 1));  // REST(c)
        });
    if constexpr (kLateO) {
#pragma unroll
      for (int nn = 0; nn < kBT / 8; ++nn)
#pragma unroll
        for (int e = 0; e < 4; ++e) o_prev[nn][e] = o[nn][e];
    } else if constexpr (!kTransition) {
      store_o<Tr, kVs>(p, hv, t0, nv, v0, o);
    }
  }
  if (kLateO && nk > 0) {  // the last chunk's o
    const int64_t c_last = c_end - 1;
    store_o<Tr, kVs>(p, hv, span.bos + c_last * kBT,
                     static_cast<int>(min(int64_t{kBT}, span.len - c_last * kBT)), v0, o_prev);
  }
  if constexpr (kTransition) {
    store_state<kK>(p.seg_state, DType::kF32, seg_index * kK * int64_t{p.V + kK}, p.V + kK, false,
                    vcol, s, rf.fwd);
  } else if (p.ht != nullptr && c_end >= nchunks && (c_begin < nchunks || c_begin == 0)) {
    // The segment with the last chunk holds the final state (segment 0 for an empty sequence).
    // With a varlen time split the segments past the sequence's end are empty and must not write
    // it: they enter with the combine's f32 copy of it, which can differ in the last bits.
    store_state<kK>(p.ht, DType::kF32, seq_head * head_state, p.V, p.v_first, vcol, s, rf.fwd);
  }
}

// ---- time split, combine pass: one CTA per (chain, kCombineCols value columns) -----------------
template <int kK>
__global__ void __launch_bounds__(kCombineThreads)
    openkda_fwd_segment_combine_kernel(const ChunkFwdParams p) {
  combine_segments<kK>(p);
}

}  // namespace openkda::cuda::chunk_forward
