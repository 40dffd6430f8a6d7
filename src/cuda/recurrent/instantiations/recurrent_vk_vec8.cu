// fused_recurrent_kda kernels for state layout [.., V, K] (state_v_first),
// 2-byte state dtypes (bf16, f16): runs of 8 elements; K and V in {64, 128}.
#include "cuda/recurrent/kernel.cuh"

OPENKDA_INSTANTIATE_RECURRENT(64, 64, true, 8);
OPENKDA_INSTANTIATE_RECURRENT(64, 128, true, 8);
OPENKDA_INSTANTIATE_RECURRENT(128, 64, true, 8);
OPENKDA_INSTANTIATE_RECURRENT(128, 128, true, 8);
