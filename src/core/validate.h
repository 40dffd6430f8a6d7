// Validation of every op's Args: the first failing precondition, with the argument, the value seen
// and the value expected. Runs before any work and never touches device memory; host-side values
// (cu_seqlens, state indices) are checked only when they live on the host.
#pragma once

#include "openkda/args.h"
#include "openkda/status.h"

namespace openkda {

Status validate(const ChunkFwdArgs& args);
Status validate(const ChunkBwdArgs& args);
Status validate(const RecurrentFwdArgs& args);
Status validate(const GateFwdArgs& args);
Status validate(const GateBwdArgs& args);

}  // namespace openkda
