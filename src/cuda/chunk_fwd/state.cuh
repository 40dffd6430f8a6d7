// Stages 4 and 5 of the chunk_kda forward (scan kernel): the inter-chunk state recurrence with
// the output fused in. CPU twins: cpu/chunk_fwd.cpp fwd_state (v_new as fwd_v_new_factored) and
// fwd_output.
//
// What it computes, per chunk c of one sequence (rows i, j < nv; state S [K, V] f32 entering the
// chunk; prep outputs ke, qg, kg, A_qk, Tinv', gamma from the workspace; v from v itself by
// tensor-map boxes (bf16 / f16) or from the prep's f32 copy):
//   h[c]  = S                                         (snapshot, when requested)
//   v_new = Tinv' (v - ke S)                          [BT, V]   (= u - w S of the WY form:
//                                                                u = Tinv' v, w = Tinv' ke)
//   o     = qg S + A_qk v_new                         [BT, V]   (scale is inside qg and A_qk)
//   S     = diag(gamma) S + kg^T v_new
// The state is held transposed, S^T [V, K], in f32 accumulators: warpgroup wg of the CTA owns the
// 64 value columns v0 + 64 wg .. + 63 (rows of S^T; warp w the 16 from v0 + 16 w) and all K rows,
// K / 2 registers per thread. Products (tf32 operands, f32 accumulation; ke, qg, kg, A_qk and
// Tinv' come from the prep kernel as tf32 operands, R and v_new are rounded here, and S^T is
// truncated: see the NOTE in scan_step), all wgmma m64 x N x 8 with A from registers:
//   X^T = S^T ke^T,  O^T = S^T qg^T    N = BT, A = S^T, B = sKe / sQg
//   v_new^T = R^T Tinv'^T              N = BT, A = R^T = v^T - X^T (f32 subtract), B = sTinv
//   O^T += v_new^T A_qk^T              N = BT, A = v_new^T, B = sA
//   S^T = S^T diag(gamma) + v_new^T kg N = K, A = v_new^T, B = sKgT (kg^T, which the prep stores
//                                      transposed because tf32 wgmma reads B K-major only); the
//                                      gamma scaling is an f32 multiply (while the Tinv' product
//                                      runs) before the product accumulates into S^T
// wgmma reads each B tile once per warpgroup instead of once per warp.
// With f16 keys (params.h: f16_keys_apply; the kernel's kF16Keys) X^T, O^T and the state update
// are f16 wgmma (m64 x N x 16) instead: ke, qg and kg arrive as f16 tiles, and the scan holds
// inv S^T, each row of S^T times a power-of-two factor inv that keeps it inside f16's range
// (f16_operands.cuh: update_f16_row_factors, the range guard; 1 in the common case), so that
// S^T's f16 operand copy is packed from its accumulator tiles as they stand (two values per
// register, no permutation: the f16 A fragment's pairs are the accumulator's) and v_new^T's times
// the same inv. The factor follows a bound of each row, carried from chunk to chunk as bound + BT
// max|v_new| (gamma <= 1 and |kg| <= 1 under f16_keys_apply's conditions) and reset to the row's
// exact maximum every kF16BoundRefresh chunks: taking that maximum costs 64 instructions per
// thread, which every chunk made the scan ~8 % slower (twenty-second session). v_new^T is packed
// saturating, with no range test on the serial chain: a row whose inv v_new passed f16's range
// (a v_new far beyond the state's bound, rare) is repaired after the product (f16_operands.cuh:
// add_saturated_residual). A factor that moves rescales the held rows by the exact ratio; the
// state's stores take them back by fwd = 1 / inv. The keys carry row anchors (wy.cuh: ke and qg
// times exp2(G_j - A_j), A_j the floor of the row's largest G), which
// X^T's and O^T's columns get back from sKa; kg = k exp2(G_last - G) <= |k| needs none, and the
// state update reads it MN-major from ke's image (wgmma_desc_mn). The O^T update reads the
// state update's f16 v_new^T operand and A_qk's f16 image (|A_qk| <= |scale|), so its o2 is in
// inv units too; only v_new's own product stays tf32.
//
// Column orders (why the tiles' rows are permuted): an accumulator tile holds columns (2t, 2t + 1)
// in thread t, an A fragment columns (t, t + 4). Every accumulator that feeds a later product as
// A therefore keeps its 8-column tiles in the pair order sigma = [0, 4, 1, 5, 2, 6, 3, 7]:
// physical column 8 n + p holds logical index 8 n + sigma(p), so thread t's pair is the logical
// (t, t + 4) and the tile is an A fragment as it stands. S^T gets that order from the B rows of
// its update (sKgT, whose row p holds d = scan_row(p)); X^T, O^T and v_new^T get it from the rows
// of sKe, sQg, sTinv and sA, whose row p holds the chunk row scan_row(p) (the prep writes these
// tile images in that order, tile_image.h; the scan copies them whole); R^T inherits it from X^T
// (the reads of sV follow it). So
//   S^T register (nt, e) is d = 8 nt + t + 4 (e % 2); X^T, R^T, O^T, v_new^T (nn, e) are row
//   j = 8 nn + t + 4 (e % 2) of the chunk,
// and every product sums over logical indices in natural order (the B tiles keep natural K).
// So the value columns of one CTA never need another CTA's data: the V split is exact.
// Exactly causal: row i of o only sums terms j <= i (A_qk and Tinv' are exactly 0 above the
// diagonal).
//
// Grid mapping: one CTA per (sequence n, value head hv, V slice): blockIdx.x =
// (n * HV + hv) * vsplit + slice, vs / 16 warps (vs in {64, 128}). The CTA walks the sequence's
// chunks in order. Shared memory (ScanTraits): sKe, sQg [BT][K] swizzled (with f16 keys f16, and
// sKa [BT] f32 after them; two chunks' buffers at vs = 128, one at vs = 64), REST buffers (three
// at vs = 128, two at vs = 64) of sA, sTinv [BT][BT] and sKgT [K][BT] swizzled, sGamma [K] and
// sV [vs / 64][BT][64] (f32; 16-bit boxes fill half of it), one mbarrier per buffer: 134 KB at
// K = 128, BT = 32, vs = 128 with f16 keys (68 KB at vs = 64: two 4-warp CTAs per SM; traits.h).
// Every tile is a bulk copy of the prep's image of it (tile_image.h), but for a 16-bit v's boxes,
// which one tensor-map load per 64 value columns takes from v (rows t0 .. t0 + BT - 1 of
// [tokens, HV V]). Pipeline (kernels.cuh): at this chunk's mid-chunk barrier the REST tiles of
// the chunk after the next (vs = 128) or of the next (vs = 64) go into the REST buffer that the
// last chunk read, and the sKe / sQg of the chunk after the next (vs = 128) or of the next
// (vs = 64) into the WQ buffer just read. scan_step hands o back to
// the kernel, which stores it at once (vs = 64) or one chunk late, while the next chunk's X^T / O^T
// products run (vs = 128: store_o). The tile loads, v's fragment reads and o's stores are in
// scan_io.cuh.
#pragma once

#include <cstdint>

#include "cuda/chunk_fwd/chunk_index.cuh"
#include "cuda/chunk_fwd/f16_operands.cuh"
#include "cuda/chunk_fwd/mma.cuh"
#include "cuda/chunk_fwd/params.h"
#include "cuda/chunk_fwd/scan_io.cuh"
#include "cuda/chunk_fwd/tile_image.h"
#include "cuda/chunk_fwd/traits.h"
#include "cuda/chunk_fwd/wgmma.cuh"
#include "cuda/common/bulk_copy.cuh"

namespace openkda::cuda::chunk_forward {

// Index of state element (d, v) in a [K, V] (or v_first [V, K]) state at `base`.
__device__ __forceinline__ int64_t state_index(int64_t base, int K, int V, bool v_first, int d,
                                               int v) {
  return v_first ? base + int64_t{v} * K + d : base + int64_t{d} * V + v;
}

// This thread's S^T fragment: element (v, d) of tile nt, register e, is
// v = vcol + 8 (e / 2), d = 8 nt + (lane % 4) + 4 (e % 2) (pair order); vcol = v of row g.
template <int kK>
__device__ __forceinline__ void load_state(const void* src, DType dtype, int64_t base, int V,
                                           bool v_first, int vcol, float (&s)[kK / 8][4]) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int nt = 0; nt < kK / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[nt][e] = src == nullptr
                     ? 0.0f
                     : load_f32(src, dtype,
                                state_index(base, kK, V, v_first, 8 * nt + t + 4 * (e % 2),
                                            vcol + 8 * (e / 2)));
    }
  }
}

// The held fragment times the row factors fwd (rows g, g + 8; with f16 keys the scan holds
// inv S^T: the range guard of f16_operands.cuh) is S^T.
template <int kK>
__device__ __forceinline__ void store_state(void* dst, DType dtype, int64_t base, int V,
                                            bool v_first, int vcol, const float (&s)[kK / 8][4],
                                            const float (&fwd)[2]) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int nt = 0; nt < kK / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      store_f32(dst, dtype,
                state_index(base, kK, V, v_first, 8 * nt + t + 4 * (e % 2), vcol + 8 * (e / 2)),
                s[nt][e] * fwd[e / 2]);
    }
  }
}

// One chunk of the recurrence for this warp's 16 value columns (see the header); `o` rows
// i < nv come back in o_out (the caller stores them: store_o). On entry sKe and sQg (the WQ buffer
// at byte `wq_off`) hold the chunk's tiles (the caller waited on their bulk copies' mbarrier);
// `mid()` is called by every thread right after the last read of sKe / sQg (/ sKa) and must return
// with sA, sTinv, sKgT, sGamma and sV of the chunk visible in the REST buffer at byte `rest_off`
// the same way (the kernel's pipeline: it refills that WQ buffer and the other REST buffer there).
// The transition pass (Tr::kTransition, segments.cuh) computes only X^T, v_new and the state
// update, with v = 0 on the M columns (m_part) and no o. `during_xo()` is called by every thread
// while the X^T / O^T products run; it must not touch this chunk's tiles or accumulators. With f16
// keys `rf` carries the range guard's row factors and bounds from chunk to chunk, and
// `refresh_bound` asks for the rows' exact maxima this chunk.
template <class Tr, int kVs, class DuringXO, class Mid>
__device__ __forceinline__ void scan_step(const ChunkFwdParams& p, int64_t t0, int nv, int v0,
                                          bool m_part, const unsigned char* smem, int wq_off,
                                          int rest_off, float (&s)[Tr::kK / 8][4],
                                          float (&o_out)[Tr::kBT / 8][4], F16RowFactors& rf,
                                          bool refresh_bound, DuringXO&& during_xo, Mid&& mid) {
  constexpr int kNK = Tr::kK / 8;   // 8-wide tiles along d
  constexpr int kNJ = Tr::kBT / 8;  // 8-wide tiles along the chunk rows
  const uint64_t dKe = wgmma_desc_base(smem_address(smem + wq_off + Tr::kOffKe));
  const uint64_t dQg = wgmma_desc_base(smem_address(smem + wq_off + Tr::kOffQg));
  const unsigned char* rest = smem + rest_off;
  const uint64_t dA = wgmma_desc_base(smem_address(rest + Tr::kRestA));
  const uint64_t dTinv = wgmma_desc_base(smem_address(rest + Tr::kRestTinv));
  const uint32_t kg_tile = smem_address(rest + Tr::kRestKgT);  // kg^T tf32, or kg f16
  const float* sGamma = reinterpret_cast<const float*>(rest + Tr::kRestGamma);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int vl = Tr::kWarpRows * warp + g;  // local value column of fragment row g

  // X^T = S^T ke^T and O^T = S^T qg^T (one A fragment of S^T feeds both).
  constexpr bool kOut = !Tr::kTransition;
  float x[kNJ][4], o[kNJ][4];
#pragma unroll
  for (int nn = 0; nn < kNJ; ++nn)
#pragma unroll
    for (int e = 0; e < 4; ++e) x[nn][e] = o[nn][e] = 0.0f;
  wgmma_fence_operands<4 * kNJ>(&x[0][0]);
  if constexpr (kOut) wgmma_fence_operands<4 * kNJ>(&o[0][0]);
  // With f16 keys X^T and O^T come out with their rows times inv and their columns (chunk rows
  // j) divided by the keys' row anchors exp2(A_j): fwd = 1 / inv and ka (read while the products
  // run) take both back, X^T's in R below (an FFMA), O^T's where o_out is formed. Both 1 with
  // tf32 keys (then fmaf(-1, x, v) is v - x, bitwise).
  const float fwd[2] = {rf.fwd[0], rf.fwd[1]};
  float ka[kNJ][2];  // ka[nn][s]: chunk row 8 nn + t + 4 s
#pragma unroll
  for (int nn = 0; nn < kNJ; ++nn) ka[nn][0] = ka[nn][1] = 1.0f;
  // m_s: a bound of this thread's rows of |S^T| (f16 keys): the rows' exact maxima on refresh
  // chunks, else the carried bound (gamma <= 1 keeps it one). Taken here, before any product is
  // in flight: a branch while a wgmma runs makes ptxas wait for it (C7517).
  float m_s[2] = {rf.bound[0], rf.bound[1]};
  if (Tr::kF16Keys && refresh_bound) {
    row_abs_max(s, m_s);  // of the held rows inv S^T: times fwd, S^T's
    m_s[0] *= rf.fwd[0];
    m_s[1] *= rf.fwd[1];
  }
  if constexpr (Tr::kF16Keys) {
    // S^T as an f16 A operand: the held rows are already inv S^T (their f16 range), so the pack
    // multiplies by nothing.
    uint32_t a[kNK / 2][4];
    pack_s_f16<false, false>(s, rf.inv, a);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kNK / 2; ++k) {
      wgmma_f16<Tr::kBT>(&x[0][0], a[k], wgmma_desc_step<Tr::kBT>(dKe, k));
      if constexpr (kOut) wgmma_f16<Tr::kBT>(&o[0][0], a[k], wgmma_desc_step<Tr::kBT>(dQg, k));
    }
    wgmma_commit();
    // The anchors of this thread's chunk rows (sKa in pair order: rows t and t + 4 of tile nn
    // are adjacent), before mid() lets the WQ buffer be refilled.
    const float* sKa = reinterpret_cast<const float*>(smem + wq_off + Tr::kOffKa);
#pragma unroll
    for (int nn = 0; nn < kNJ; ++nn) {
      const float2 k2 = *reinterpret_cast<const float2*>(sKa + 8 * nn + 2 * t);
      ka[nn][0] = k2.x;
      ka[nn][1] = k2.y;
    }
    during_xo();
    wgmma_wait<0>();
    wgmma_fence_operands<4 * kNJ>(&x[0][0]);
    if constexpr (kOut) wgmma_fence_operands<4 * kNJ>(&o[0][0]);
  } else {
    // NOTE: the A fragments must stay unchanged until their wgmma completes; all K / 8 of them
    // are live through one commit group (one wait per chunk here instead of two: ptxas places the
    // 64 registers without spills or serialisation at K = 128; with the late o store, scan 0.530
    // -> 0.506 ms at B1-T8192-H96 in a development A/B, twentieth session). The copies pass S^T's
    // f32 bits, which the tensor core truncates to tf32, instead of rounding them to nearest:
    // rounding then took three instructions per element (64 per thread and chunk, on the serial
    // chain), and dropping it made the scan 2-5 % faster with the same accuracy to three digits
    // (eleventh session, chunk_fwd README). S^T itself stays f32; only this operand copy loses
    // the low bits. The tf32 A layout interleaves the accumulator's registers (c0, c2, c1, c3),
    // so these copies are register moves on the chain (~10 % of the stall samples at H96,
    // twenty-first session): the f16 branch above packs instead.
    uint32_t a[kNK][4];
#pragma unroll
    for (int kk = 0; kk < kNK; ++kk) a_from_acc<false>(s[kk], a[kk]);
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kNK; ++k) {
      wgmma_tf32<Tr::kBT>(&x[0][0], a[k], wgmma_desc_step<Tr::kBT>(dKe, k));
      if constexpr (kOut) wgmma_tf32<Tr::kBT>(&o[0][0], a[k], wgmma_desc_step<Tr::kBT>(dQg, k));
    }
    wgmma_commit();
    during_xo();
    wgmma_wait<0>();
    wgmma_fence_operands<4 * kNJ>(&x[0][0]);
    if constexpr (kOut) wgmma_fence_operands<4 * kNJ>(&o[0][0]);
  }

  // sKe and sQg are dead from here on; sA, sTinv, sKgT, sGamma, sV are ready after the hook.
  mid();

  // R^T = v^T - X^T (rows past the chunk: 0, whatever X holds there; the row test only runs in
  // tail chunks, nv is block-uniform), then v_new^T = R^T Tinv'^T: u - w S in one BT x BT product
  // (Tinv' is exactly 0 above the diagonal, so row i of v_new sums rows j <= i only).
  float v[kNJ][4];
  if (m_part) {
#pragma unroll
    for (int nn = 0; nn < kNJ; ++nn)
#pragma unroll
      for (int e = 0; e < 4; ++e) v[nn][e] = 0.0f;
  } else {
    read_v_fragment<Tr>(scan_v_dtype<Tr>(p), rest + Tr::kRestV, vl, t, v);
  }
  uint32_t ra[kNJ][4];
#pragma unroll
  for (int nn = 0; nn < kNJ; ++nn) {
    float r[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) r[e] = fmaf(-(fwd[e / 2] * ka[nn][e % 2]), x[nn][e], v[nn][e]);
    if (nv < Tr::kBT) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (8 * nn + t + 4 * (e % 2) >= nv) r[e] = 0.0f;
      }
    }
    a_from_acc(r, ra[nn]);
  }
  float vn[kNJ][4];
#pragma unroll
  for (int nn = 0; nn < kNJ; ++nn)
#pragma unroll
    for (int e = 0; e < 4; ++e) vn[nn][e] = 0.0f;
  wgmma_fence_operands<4 * kNJ>(&vn[0][0]);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kNJ; ++kk)
    wgmma_tf32<Tr::kBT>(&vn[0][0], ra[kk], wgmma_desc_step<Tr::kBT>(dTinv, kk));
  wgmma_commit();

  // S^T <- S^T diag(gamma) while that product runs (it does not read S^T; X^T and O^T used
  // converted copies).
#pragma unroll
  for (int nt = 0; nt < kNK; ++nt) {
    const float gm0 = sGamma[8 * nt + t], gm1 = sGamma[8 * nt + t + 4];
    s[nt][0] *= gm0;
    s[nt][1] *= gm1;
    s[nt][2] *= gm0;
    s[nt][3] *= gm1;
  }
  wgmma_wait<0>();
  wgmma_fence_operands<4 * kNJ>(&vn[0][0]);
  // v_new^T as the A operand of the O^T update and the state update: tf32, or with f16 keys f16,
  // each row times the row's factor inv (the held state is inv S^T). Packed saturating, without a
  // range test on the serial chain: a row of inv v_new past f16's range is rare (v_new far beyond
  // the state's bound) and repaired after the products (add_saturated_residual).
  [[maybe_unused]] uint32_t va[kNJ][4];
  if constexpr (!Tr::kF16Keys) {
#pragma unroll
    for (int nn = 0; nn < kNJ; ++nn) a_from_acc(vn[nn], va[nn]);
  }
  [[maybe_unused]] uint32_t vh[kNJ / 2][4];
  if constexpr (Tr::kF16Keys) {
    if (rf.inv[0] == 1.0f && rf.inv[1] == 1.0f) {
      pack_s_f16<false, true>(vn, rf.inv, vh);
    } else {
      pack_s_f16<true, true>(vn, rf.inv, vh);
    }
  }

  // O^T += v_new^T A_qk^T (the blocks above the diagonal of A_qk are exact zeros) and
  // S^T += v_new^T kg (N = K; B = kg^T, rows d in pair order, so S^T keeps its column order),
  // one commit group. With f16 keys the first product goes to its own accumulator o2 (inv v_new^T
  // A_qk^T, f16: A_qk's f16 image), and O^T = fwd (S^T qg^T + o2) after the wait: O^T's
  // registers then keep the values their wgmma defined, which ptxas needs to leave the late o
  // store of the 8-warp scan without injected waits.
  float o2[kNJ][4];
  float* o_acc = Tr::kF16Keys ? &o2[0][0] : &o[0][0];
  if constexpr (Tr::kF16Keys && kOut) {
#pragma unroll
    for (int nn = 0; nn < kNJ; ++nn)
#pragma unroll
      for (int e = 0; e < 4; ++e) o2[nn][e] = 0.0f;
  }
  if constexpr (kOut) wgmma_fence_operands<4 * kNJ>(o_acc);
  wgmma_fence_operands<4 * kNK>(&s[0][0]);
  wgmma_fence();
  if constexpr (kOut && Tr::kF16Keys) {
#pragma unroll
    for (int kk = 0; kk < kNJ / 2; ++kk)
      wgmma_f16<Tr::kBT>(o_acc, vh[kk], wgmma_desc_step<Tr::kBT>(dA, kk));
  } else if constexpr (kOut) {
#pragma unroll
    for (int kk = 0; kk < kNJ; ++kk)
      wgmma_tf32<Tr::kBT>(o_acc, va[kk], wgmma_desc_step<Tr::kBT>(dA, kk));
  }
  if constexpr (Tr::kF16Keys) {
    // kg [BT][K] f16 in ke's image, read MN-major: K = the chunk rows j in pair order (v_new^T's
    // columns), N = d in S^T's column order (half_pair_image_offset).
#pragma unroll
    for (int kk = 0; kk < kNJ / 2; ++kk)
      wgmma_f16_mn<Tr::kK>(&s[0][0], vh[kk], wgmma_desc_mn<Tr::kBT>(kg_tile, kk));
  } else {
    const uint64_t dKgT = wgmma_desc_base(kg_tile);
#pragma unroll
    for (int kk = 0; kk < kNJ; ++kk)
      wgmma_tf32<Tr::kK>(&s[0][0], va[kk], wgmma_desc_step<Tr::kK>(dKgT, kk));
  }
  wgmma_commit();
  float ratio[2] = {1.0f, 1.0f}, inv_old[2] = {1.0f, 1.0f};
  bool fits = true;
  if constexpr (Tr::kF16Keys) {  // while the state update runs: the next chunk's row factors
    // m_v: this thread's parts of the rows' max |v_new|. gamma <= 1 and |kg| <= 1
    // (f16_keys_apply), so the updated state's row is at most (the row's bound of m_s) + BT (the
    // row's maximum of m_v): the invariant of update_f16_row_factors holds again.
    float m_v[2];
    row_abs_max(vn, m_v);
    inv_old[0] = rf.inv[0];
    inv_old[1] = rf.inv[1];
    fits = m_v[0] * inv_old[0] <= 65504.0f && m_v[1] * inv_old[1] <= 65504.0f;  // false if inf
    const float old_fwd[2] = {rf.fwd[0], rf.fwd[1]};
    update_f16_row_factors(m_s[0] + Tr::kBT * m_v[0], m_s[1] + Tr::kBT * m_v[1], rf);
    ratio[0] = rf.inv[0] * old_fwd[0];
    ratio[1] = rf.inv[1] * old_fwd[1];
  }
  wgmma_wait<0>();
  if constexpr (kOut) wgmma_fence_operands<4 * kNJ>(o_acc);
  wgmma_fence_operands<4 * kNK>(&s[0][0]);
  // The held rows follow a factor that moved, and a saturated v_new row is repaired (both rare;
  // after the wait: no branch while a wgmma runs; warp-uniform for the repair's shuffles). A row
  // that did not fit moved its factor (its bound includes BT times its v_new), unless its v_new
  // is inf (then the repair makes the held row inf or NaN, as an unsaturated product would).
  if constexpr (Tr::kF16Keys) {
    if (__any_sync(0xffffffffu, ratio[0] != 1.0f || ratio[1] != 1.0f || !fits)) {
      rescale_rows(s, ratio[0], ratio[1]);
      if (__any_sync(0xffffffffu, !fits))
        add_saturated_residual<kOut, Tr::kBT>(s, o2, vn, vh, inv_old, ratio, rest + Tr::kRestKgT,
                                              rest + Tr::kRestA);
    }
  }
  if constexpr (kOut) {
#pragma unroll
    for (int nn = 0; nn < kNJ; ++nn)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        o_out[nn][e] =
            Tr::kF16Keys ? fwd[e / 2] * fmaf(ka[nn][e % 2], o[nn][e], o2[nn][e]) : o[nn][e];
  }
}

}  // namespace openkda::cuda::chunk_forward
