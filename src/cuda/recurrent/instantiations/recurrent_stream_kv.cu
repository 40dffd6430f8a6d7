// Streaming fused_recurrent_kda kernels (stream.cuh) for an f32 state in layout [.., K, V];
// K and V in {64, 128}.
#include "cuda/recurrent/stream.cuh"

OPENKDA_INSTANTIATE_RECURRENT_STREAM(64, 64, false);
OPENKDA_INSTANTIATE_RECURRENT_STREAM(64, 128, false);
OPENKDA_INSTANTIATE_RECURRENT_STREAM(128, 64, false);
OPENKDA_INSTANTIATE_RECURRENT_STREAM(128, 128, false);
