// Host-side plans of the chunk_kda forward's grids, made by launch.cu's workspace_layout from the
// call's sizes and the device's multiprocessor count:
//   plan_scan  how the scan covers the state chains: the V split (4- or 8-warp CTAs) and the time
//              split (segments.cuh);
//   plan_prep  whether the prep hands its tiles to a scan running beside it (handoff.cuh), and
//              that hand-off's persistent grid, keepers and exit item.
// Plain C++ (no CUDA calls), so that the C++ tests check the choices at any multiprocessor count
// (tests/cpp/test_chunk_fwd_plan.cpp).
#pragma once

#include <algorithm>
#include <cstdint>

#include "cuda/chunk_fwd/traits.h"

namespace openkda::cuda::chunk_forward {

// The kernels' chunk length, whatever the caller's chunk_size (32 or 64), which only sets where
// the h snapshots are taken (every chunk_size / kKernelChunk kernel chunks): the outputs are the
// same function of the inputs at any chunk length, and the prep's shared memory at 32 tokens
// (56 KB at K = 128) lets four of its 256-thread CTAs share a multiprocessor (one at 64
// tokens: 123 KB). Measured on the H200 (bench_chunk_fwd --no-fla --quick, one run, the same
// kernels at both lengths): B = 1, T = 8192, H = 96 2.74 -> 2.14 ms (prep 1.76 -> 1.18 ms, scan
// 0.89 -> 0.87 ms); B = 1, T = 65536, H = 16 4.85 -> 4.26 ms.
constexpr int kKernelChunk = 32;

// The sizes that the plans read.
struct PlanShape {
  int64_t N = 0;   // sequences: B dense, len(cu_seqlens) - 1 varlen
  int64_t HV = 0;  // value heads
  int64_t K = 0, V = 0;
  int64_t T = 0;  // tokens per row (dense) or in all (varlen)
  int64_t BT = kKernelChunk;
  bool varlen = false;

  int64_t chains() const { return N * HV; }             // state chains
  int64_t chunks() const { return (T + BT - 1) / BT; }  // kernel chunks of T tokens
};

// How the scan covers the state chains: `vsplit` CTAs of vs = V / vsplit value columns per chain
// and segment, and `nseg` segments of `seg_chunks` chunks per sequence (the time split of
// segments.cuh; nseg = 1 without it).
//
// V split: every warp owns 16 value columns and does the same work per chunk whatever the split,
// so splitting only pays while it spreads warps over idle multiprocessors: 4 warps (vs = 64, one
// per SM sub-partition) when two CTAs per state still fit one wave of one CTA per multiprocessor
// (the scan's shared memory allows one), else 8 warps (vs = 128, no split). Never fewer than 4
// warps: a CTA's tile loads are shared by its warps. (Measured on the H200 at B = 1, T = 65536,
// H = 16: one warp per CTA, vs = 16, 128 CTAs, makes the scan 1.56x slower than 4 warps, vs = 64,
// 32 CTAs.) Where the prep / scan hand-off fits (handoff_fits, below) the scan keeps 8 warps even
// so: beside the prep its chain steps are slower (~1.77 us against ~1.32 for a 4-warp V half
// alone), but it no longer waits for the whole prep. Measured on the H200 at B = 1, T = 8192,
// H = 64 (thirty-second session, development run 19; outputs bitwise equal): the call's CUDA-graph
// replay 0.692-0.698 -> 0.606-0.608 ms.
//
// Time split (dense batches, and varlen with one sequence: the segment grid needs every sequence's
// chunk count on the host, and the one packed sequence has at most ceil(T / BT) chunks, the count
// its segments then cover; those past its end are empty: segments.cuh): when the chains at vs = 64
// fill at most half of the multiprocessors, as many segments as keep one wave of output CTAs at
// kSplitCtasPerSm per multiprocessor, each of at least kMinSegmentChunks chunks (the transition
// and combine passes cost ~1.5 plain chunk steps per segment chunk, so short segments do not
// pay). Several varlen sequences are never split: their lengths live on the device, and a grid
// sized for the longest possible one would give short sequences the transition pass's extra work
// without spreading them over more multiprocessors.
constexpr int64_t kMinSegmentChunks = 16;
// The output pass's 4-warp CTAs (254 registers, 99 KB of shared memory at BT = 32, K = 128) fit
// two per multiprocessor, and its serial chunk steps are latency-bound, so two co-resident CTAs
// with half the chunks each finish sooner than one with all of them.
constexpr int64_t kSplitCtasPerSm = 2;
static_assert(kSplitCtasPerSm * (ScanTraits<128, kKernelChunk>::smem_bytes(64) + 1024) <=
                  228 * 1024,
              "kSplitCtasPerSm 4-warp output CTAs per SM (1 KB reserved per CTA) at K = 128");

// The prep / scan hand-off (handoff.cuh; plan_prep below) fits dense batches of at least
// kMinHandoffChunks chunks at K = V = 128 (where its timing model was measured) whose scan, one
// 8-warp CTA per state chain, leaves at least kMinKeeperSms multiprocessors to the prep. (Fewer
// than about a quarter of the multiprocessors' chains take the time split instead: plan_scan.)
constexpr int64_t kMinKeeperSms = 8;
constexpr int64_t kMinHandoffChunks = 64;

inline bool handoff_fits(const PlanShape& d, int sms) {
  return !d.varlen && d.K == 128 && d.V == 128 && d.chains() <= sms - kMinKeeperSms &&
         d.chunks() >= kMinHandoffChunks;
}

struct ScanPlan {
  int vsplit = 1;
  int nseg = 1;
  int64_t seg_chunks = 0;
};

inline ScanPlan plan_scan(const PlanShape& d, int sms) {
  ScanPlan plan;
  const int64_t chains = d.chains(), chunks = d.chunks();
  plan.vsplit = (d.V == 128 && chains * 2 <= sms && !handoff_fits(d, sms)) ? 2 : 1;
  if ((d.varlen && d.N != 1) || chains == 0 || chunks == 0) return plan;
  const int64_t ctas = chains * (d.V / 64);  // output CTAs per segment at vs = 64
  if (2 * ctas > sms) return plan;
  const int64_t nseg = std::min<int64_t>(kSplitCtasPerSm * sms / ctas, chunks / kMinSegmentChunks);
  if (nseg < 2) return plan;
  plan.vsplit = static_cast<int>(d.V / 64);
  plan.seg_chunks = (chunks + nseg - 1) / nseg;
  plan.nseg = static_cast<int>((chunks + plan.seg_chunks - 1) / plan.seg_chunks);
  return plan;
}

// The prep / scan hand-off (handoff.cuh), taken where it fits (handoff_fits) and the scan runs
// one 8-warp CTA per state chain (vsplit 1, one segment: plan_scan's choice there unless the
// time split takes the call). The prep then runs as kMinBlocks persistent CTAs per multiprocessor
// (prep_ctas); its keepers are as many multiprocessors as the scan leaves, and the others stop
// claiming at exit_item, chosen so that the keepers take the remaining items in about the scan's
// time, at kPrepItemSmUs us of one multiprocessor per item and kScanChunkUs us per chunk of the
// scan beside the prep (H200, K = V = 128, the bf16 serving path at B = 1, T = 8192, HV = 96: the
// persistent prep's items cost ~3 % more than one CTA per item, and the scan runs ~8 % slower
// beside it; twenty-ninth session, development runs 11-13, chunk_fwd README).
struct PrepPlan {
  int64_t ctas = 0;
  bool handoff = false;
  int32_t keeper_sms = 0;
  int32_t exit_item = 0;
};
constexpr double kPrepItemSmUs = 2.87;
constexpr double kScanChunkUs = 1.77;

inline PrepPlan plan_prep(const PlanShape& d, const ScanPlan& scan, int64_t slots, int sms) {
  PrepPlan plan;
  // Every prep path has the same occupancy (traits.h).
  constexpr int kCtasPerSm = PrepTraits<128, kKernelChunk, PrepPath::kGeneric>::kMinBlocks;
  const int64_t items = slots * d.HV;
  if (!handoff_fits(d, sms) || scan.nseg > 1 || scan.vsplit != 1) return plan;
  plan.handoff = true;
  plan.ctas = std::min<int64_t>(items, int64_t{kCtasPerSm} * sms);
  plan.keeper_sms = static_cast<int32_t>(sms - d.chains());
  const double rest = static_cast<double>(plan.keeper_sms) * static_cast<double>(d.chunks()) *
                      kScanChunkUs / kPrepItemSmUs;
  plan.exit_item = static_cast<int32_t>(std::max(0.0, static_cast<double>(items) - rest));
  return plan;
}

}  // namespace openkda::cuda::chunk_forward
