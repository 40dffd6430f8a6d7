// Stages 4 and 5 of the chunk_kda forward (scan kernel): the inter-chunk state recurrence with
// the output fused in. CPU twins: cpu/chunk_fwd.cpp fwd_state and fwd_output.
//
// What it computes, per chunk c of one sequence (rows i, j < nv; state S [K, V] f32 entering the
// chunk; prep outputs w, qg, kg, u, A_qk, gamma from the workspace):
//   h[c]  = S                                         (snapshot, when requested)
//   v_new = u - w S                                   [BT, V]
//   o     = qg S + A_qk v_new                         [BT, V]   (scale is inside qg and A_qk)
//   S     = diag(gamma) S + kg^T v_new
// The state is held transposed, S^T [V, K], in f32 mma accumulators: warp w of the CTA owns the
// 16 value columns v0 + 16 w .. v0 + 16 w + 15 (rows of S^T) and all K rows, K / 2 registers per
// thread. Every product is mma.sync m16n8k8 tf32 with f32 accumulation (w, qg, kg and A_qk come
// tf32-rounded from the prep kernel and are passed as raw bits; S^T and v_new are rounded here):
//   X^T = S^T w^T,  O^T = S^T qg^T          A = S^T (the accumulators, paired k order), k = d
//   O^T += v_new^T A_qk^T                   A = v_new^T (accumulators), k = j; blocks j > i skipped
//   U^T = v_new^T kg;  S^T = S^T diag(gamma) + U^T   (the final add is an IEEE f32 fma)
// so the value columns of one CTA never need another CTA's data: the V split is exact.
// Exactly causal: row i of o only sums terms j <= i (A_qk is exactly 0 above the diagonal).
//
// Grid mapping: one CTA per (sequence n, value head hv, V slice): blockIdx.x =
// (n * HV + hv) * vsplit + slice, vs / 16 warps. The CTA walks the sequence's chunks in order.
// Shared memory (ScanTraits, one chunk at a time): sW, sQg [BT][K + 8], sKg [BT][K + 4],
// sA [BT][BT + 8], sGamma [K], sU [BT][vs + 4]: 140 KB for K = 128, BT = 64, vs = 64.
// Pipeline (kernels.cuh): the next chunk's sW / sQg load while this chunk finishes (after the
// first products), its sKg / sA / sU / sGamma while the next chunk's first products run; two
// cp.async groups per chunk, no extra shared memory.
#pragma once

#include <cstdint>

#include "cuda/chunk_fwd/chunk_index.cuh"
#include "cuda/chunk_fwd/io.cuh"
#include "cuda/chunk_fwd/mma.cuh"
#include "cuda/chunk_fwd/params.h"
#include "cuda/chunk_fwd/traits.h"

namespace openkda::cuda::chunk_forward {

// Index of state element (d, v) in a [K, V] (or v_first [V, K]) state at `base`.
__device__ __forceinline__ int64_t state_index(int64_t base, int K, int V, bool v_first, int d,
                                               int v) {
  return v_first ? base + int64_t{v} * K + d : base + int64_t{d} * V + v;
}

// This thread's S^T fragment: element (v, d) of tile nt, register e, is
// v = vcol + 8 (e / 2), d = 8 nt + 2 (lane % 4) + e % 2; vcol = v of fragment row g.
template <int kK>
__device__ __forceinline__ void load_state(const void* src, DType dtype, int64_t base, int V,
                                           bool v_first, int vcol, float (&s)[kK / 8][4]) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int nt = 0; nt < kK / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[nt][e] = src == nullptr ? 0.0f
                                : load_f32(src, dtype,
                                           state_index(base, kK, V, v_first, 8 * nt + 2 * t + e % 2,
                                                       vcol + 8 * (e / 2)));
    }
  }
}

template <int kK>
__device__ __forceinline__ void store_state(void* dst, DType dtype, int64_t base, int V,
                                            bool v_first, int vcol, const float (&s)[kK / 8][4]) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int nt = 0; nt < kK / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      store_f32(dst, dtype,
                state_index(base, kK, V, v_first, 8 * nt + 2 * t + e % 2, vcol + 8 * (e / 2)),
                s[nt][e]);
    }
  }
}

// The cp.async copies of one chunk's tiles (rows past the chunk are zero-filled), in two groups
// so that the scan kernel can prefetch the next chunk into buffers as soon as they are dead:
//   scan_load_wq    sW, sQg                (read only by the first products of scan_step)
//   scan_load_rest  sKg, sA, sU, sGamma    (read only after scan_step's mid-chunk hook)
template <class Tr>
__device__ __forceinline__ void scan_load_wq(const ChunkFwdParams& p, int hv, int64_t t0, int nv,
                                             float* smem) {
  constexpr int kK = Tr::kK, kBT = Tr::kBT;
  const int64_t row0 = int64_t{hv} * p.tokens + t0;
  const float* gW = p.w + row0 * kK;
  const float* gQg = p.qg + row0 * kK;
  float* sW = smem + Tr::kOffW;
  float* sQg = smem + Tr::kOffQg;
  constexpr int kC4 = kK / 4;
  for (int idx = threadIdx.x; idx < kBT * kC4; idx += blockDim.x) {
    const int r = idx / kC4, c = 4 * (idx % kC4);
    const bool valid = r < nv;
    const int64_t off = int64_t{valid ? r : 0} * kK + c;
    cp_async_16(sW + r * Tr::kLdW + c, gW + off, valid);
    cp_async_16(sQg + r * Tr::kLdW + c, gQg + off, valid);
  }
}

template <class Tr>
__device__ __forceinline__ void scan_load_rest(const ChunkFwdParams& p, int hv, int64_t t0, int nv,
                                               int64_t slot, int v0, float* smem) {
  constexpr int kK = Tr::kK, kBT = Tr::kBT;
  const int64_t row0 = int64_t{hv} * p.tokens + t0;
  const float* gKg = p.kg + row0 * kK;
  const float* gA = p.aqk + row0 * kBT;
  const float* gU = p.u + row0 * p.V + v0;
  const float* gGamma = p.gamma + (int64_t{hv} * p.slots + slot) * kK;
  float* sKg = smem + Tr::kOffKg;
  float* sA = smem + Tr::kOffA;
  float* sGamma = smem + Tr::kOffGamma;
  float* sU = smem + Tr::kOffU;
  const int ld_u = Tr::ld_u(p.vs);

  constexpr int kC4 = kK / 4;
  for (int idx = threadIdx.x; idx < kBT * kC4; idx += blockDim.x) {
    const int r = idx / kC4, c = 4 * (idx % kC4);
    const bool valid = r < nv;
    cp_async_16(sKg + r * Tr::kLdKg + c, gKg + int64_t{valid ? r : 0} * kK + c, valid);
  }
  constexpr int kA4 = kBT / 4;
  for (int idx = threadIdx.x; idx < kBT * kA4; idx += blockDim.x) {
    const int r = idx / kA4, c = 4 * (idx % kA4);
    const bool valid = r < nv;
    cp_async_16(sA + r * Tr::kLdA + c, gA + int64_t{valid ? r : 0} * kBT + c, valid);
  }
  // vs / 4 is a power of two (vs = V / vsplit, V in {64, 128}, vsplit a power of two, vs >= 16):
  // shifts, not a run-time division per copy.
  const int u4 = p.vs / 4, u4_log2 = __ffs(u4) - 1;
  for (int idx = threadIdx.x; idx < kBT * u4; idx += blockDim.x) {
    const int r = idx >> u4_log2, c = 4 * (idx & (u4 - 1));
    const bool valid = r < nv;
    cp_async_16(sU + r * ld_u + c, gU + int64_t{valid ? r : 0} * p.V + c, valid);
  }
  for (int idx = threadIdx.x; idx < kK / 4; idx += blockDim.x) {
    cp_async_16(sGamma + 4 * idx, gGamma + 4 * idx, true);
  }
}

// One chunk of the recurrence for this warp's 16 value columns (see the header); `o` rows
// i < nv are written. On entry sW and sQg hold the chunk's tiles; `mid()` is called by every
// thread right after the last read of sW / sQg and must return with sKg, sA, sU and sGamma of
// the chunk visible (the kernel's pipeline: it refills sW / sQg with the next chunk there).
template <class Tr, class Mid>
__device__ __forceinline__ void scan_step(const ChunkFwdParams& p, int hv, int64_t t0, int nv,
                                          int v0, const float* smem, float (&s)[Tr::kK / 8][4],
                                          Mid&& mid) {
  constexpr int kNK = Tr::kK / 8;   // 8-wide tiles along d
  constexpr int kNJ = Tr::kBT / 8;  // 8-wide tiles along the chunk rows
  const float* sW = smem + Tr::kOffW;
  const float* sQg = smem + Tr::kOffQg;
  const float* sKg = smem + Tr::kOffKg;
  const float* sA = smem + Tr::kOffA;
  const float* sGamma = smem + Tr::kOffGamma;
  const float* sU = smem + Tr::kOffU;
  const int ld_u = Tr::ld_u(p.vs);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int vl = Tr::kWarpRows * warp + g;  // local value column of fragment row g

  // X^T = S^T w^T and O^T = S^T qg^T (one A fragment of S^T feeds both).
  float x[kNJ][4], o[kNJ][4];
#pragma unroll
  for (int nn = 0; nn < kNJ; ++nn)
#pragma unroll
    for (int e = 0; e < 4; ++e) x[nn][e] = o[nn][e] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < kNK; ++kk) {
    uint32_t a[4];
    a_from_acc(s[kk], a);
#pragma unroll
    for (int nn = 0; nn < kNJ; ++nn) {
      const float2 bw =
          *reinterpret_cast<const float2*>(sW + (8 * nn + g) * Tr::kLdW + 8 * kk + 2 * t);
      const float2 bq =
          *reinterpret_cast<const float2*>(sQg + (8 * nn + g) * Tr::kLdW + 8 * kk + 2 * t);
      mma_tf32(x[nn], a, tf32_bits(bw.x), tf32_bits(bw.y));
      mma_tf32(o[nn], a, tf32_bits(bq.x), tf32_bits(bq.y));
    }
  }

  // sW and sQg are dead from here on; sKg, sA, sU, sGamma are ready after the hook.
  mid();

  // v_new^T = u^T - X^T (rows past the chunk: 0), then as A operands (paired k order).
  uint32_t va[kNJ][4];
#pragma unroll
  for (int nn = 0; nn < kNJ; ++nn) {
    float vn[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int j = 8 * nn + 2 * t + e % 2;
      vn[e] = j < nv ? sU[j * ld_u + vl + 8 * (e / 2)] - x[nn][e] : 0.0f;
    }
    a_from_acc(vn, va[nn]);
  }

  // O^T += v_new^T A_qk^T; the blocks with every j > every i (kk > nn) are zero and skipped.
#pragma unroll
  for (int kk = 0; kk < kNJ; ++kk) {
#pragma unroll
    for (int nn = 0; nn < kNJ; ++nn) {
      if (nn >= kk) {
        const float2 ba =
            *reinterpret_cast<const float2*>(sA + (8 * nn + g) * Tr::kLdA + 8 * kk + 2 * t);
        mma_tf32(o[nn], va[kk], tf32_bits(ba.x), tf32_bits(ba.y));
      }
    }
  }

  // o rows i < nv.
  const int64_t o_row_stride = int64_t{p.HV} * p.V;
  const int64_t o_base = (t0 * p.HV + hv) * int64_t{p.V} + v0 + vl;
#pragma unroll
  for (int nn = 0; nn < kNJ; ++nn) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 8 * nn + 2 * t + e % 2;
      if (i < nv) store_f32(p.o, p.o_dtype, o_base + i * o_row_stride + 8 * (e / 2), o[nn][e]);
    }
  }

  // S^T = S^T diag(gamma) + v_new^T kg, one 8-column tile of d at a time.
#pragma unroll
  for (int nt = 0; nt < kNK; ++nt) {
    float upd[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int kk = 0; kk < kNJ; ++kk) {
      const float* b = sKg + (8 * kk + 2 * t) * Tr::kLdKg + 8 * nt + g;
      mma_tf32(upd, va[kk], tf32_bits(b[0]), tf32_bits(b[Tr::kLdKg]));
    }
    const float gm0 = sGamma[8 * nt + 2 * t], gm1 = sGamma[8 * nt + 2 * t + 1];
    s[nt][0] = fmaf(s[nt][0], gm0, upd[0]);
    s[nt][1] = fmaf(s[nt][1], gm1, upd[1]);
    s[nt][2] = fmaf(s[nt][2], gm0, upd[2]);
    s[nt][3] = fmaf(s[nt][3], gm1, upd[3]);
  }
}

}  // namespace openkda::cuda::chunk_forward
