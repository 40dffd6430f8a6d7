// Per-token inputs of fused_recurrent_kda shared by both kernels (kernel.cuh: register tile,
// stream.cuh: shared-memory tile): run-time dtype loads of q/k/v/g/beta and stores of o, the
// index chains (cu_seqlens, state_indices, num_accepted_tokens), the gate and beta activations,
// the l2norm / scale factors of a token and v' = beta (v - a). No state access here.
//
// Inputs are loaded as raw bits and converted at first use: a conversion right after a load in
// the dtype switch would stall the warp on that load, serialising every input load.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common/math.cuh"
#include "cuda/recurrent/params.h"

namespace openkda::cuda::recurrent {

constexpr unsigned kFullMask = 0xffffffffu;

// ---- run-time dtype element access (inputs and outputs that are not the state) ---------------
__device__ __forceinline__ uint32_t load_bits(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF16:
    case DType::kBF16: return static_cast<const uint16_t*>(p)[i];
    // NOTE: f64 inputs are converted at once (a rare dtype: one stall instead of a 64-bit lane).
    case DType::kF64: return __float_as_uint(__double2float_rn(static_cast<const double*>(p)[i]));
    default: return static_cast<const uint32_t*>(p)[i];
  }
}

__device__ __forceinline__ float bits_to_f32(uint32_t bits, DType dtype) {
  switch (dtype) {
    case DType::kF16: return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));
    case DType::kBF16: return __uint_as_float(bits << 16);
    default: return __uint_as_float(bits);
  }
}

// Indices (i32 | i64) as raw 64-bit words (i32 zero-extended), sign-extended at use.
__device__ __forceinline__ uint64_t load_index_bits(const void* p, DType dtype, int64_t i) {
  return dtype == DType::kI32 ? static_cast<uint64_t>(static_cast<const uint32_t*>(p)[i])
                              : static_cast<const uint64_t*>(p)[i];
}

__device__ __forceinline__ int64_t index_from_bits(uint64_t bits, DType dtype) {
  return dtype == DType::kI32
             ? static_cast<int64_t>(static_cast<int32_t>(static_cast<uint32_t>(bits)))
             : static_cast<int64_t>(bits);
}

__device__ __forceinline__ int64_t load_index(const void* p, DType dtype, int64_t i) {
  return index_from_bits(load_index_bits(p, dtype, i), dtype);
}

// Tokens [bos, bos + len) of sequence n: n T .. with T tokens, or from the device cu_seqlens,
// clamped to 0 <= bos <= bos + len <= T (T = q.shape[1], all tokens with cu_seqlens). Device
// values cannot be validated on the host: malformed ones give empty or shortened sequences, never
// an access outside the tensors.
struct TokenSpan {
  int64_t bos = 0;
  int64_t len = 0;
};

__device__ __forceinline__ TokenSpan token_span(const RecurrentParams& p, int n) {
  if (p.cu_seqlens == nullptr) return TokenSpan{static_cast<int64_t>(n) * p.T, p.T};
  const int64_t a = min(max(load_index(p.cu_seqlens, p.cu_dtype, n), int64_t{0}), p.T);
  const int64_t b = min(max(load_index(p.cu_seqlens, p.cu_dtype, n + 1), a), p.T);
  return TokenSpan{a, b - a};
}

// Row of the initial state of sequence n: initial_state[n] without a pool, else the pool slot
// state_indices[n, num_accepted[n] - 1] (column 0 without num_accepted); -1 (zero state) without
// an initial state, or for a column or slot out of range (device indices cannot be validated on
// the host, and vLLM pads with -1).
__device__ __forceinline__ int64_t initial_state_row(const RecurrentParams& p, int n) {
  if (p.h0 == nullptr) return -1;
  if (!p.pool) return n;
  const int64_t col =
      p.num_accepted != nullptr ? load_index(p.num_accepted, p.acc_dtype, n) - 1 : 0;
  if (col < 0 || col >= p.idx_cols) return -1;
  const int64_t row = load_index(p.state_indices, p.idx_dtype, n * p.idx_cols + col);
  return row >= 0 && row < p.num_slots ? row : -1;
}

// ---- per-token inputs --------------------------------------------------------------------------

// What a prologue thread (row d = tid < K) reads of one token, as raw bits; prefetched one token
// ahead.
struct RowInputs {
  uint32_t q = 0;
  uint32_t k = 0;
  uint32_t g = 0;
  uint64_t slot = 0;  // pool slot written after this token (in-place pool mode), raw index bits
};

// Loads of token `tok` (packed row; sequence-local index t) for row d = tid.
template <class Tr>
__device__ __forceinline__ RowInputs load_row_inputs(const RecurrentParams& p, int64_t tok,
                                                     int64_t t, int n, int h, int hv, int tid) {
  RowInputs r;
  if (tid < Tr::kK) {
    const int64_t qk_off = (tok * p.H + h) * Tr::kK + tid;
    r.q = load_bits(p.q, p.qk_dtype, qk_off);
    r.k = load_bits(p.k, p.qk_dtype, qk_off);
    r.g = load_bits(p.g, p.g_dtype, (tok * p.HV + hv) * Tr::kK + tid);
  }
  // Tokens past the index columns (a sequence longer than state_indices is wide, only possible
  // with device cu_seqlens) store nowhere: all-ones bits read as slot -1.
  if (p.inplace) {
    r.slot = t < p.idx_cols ? load_index_bits(p.state_indices, p.idx_dtype, n * p.idx_cols + t)
                            : ~uint64_t{0};
  }
  return r;
}

// Values and beta of a thread's kN value columns (raw bits; beta[0] only unless headwise);
// prefetched one token ahead with the rows.
template <int kN>
struct ColumnInputs {
  uint32_t v[kN];
  uint32_t beta[kN];
};

// Columns e_of(i), i < kN, of token `tok` (packed row) in value head hv of a kV-wide head.
template <int kV, int kN, class ColumnOf>
__device__ __forceinline__ ColumnInputs<kN> load_column_inputs(const RecurrentParams& p,
                                                               int64_t tok, int hv, ColumnOf e_of) {
  ColumnInputs<kN> c;
  const int64_t row_v = (tok * p.HV + hv) * kV;
#pragma unroll
  for (int i = 0; i < kN; ++i) c.v[i] = load_bits(p.v, p.v_dtype, row_v + e_of(i));
  if (p.headwise_beta) {
#pragma unroll
    for (int i = 0; i < kN; ++i) c.beta[i] = load_bits(p.beta, p.beta_dtype, row_v + e_of(i));
  } else {
    c.beta[0] = load_bits(p.beta, p.beta_dtype, tok * p.HV + hv);
#pragma unroll
    for (int i = 1; i < kN; ++i) c.beta[i] = 0;
  }
  return c;
}

// Per-token log-decay of row d from the raw gate (spec 3.1 / 3.2, fp32).
__device__ __forceinline__ float gate_log_decay(const RecurrentParams& p, float g, float bias,
                                                float a_coef) {
  if (!p.gate_in_kernel) return g;
  const float x = g + bias;
  if (p.has_lower_bound) return p.lower_bound * sigmoid_f32(a_coef * x);
  return -a_coef * softplus_f32(x);
}

// Row d's values of one token after the gate: raw q_d, raw k_d and alpha_d = exp(g_d).
struct RowValues {
  float q;
  float k;
  float alpha;
};

__device__ __forceinline__ RowValues row_values(const RecurrentParams& p, const RowInputs& in,
                                                float bias, float a_coef) {
  return {bits_to_f32(in.q, p.qk_dtype), bits_to_f32(in.k, p.qk_dtype),
          exp_f32(gate_log_decay(p, bits_to_f32(in.g, p.g_dtype), bias, a_coef))};
}

// The warp's partial (q.q, k.k, q.k) of its 32 rows into sums[warp] (one lane writes).
__device__ __forceinline__ void store_row_sums(float q, float k, int tid, float4* sums) {
  float qq = q * q, kk = k * k, qk = q * k;
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) {
    qq += __shfl_xor_sync(kFullMask, qq, m);
    kk += __shfl_xor_sync(kFullMask, kk, m);
    qk += __shfl_xor_sync(kFullMask, qk, m);
  }
  if ((tid & 31) == 0) sums[tid >> 5] = make_float4(qq, kk, qk, 0.0f);
}

// l2norm and scale factors of one token from the per-warp sums, summed in a fixed order (the
// same on every thread): q_scale = rq * scale, rk, and kq = (k . q) of the normalised, scaled
// vectors.
struct TokenNorms {
  float q_scale;
  float rk;
  float kq;
};

template <int kWarps>
__device__ __forceinline__ TokenNorms token_norms(const RecurrentParams& p, const float4* sums) {
  float qq = 0.0f, kk = 0.0f, qk = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const float4 s4 = sums[w];
    qq += s4.x;
    kk += s4.y;
    qk += s4.z;
  }
  const float rq = p.l2norm ? 1.0f / sqrtf(qq + kL2NormEps) : 1.0f;
  const float rk = p.l2norm ? 1.0f / sqrtf(kk + kL2NormEps) : 1.0f;
  const float q_scale = rq * p.scale;
  return {q_scale, rk, qk * q_scale * rk};
}

// v' = beta (v - a) of kN columns (a = S'^T k of the normalised k).
template <int kN>
__device__ __forceinline__ void delta_values(const RecurrentParams& p, const ColumnInputs<kN>& col,
                                             const float (&a)[kN], float (&vn)[kN]) {
  if (p.headwise_beta) {
#pragma unroll
    for (int i = 0; i < kN; ++i)
      vn[i] =
          beta_activation(bits_to_f32(col.beta[i], p.beta_dtype), p.beta_sigmoid, p.beta_scale) *
          (bits_to_f32(col.v[i], p.v_dtype) - a[i]);
  } else {
    const float beta =
        beta_activation(bits_to_f32(col.beta[0], p.beta_dtype), p.beta_sigmoid, p.beta_scale);
#pragma unroll
    for (int i = 0; i < kN; ++i) vn[i] = beta * (bits_to_f32(col.v[i], p.v_dtype) - a[i]);
  }
}

}  // namespace openkda::cuda::recurrent
