// Entry points of the CUDA gate kernels, called by the core (src/core) for tensors on a CUDA
// device; the other kernel families have the same kind of header next to their kernels
// (chunk_fwd/launch_chunk_fwd.h, recurrent/launch_recurrent.h).
//
// Framework-free and CUDA-free: this header includes only the public API, so g++-compiled core
// sources include it under OPENKDA_WITH_CUDA. Arguments are validated by the core
// (can_implement) before any call here. Launchers enqueue work on `stream` (a cudaStream_t; null
// is the legacy default stream) on the current device; they never allocate, never synchronise the
// host, and are CUDA-graph capturable. A failed launch returns StatusCode::kInternal.
#pragma once

#include <cstddef>

#include "openkda/api.h"
#include "openkda/args.h"
#include "openkda/status.h"

namespace openkda::cuda {

// Index of the calling thread's current CUDA device (cudaGetDevice), or -1 when there is none
// (no device, no driver).
int current_device();

// fused_kda_gate forward: y = gate(g, A_log, dt_bias, lower_bound) in y's dtype.
Status gate_fwd(const GateFwdArgs& args, Stream stream);

// Scratch of gate_bwd: per-row-block partial sums of ddt_bias and dA_log (0 when neither
// dt_bias nor A_log is defined). Depends only on the shapes and on which of them are defined.
size_t gate_bwd_workspace_bytes(const GateBwdArgs& args);

// fused_kda_gate backward: dg, and dA_log / ddt_bias (when defined) reduced deterministically
// through `workspace` (at least gate_bwd_workspace_bytes(args) bytes, 16-byte aligned, on the
// tensors' device; its contents on entry do not matter).
Status gate_bwd(const GateBwdArgs& args, Workspace workspace, Stream stream);

}  // namespace openkda::cuda
