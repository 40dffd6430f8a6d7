// Device stage of fused_recurrent_kda: one token of the KDA recurrence on a register-resident
// state slice. The kernel (kernel.cuh) reads the state once per call and keeps it in registers
// across the tokens of a sequence; it writes it once per token (pool mode) or once at the end.
// The per-token inputs, gate, norms and v' helpers it uses (token_inputs.cuh) also serve the
// streaming kernel (stream.cuh), whose state lives in shared memory instead.
//
// What (spec 1.1, per sequence n, value head hv, token t; q/k head h = hv / group):
//   alpha = exp(g_t) (after the in-kernel gate, if any)             [K]
//   q <- q * rq * scale, k <- k * rk (rq, rk = l2norm rstd or 1)     [K]
//   a[e] = sum_d alpha_d S[d, e] k_d,  b[e] = sum_d alpha_d S[d, e] q_d   (one pass over S)
//   v'   = beta (v - a)                                               [V]
//   o    = b + v' (k . q)                                             [V]  (= S_new^T q)
//   S    <- alpha S + k v'^T                                          [K, V]
// The decayed state alpha S is kept in registers between the reduction and the rank-1 update,
// so the state is never re-read: a token costs one multiply and three FMAs per element.
//
// Grid mapping: one CTA per (n, hv, value slice of Traits::kBlockV columns); see traits.h for
// the thread tile and lane arrangement of each layout.
//
// Thread roles per token:
//   prologue  threads tid < K own row d = tid: load raw q_d, k_d, g_d, apply the gate, and write
//             q_d, k_d, alpha_d plus per-warp partial sums (q.q, k.k, q.k) to shared memory;
//   all       after one __syncthreads: read their rows' q, k, alpha, update their tile, reduce a
//             and b over the d lanes of the warp (xor shuffles, bitwise identical on every lane),
//             lane_d == 0 stores o, every thread updates and (optionally) stores its tile.
//
// Inputs: RecurrentParams (params.h): q/k/v/g/beta/o in any float dtype through run-time dtype
// loads; the state through 16-byte loads that bypass L1 (ld.global.L1::no_allocate).
// Outputs: o, and the state (per token into the pool or final_state rows, or once at the end).
//
// Shared memory: TokenSmem<Traits>, double-buffered by token parity so that one barrier per
// token suffices: 2 x (3 K + 4 kPrologueWarps) floats = 3,200 bytes at K = 128.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common/math.cuh"
#include "cuda/common/vec.cuh"
#include "cuda/recurrent/params.h"
#include "cuda/recurrent/token_inputs.cuh"
#include "cuda/recurrent/traits.h"

namespace openkda::cuda::recurrent {

// ---- state runs: kN contiguous elements of T <-> fp32 registers --------------------------------
// 16-byte load that does not allocate in L1: the state is read exactly once per call.
__device__ __forceinline__ uint4 load_stream_16B(const void* ptr) {
  uint4 r;
  asm volatile("ld.global.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(ptr));
  return r;
}

// `src` is aligned to min(16, kN * sizeof(T)) bytes (launch.cu checks the base pointers; run
// offsets are multiples of kN elements).
template <typename T, int kN>
__device__ __forceinline__ void load_run(const T* src, float (&out)[kN]) {
  constexpr int kBytes = kN * static_cast<int>(sizeof(T));
  if constexpr (kBytes % 16 == 0) {
    constexpr int kPer = 16 / static_cast<int>(sizeof(T));
#pragma unroll
    for (int c = 0; c < kN / kPer; ++c) {
      const uint4 raw = load_stream_16B(src + c * kPer);
      const Pack<T, kPer>& pk = *reinterpret_cast<const Pack<T, kPer>*>(&raw);
#pragma unroll
      for (int m = 0; m < kPer; ++m) out[c * kPer + m] = to_f32(pk.v[m]);
    }
  } else {
    const Pack<T, kN> pk = load_pack<T, kN>(src);
#pragma unroll
    for (int m = 0; m < kN; ++m) out[m] = to_f32(pk.v[m]);
  }
}

template <typename T, int kN>
__device__ __forceinline__ void store_run(T* dst, const float (&in)[kN]) {
  constexpr int kBytes = kN * static_cast<int>(sizeof(T));
  constexpr int kPer = kBytes % 16 == 0 ? 16 / static_cast<int>(sizeof(T)) : kN;
#pragma unroll
  for (int c = 0; c < kN / kPer; ++c) {
    Pack<T, kPer> pk;
#pragma unroll
    for (int m = 0; m < kPer; ++m) pk.v[m] = from_f32<T>(in[c * kPer + m]);
    store_pack<T, kPer>(dst + c * kPer, pk);
  }
}

// ---- the register tile of one thread -----------------------------------------------------------
template <class Tr>
struct StateTile {
  float s[Tr::kTileD][Tr::kTileE];  // s[j][i] = S[d_of(j), e_of(i)]
  int lane_d = 0;
  int e_base = 0;  // column of i = 0

  __device__ __forceinline__ StateTile(int lane, int warp, int e0) {
    if constexpr (Tr::kVFirst) {
      lane_d = lane % Tr::kLanesD;
      e_base = e0 + warp * Tr::kWarpE + lane / Tr::kLanesD;
    } else {
      lane_d = lane / Tr::kLanesE;
      e_base = e0 + warp * Tr::kWarpE + (lane % Tr::kLanesE) * Tr::kVec;
    }
  }

  __device__ __forceinline__ int d_of(int j) const {
    if constexpr (Tr::kVFirst)
      return lane_d * Tr::kVec + (j / Tr::kVec) * Tr::kRunStrideD + j % Tr::kVec;
    else
      return lane_d + Tr::kLanesD * j;
  }

  __device__ __forceinline__ int e_of(int i) const {
    return Tr::kVFirst ? e_base + Tr::kLanesE * i : e_base + i;
  }

  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int j = 0; j < Tr::kTileD; ++j)
#pragma unroll
      for (int i = 0; i < Tr::kTileE; ++i) s[j][i] = 0.0f;
  }

  // `head` points at element (0, 0) of this head's [K, V] (or [V, K]) state.
  template <typename T>
  __device__ __forceinline__ void load(const T* head) {
    if constexpr (Tr::kVFirst) {
#pragma unroll
      for (int i = 0; i < Tr::kTileE; ++i)
#pragma unroll
        for (int r = 0; r < Tr::kTileD / Tr::kVec; ++r) {
          float run[Tr::kVec];
          load_run<T, Tr::kVec>(head + e_of(i) * Tr::kK + d_of(r * Tr::kVec), run);
#pragma unroll
          for (int m = 0; m < Tr::kVec; ++m) s[r * Tr::kVec + m][i] = run[m];
        }
    } else {
#pragma unroll
      for (int j = 0; j < Tr::kTileD; ++j)
        load_run<T, Tr::kVec>(head + d_of(j) * Tr::kV + e_base, s[j]);
    }
  }

  template <typename T>
  __device__ __forceinline__ void store(T* head) const {
    if constexpr (Tr::kVFirst) {
#pragma unroll
      for (int i = 0; i < Tr::kTileE; ++i)
#pragma unroll
        for (int r = 0; r < Tr::kTileD / Tr::kVec; ++r) {
          float run[Tr::kVec];
#pragma unroll
          for (int m = 0; m < Tr::kVec; ++m) run[m] = s[r * Tr::kVec + m][i];
          store_run<T, Tr::kVec>(head + e_of(i) * Tr::kK + d_of(r * Tr::kVec), run);
        }
    } else {
#pragma unroll
      for (int j = 0; j < Tr::kTileD; ++j)
        store_run<T, Tr::kVec>(head + d_of(j) * Tr::kV + e_base, s[j]);
    }
  }

  // Run-time dtype of the state tensor -> one typed load (a uniform branch per call).
  __device__ __forceinline__ void load_any(const void* base, DType dtype, int64_t head_offset) {
    switch (dtype) {
      case DType::kF32: load(static_cast<const float*>(base) + head_offset); break;
      case DType::kBF16: load(static_cast<const __nv_bfloat16*>(base) + head_offset); break;
      case DType::kF16: load(static_cast<const __half*>(base) + head_offset); break;
      case DType::kF64: load(static_cast<const double*>(base) + head_offset); break;
      default: zero(); break;
    }
  }

  __device__ __forceinline__ void store_any(void* base, DType dtype, int64_t head_offset) const {
    switch (dtype) {
      case DType::kF32: store(static_cast<float*>(base) + head_offset); break;
      case DType::kBF16: store(static_cast<__nv_bfloat16*>(base) + head_offset); break;
      case DType::kF16: store(static_cast<__half*>(base) + head_offset); break;
      case DType::kF64: store(static_cast<double*>(base) + head_offset); break;
      default: break;
    }
  }
};

// Sum over the kLanesD lanes that hold the same columns (xor butterfly: every lane ends with the
// bitwise same value, since each step adds the same two partial sums in either order).
template <class Tr>
__device__ __forceinline__ float sum_over_d_lanes(float x) {
#pragma unroll
  for (int m = Tr::kLaneMaskD; m < Tr::kLaneMaskD * Tr::kLanesD; m <<= 1)
    x += __shfl_xor_sync(kFullMask, x, m);
  return x;
}

// ---- per-token shared memory --------------------------------------------------------------------
// Shared memory of the prologue, double-buffered by token parity.
template <class Tr>
struct TokenSmem {
  alignas(16) float q[2][Tr::kK];      // raw q (before l2norm and scale)
  alignas(16) float k[2][Tr::kK];      // raw k
  alignas(16) float alpha[2][Tr::kK];  // exp(g) after the gate
  float4 sums[2][Tr::kPrologueWarps];  // per-warp (q.q, k.k, q.k, 0)
};

template <class Tr>
__device__ __forceinline__ ColumnInputs<Tr::kTileE> load_tile_columns(const RecurrentParams& p,
                                                                      const StateTile<Tr>& S,
                                                                      int64_t tok, int hv) {
  return load_column_inputs<Tr::kV, Tr::kTileE>(p, tok, hv, [&](int i) { return S.e_of(i); });
}

// Prologue of one token: row d = tid writes its q, k, alpha and the warp's partial dot products.
template <class Tr>
__device__ __forceinline__ void token_prologue(const RecurrentParams& p, const RowInputs& in,
                                               float bias, float a_coef, int buf, int tid,
                                               TokenSmem<Tr>& sm) {
  if (tid >= Tr::kK) return;  // whole warps: K is a multiple of 32
  const RowValues r = row_values(p, in, bias, a_coef);
  sm.q[buf][tid] = r.q;
  sm.k[buf][tid] = r.k;
  sm.alpha[buf][tid] = r.alpha;
  store_row_sums(r.q, r.k, tid, sm.sums[buf]);
}

// ---- the token update --------------------------------------------------------------------------
// After the prologue barrier: decays the tile, reduces a and b, writes o (lane_d == 0) and
// applies the rank-1 update. `tok` is the packed token row.
template <class Tr>
__device__ __forceinline__ void token_update(const RecurrentParams& p, StateTile<Tr>& S,
                                             const TokenSmem<Tr>& sm, int buf,
                                             const ColumnInputs<Tr::kTileE>& col, int64_t tok,
                                             int hv) {
  const int64_t row_v = (tok * p.HV + hv) * Tr::kV;
  const TokenNorms nm = token_norms<Tr::kPrologueWarps>(p, sm.sums[buf]);
  const float rk = nm.rk, q_scale = nm.q_scale, kq = nm.kq;

  // One pass over the tile: decay, and the partial sums of a = S'^T k, b = S'^T q.
  float a[Tr::kTileE], b[Tr::kTileE];
#pragma unroll
  for (int i = 0; i < Tr::kTileE; ++i) a[i] = b[i] = 0.0f;
#pragma unroll
  for (int j = 0; j < Tr::kTileD; ++j) {
    const int d = S.d_of(j);
    const float alpha = sm.alpha[buf][d];
    const float kd = sm.k[buf][d] * rk;
    const float qd = sm.q[buf][d] * q_scale;
#pragma unroll
    for (int i = 0; i < Tr::kTileE; ++i) {
      const float x = alpha * S.s[j][i];
      S.s[j][i] = x;
      a[i] = fmaf(x, kd, a[i]);
      b[i] = fmaf(x, qd, b[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < Tr::kTileE; ++i) {
    a[i] = sum_over_d_lanes<Tr>(a[i]);
    b[i] = sum_over_d_lanes<Tr>(b[i]);
  }

  // v' = beta (v - a); o = b + v' (k . q).
  float vn[Tr::kTileE];
  delta_values(p, col, a, vn);
  if (S.lane_d == 0) {
#pragma unroll
    for (int i = 0; i < Tr::kTileE; ++i)
      store_f32(p.o, p.o_dtype, row_v + S.e_of(i), fmaf(vn[i], kq, b[i]));
  }

  // Rank-1 update S = S' + k v'^T.
#pragma unroll
  for (int j = 0; j < Tr::kTileD; ++j) {
    const float kd = sm.k[buf][S.d_of(j)] * rk;
#pragma unroll
    for (int i = 0; i < Tr::kTileE; ++i) S.s[j][i] = fmaf(kd, vn[i], S.s[j][i]);
  }
}

// Every token of one (sequence n, value head hv, this CTA's value slice) with the state in S, and
// the final-state store (kernel.cuh). Per token: prefetch of token t + 1, prologue (smem) -> the
// one barrier -> token_update -> the state store to pool slot state_indices[n, t] or
// final_state[tok] (pool mode); the caller has loaded token 0's inputs into row / col.
template <class Tr>
__device__ __forceinline__ void run_tokens(const RecurrentParams& p, StateTile<Tr>& S,
                                           TokenSmem<Tr>& smem, RowInputs row,
                                           ColumnInputs<Tr::kTileE> col, float bias, float a_coef,
                                           int64_t bos, int64_t len, int n, int h, int hv,
                                           int tid) {
  for (int64_t t = 0; t < len; ++t) {
    const int buf = static_cast<int>(t & 1);
    // Prefetch token t + 1 (its latency overlaps this token's update).
    RowInputs next_row = row;
    ColumnInputs<Tr::kTileE> next_col = col;
    if (t + 1 < len) {
      next_row = load_row_inputs<Tr>(p, bos + t + 1, t + 1, n, h, hv, tid);
      if constexpr (Tr::kPrefetchColumns) next_col = load_tile_columns<Tr>(p, S, bos + t + 1, hv);
    }
    if constexpr (!Tr::kPrefetchColumns) {
      if (t > 0) col = load_tile_columns<Tr>(p, S, bos + t, hv);  // still before the barrier
    }

    token_prologue<Tr>(p, row, bias, a_coef, buf, tid, smem);
    // NOTE: the one barrier per token. The buffer written next token (buf ^ 1) was last read
    // before this barrier, so double buffering makes a second barrier unnecessary.
    __syncthreads();
    token_update<Tr>(p, S, smem, buf, col, bos + t, hv);

    if (p.store_each_token) {
      const int64_t dst_row = p.inplace ? index_from_bits(row.slot, p.idx_dtype) : bos + t;
      if (!p.inplace || (dst_row >= 0 && dst_row < p.num_slots))
        S.store_any(p.ht, p.ht_dtype, (dst_row * p.HV + hv) * Tr::kHeadElems);
    }
    row = next_row;
    col = next_col;
  }
  if (p.store_final)
    S.store_any(p.ht, p.ht_dtype, (static_cast<int64_t>(n) * p.HV + hv) * Tr::kHeadElems);
}

}  // namespace openkda::cuda::recurrent
