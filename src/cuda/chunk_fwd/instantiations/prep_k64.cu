// chunk_kda forward prep kernels with K = 64: V in {64, 128}, chunk size in {32, 64}.
#include "cuda/chunk_fwd/kernels.cuh"

OPENKDA_INSTANTIATE_CHUNK_FWD_PREP(64, 64, 64);
OPENKDA_INSTANTIATE_CHUNK_FWD_PREP(64, 128, 64);
OPENKDA_INSTANTIATE_CHUNK_FWD_PREP(64, 64, 32);
OPENKDA_INSTANTIATE_CHUNK_FWD_PREP(64, 128, 32);
