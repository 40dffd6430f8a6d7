// Per-device facts and one-time kernel set-up, cached per device: after the first launch on a
// device, launchers make no runtime queries (SM count, shared-memory attributes, occupancy) on
// the hot path.
#pragma once

#include <cuda_runtime.h>

#include <atomic>

namespace openkda::cuda {

constexpr int kMaxCachedDevices = 64;

// Runs `query(int* out)` on `device` until it yields a positive value, then returns that value
// from the cache. `Tag` names the cached quantity (one cache per Tag type).
template <class Tag, class Query>
cudaError_t cached_per_device(int device, int* out, Query&& query) {
  static std::atomic<int> cache[kMaxCachedDevices];  // zero: not known yet
  const bool cacheable = device >= 0 && device < kMaxCachedDevices;
  if (cacheable) {
    const int v = cache[device].load(std::memory_order_relaxed);
    if (v > 0) {
      *out = v;
      return cudaSuccess;
    }
  }
  const cudaError_t err = query(out);
  if (err == cudaSuccess && cacheable && *out > 0)
    cache[device].store(*out, std::memory_order_relaxed);
  return err;
}

// Multiprocessors of the current device.
inline cudaError_t sm_count(int* sms) {
  int device = 0;
  const cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  struct SmCount {};
  return cached_per_device<SmCount>(device, sms, [device](int* out) {
    return cudaDeviceGetAttribute(out, cudaDevAttrMultiProcessorCount, device);
  });
}

// Sets the dynamic shared-memory limit of `kernel` to `bytes` once per device (Tag: the kernel's
// traits type). With max_shared_carveout, also asks for the largest shared-memory carveout of the
// unified L1 / shared storage, for kernels whose occupancy is set by shared memory.
template <class Tag, class Kernel>
cudaError_t set_max_dynamic_smem_once(Kernel kernel, int bytes, bool max_shared_carveout = false) {
  int device = 0;
  const cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  int done = 0;
  return cached_per_device<Tag>(device, &done, [&](int* out) {
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e == cudaSuccess && max_shared_carveout)
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                               cudaSharedmemCarveoutMaxShared);
    *out = e == cudaSuccess ? 1 : 0;
    return e;
  });
}

}  // namespace openkda::cuda
