// Hopper bulk-copy engine (cp.async.bulk, sm_90) between global and shared memory, its tensor-map
// (TMA) loads, and the mbarrier that a bulk load completes on. One thread issues a copy of up to
// the whole tile; the engine moves it without registers, address arithmetic or per-thread
// instructions.
//
// Protocol of a bulk load (one use of the barrier, phase 0):
//   issuing thread: mbarrier_init(bar, 1); fence_mbarrier_init(); mbarrier_expect_tx(bar, bytes);
//                   bulk_load(dst, src, bytes, bar) (one or more, summing to `bytes`);
//   every reader:   after a __syncthreads that follows the init, mbarrier_wait(bar, 0).
// A barrier can be reused: load k completes phase k, its readers wait on parity k % 2, and the
// next expect_tx may come only once every reader of phase k has passed its wait (a block barrier
// after the waits: the chunk_fwd scan's pipeline, kernels.cuh).
// Protocol of a bulk store: every writer of the tile fence_proxy_async_shared(); __syncthreads();
// one thread bulk_store(...); bulk_commit(); and before the tile is written again (or the CTA
// exits) that thread bulk_wait_read() (the engine has read the tile; the global writes complete
// on their own and are visible to later kernels).
// Addresses: shared ones as 32-bit shared-window addresses (smem_address), global ones 16-byte
// aligned; sizes multiples of 16 bytes.
#pragma once

#include <cstdint>

namespace openkda::cuda {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(arrivals) : "memory");
}

// Makes the initialised barrier visible to the bulk-copy engine.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// The calling thread's arrival, announcing `bytes` of bulk-load traffic to complete the phase.
__device__ __forceinline__ void mbarrier_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t phase) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}\n" ::"r"(bar),
      "r"(phase)
      : "memory");
}

__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}

// Tensor-map load (TMA): the box of `map` (tensor_map.h) at element coordinates (x, y) (x along the
// contiguous dimension) into shared memory at `dst`, completing on `bar` like bulk_load; `map` must
// live in kernel parameter space (a __grid_constant__ parameter), constant or global memory. The
// whole box counts toward the barrier's bytes, zero-filled parts included.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* map, int x, int y,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3}], [%4];" ::"r"(dst),
      "l"(map), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// Fetches a tensor map (tma_load_2d's `map`) ahead of its first use.
__device__ __forceinline__ void prefetch_tensor_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}

// Orders this thread's ordinary shared-memory writes before later bulk-copy reads of them.
__device__ __forceinline__ void fence_proxy_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// The same for global memory: ordinary accesses (the acquire of another CTA's ready mark, that
// CTA's stores of the tile) before this thread's later bulk-copy reads of it.
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;" ::: "memory");
}

__device__ __forceinline__ void bulk_store(void* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(src),
               "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Waits until every committed bulk store of this thread has read its shared-memory source.
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
}

// Per-thread asynchronous copies (cp.async, sm_80+), for sources that one bulk copy cannot take
// (the combine's padded rows, segments.cuh): 4 bytes global -> shared, grouped per thread by
// cp_async_commit; cp_async_wait<n> returns once at most n of this thread's groups are pending.
__device__ __forceinline__ void cp_async_4(float* dst, const float* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_address(dst)), "l"(src)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

}  // namespace openkda::cuda
