// Compile-time configuration of the recurrent (decode / speculative-verify) kernel.
//
// One CTA of kThreads = 128 threads (4 warps) owns the state slice S[:, e0 : e0 + kBlockV] of one
// (sequence n, value head hv): all K rows d, kBlockV value columns e. Each warp owns kWarpE of
// those columns and all K rows, so the reduction over d (a = S'^T k, b = S'^T q) never leaves the
// warp: it is a sum inside the thread, then xor-shuffles over the kLanesD lanes that hold the same
// columns. Every thread holds a kTileD x kTileE tile of S in fp32 registers.
//
// The layout decides which dimension is contiguous in memory and so the lane arrangement; a
// thread always moves runs of kVec contiguous elements (16 bytes of a 4-byte pool dtype as 4
// elements, 16 bytes of a 2-byte one as 8). Every CTA owns kBlockV = 64 columns:
//
//   [K, V] (kVFirst = false): runs along e. lane = lane_d * kLanesE + lane_e with kLanesD = 8,
//     kLanesE = 4 (4-byte pools) or kLanesD = 16, kLanesE = 2 (2-byte pools). Thread rows
//     d = lane_d + kLanesD j (j < kTileD = K / kLanesD), columns
//     e = e0 + warp * kWarpE + lane_e * kVec + i (i < kTileE = kVec). One warp access covers
//     kLanesD rows x 64 bytes (f32) or 32 bytes (bf16/f16) per row: whole 32-byte sectors.
//   [V, K] (kVFirst = true): runs along d. lane = lane_e * kLanesD + lane_d, kLanesD = 4,
//     kLanesE = 8. Thread columns e = e0 + warp * 16 + lane_e + 8 i (i < kTileE = 2), rows
//     d = lane_d * kVec + r * 4 kVec + m (run r < K / (4 kVec), m < kVec). One warp access covers
//     8 rows of 4 runs = 64 contiguous bytes each.
//
// At K = 128 a thread holds 64 state elements (32 at K = 64); see kMinBlocksPerSm.
#pragma once

namespace openkda::cuda::recurrent {

template <int kK_, int kV_, bool kVFirst_, int kVec_>
struct RecurrentTraits {
  static constexpr int kK = kK_;             // q/k head dim (state rows d)
  static constexpr int kV = kV_;             // value head dim (state columns e)
  static constexpr bool kVFirst = kVFirst_;  // state layout [.., V, K] instead of [.., K, V]
  static constexpr int kVec = kVec_;         // elements per contiguous run of one thread

  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kLanesD = kVFirst ? 4 : (kVec == 4 ? 8 : 16);  // lanes sharing columns
  static constexpr int kLanesE = 32 / kLanesD;                        // lanes side by side along e
  static constexpr int kLaneMaskD = kVFirst ? 1 : kLanesE;  // lane-id bit of the first d lane
  static constexpr int kTileD = kK / kLanesD;               // rows per thread
  static constexpr int kTileE = kVFirst ? 2 : kVec;         // columns per thread
  static constexpr int kRunStrideD = kLanesD * kVec;  // [V, K]: distance between a thread's runs
  static constexpr int kWarpE = kLanesE * kTileE;     // columns per warp
  static constexpr int kBlockV = kWarps * kWarpE;     // columns per CTA
  static constexpr int kSlices = kV / kBlockV;        // CTAs per (sequence, value head)
  static constexpr int kHeadElems = kK * kV;          // state elements per head
  static constexpr int kPrologueWarps = kK / 32;      // warps that own one row d per thread
  // NOTE: bytes in flight per SM are what a memory-bound kernel needs (~30 KB of state loads hide
  // HBM latency at 4.8 TB/s). 64 fp32 state elements per thread fit 168 registers: 3 CTAs per SM
  // with 96 KB of state loads in flight (32 elements: 128 registers, 4 CTAs, 64 KB), and half the
  // CTAs (prologue work, index chains) of a 32-element tile. The 2 x 8 column inputs of a [K, V]
  // 2-byte pool tile (kTileE = 8) are not prefetched a token ahead: that spills at 168.
  static constexpr int kMinBlocksPerSm = kTileD * kTileE <= 32 ? 4 : 3;
  static constexpr bool kPrefetchColumns = kTileE <= 4;

  static_assert(kK == 64 || kK == 128, "compiled head dims: K in {64, 128}");
  static_assert(kV == 64 || kV == 128, "compiled head dims: V in {64, 128}");
  static_assert(kVec == 4 || kVec == 8, "a run is 16 bytes of a 4-byte or a 2-byte pool dtype");
  static_assert(kK % 32 == 0 && kK <= kThreads, "the prologue gives one row d to one thread");
  static_assert(kLanesD * kLanesE == 32, "the lanes of a warp tile its columns x rows");
  static_assert(kVFirst ? kK % kRunStrideD == 0 : kK % kLanesD == 0,
                "every thread holds whole runs of the same number of rows");
  static_assert(kBlockV == 64, "launch.cu sizes the grid with 64 columns per CTA");
  static_assert(kV % kBlockV == 0, "a CTA slice never straddles the value head");
  static_assert(kTileD * kTileE <= 64, "register budget: at most 64 state elements per thread");
};

// Compile-time configuration of the streaming kernel (stream.cuh) for an fp32 state: one CTA of
// kThreads = 256 threads per (sequence, value head), the whole K x V head in shared memory.
//
// The tile keeps the memory layout of the state: rows of kInner contiguous floats (e for [K, V],
// d for [V, K]), kOuter rows. Every warp access is 4 rows x one 128-byte segment (8 lanes x 16
// bytes per row, lane = 8 row_lane + seg_lane), so each 8-lane phase of a 16-byte shared access
// covers 32 distinct banks (conflict-free on the unpadded layout that the bulk copy writes).
//
//   [K, V]: warp w owns segment w % kSegments (32 columns e) and row group w / kSegments
//     (kWarpRows rows d, 4 per access). A thread owns 4 columns e = 32 seg + 4 seg_lane + m and
//     rows d = kWarpRows group + row_lane + 4 i (i < kRowSteps). The reduction over d is
//     in-thread, then over row_lane (xor 8, 16), then over the kRowGroups warps through shared
//     memory.
//   [V, K]: warp w owns kWarpRows rows e (4 per access) and every segment. A thread owns rows
//     e = kWarpRows w + row_lane + 4 r (r < kRowSteps) and d = 32 s + 4 seg_lane + m (s <
//     kSegments). The reduction over d is in-thread, then over seg_lane (xor 1, 2, 4).
template <int kK_, int kV_, bool kVFirst_>
struct StreamTraits {
  static constexpr int kK = kK_;
  static constexpr int kV = kV_;
  static constexpr bool kVFirst = kVFirst_;

  static constexpr int kWarps = 8;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kInner = kVFirst ? kK : kV;  // contiguous floats per tile row
  static constexpr int kOuter = kVFirst ? kV : kK;  // tile rows
  static constexpr int kRowRuns = kInner / 4;       // 16-byte runs per tile row
  static constexpr int kSegments = kInner / 32;     // 128-byte segments per tile row
  static constexpr int kRowGroups = kVFirst ? 1 : kWarps / kSegments;  // warps sharing columns
  static constexpr int kWarpRows = kOuter / (kVFirst ? kWarps : kRowGroups);
  static constexpr int kRowSteps = kWarpRows / 4;  // warp accesses along the rows
  static constexpr int kThreadSegments = kVFirst ? kSegments : 1;
  static constexpr int kRuns = kRowSteps * kThreadSegments;  // 16-byte runs of S per thread
  static constexpr int kColumns = kVFirst ? kRowSteps : 4;   // value columns e per thread
  static constexpr int kHeadElems = kK * kV;
  static constexpr int kHeadBytes = kHeadElems * 4;
  static constexpr int kPrologueWarps = kK / 32;  // warps that own one row d per thread
  // NOTE: three 64 KB tiles per SM (shared memory allows no more at K = V = 128) need at most 85
  // registers a thread; smaller heads keep the same bound.
  static constexpr int kMinBlocksPerSm = 3;

  static_assert(kK == 64 || kK == 128, "compiled head dims: K in {64, 128}");
  static_assert(kV == 64 || kV == 128, "compiled head dims: V in {64, 128}");
  static_assert(kWarps % kSegments == 0, "[K, V]: the warps tile the segments evenly");
  static_assert(kWarpRows % 4 == 0, "a warp access covers 4 rows");
  static_assert(kRuns * 4 * kThreads == kHeadElems, "the threads tile the head exactly once");
  static_assert(kK <= kThreads, "the prologue gives one row d to one thread");
};

}  // namespace openkda::cuda::recurrent
