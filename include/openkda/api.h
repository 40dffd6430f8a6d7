// The host protocol of every op (CUTLASS style): the caller owns all memory.
//   Status can_implement(args)        every precondition, checked before any work
//   size_t workspace_bytes(args)      scratch the op needs on the tensors' device
//   Status run(args, workspace, stream)
// run() re-validates, never allocates device memory, never synchronises the host, and routes by
// device: CPU tensors run the CPU backend, CUDA tensors the kernels. CUDA work is enqueued on the
// calling thread's current CUDA device: make the tensors' device current first (the tensors'
// device index is not compared with it; the Python layer does this with torch.cuda.device).
#pragma once

#include <cstddef>

#include "openkda/args.h"
#include "openkda/status.h"

namespace openkda {

// Caller-owned scratch memory on the tensors' device; 16-byte aligned.
struct Workspace {
  void* data = nullptr;
  size_t bytes = 0;
};

// The CUDA stream as an opaque handle (cudaStream_t); ignored by the CPU backend.
using Stream = void*;

Status can_implement(const ChunkFwdArgs& args);
size_t workspace_bytes(const ChunkFwdArgs& args);
Status run(const ChunkFwdArgs& args, Workspace workspace, Stream stream = nullptr);

Status can_implement(const ChunkBwdArgs& args);
size_t workspace_bytes(const ChunkBwdArgs& args);
Status run(const ChunkBwdArgs& args, Workspace workspace, Stream stream = nullptr);

Status can_implement(const RecurrentFwdArgs& args);
size_t workspace_bytes(const RecurrentFwdArgs& args);
Status run(const RecurrentFwdArgs& args, Workspace workspace, Stream stream = nullptr);

Status can_implement(const GateFwdArgs& args);
size_t workspace_bytes(const GateFwdArgs& args);
Status run(const GateFwdArgs& args, Workspace workspace, Stream stream = nullptr);

Status can_implement(const GateBwdArgs& args);
size_t workspace_bytes(const GateBwdArgs& args);
Status run(const GateBwdArgs& args, Workspace workspace, Stream stream = nullptr);

// Which optional parts this build has ("cuda": compiled CUDA backend and its archs).
struct BuildConfig {
  bool cuda = false;
  const char* cuda_archs = "";
  const char* version = "";
};
BuildConfig build_config();

}  // namespace openkda
