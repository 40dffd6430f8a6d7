// openkda_fwd_recurrent_persistent_kernel: fused_recurrent_kda forward for large batches with an
// fp32 state source, the state of the next work items streamed through shared memory.
//
// Work item: (slice, hv, n) as in kernel.cuh (one 64-column slice of one value head of one
// sequence, all its tokens), numbered item = (n * HV + hv) * kSlices + slice. The grid is
// persistent (launch.cu sizes it to the CTAs that fit on the device at once); CTA b runs items
// b, b + grid, b + 2 grid, ... in order.
//
// Streaming: the state slice of item j + 2 is copied into shared memory with cp.async (16-byte
// runs, L1 bypassed) while item j runs, so every CTA keeps one or two items' state loads in
// flight during its prologue, reductions and stores, and HBM never waits for the next CTA to be
// scheduled (the one-item kernel's CTAs load, then compute, then store, and the loads of an SM
// pause whenever its resident CTAs are all past their load phase). Two shared-memory stages of
// kThreads x kRuns x 16 bytes (2 x 32 KB at K = 128): stage j & 1 holds item j. Each thread
// copies and later reads only its own runs, laid out run-major ((run * kThreads + tid) * 16 B) so
// that both the copies and the reads of a warp touch 512 contiguous bytes (no bank conflicts).
//
// Per item j (every branch below is uniform over the CTA, so the barriers are too):
//   1. bounds (cu_seqlens), gate parameters and token 0's inputs are issued;
//   2. cp.async.wait_group 1 (item j's copies have landed; item j + 1's may still be in flight),
//      the tile moves from stage j & 1 into registers (or zeros when the item has no state);
//   3. __syncthreads: every read of stage j & 1 (and of the previous item's TokenSmem) is done;
//   4. the copies of item j + 2 go into stage j & 1 (its slot chain is read here; one commit per
//      item, empty when there is nothing to copy, so the group count stays uniform);
//   5. an empty sequence in pool mode is skipped (its state is never written);
//   6. the token loop of kernel.cuh (prologue -> barrier -> token_update -> stores), unchanged.
// Item j + 2's source slot may be read before item j writes its slots: distinct items own
// distinct state regions unless two sequences share a slot, which no launch order makes defined.
// No atomics, no allocation; deterministic (the arithmetic is that of the one-item kernel).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/device.cuh"
#include "cuda/recurrent/step.cuh"

namespace openkda::cuda::recurrent {

template <class Tr>
struct PersistentLayout {
  static_assert(Tr::kVec == 4, "the persistent kernel streams an f32 state: 4 elements per run");
  static constexpr int kRuns = Tr::kTileD * Tr::kTileE / Tr::kVec;  // 16-byte runs per thread
  static constexpr int kStageBytes = kRuns * Tr::kThreads * 16;
  static constexpr int kStages = 2;
  static constexpr int kSmemBytes = kStages * kStageBytes;  // dynamic shared memory
};

__device__ __forceinline__ void cp_async_16B(uint32_t smem_addr, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr), "l"(gmem) : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Row of the initial state of sequence n: initial_state[n] without a pool, else the pool slot
// state_indices[n, num_accepted[n] - 1] (column 0 without num_accepted); -1 (zero state) without
// an initial state, or for a column or slot out of range (as kernel.cuh).
__device__ __forceinline__ int64_t initial_state_row(const RecurrentParams& p, int n) {
  if (p.h0 == nullptr) return -1;
  if (!p.pool) return n;
  const int64_t col =
      p.num_accepted != nullptr ? load_index(p.num_accepted, p.acc_dtype, n) - 1 : 0;
  if (col < 0 || col >= p.idx_cols) return -1;
  const int64_t row = load_index(p.state_indices, p.idx_dtype, n * p.idx_cols + col);
  return row >= 0 && row < p.num_slots ? row : -1;
}

// Issues this thread's copies of the initial state of `item` into the stage at `stage_addr`
// (shared address). Returns whether the item has a state (false: nothing issued, zeros).
template <class Tr>
__device__ __forceinline__ bool prefetch_item_state(const RecurrentParams& p, uint32_t item,
                                                    uint32_t stage_addr, int tid) {
  const int slice = static_cast<int>(item % Tr::kSlices);
  const uint32_t nh = item / Tr::kSlices;
  const int hv = static_cast<int>(nh % static_cast<uint32_t>(p.HV));
  const int n = static_cast<int>(nh / static_cast<uint32_t>(p.HV));
  const int64_t row = initial_state_row(p, n);
  if (row < 0) return false;
  const float* head = static_cast<const float*>(p.h0) + (row * p.HV + hv) * Tr::kHeadElems;
  const StateTile<Tr> S(tid & 31, tid >> 5, slice * Tr::kBlockV);  // geometry only
  const uint32_t dst = stage_addr + static_cast<uint32_t>(tid) * 16u;
  constexpr uint32_t kRunStride = Tr::kThreads * 16u;
  if constexpr (Tr::kVFirst) {
    constexpr int kRunsD = Tr::kTileD / Tr::kVec;
#pragma unroll
    for (int i = 0; i < Tr::kTileE; ++i)
#pragma unroll
      for (int r = 0; r < kRunsD; ++r)
        cp_async_16B(dst + (i * kRunsD + r) * kRunStride,
                     head + S.e_of(i) * Tr::kK + S.d_of(r * Tr::kVec));
  } else {
#pragma unroll
    for (int j = 0; j < Tr::kTileD; ++j)
      cp_async_16B(dst + j * kRunStride, head + S.d_of(j) * Tr::kV + S.e_base);
  }
  return true;
}

// This thread's runs of the stage at `stage` -> the register tile (the order of
// prefetch_item_state).
template <class Tr>
__device__ __forceinline__ void load_tile_from_stage(StateTile<Tr>& S, const float4* stage,
                                                     int tid) {
  if constexpr (Tr::kVFirst) {
    constexpr int kRunsD = Tr::kTileD / Tr::kVec;
#pragma unroll
    for (int i = 0; i < Tr::kTileE; ++i)
#pragma unroll
      for (int r = 0; r < kRunsD; ++r) {
        const float4 x = stage[(i * kRunsD + r) * Tr::kThreads + tid];
        S.s[r * Tr::kVec + 0][i] = x.x;
        S.s[r * Tr::kVec + 1][i] = x.y;
        S.s[r * Tr::kVec + 2][i] = x.z;
        S.s[r * Tr::kVec + 3][i] = x.w;
      }
  } else {
#pragma unroll
    for (int j = 0; j < Tr::kTileD; ++j) {
      const float4 x = stage[j * Tr::kThreads + tid];
      S.s[j][0] = x.x;
      S.s[j][1] = x.y;
      S.s[j][2] = x.z;
      S.s[j][3] = x.w;
    }
  }
}

extern __shared__ float4 openkda_recurrent_stages[];  // PersistentLayout::kSmemBytes, dynamic

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocksPerSm)
    openkda_fwd_recurrent_persistent_kernel(const __grid_constant__ RecurrentParams p,
                                            uint32_t num_items) {
  using L = PersistentLayout<Tr>;
  __shared__ TokenSmem<Tr> smem;
  const int tid = threadIdx.x;
  const uint32_t stages_addr =
      static_cast<uint32_t>(__cvta_generic_to_shared(openkda_recurrent_stages));
  // NOTE: 32-bit item arithmetic (registers): num_items < 2^31 (launch.cu checks the grid of the
  // one-item kernel) and the grid is at most the resident CTAs (thousands), so item + 2 grid <
  // 2^32.
  const uint32_t first = blockIdx.x, stride = gridDim.x;

  // Items 0 and 1 of this CTA into stages 0 and 1; bit s of has_state: stage s holds a state.
  unsigned has_state = 0;
#pragma unroll
  for (int s = 0; s < L::kStages; ++s) {
    const uint32_t item = first + s * stride;
    if (item < num_items && prefetch_item_state<Tr>(p, item, stages_addr + s * L::kStageBytes, tid))
      has_state |= 1u << s;
    cp_async_commit();
  }

  int stage = 1;
  for (uint32_t item = first; item < num_items; item += stride) {
    stage ^= 1;  // item j of this CTA is in stage j & 1
    const int slice = static_cast<int>(item % Tr::kSlices);
    const uint32_t nh = item / Tr::kSlices;
    const int hv = static_cast<int>(nh % static_cast<uint32_t>(p.HV));
    const int n = static_cast<int>(nh / static_cast<uint32_t>(p.HV));
    const int h = hv / p.group;

    // 1. Bounds, gate parameters, token 0's inputs.
    int64_t bos = static_cast<int64_t>(n) * p.T, len = p.T;
    if (p.cu_seqlens != nullptr) {
      bos = load_index(p.cu_seqlens, p.cu_dtype, n);
      len = load_index(p.cu_seqlens, p.cu_dtype, n + 1) - bos;
    }
    uint32_t bias_bits = 0, A_bits = 0;
    if (p.gate_in_kernel) {
      if (p.dt_bias != nullptr && tid < Tr::kK)
        bias_bits = load_bits(p.dt_bias, p.dt_bias_dtype, static_cast<int64_t>(hv) * Tr::kK + tid);
      if (p.A_log != nullptr) A_bits = load_bits(p.A_log, p.A_log_dtype, hv);
    }
    StateTile<Tr> S(tid & 31, tid >> 5, slice * Tr::kBlockV);
    RowInputs row{};
    ColumnInputs<Tr> col{};
    if (len > 0) {
      row = load_row_inputs<Tr>(p, bos, 0, n, h, hv, tid);
      col = load_column_inputs<Tr>(p, S, bos, hv);
    }

    // 2. Item j's state: stage `stage` -> registers.
    cp_async_wait<L::kStages - 1>();
    if (has_state & (1u << stage))
      load_tile_from_stage<Tr>(S, openkda_recurrent_stages + stage * (L::kStageBytes / 16), tid);
    else
      S.zero();
    // 3. NOTE: the one barrier per item: after it, stage `stage` may be overwritten (every
    // thread has read its runs) and TokenSmem buffer 0 may be rewritten (the previous item's
    // last token_update is done on every thread).
    __syncthreads();
    // 4. Item j + 2 into the stage just read.
    {
      const uint32_t next = item + L::kStages * stride;
      has_state &= ~(1u << stage);
      if (next < num_items &&
          prefetch_item_state<Tr>(p, next, stages_addr + stage * L::kStageBytes, tid))
        has_state |= 1u << stage;
      cp_async_commit();
    }
    // 5. Continuous batching: an empty sequence is untouched.
    if (p.pool && len <= 0) continue;

    const float bias = p.dt_bias != nullptr ? bits_to_f32(bias_bits, p.dt_bias_dtype) : 0.0f;
    const float a_coef =
        p.A_log != nullptr ? exp_f32(bits_to_f32(A_bits, p.A_log_dtype)) : p.a_default;

    // 6. The tokens and the final store (step.cuh).
    run_tokens<Tr>(p, S, smem, row, col, bias, a_coef, bos, len, n, h, hv, tid);
  }
  cp_async_wait<0>();  // the copies past the last item are empty groups; none outlives the CTA
}

// CTAs of the persistent kernel that fit on one SM at once (0: it does not fit), after raising
// its dynamic shared-memory limit; cached per device after the first positive answer.
// Host-only runtime calls (no stream work): capturable.
template <class Tr>
cudaError_t recurrent_persistent_ctas_per_sm(int* ctas) {
  int device = 0;
  const cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  return cached_per_device<PersistentLayout<Tr>>(device, ctas, [](int* out) {
    const auto kernel = &openkda_fwd_recurrent_persistent_kernel<Tr>;
    constexpr int kSmem = PersistentLayout<Tr>::kSmemBytes;
    cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (e != cudaSuccess) return e;
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess) return e;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(out, kernel, Tr::kThreads, kSmem);
  });
}

// Enqueues the persistent kernel on `grid` CTAs (1 <= grid; launch.cu: SMs x ctas per SM, at
// most the number of items) after recurrent_persistent_ctas_per_sm<Tr>.
template <class Tr>
cudaError_t launch_recurrent_persistent(const RecurrentParams& p, int grid, cudaStream_t stream) {
  const long long items = static_cast<long long>(p.N) * p.HV * Tr::kSlices;
  if (items == 0 || grid < 1) return cudaSuccess;
  openkda_fwd_recurrent_persistent_kernel<Tr>
      <<<static_cast<unsigned>(grid), Tr::kThreads, PersistentLayout<Tr>::kSmemBytes, stream>>>(
          p, static_cast<uint32_t>(items));
  return cudaGetLastError();
}

}  // namespace openkda::cuda::recurrent

// Explicit instantiation of the persistent launcher pair for one compiled f32 configuration.
#define OPENKDA_INSTANTIATE_RECURRENT_PERSISTENT(K, V, V_FIRST)                    \
  template cudaError_t openkda::cuda::recurrent::recurrent_persistent_ctas_per_sm< \
      openkda::cuda::recurrent::RecurrentTraits<K, V, V_FIRST, 4>>(int*);          \
  template cudaError_t openkda::cuda::recurrent::launch_recurrent_persistent<      \
      openkda::cuda::recurrent::RecurrentTraits<K, V, V_FIRST, 4>>(                \
      const openkda::cuda::recurrent::RecurrentParams&, int, cudaStream_t)
