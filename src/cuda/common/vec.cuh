// Vectorised global- or shared-memory access: N consecutive elements moved as one aligned pack,
// so a thread issues 16-byte loads and stores (8 x bf16/f16, or 2 x 16 B for f32) instead of N
// narrow ones.
//
// The caller guarantees that `ptr` is aligned to sizeof(Pack<T, N>) (launchers check the base
// pointers and pick N = 1 otherwise).
//
// prefetch_l2 brings the 128-byte line holding `p` into L2 (no register result, never faults on a
// valid address; callers pass only addresses inside their tensors).
#pragma once

namespace openkda::cuda {

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
}

template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

template <typename T, int N>
__device__ __forceinline__ Pack<T, N> load_pack(const T* __restrict__ ptr) {
  return *reinterpret_cast<const Pack<T, N>*>(ptr);
}

template <typename T, int N>
__device__ __forceinline__ void store_pack(T* __restrict__ ptr, const Pack<T, N>& pack) {
  *reinterpret_cast<Pack<T, N>*>(ptr) = pack;
}

}  // namespace openkda::cuda
