// The prep / scan hand-off: the prep and the scan of one call run at the same time, on different
// multiprocessors, where the scan alone would leave some of them idle (plan.h: plan_prep;
// dense batches whose N HV state chains take one 8-warp scan CTA each with multiprocessors to
// spare, e.g. B = 1, HV = 96: 96 scan CTAs on 132 multiprocessors). Without it the scan starts
// when the last prep CTA ends and 36 multiprocessors idle through the whole scan.
//
// Prep: a persistent grid (PrepTraits::kMinBlocks CTAs per multiprocessor) whose CTAs
//   - trigger their dependents as they start (griddepcontrol.launch_dependents), so that the scan
//     grid, launched as the prep's programmatic dependent, becomes eligible once every prep CTA is
//     resident and is then placed on multiprocessors as they empty;
//   - claim (chunk, value head) items in the prep's grid order (value heads fastest, chunks in
//     order) from claims[0];
//   - on the `keeper_sms` multiprocessors of lowest %smid ("keepers", registered in claims[1])
//     claim until no item is left; the others stop after their first item at or past `exit_item`,
//     which empties their multiprocessors for the scan, but only once a keeper has registered:
//     some CTA then always takes the remaining items, so no scan CTA waits on an item that no
//     running prep CTA will claim (every prep CTA starts before any scan CTA);
//   - after an item's last workspace store and a block barrier, publish ready[tile] = 1 (thread 0:
//     a proxy fence, then a release store at gpu scope).
// Scan: before thread 0 issues the bulk copies of a tile, warp 0 waits for its ready mark (each
//   lane acquires one of the next 32 tiles' marks per poll, so that a scan behind the prep polls
//   once per 32 chunks), and thread 0 then orders its later async-proxy reads after those
//   acquires (fence.proxy.async).
// Which multiprocessor runs which item changes from call to call, never what an item computes:
// the outputs stay bitwise reproducible. The claims use atomics; no result is reduced by them.
// Workspace (launch.cu: WorkspaceLayout::handoff, zeroed on the stream before the prep):
//   claims [2] u32 (next item, keepers), ready [HV, slots] u32 (tile order).
// Shared memory: the prep's two claimed-item slots next to its mbarrier (PrepTraits: bar); the
// scan's count of tiles known ready, after its mbarriers (ScanTraits::ready_offset).
#pragma once

#include <cstdint>

#include "cuda/chunk_fwd/params.h"
#include "cuda/common/bulk_copy.cuh"

namespace openkda::cuda::chunk_forward {

__device__ __forceinline__ uint32_t sm_id() {
  uint32_t id;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(id));
  return id;
}

__device__ __forceinline__ void launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

__device__ __forceinline__ uint32_t load_acquire_gpu(const uint32_t* address) {
  uint32_t value;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}

__device__ __forceinline__ uint32_t load_relaxed_gpu(const uint32_t* address) {
  uint32_t value;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
  return value;
}

__device__ __forceinline__ void store_release_gpu(uint32_t* address, uint32_t value) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(address), "r"(value) : "memory");
}

// ---- prep side (thread 0 unless noted) ----

// Every thread: whether this CTA's multiprocessor keeps the prep to the end.
__device__ __forceinline__ bool handoff_keeper(const ChunkFwdParams& p) {
  return sm_id() < static_cast<uint32_t>(p.keeper_sms);
}

// The CTA's first item; registers a keeper first (its claims then cover every later item).
__device__ __forceinline__ int32_t handoff_first_item(const ChunkFwdParams& p, bool keeper) {
  if (keeper) atomicAdd(p.claims + 1, 1u);
  return static_cast<int32_t>(atomicAdd(p.claims, 1u));
}

// The item after `item`, claimed while `item` runs, or `items` (stop after it): a CTA that is not a
// keeper stops at the first item at or past exit_item once some keeper has registered.
__device__ __forceinline__ int32_t handoff_next_item(const ChunkFwdParams& p, int32_t item,
                                                     bool keeper, int32_t items) {
  if (!keeper && item >= p.exit_item && load_relaxed_gpu(p.claims + 1) != 0) return items;
  const uint32_t next = atomicAdd(p.claims, 1u);
  return next < static_cast<uint32_t>(items) ? static_cast<int32_t>(next) : items;
}

// After a block barrier that follows every store of the item's tiles.
__device__ __forceinline__ void handoff_publish(const ChunkFwdParams& p, int64_t tile) {
  fence_proxy_async_global();
  store_release_gpu(p.ready + tile, 1u);
}

// ---- scan side (warp 0, all lanes) ----

// Waits until the tiles tile0 + [0, need] are ready; tile0 + [0, *ready_end) are known to be
// (ready_end: an int in shared memory, owned by warp 0, so that the scan's loop keeps no register
// for it). Chunks at or past nk are not this chain's and count as ready.
__device__ __forceinline__ void handoff_wait(const ChunkFwdParams& p, int64_t tile0, int need,
                                             int nk, int* ready_end) {
  int end = *ready_end;
  if (need < end) return;
  const int lane = static_cast<int>(threadIdx.x % 32);
  while (true) {
    const int k = end + lane;
    const bool ready = k >= nk || load_acquire_gpu(p.ready + tile0 + k) != 0;
    const uint32_t pending = __ballot_sync(0xffffffffu, !ready);
    end += pending != 0 ? __ffs(static_cast<int>(pending)) - 1 : 32;
    if (need < end) break;
    __nanosleep(256);
  }
  __syncwarp();
  if (lane == 0) {
    *ready_end = end;
    fence_proxy_async_global();
  }
  __syncwarp();
}

}  // namespace openkda::cuda::chunk_forward
