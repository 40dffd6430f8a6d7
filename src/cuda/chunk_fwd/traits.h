// Compile-time configuration of the chunk_kda forward kernels: tiles, threads and the shared
// memory plan of each kernel, with the bank-conflict and alignment constraints as static_asserts.
//
//   PrepTraits<K, BT, P>  openkda_fwd_prep_kernel: one CTA of 256 threads (BT = 32) per (chunk,
//                         value head); it never reads v, so V is not a parameter; P: its
//                         compiled path (PrepPath below)
//   ScanTraits<K, BT, T>  openkda_fwd_scan_kernel: one CTA of vs / 16 warps (vs / 64
//                         warpgroups) per (sequence, value head, V slice); vs in {64, 128};
//                         T: the transition pass of the time split (no output tiles)
//
// Padding rule for f32 tiles read by mma.sync fragments (32 banks of 4 bytes): a tile read as
// (row = lane / 4, column = lane % 4) has a row stride = 4 (mod 32); one read as float2 at
// (row = lane / 4, column = 2 (lane % 4)) or as (row = 2 (lane % 4), column = lane / 4) has a row
// stride = 8 (mod 32) or 4 (mod 32) respectively (see each tile below). Every row stride is a
// multiple of 4 floats so that float4 accesses stay aligned.
#pragma once

#include <cstddef>

#include "openkda/tensor_ref.h"

namespace openkda::cuda::chunk_forward {

constexpr int kSubChunk = 16;                // rows of the sub-chunk blocks of A_qk / A_kk
constexpr int kMaxDynamicSmem = 227 * 1024;  // per block on H100 / H200

// The prep's compiled paths (one kernel each per K). kGeneric switches at run time on every
// option the prep has: input dtypes, the gate mode, the key tiles' format, the diagonal blocks'
// method, and an f32 / f64 v's copy. kSafeBF16 / kSafeF16 fix all of them for the safe-gate
// serving configuration (params.h: prep_path_of): q, k and g of one 16-bit dtype (by tensor-map
// boxes), a 16-bit v, the lower-bound gate with anchored diagonal blocks, and f16 key tiles. Their
// kernels are half the generic one's size, and ran 6-8 % faster than it on the benchmark's five
// cases (H200, twenty-seventh session; the prep is issue-bound, and the untaken paths' code and
// switches cost instruction fetch and issue slots).
enum class PrepPath : int { kGeneric = 0, kSafeBF16 = 1, kSafeF16 = 2 };

template <int kK_, int kBT_, PrepPath kPath_ = PrepPath::kGeneric>
struct PrepTraits {
  static constexpr int kK = kK_;    // q/k head dim
  static constexpr int kBT = kBT_;  // chunk size
  static constexpr PrepPath kPath = kPath_;
  static constexpr bool kSafePath = kPath != PrepPath::kGeneric;
  // NOTE: the prep's phases are short, serial and latency-bound, so what counts is how many
  // independent CTAs share a multiprocessor. At BT = 32 (plan.h's kKernelChunk, the only length
  // instantiated) the plan is 56 KB at K = 128, so four CTAs of 8 warps fit in shared memory, at
  // <= 64 registers (four CTAs ran 3-6 % faster than three at <= 80 registers: tenth and eleventh
  // sessions, development A/Bs). A 64-token prep (123 KB, one CTA per multiprocessor) ran best at
  // 512 threads (chunk_fwd README, sixth session).
  static constexpr int kThreads = 256;
  static constexpr int kMinBlocks = 4;  // CTAs per multiprocessor (launch bound)
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kNB = kBT / kSubChunk;  // 16-row blocks per chunk

  // Row strides (floats).
  //   sQ, sK, sG [kBT][kLdX]: read by mma fragments at (row g, col t) -> kLdX = 4 (mod 32).
  //   sA [kBT][kLdA] (A_kk, then Tinv): read as float2 at (row g, col 2t) -> 8 (mod 32).
  static constexpr int kLdX = kK + 4;
  static constexpr int kLdA = kBT + 8;

  // ---- shared memory plan (floats); lifetimes in kernels.cuh ----
  //   sQ    [kBT][kLdX]  q (l2-normalised)
  //   sK    [kBT][kLdX]  k (l2-normalised)
  //   sG    [kBT][kLdX]  gate g                     -> G (log2 chunk-local cumsum)
  //   sA    [kBT][kLdA]  the cumsum's column totals [kWarps][kK] -> A_kk (strictly lower)
  //                      -> Tinv = (I + A_kk)^-1
  //   sBeta [kBT]        beta (post-activation; 0 on rows past the sequence)
  //   sScr  [kScratch]   the block-inverse products P_rc
  //   bar   [kBarFloats] the mbarrier of the input boxes (inputs_by_tensor_map, params.h), then
  //                      the hand-off's two claimed items (int32, kOffItem; handoff.cuh)
  // With inputs_by_tensor_map the rows of q, k and g first land as dense boxes [kBT][kK] of their
  // dtype (2 or 4 bytes) at the start of sQ, sK and sG (each 128-byte aligned, kAlign); every
  // thread reads its values into registers and, after a block barrier, writes the f32 rows over
  // them.
  static constexpr int kOffQ = 0;
  static constexpr int kOffK = kOffQ + kBT * kLdX;
  static constexpr int kOffG = kOffK + kBT * kLdX;
  static constexpr int kOffA = kOffG + kBT * kLdX;
  static constexpr int kOffBeta = kOffA + kBT * kLdA;
  static constexpr int kOffScr = kOffBeta + kBT;
  static constexpr int kScratch = (kNB - 1) * kSubChunk * kSubChunk;
  static constexpr int kOffBar = kOffScr + kScratch;
  static constexpr int kBarFloats = 4;  // one 8-byte mbarrier, two int32 items (16-byte aligned)
  static constexpr int kOffItem = kOffBar + 2;
  static constexpr int kSmemFloats = kOffBar + kBarFloats;
  // The TMA destinations need a 128-byte aligned base: the kernel rounds the dynamic shared
  // memory's base up, within kAlign bytes of slack.
  static constexpr int kAlign = 128;
  static constexpr size_t kSmemBytes = sizeof(float) * kSmemFloats + kAlign;

  static_assert(kK == 64 || kK == 128, "compiled head dims: K in {64, 128}");
  static_assert(kBT == 32, "thread count and occupancy planned for 32-token chunks");
  static_assert(kLdX % 32 == 4 && kLdA % 32 == 8, "bank-conflict-free fragment reads");
  static_assert(kOffK % 4 == 0 && kOffG % 4 == 0 && kOffA % 4 == 0 && kOffBeta % 4 == 0 &&
                    kOffScr % 4 == 0,
                "every tile starts 16-byte aligned");
  static_assert(kBT % kWarps == 0, "whole rows per warp in the row-wise passes");
  static_assert(kWarps * kK <= kBT * kLdA, "the cumsum's column totals fit in sA");
  static_assert(kNB * (kNB + 1) / 2 < kWarps,
                "intra products: one warp per block pair, and at least one warp for the zeros");
  static_assert(kBT * kBT == 4 * kThreads, "Tinv' image: one 16-byte chunk per thread");
  static_assert((sizeof(float) * kOffK) % kAlign == 0 && (sizeof(float) * kOffG) % kAlign == 0,
                "input boxes: sQ, sK and sG start 128-byte aligned");
  static_assert(kBT * kK * 4 <= kBT * kLdX * 4, "a 4-byte input box fits its f32 tile");
  static_assert((sizeof(float) * kOffBar) % 8 == 0, "the mbarrier is 8-byte aligned");
  static_assert(kSmemBytes <= kMaxDynamicSmem, "shared memory plan exceeds 227 KB");
  static_assert(kMinBlocks * (kSmemBytes + 1024) <= 228 * 1024,
                "kMinBlocks CTAs per multiprocessor (1 KB reserved per CTA)");
};

// The scan's compiled input / output formats (with f16 keys only; one kernel set each per K).
// kGeneric reads v's dtype, o's dtype and whether h snapshots are taken at run time; kBF16 / kF16
// fix them for the serving configuration (params.h: scan_io_of): v and o of that 16-bit dtype, no
// h snapshots. Their kernels are a third smaller (5712 vs 8368 instructions, K = 128, 8 warps),
// and the scan ran 5-12 % faster on the benchmark's five cases (H200, twenty-seventh session).
enum class ScanIo : int { kGeneric = 0, kBF16 = 1, kF16 = 2 };

template <int kK_, int kBT_, bool kTransition_ = false, bool kF16Keys_ = false,
          ScanIo kIo_ = ScanIo::kGeneric>
struct ScanTraits {
  static constexpr int kK = kK_;
  static constexpr int kBT = kBT_;
  static constexpr ScanIo kIo = kIo_;
  // kF16Keys: sKe, sQg, sKg and sA (A_qk) are f16 tiles, and X^T, O^T, the O^T update and the
  // state update f16 wgmma (params.h: f16_keys_apply).
  static constexpr bool kF16Keys = kF16Keys_;
  static constexpr int kKeyBytes = kF16Keys ? 2 : 4;
  static_assert(kIo == ScanIo::kGeneric || kF16Keys, "fixed formats only with f16 keys");
  // With f16 keys: chunks between exact row maxima of S^T in the range guard (state.cuh).
  static constexpr int kF16BoundRefresh = 8;
  static_assert(kF16BoundRefresh >= 1, "a refresh period of at least one chunk");
  // kTransition: the time split's first pass (segments.cuh), which needs no output tiles (sQg,
  // sA): 75 KB at K = 128, BT = 32, vs = 64 (99 KB with them), so two CTAs of either pass share
  // a multiprocessor.
  static constexpr bool kTransition = kTransition_;
  // The kernel's warps (4 or 8: vs = 64 or 128 value columns, one or two warpgroups) are its
  // third template parameter (kernels.cuh).
  static constexpr int kWarpRows = 16;  // value columns (rows of S^T) per warp

  // ---- shared memory plan (bytes from a 1024-byte aligned base) ----
  //   wq_buffers(vs) WQ buffers (chunks c_begin + k with k % wq_buffers in buffer k %
  //     wq_buffers; each kWqBytes, 1024-byte aligned at wq_offset(buffer)): sKe, sQg [kBT][kK]
  //     tf32 (f16 with kF16Keys: half_pair_image_offset): wgmma B operands, 128-byte swizzled
  //     K-major (wgmma.cuh), rows in the pair order of scan_row (tile_image.h). sQg is empty in
  //     the transition pass. With kF16Keys, sKa [kBT] f32 follows (the row anchors, pair order).
  //   rest_buffers(vs) REST buffers (chunk c_begin + k in buffer k % rest_buffers; kRest* are
  //     byte offsets within a buffer, which starts 1024-byte aligned at rest_offset(buffer, vs)):
  //     sA [kBT][kBT] tf32 (A_qk; swizzled, pair order; empty in the transition pass; with
  //     kF16Keys f16 in half of each 128-byte row, half_pair_image_offset), sTinv
  //     [kBT][kBT] tf32 (Tinv' = Tinv diag(beta), the B operand of v_new^T = R^T Tinv'^T; the same
  //     layout), sKgT [kK][kBT] tf32 (the state update's B operand, kg^T: N = d, K-major along the
  //     chunk rows j; swizzled, rows d in pair order; with kF16Keys kg [kBT][kK] f16 in sKe's
  //     image, read MN-major), sGamma [kK], sV [vs / 64][kBT][64] (the
  //     prep's f32 v image, XOR-swizzled columns; or, in its first half, the tensor-map boxes of a
  //     16-bit v, 128-byte swizzled: 1024-byte aligned).
  //   bar [kMaxBuffers + kMaxBuffers] at bar_offset(vs): the mbarriers of the bulk copies into
  //     WQ buffers 0 .. 2, then REST buffers 0 .. 2 (kernels.cuh; those of absent buffers unused).
  //   ready [1] int at ready_offset(vs): the hand-off scan's tiles known ready (handoff.cuh;
  //     smem_bytes(vs, true): 8 bytes more).
  // Sizes at K = 128 with f16 keys: 134 KB at vs = 128 (two WQ and three REST buffers), 68 KB
  // for the 4-warp output CTA (one and two), 61 KB for the transition CTA (two WQ buffers of sKe
  // alone, two REST); with tf32 keys 188, 99 and 91 KB.
  static constexpr int kOffKe = 0;  // within a WQ buffer
  static constexpr int kOffQg = kOffKe + kBT * kK * kKeyBytes;
  // With f16 keys, sKa [kBT] f32 after the key tiles: the rows' anchors exp2(A_j) (params.h: ka).
  static constexpr int kOffKa = kOffQg + (kTransition ? 0 : kBT * kK * kKeyBytes);
  static constexpr int kWqBytes = kF16Keys ? (kOffKa + kBT * 4 + 1023) / 1024 * 1024 : kOffKa;
  static constexpr int kRestA = 0;
  static constexpr int kRestTinv = kRestA + (kTransition ? 0 : kBT * kBT * 4);
  static constexpr int kRestKgT = kRestTinv + kBT * kBT * 4;
  // sKgT: [kK][kBT] tf32, or with kF16Keys kg itself [kBT][kK] f16 in sKe's image (read MN-major).
  static constexpr int kRestGamma = kRestKgT + kK * kBT * kKeyBytes;
  static constexpr int kRestV = (kRestGamma + kK * 4 + 1023) / 1024 * 1024;  // swizzled boxes
  static constexpr int kAlign = 1024;  // slack to align the dynamic shared-memory base

  // WQ buffers: two where shared memory allows (the 8-warp CTA, one per SM; the transition pass,
  // whose WQ is sKe alone), so that chunk c + 2's sKe / sQg copies start at chunk c's mid-chunk
  // barrier, 1.5 chunks before their first read instead of 0.5 (scan -2 to -3 % in a development
  // A/B, chunk_fwd README); one for the 4-warp output CTA, which must fit twice per SM.
  OPENKDA_HOST_DEVICE static constexpr int wq_buffers(int vs) {
    return (kTransition || vs == 128) ? 2 : 1;
  }
  OPENKDA_HOST_DEVICE static constexpr int wq_offset(int buffer) { return buffer * kWqBytes; }
  // REST buffers: three for the 8-warp output CTA (one per SM), so that chunk c + 2's REST
  // copies start at chunk c's mid-chunk barrier, 2 chunks before their first read instead of 1
  // (scan -2 to -3 % at B1-T8192-H96 and varlen8x4096, outputs bitwise equal; a third WQ buffer
  // there added nothing: chunk_fwd README, thirty-third session); two for the 4-warp CTAs. With
  // f16 keys three REST and two WQ buffers would still fit two 4-warp CTAs per SM, but the
  // time split's transition pass ran 9 % slower with them (the same session).
  OPENKDA_HOST_DEVICE static constexpr int rest_buffers(int vs) {
    return (!kTransition && vs == 128) ? 3 : 2;
  }
  static constexpr int kMaxBuffers = 3;  // of either kind: the mbarriers' slots
  // How far ahead the copies reach: the prologue copies chunks [0, copy_lead), chunk k's
  // mid-chunk barrier those up to k + copy_lead (the hand-off's ready marks cover as much).
  OPENKDA_HOST_DEVICE static constexpr int copy_lead(int vs) {
    return wq_buffers(vs) > rest_buffers(vs) - 1 ? wq_buffers(vs) : rest_buffers(vs) - 1;
  }
  OPENKDA_HOST_DEVICE static constexpr int rest_bytes(int vs) {
    return (kRestV + 4 * kBT * vs + 1023) / 1024 * 1024;
  }
  OPENKDA_HOST_DEVICE static constexpr int rest_offset(int buffer, int vs) {
    return wq_buffers(vs) * kWqBytes + buffer * rest_bytes(vs);
  }
  // mbarriers: WQ buffers 0 .. 2, then REST buffers 0 .. 2.
  OPENKDA_HOST_DEVICE static constexpr int bar_offset(int vs) {
    return rest_offset(rest_buffers(vs), vs);
  }
  OPENKDA_HOST_DEVICE static constexpr int ready_offset(int vs) {
    return bar_offset(vs) + 2 * kMaxBuffers * 8;
  }
  OPENKDA_HOST_DEVICE static constexpr size_t smem_bytes(int vs, bool handoff = false) {
    return static_cast<size_t>(kAlign + ready_offset(vs) + (handoff ? 8 : 0));
  }

  static_assert(kK == 64 || kK == 128, "compiled head dims: K in {64, 128}");
  static_assert(kBT == 32, "planned for the kernels' 32-token chunks");
  static_assert(wq_buffers(64) <= kMaxBuffers && wq_buffers(128) <= kMaxBuffers &&
                    rest_buffers(64) <= kMaxBuffers && rest_buffers(128) <= kMaxBuffers,
                "an mbarrier slot per buffer");
  static_assert(kOffQg % 1024 == 0 && kWqBytes % 1024 == 0 && kRestTinv % 1024 == 0 &&
                    kRestKgT % 1024 == 0,
                "swizzled wgmma tiles start 1024-byte aligned");
  static_assert(kOffKa % 16 == 0 && kRestGamma % 16 == 0 && kRestV % 1024 == 0,
                "16-byte aligned bulk-copy destinations; sV on the 128-byte swizzle's 1 KB period");
  static_assert(rest_bytes(64) % 1024 == 0 && rest_bytes(128) % 1024 == 0 &&
                    bar_offset(64) % 8 == 0 && bar_offset(128) % 8 == 0,
                "1024-byte aligned REST buffers, 8-byte aligned mbarriers");
  static_assert(smem_bytes(128, true) <= kMaxDynamicSmem, "shared memory plan exceeds 227 KB");
  static_assert(2 * (smem_bytes(64) + 1024) <= 228 * 1024,
                "two 4-warp CTAs per multiprocessor (1 KB reserved per CTA)");
};

}  // namespace openkda::cuda::chunk_forward
