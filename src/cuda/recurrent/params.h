// Kernel view of fused_recurrent_kda (FLA's fused_recurrent_kda_fwd): raw pointers, run-time
// dtypes and flags, filled from RecurrentFwdArgs in one function (launch.cu: make_params).
//
// Shapes (contiguous row-major, "tok" = packed token row b * T + t, or bos + t with cu_seqlens):
//   q, k          [B, T, H, K]    qk_dtype            (q/k head h = hv / group)
//   v             [B, T, HV, V]   v_dtype
//   g             [B, T, HV, K]   g_dtype             raw gate (gate_in_kernel) or log-decay
//   beta          [B, T, HV] or headwise [B, T, HV, V]  beta_dtype
//   A_log         [HV]            may be null         (read only with gate_in_kernel)
//   dt_bias       [HV * K]        may be null         (read only with gate_in_kernel)
//   h0            [rows, HV, K, V] ([.., V, K] when state_v_first); rows = N, or num_slots of a
//                 pool with state_indices; may be null (zero initial state)
//   ht            state destination, may be null:
//                   pool && inplace        the pool itself (== h0): slot state_indices[n, t]
//                                          after token t
//                   pool && !inplace       [B * T, HV, K, V]: row tok after token tok
//                   !pool                  [N, HV, K, V]: the final state of sequence n
//   o             [B, T, HV, V]   o_dtype
//   cu_seqlens    [N + 1] i32 | i64 on the device; may be null
//   state_indices [N] or [N, idx_cols] i32 | i64; may be null (no pool)
//   num_accepted  [N] i32 | i64; may be null (initial slot column num_accepted[n] - 1, else 0)
#pragma once

#include <cstdint>

#include "openkda/tensor_ref.h"

namespace openkda::cuda::recurrent {

struct RecurrentParams {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* g = nullptr;
  const void* beta = nullptr;
  const void* A_log = nullptr;
  const void* dt_bias = nullptr;
  const void* h0 = nullptr;
  void* ht = nullptr;
  void* o = nullptr;
  const void* cu_seqlens = nullptr;
  const void* state_indices = nullptr;
  const void* num_accepted = nullptr;

  DType qk_dtype = DType::kUndefined;
  DType v_dtype = DType::kUndefined;
  DType g_dtype = DType::kUndefined;
  DType beta_dtype = DType::kUndefined;
  DType A_log_dtype = DType::kUndefined;
  DType dt_bias_dtype = DType::kUndefined;
  DType h0_dtype = DType::kUndefined;
  DType ht_dtype = DType::kUndefined;
  DType o_dtype = DType::kUndefined;
  DType cu_dtype = DType::kUndefined;
  DType idx_dtype = DType::kUndefined;
  DType acc_dtype = DType::kUndefined;

  int64_t T = 0;          // tokens per batch row (dense layout; unused with cu_seqlens)
  int64_t idx_cols = 1;   // slots per sequence in state_indices (1 for 1-D indices)
  int64_t num_slots = 0;  // pool slots (h0.shape[0]); 0 without a pool
  int N = 0;              // sequences
  int H = 0;              // q/k heads
  int HV = 0;             // value heads
  int group = 1;          // HV / H

  float scale = 1.0f;
  float lower_bound = 0.0f;
  float a_default = 1.0f;   // exp(A_log) when A_log is null: e (softplus gate) or 1 (lower bound)
  float beta_scale = 1.0f;  // 2 with allow_neg_eigval

  bool l2norm = false;
  bool gate_in_kernel = false;
  bool has_lower_bound = false;
  bool beta_sigmoid = false;
  bool headwise_beta = false;
  bool pool = false;              // state_indices given (continuous batching)
  bool inplace = false;           // pool && inplace_final_state: per-token states into the pool
  bool store_each_token = false;  // pool && ht: a state store after every token
  bool store_final = false;       // !pool && ht: one store after the last token
};

}  // namespace openkda::cuda::recurrent
