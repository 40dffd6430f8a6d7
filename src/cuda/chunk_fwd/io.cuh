// Global-memory access of run-time dtypes (f16, bf16, f32, f64) for the chunk_kda forward: the
// input and output dtypes are run-time values (one kernel serves every dtype combination), so
// every access switches on the dtype. The switch is uniform over the grid (no divergence).
//
// load_run / store_run move N consecutive elements as one aligned vector access (N * size bytes);
// the caller guarantees the alignment (16-byte aligned base, N | row length, element index a
// multiple of N). One element moves through load_f32 / store_f32 (common/math.cuh).
#pragma once

#include <cstdint>

#include "cuda/common/math.cuh"
#include "cuda/common/vec.cuh"
#include "openkda/tensor_ref.h"

namespace openkda::cuda::chunk_forward {

template <typename T, int N>
__device__ __forceinline__ void load_run_as(const void* base, int64_t idx, float (&out)[N]) {
  const Pack<T, N> pk = load_pack<T, N>(static_cast<const T*>(base) + idx);
#pragma unroll
  for (int e = 0; e < N; ++e) out[e] = to_f32(pk.v[e]);
}

template <int N>
__device__ __forceinline__ void load_run(const void* base, DType dtype, int64_t idx,
                                         float (&out)[N]) {
  switch (dtype) {
    case DType::kBF16: load_run_as<__nv_bfloat16, N>(base, idx, out); break;
    case DType::kF16: load_run_as<__half, N>(base, idx, out); break;
    case DType::kF64: load_run_as<double, N>(base, idx, out); break;
    default: load_run_as<float, N>(base, idx, out); break;
  }
}

}  // namespace openkda::cuda::chunk_forward
