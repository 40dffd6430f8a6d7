// chunk_kda forward scan kernels (K in {64, 128}, chunk size in {32, 64}; V is a run-time value)
// and the varlen chunk-index kernel.
#include "cuda/chunk_fwd/kernels.cuh"

OPENKDA_INSTANTIATE_CHUNK_FWD_SCAN(64, 64);
OPENKDA_INSTANTIATE_CHUNK_FWD_SCAN(128, 64);
OPENKDA_INSTANTIATE_CHUNK_FWD_SCAN(64, 32);
OPENKDA_INSTANTIATE_CHUNK_FWD_SCAN(128, 32);
OPENKDA_INSTANTIATE_CHUNK_FWD_INDEX();
