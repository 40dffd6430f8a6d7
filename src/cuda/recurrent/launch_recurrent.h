// CUDA backend of fused_recurrent_kda (decode and speculative verify): the entry points the core
// calls for CUDA tensors. Framework-free and CUDA-free, so g++-compiled core sources include it
// under OPENKDA_WITH_CUDA.
#pragma once

#include "openkda/api.h"
#include "openkda/args.h"
#include "openkda/status.h"

namespace openkda::cuda {

// What the CUDA kernel adds to the core's validation: K and V among the compiled head dims
// {64, 128}, a state dtype the kernel loads, 16-byte aligned state buffers, a grid that fits.
// kNotSupported with a message naming the value and the compiled choices otherwise.
Status recurrent_fwd_supported(const RecurrentFwdArgs& args);

// fused_recurrent_kda forward on `stream` (a cudaStream_t; null is the legacy default stream) for
// validated args (the core's can_implement): writes o and the states (in place into the pool,
// per token into final_state, or the final state per sequence). No allocation, no host
// synchronisation, CUDA-graph capturable; cu_seqlens, ssm_state_indices and num_accepted_tokens
// are read on the device only. Device values the host could not check are clamped, never
// trusted as addresses: cu_seqlens to [0, T] (token_span), index columns past state_indices'
// width and slots outside [0, num_slots) store nothing. Calls recurrent_fwd_supported first.
Status recurrent_fwd(const RecurrentFwdArgs& args, Stream stream);

}  // namespace openkda::cuda
