// CUDA backend of chunk_kda forward: the entry points the core calls for CUDA tensors.
// Framework-free and CUDA-free, so g++-compiled core sources include it under OPENKDA_WITH_CUDA.
//
// The core (src/core/dispatch.cpp) calls, for ChunkFwdArgs on a CUDA device:
//   can_implement   -> validate(args), then chunk_fwd_can_implement(args)
//   workspace_bytes -> chunk_fwd_workspace_bytes(args)
//   run             -> chunk_fwd(args, workspace, stream)
#pragma once

#include <cstddef>

#include "openkda/api.h"
#include "openkda/args.h"
#include "openkda/status.h"

namespace openkda::cuda {

// What the CUDA kernels add to the core's validation (which the args must already pass): K and V
// in {64, 128}, final_state f32, 16-byte aligned q/k/v/g/o (32 for f64), grids that fit, at most
// 2^31 - 1 tokens (B T) when any input is read by tensor-map boxes (int32 rows: q, k and g unless
// one is f64, a bf16 / f16 v), and, when the scan is split in time (few state chains;
// segments.cuh), final_state not sharing memory with initial_state. kNotSupported with a message
// naming the value and the supported choices otherwise.
Status chunk_fwd_can_implement(const ChunkFwdArgs& args);

// Bytes of scratch chunk_fwd needs (the f32 intermediates of every chunk slot and value head, as
// whole 32-row tiles: ~70 KB per slot and head at K = V = 128; the varlen chunk tables; the time
// split's segment states); depends on the shapes, on whether h is requested, and on the current
// device's SM count (the time split's plan), never on device data. The kernels' chunk is BT = 32
// whatever args.chunk_size (plan.h: kKernelChunk). With varlen the slot count is the bound
// floor((T + N (BT - 1)) / BT), so short sequences cost more than their tokens: each takes whole
// slots (N = T one-token sequences: 32x the workspace of one sequence of T tokens). For args that
// pass chunk_fwd_can_implement (the core's workspace_bytes checks them first).
size_t chunk_fwd_workspace_bytes(const ChunkFwdArgs& args);

// chunk_kda forward on `stream` (a cudaStream_t; null is the legacy default stream) for args that
// pass the core's validation and chunk_fwd_can_implement (the core's run checks both first, once
// per call): writes o, final_state (if defined) and h (if defined). `workspace`
// holds at least chunk_fwd_workspace_bytes(args) bytes on the tensors' device, 16-byte aligned;
// its contents on entry do not matter. No allocation, no host synchronisation, no host read of
// device memory (cu_seqlens is read on the device): CUDA-graph capturable, bitwise deterministic.
// Device-side cu_seqlens should be non-decreasing (the core checks host-side ones): the kernels
// clamp every sequence to [0, T] and cap the chunk count at the workspace's slots, so decreasing
// values give overlapping sequences with unspecified o there, never an access outside the
// tensors or the workspace. With varlen, o rows outside [cu_seqlens[0], cu_seqlens[N]) are
// written as 0 (all of o when N = 0, cu_seqlens of one element).
Status chunk_fwd(const ChunkFwdArgs& args, Workspace workspace, Stream stream);

}  // namespace openkda::cuda
