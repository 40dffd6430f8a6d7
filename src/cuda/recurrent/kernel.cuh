// openkda_fwd_recurrent_kernel: fused_recurrent_kda forward (decode and speculative verify).
//
// Grid: N * HV * Traits::kSlices CTAs of Traits::kThreads threads; CTA -> (slice, hv, n) with the
// slice fastest. A CTA runs every token of its sequence with its state slice in registers:
//   1. the initial-slot chain (num_accepted_tokens -> state_indices) and the sequence bounds
//      (cu_seqlens on the device, or n * T) are issued together; an empty sequence in pool mode
//      exits (neither read nor written);
//   2. token 0's inputs (raw bits), then the 16-byte state loads of the initial state (or zeros);
//   3. per token: prefetch of token t + 1, prologue (smem) -> __syncthreads -> token_update
//      (step.cuh) -> state store to the pool slot state_indices[n, t] or final_state[tok] (pool
//      mode);
//   4. without a pool: one store of the final state into final_state[n] (or initial_state[n]
//      in place).
// A slot outside [0, num_slots) is neither read (zero state) nor written, and num_accepted_tokens
// outside [1, idx_cols] gives a zero initial state: device indices cannot be validated on the
// host, and vLLM pads with -1.
// No atomics, no allocation; deterministic (fixed reduction order).
#pragma once

#include <cuda_runtime.h>

#include "cuda/recurrent/step.cuh"

namespace openkda::cuda::recurrent {

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocksPerSm)
    openkda_fwd_recurrent_kernel(const __grid_constant__ RecurrentParams p) {
  __shared__ TokenSmem<Tr> smem;
  const int tid = threadIdx.x;
  const int slice = blockIdx.x % Tr::kSlices;
  const int nh = blockIdx.x / Tr::kSlices;
  const int hv = nh % p.HV;
  const int n = nh / p.HV;
  const int h = hv / p.group;

  // NOTE: issue order matters at small batch, where the latency chain is the run time. Two
  // independent chains start before either is consumed: num_accepted -> state_indices -> state,
  // and cu_seqlens -> token inputs. Loads land in raw-bit registers and are converted at use.
  // Initial state: initial_state[n], or pool slot state_indices[n, num_accepted[n] - 1].
  bool has_src = p.h0 != nullptr && !p.pool;
  uint64_t slot_bits = static_cast<uint64_t>(n);
  if (p.h0 != nullptr && p.pool) {
    const int64_t col_idx =
        p.num_accepted != nullptr ? load_index(p.num_accepted, p.acc_dtype, n) - 1 : 0;
    has_src = col_idx >= 0 && col_idx < p.idx_cols;
    if (has_src)
      slot_bits = load_index_bits(p.state_indices, p.idx_dtype, n * p.idx_cols + col_idx);
  }
  const TokenSpan span = token_span(p, n);
  const int64_t bos = span.bos, len = span.len;
  if (p.pool && len <= 0) return;  // continuous batching: an empty slot is untouched

  StateTile<Tr> S(tid & 31, tid >> 5, slice * Tr::kBlockV);
  // Token 0's inputs and the gate parameters (consumed after the state load).
  RowInputs row{};
  ColumnInputs<Tr::kTileE> col{};
  if (len > 0) {
    row = load_row_inputs<Tr>(p, bos, 0, n, h, hv, tid);
    col = load_tile_columns<Tr>(p, S, bos, hv);
  }
  uint32_t bias_bits = 0, A_bits = 0;
  if (p.gate_in_kernel) {
    if (p.dt_bias != nullptr && tid < Tr::kK)
      bias_bits = load_bits(p.dt_bias, p.dt_bias_dtype, static_cast<int64_t>(hv) * Tr::kK + tid);
    if (p.A_log != nullptr) A_bits = load_bits(p.A_log, p.A_log_dtype, hv);
  }

  int64_t src_row = -1;
  if (has_src) {
    src_row = p.pool ? index_from_bits(slot_bits, p.idx_dtype) : n;
    if (p.pool && (src_row < 0 || src_row >= p.num_slots)) src_row = -1;
  }
  if (src_row >= 0)
    S.load_any(p.h0, p.h0_dtype, (src_row * p.HV + hv) * Tr::kHeadElems);
  else
    S.zero();

  const float bias = p.dt_bias != nullptr ? bits_to_f32(bias_bits, p.dt_bias_dtype) : 0.0f;
  const float a_coef =
      p.A_log != nullptr ? exp_f32(bits_to_f32(A_bits, p.A_log_dtype)) : p.a_default;

  run_tokens<Tr>(p, S, smem, row, col, bias, a_coef, bos, len, n, h, hv, tid);
}

// Enqueues the kernel for p (N * HV * kSlices CTAs; the caller checked the grid fits).
template <class Tr>
cudaError_t launch_recurrent(const RecurrentParams& p, cudaStream_t stream) {
  const long long blocks = static_cast<long long>(p.N) * p.HV * Tr::kSlices;
  if (blocks == 0) return cudaSuccess;
  openkda_fwd_recurrent_kernel<Tr><<<static_cast<unsigned>(blocks), Tr::kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace openkda::cuda::recurrent

// Explicit instantiation of the launcher for one compiled configuration (cmake/OpenkdaCuda.cmake).
#define OPENKDA_INSTANTIATE_RECURRENT(K, V, V_FIRST, VEC)             \
  template cudaError_t openkda::cuda::recurrent::launch_recurrent<    \
      openkda::cuda::recurrent::RecurrentTraits<K, V, V_FIRST, VEC>>( \
      const openkda::cuda::recurrent::RecurrentParams&, cudaStream_t)
