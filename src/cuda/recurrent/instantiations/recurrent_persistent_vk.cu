// Persistent fused_recurrent_kda kernels (persistent.cuh) for an f32 state source in layout
// [.., V, K] (state_v_first); K and V in {64, 128}.
#include "cuda/recurrent/persistent.cuh"

OPENKDA_INSTANTIATE_RECURRENT_PERSISTENT(64, 64, true);
OPENKDA_INSTANTIATE_RECURRENT_PERSISTENT(64, 128, true);
OPENKDA_INSTANTIATE_RECURRENT_PERSISTENT(128, 64, true);
OPENKDA_INSTANTIATE_RECURRENT_PERSISTENT(128, 128, true);
