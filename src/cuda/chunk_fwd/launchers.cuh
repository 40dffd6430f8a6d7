// Launchers of the chunk_kda forward's kernels (kernels.cuh), the functions that launch.cu
// calls through its dispatch (one per K and prep path, and the scan's passes), and the macros
// with which cmake/OpenkdaCuda.cmake instantiates them, one generated translation unit each.
// Each launcher sets its kernel's dynamic shared memory once per device
// (set_max_dynamic_smem_once), then launches on the caller's stream; the hand-off scan is the
// persistent prep's programmatic dependent (cudaLaunchKernelEx with programmatic stream
// serialization). No allocation, no host synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/chunk_fwd/kernels.cuh"
#include "cuda/chunk_fwd/params.h"
#include "cuda/chunk_fwd/segments.cuh"
#include "cuda/chunk_fwd/traits.h"
#include "cuda/common/device.cuh"

namespace openkda::cuda::chunk_forward {

template <int kK, int kBT, int kWarps, bool kTransition, bool kHandoff, bool kF16Keys, ScanIo kIo>
struct ScanKernelTag {};  // one cached shared-memory set-up per scan kernel
template <int kK, int kBT, bool kHandoff, PrepPath kPath>
struct PrepKernelTag {};
template <int kK>
struct CombineKernelTag {};

template <int kThreads>
cudaError_t launch_chunk_index(const ChunkFwdParams& p, cudaStream_t stream) {
  openkda_fwd_chunk_index_kernel<kThreads><<<1, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

// grid: slots * HV CTAs, or prep_ctas persistent ones with the hand-off (K = 128 only:
// plan.h's plan_prep).
template <int kK, int kBT, bool kHandoff, PrepPath kPath>
cudaError_t launch_prep_kernel(const ChunkFwdParams& p, int64_t ctas, cudaStream_t stream) {
  using Tr = PrepTraits<kK, kBT, kPath>;
  const auto kernel = openkda_fwd_prep_kernel<kK, kBT, kHandoff, kPath>;
  const cudaError_t err = set_max_dynamic_smem_once<PrepKernelTag<kK, kBT, kHandoff, kPath>>(
      kernel, static_cast<int>(Tr::kSmemBytes));
  if (err != cudaSuccess) return err;
  kernel<<<static_cast<unsigned>(ctas), Tr::kThreads, Tr::kSmemBytes, stream>>>(p);
  return cudaGetLastError();
}

template <int kK, int kBT, PrepPath kPath>
cudaError_t launch_prep(const ChunkFwdParams& p, cudaStream_t stream) {
  if constexpr (kK == 128) {
    if (p.ready != nullptr) return launch_prep_kernel<kK, kBT, true, kPath>(p, p.prep_ctas, stream);
  }
  return launch_prep_kernel<kK, kBT, false, kPath>(p, p.slots * p.HV, stream);
}

// slices: V slices per segment (p.vsplit), or (V + K) / 64 for the transition pass.
template <int kK, int kBT, int kWarps, bool kTransition, bool kHandoff, bool kF16Keys, ScanIo kIo>
cudaError_t launch_scan_pass(const ChunkFwdParams& p, int64_t slices, cudaStream_t stream) {
  using Tr = ScanTraits<kK, kBT, kTransition, kF16Keys, kIo>;
  const auto kernel =
      openkda_fwd_scan_kernel<kK, kBT, kWarps, kTransition, kHandoff, kF16Keys, kIo>;
  constexpr int kSmem = static_cast<int>(Tr::smem_bytes(16 * kWarps, kHandoff));
  const cudaError_t err = set_max_dynamic_smem_once<
      ScanKernelTag<kK, kBT, kWarps, kTransition, kHandoff, kF16Keys, kIo>>(kernel, kSmem);
  if (err != cudaSuccess) return err;
  const int64_t ctas = p.N * p.HV * p.nseg * slices;
  if constexpr (!kHandoff) {
    kernel<<<static_cast<unsigned>(ctas), 32 * kWarps, kSmem, stream>>>(p);
    return cudaGetLastError();
  } else {
    // The scan is the prep's programmatic dependent: placed as the prep's CTAs leave
    // multiprocessors, it waits on the tiles' ready marks, not on the prep grid (handoff.cuh).
    cudaLaunchAttribute attribute{};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(static_cast<unsigned>(ctas));
    config.blockDim = dim3(32 * kWarps);
    config.dynamicSmemBytes = kSmem;
    config.stream = stream;
    config.attrs = &attribute;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, kernel, p);
  }
}

template <int kK>
cudaError_t launch_combine(const ChunkFwdParams& p, cudaStream_t stream) {
  const auto kernel = openkda_fwd_segment_combine_kernel<kK>;
  constexpr int kSmem = static_cast<int>(combine_smem_bytes<kK>());
  const cudaError_t err = set_max_dynamic_smem_once<CombineKernelTag<kK>>(kernel, kSmem);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(p.N * p.HV), static_cast<unsigned>(p.V / kCombineCols));
  kernel<<<grid, kCombineThreads, kSmem, stream>>>(p);
  return cudaGetLastError();
}

// vs in {64, 128} (plan.h's plan_scan): 4 or 8 warps. With a time split (nseg > 1, vs = 64) the
// transition and combine passes run first (segments.cuh).
// With the hand-off (K = 128, vs = 128, one segment: plan.h's plan_prep) the 8-warp scan that
// waits on the prep's ready marks.
template <int kK, int kBT, bool kF16Keys, ScanIo kIo>
cudaError_t launch_scan_passes(const ChunkFwdParams& p, cudaStream_t stream) {
  if constexpr (kK == 128) {
    if (p.ready != nullptr)
      return launch_scan_pass<kK, kBT, 8, false, true, kF16Keys, kIo>(p, p.vsplit, stream);
  }
  if (p.nseg > 1) {
    cudaError_t err =
        launch_scan_pass<kK, kBT, 4, true, false, kF16Keys, kIo>(p, (p.V + kK) / 64, stream);
    if (err == cudaSuccess) err = launch_combine<kK>(p, stream);
    if (err != cudaSuccess) return err;
  }
  return p.vs == 64
             ? launch_scan_pass<kK, kBT, 4, false, false, kF16Keys, kIo>(p, p.vsplit, stream)
             : launch_scan_pass<kK, kBT, 8, false, false, kF16Keys, kIo>(p, p.vsplit, stream);
}

// The key tiles' format (p.f16_keys) and, with f16 keys, the input / output formats
// (params.h: scan_io_of) are the run-time choices made here.
template <int kK, int kBT>
cudaError_t launch_scan(const ChunkFwdParams& p, cudaStream_t stream) {
  if (!p.f16_keys) return launch_scan_passes<kK, kBT, false, ScanIo::kGeneric>(p, stream);
  switch (scan_io_of(p)) {
    case ScanIo::kBF16: return launch_scan_passes<kK, kBT, true, ScanIo::kBF16>(p, stream);
    case ScanIo::kF16: return launch_scan_passes<kK, kBT, true, ScanIo::kF16>(p, stream);
    default: return launch_scan_passes<kK, kBT, true, ScanIo::kGeneric>(p, stream);
  }
}

}  // namespace openkda::cuda::chunk_forward

#define OPENKDA_INSTANTIATE_CHUNK_FWD_PREP(K, BT, PATH)                                           \
  template cudaError_t                                                                            \
  openkda::cuda::chunk_forward::launch_prep<K, BT, openkda::cuda::chunk_forward::PrepPath::PATH>( \
      const openkda::cuda::chunk_forward::ChunkFwdParams&, cudaStream_t)

#define OPENKDA_INSTANTIATE_CHUNK_FWD_SCAN(K, BT)                        \
  template cudaError_t openkda::cuda::chunk_forward::launch_scan<K, BT>( \
      const openkda::cuda::chunk_forward::ChunkFwdParams&, cudaStream_t)

#define OPENKDA_INSTANTIATE_CHUNK_FWD_INDEX()                                                    \
  template cudaError_t                                                                           \
  openkda::cuda::chunk_forward::launch_chunk_index<openkda::cuda::chunk_forward::kIndexThreads>( \
      const openkda::cuda::chunk_forward::ChunkFwdParams&, cudaStream_t)
