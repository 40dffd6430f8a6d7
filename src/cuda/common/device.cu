// The current CUDA device, for the core's check that an op's tensors live on it (cuda/launch.h):
// launchers enqueue on the current device, so a tensor on another one would be addressed through
// the wrong context.
#include <cuda_runtime.h>

#include "cuda/launch.h"

namespace openkda::cuda {

int current_device() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    cudaGetLastError();  // clear the error a failed query leaves behind
    return -1;
  }
  return device;
}

}  // namespace openkda::cuda
