// fused_kda_gate on the CPU (spec 2.3): forward y = gate(g) and backward dg, dA_log, ddt_bias, in
// double, reductions in a fixed token order.
#pragma once

#include "openkda/args.h"

namespace openkda::cpu {

void gate_fwd_cpu(const GateFwdArgs& a);
void gate_bwd_cpu(const GateBwdArgs& a);

}  // namespace openkda::cpu
