// fused_recurrent_kda kernels for state layout [.., K, V],
// 2-byte state dtypes (bf16, f16): runs of 8 elements; K and V in {64, 128}.
#include "cuda/recurrent/kernel.cuh"

OPENKDA_INSTANTIATE_RECURRENT(64, 64, false, 8);
OPENKDA_INSTANTIATE_RECURRENT(64, 128, false, 8);
OPENKDA_INSTANTIATE_RECURRENT(128, 64, false, 8);
OPENKDA_INSTANTIATE_RECURRENT(128, 128, false, 8);
