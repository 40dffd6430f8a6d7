// fused_recurrent_kda kernels for state layout [.., V, K] (state_v_first),
// 4-byte and 8-byte state dtypes (f32, f64): runs of 4 elements; K and V in {64, 128}.
#include "cuda/recurrent/kernel.cuh"

OPENKDA_INSTANTIATE_RECURRENT(64, 64, true, 4);
OPENKDA_INSTANTIATE_RECURRENT(64, 128, true, 4);
OPENKDA_INSTANTIATE_RECURRENT(128, 64, true, 4);
OPENKDA_INSTANTIATE_RECURRENT(128, 128, true, 4);
