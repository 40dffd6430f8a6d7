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
// With f16 keys (params.h: f16_keys_apply; the kernel's kF16Keys) X^T and O^T are f16 wgmma m64 x
// BT x 16 instead: ke and qg arrive as f16 tiles, and S^T's f16 operand copy is packed from its
// accumulator tiles (two values per register, no permutation: the f16 A fragment's pairs are the
// accumulator's) with each row times a power-of-two factor that keeps it inside f16's range
// (update_f16_row_factors: the range guard; 1, so no multiply, in the common case). The factor
// follows a bound of each row, carried from chunk to chunk as bound + BT max|v_new| (gamma <= 1
// and |kg| <= 1 under f16_keys_apply's conditions) and reset to the row's exact maximum every
// kF16BoundRefresh chunks: taking that maximum costs 64 instructions per thread, which every
// chunk made the scan ~8 % slower (twenty-second session). The keys carry row anchors (wy.cuh:
// ke and qg times exp2(G_j - A_j), A_j the floor of the row's largest G), which X^T's and O^T's
// columns get back from sKa. The other three products stay tf32.
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
// sKa [BT] f32 after them; two chunks' buffers at vs = 128, one at vs = 64), two REST buffers of
// sA, sTinv [BT][BT] and sKgT [K][BT] swizzled, sGamma [K] and sV [vs / 64][BT][64] (f32; 16-bit
// boxes fill half of it), four mbarriers: 147 KB at K = 128, BT = 32, vs = 128 (99 KB at vs = 64:
// two 4-warp CTAs per SM). Every tile is a bulk copy of the prep's image of it (tile_image.h), but
// for a 16-bit v's boxes, which one tensor-map load per 64 value columns takes from v (rows t0 ..
// t0 + BT - 1 of [tokens, HV V]). Pipeline (kernels.cuh): at this chunk's mid-chunk barrier the
// next chunk's REST tiles go into the other REST buffer, and the sKe / sQg of the chunk after the
// next (vs = 128) or of the next (vs = 64) into the WQ buffer just read. scan_step hands o back to
// the kernel, which stores it at once (vs = 64) or one chunk late, while the next chunk's X^T / O^T
// products run (vs = 128: store_o).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/chunk_fwd/chunk_index.cuh"
#include "cuda/chunk_fwd/mma.cuh"
#include "cuda/chunk_fwd/params.h"
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

template <int kK>
__device__ __forceinline__ void store_state(void* dst, DType dtype, int64_t base, int V,
                                            bool v_first, int vcol, const float (&s)[kK / 8][4]) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int nt = 0; nt < kK / 8; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      store_f32(dst, dtype,
                state_index(base, kK, V, v_first, 8 * nt + t + 4 * (e % 2), vcol + 8 * (e / 2)),
                s[nt][e]);
    }
  }
}

// The bulk copies of one chunk's tiles, by one thread, in two groups, each completing on its
// mbarrier (kernels.cuh has the pipeline):
//   scan_load_wq    sKe, sQg (and sKa with f16 keys) into the WQ buffer at `wq`, on bar_wq:
//                   read only by the first products of scan_step (sKa while they run)
//   scan_load_rest  sA, sTinv, sKgT, sGamma, sV into the REST buffer at `rest`, on bar_rest: read
//                   only after scan_step's mid-chunk hook
// Each source is the prep's image of the whole tile (tile_image.h): the copy lands as the
// swizzled, pair-ordered wgmma operand (sKe, sQg, sA, sTinv: physical row p holds chunk row
// scan_row(p); sKgT: d = scan_row(p)) or as the XOR-swizzled sV slices (kVs value columns from
// v0), with the prep's rows past the chunk. with_v = false (the transition pass's M columns,
// whose v is 0) leaves sV unloaded.
template <class Tr>
__device__ __forceinline__ void scan_load_wq(const ChunkFwdParams& p, int64_t tile,
                                             unsigned char* wq, uint32_t bar_wq) {
  constexpr uint32_t kKBytes = Tr::kKeyBytes * Tr::kBT * Tr::kK;  // sKe, sQg
  const int64_t at = tile * Tr::kBT * Tr::kK * Tr::kKeyBytes;
  constexpr uint32_t kKaBytes = Tr::kF16Keys ? sizeof(float) * Tr::kBT : 0;  // sKa
  mbarrier_expect_tx(bar_wq, (Tr::kTransition ? kKBytes : 2 * kKBytes) + kKaBytes);
  bulk_load(smem_address(wq + Tr::kOffKe), reinterpret_cast<const char*>(p.ke) + at, kKBytes,
            bar_wq);
  if constexpr (!Tr::kTransition)
    bulk_load(smem_address(wq + Tr::kOffQg), reinterpret_cast<const char*>(p.qg) + at, kKBytes,
              bar_wq);
  if constexpr (Tr::kF16Keys)
    bulk_load(smem_address(wq + Tr::kOffKa), p.ka + tile * Tr::kBT, kKaBytes, bar_wq);
}

template <class Tr, int kVs>
__device__ __forceinline__ void scan_load_rest(const ChunkFwdParams& p, int64_t tile, int64_t t0,
                                               int hv, int v0, bool with_v, unsigned char* rest,
                                               uint32_t bar_rest) {
  constexpr uint32_t kKBytes = sizeof(float) * Tr::kBT * Tr::kK;  // sKgT
  constexpr uint32_t kBTBytes = sizeof(float) * Tr::kBT * Tr::kBT;
  constexpr uint32_t kGammaBytes = sizeof(float) * Tr::kK;
  const bool image = !v_by_tensor_map(p.v_dtype);
  const uint32_t v_bytes = (image ? 4 : 2) * Tr::kBT * kVs;  // f32 image or 16-bit boxes
  const int64_t at = tile * Tr::kBT * Tr::kK, at_bt = tile * Tr::kBT * Tr::kBT;
  mbarrier_expect_tx(bar_rest, (Tr::kTransition ? 1 : 2) * kBTBytes + kKBytes + kGammaBytes +
                                   (with_v ? v_bytes : 0));
  if constexpr (!Tr::kTransition)
    bulk_load(smem_address(rest + Tr::kRestA), p.aqk + at_bt, kBTBytes, bar_rest);
  bulk_load(smem_address(rest + Tr::kRestTinv), p.tinv + at_bt, kBTBytes, bar_rest);
  bulk_load(smem_address(rest + Tr::kRestKgT), p.kgT + at, kKBytes, bar_rest);
  bulk_load(smem_address(rest + Tr::kRestGamma), p.gamma + tile * Tr::kK, kGammaBytes, bar_rest);
  if (!with_v) return;
  if (image) {
    bulk_load(smem_address(rest + Tr::kRestV), p.v_img + tile * Tr::kBT * p.V + Tr::kBT * v0,
              v_bytes, bar_rest);
    return;
  }
  // Rows t0 .. t0 + BT - 1 of v as [tokens, HV V]: rows past the chunk belong to the next
  // sequence or batch row, or read as zero past the last token (the scan masks them either way).
#pragma unroll
  for (int s = 0; s < kVs / 64; ++s) {
    tma_load_2d(smem_address(rest + Tr::kRestV + s * Tr::kBT * 128), &p.v_map,
                hv * p.V + v0 + 64 * s, static_cast<int>(t0), bar_rest);
  }
}

// This thread's o values (pair order: tile nn, register e is row i = 8 nn + t + 4 (e % 2), value
// column g + 8 (e / 2)) for rows i < nv, as T, one scalar store each: f32 and f64 outputs, and
// 16-bit ones with one warpgroup per CTA (see scan_step).
template <typename T, int kNJ>
__device__ __forceinline__ void store_o_rows(const ChunkFwdParams& p, int64_t o_base, int t, int nv,
                                             const float (&o)[kNJ][4]) {
  T* dst = static_cast<T*>(p.o) + o_base;
  const int64_t row_stride = int64_t{p.HV} * p.V;
#pragma unroll
  for (int nn = 0; nn < kNJ; ++nn) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int i = 8 * nn + t + 4 * (e % 2);
      if (i < nv) dst[i * row_stride + 8 * (e / 2)] = from_f32<T>(o[nn][e]);
    }
  }
}

// Two values as one 32-bit pair of 16-bit T (bf16 or f16), `lo` in the low half.
template <typename T>
__device__ __forceinline__ uint32_t pack_b16(float lo, float hi) {
  const T a = from_f32<T>(lo), b = from_f32<T>(hi);
  return static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(&a)) |
         (static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(&b)) << 16);
}

__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

// The warp's o tile (16 value columns from `o_warp`) for rows i < nv, as 16-bit T, with 8-byte
// stores: 8 per thread and chunk instead of 32 two-byte ones (the scalar stores kept the LSU
// queue full: lg throttle). Per 8-row tile nn and column half h the thread's pair
// (o[nn][2h], o[nn][2h + 1]) is element (g, 2t .. 2t + 1) of the 8 x 8 matrix P_h[c][p] =
// o(row 8 nn + scan_row(p), column 8 h + c) (pair order: physical p = 2t + s is row t + 4 s), the
// layout movmatrix transposes. After the transpose thread (g, t) holds row 8 nn + scan_row(g),
// columns 8 h + 2t, + 1 of both halves; four shuffles give it the columns 4t .. 4t + 3.
template <typename T, int kNJ>
__device__ __forceinline__ void store_o_rows_b16(const ChunkFwdParams& p, int64_t o_warp, int nv,
                                                 const float (&o)[kNJ][4]) {
  T* dst = static_cast<T*>(p.o) + o_warp;
  const int64_t row_stride = int64_t{p.HV} * p.V;
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int src0 = 4 * g + 2 * (t % 2), src1 = src0 + 1;  // lanes holding columns 4t .. 4t + 3
#pragma unroll
  for (int nn = 0; nn < kNJ; ++nn) {
    const uint32_t m0 = movmatrix_trans(pack_b16<T>(o[nn][0], o[nn][1]));
    const uint32_t m1 = movmatrix_trans(pack_b16<T>(o[nn][2], o[nn][3]));
    const uint32_t a0 = __shfl_sync(0xffffffffu, m0, src0), a1 = __shfl_sync(0xffffffffu, m0, src1);
    const uint32_t b0 = __shfl_sync(0xffffffffu, m1, src0), b1 = __shfl_sync(0xffffffffu, m1, src1);
    const int i = 8 * nn + scan_row(g);
    if (i < nv) {
      *reinterpret_cast<uint2*>(dst + i * row_stride + 4 * t) =
          t < 2 ? make_uint2(a0, a1) : make_uint2(b0, b1);
    }
  }
}

// ldmatrix .x4 .trans: lane l gives the shared-memory address of row l % 8 of matrix l / 8;
// thread (g, t) gets {row 2 t, row 2 t + 1} of each matrix in column g, two 16-bit values per
// register.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// This thread's values of the chunk's v (x's fragment layout: tile nn, register e is chunk row
// 8 nn + t + 4 (e % 2), value column vl + 8 (e / 2)) from the REST buffer's sV: the prep's f32
// image (v_image_index), or the tensor-map boxes of a 16-bit v by two ldmatrix .x4 .trans per
// chunk (v_box_ldmatrix_row: the rows' order puts chunk rows t and t + 4 into thread t's pair),
// widened exactly.
template <class Tr>
__device__ __forceinline__ void read_v_fragment(DType v_dtype, const unsigned char* sV, int vl,
                                                int t, float (&v)[Tr::kBT / 8][4]) {
  constexpr int kNJ = Tr::kBT / 8;
  if (!v_by_tensor_map(v_dtype)) {
    const float* f = reinterpret_cast<const float*>(sV);
#pragma unroll
    for (int nn = 0; nn < kNJ; ++nn)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        v[nn][e] = f[v_image_index<Tr::kBT>(8 * nn + t + 4 * (e % 2), vl + 8 * (e / 2))];
    return;
  }
  static_assert(kNJ % 2 == 0, "one ldmatrix .x4 per two 8-row tiles");
  const bool bf16 = v_dtype == DType::kBF16;
  const uint32_t lane = threadIdx.x % 32, c0 = vl - vl % 8;  // vl % 8 = g: the warp's first column
#pragma unroll
  for (int q = 0; q < kNJ / 2; ++q) {
    uint32_t x[4];
    ldmatrix_x4_trans(smem_address(sV + v_box_ldmatrix_row<Tr::kBT>(lane, c0, q)), x);
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      float* pair = &v[2 * q + m / 2][2 * (m % 2)];  // rows t (low half) and t + 4 (high half)
      if (bf16) {
        pair[0] = __uint_as_float(x[m] << 16);
        pair[1] = __uint_as_float(x[m] & 0xffff0000u);
      } else {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&x[m]));
        pair[0] = f.x;
        pair[1] = f.y;
      }
    }
  }
}

// Chunk rows i < nv of o (from row t0 of value head hv) from this warp's O^T tile `o` (one dtype
// switch per chunk). With two warpgroups the kernel calls it one chunk late, while the next chunk's
// X^T / O^T products run, so that the stores' shuffles and address math leave the serial chain.
template <class Tr, int kVs>
__device__ __forceinline__ void store_o(const ChunkFwdParams& p, int hv, int64_t t0, int nv, int v0,
                                        const float (&o)[Tr::kBT / 8][4]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t o_warp = (t0 * p.HV + hv) * int64_t{p.V} + v0 + Tr::kWarpRows * warp;
  const int64_t o_base = o_warp + g;
  // NOTE: the packed stores (fewer, wider) pay off with two warpgroups (scan 0.92 -> 0.88 ms at
  // B1-T8192-H96), whose stores contend for the LSU; with one warpgroup (vs = 64) the movmatrix
  // and shuffle latency sits on the serial chain instead (B1-T65536-H16: 5.53 -> 5.73 ms).
  const auto store_2byte = [&](auto zero) {  // bf16 / f16 o (the element type of `zero`)
    using T = decltype(zero);
    if constexpr (kVs == 128) {
      store_o_rows_b16<T>(p, o_warp, nv, o);
    } else {
      store_o_rows<T>(p, o_base, t, nv, o);
    }
  };
  switch (p.o_dtype) {
    case DType::kBF16: store_2byte(__nv_bfloat16{}); break;
    case DType::kF16: store_2byte(__half{}); break;
    case DType::kF64: store_o_rows<double>(p, o_base, t, nv, o); break;
    default: store_o_rows<float>(p, o_base, t, nv, o); break;
  }
}

// The range guard of S^T's f16 operand (kF16Keys). For this thread's rows r (g, g + 8) of S^T,
// inv[r] is the power-of-two factor of the row in its f16 copy and fwd[r] = 1 / inv[r] takes it
// back (both exact). update_f16_row_factors gets this thread's part of a bound of the row's next
// magnitudes and takes the quad's maximum (the quad's four threads share a row), kept in bound[r].
// The parts are sums, a + b, and the maximum of the sums is at least half the sum of the maxima,
// so the invariant is: the row's largest magnitude <= 2 bound[r]. While bound * inv stays in
// [2^-4, 2^14] the factor stays (1 in the common case: the packing then multiplies by nothing);
// outside it the factor moves so that bound * inv lands in [2^12, 2^13): with the factor 2 of the
// invariant the packed row stays below 2^15 (f16's largest finite value is 65504), and its largest
// elements so far above f16's smallest normal (2^-14) that every element within 2^-10 of them
// keeps f16's full 10-bit mantissa. A zero, inf or NaN bound leaves the factor alone (a zero row
// packs exactly with any factor; inf and NaN propagate as they would in f32). Factors stay in
// [2^-100, 2^100].
struct F16RowFactors {
  float inv[2] = {1.0f, 1.0f};
  float fwd[2] = {1.0f, 1.0f};
  float bound[2] = {0.0f, 0.0f};  // quad-uniform
};

__device__ __forceinline__ void update_f16_row_factors(float bound0, float bound1,
                                                       F16RowFactors& f) {
  const float bound[2] = {bound0, bound1};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float b = bound[r];
    b = fmaxf(b, __shfl_xor_sync(0xffffffffu, b, 1));
    b = fmaxf(b, __shfl_xor_sync(0xffffffffu, b, 2));
    f.bound[r] = b;
    const float scaled = b * f.inv[r];
    if (b > 0.0f && b < INFINITY && !(scaled >= 0.0625f && scaled <= 16384.0f)) {
      const int e = min(max(12 - ilogbf(b), -100), 100);  // 2^(12 - e) <= b < 2^(13 - e)
      f.inv[r] = ldexpf(1.0f, e);
      f.fwd[r] = ldexpf(1.0f, -e);
    }
  }
}

// This thread's parts of the row maxima of |S^T| (rows g and g + 8).
template <int kNK>
__device__ __forceinline__ void row_abs_max(const float (&s)[kNK][4], float (&m)[2]) {
  m[0] = m[1] = 0.0f;
#pragma unroll
  for (int nt = 0; nt < kNK; ++nt) {
    m[0] = fmaxf(m[0], fmaxf(fabsf(s[nt][0]), fabsf(s[nt][1])));
    m[1] = fmaxf(m[1], fmaxf(fabsf(s[nt][2]), fabsf(s[nt][3])));
  }
}

// The row factors for S^T as it enters the scan (its rows' own maxima as the bound).
template <int kNK>
__device__ __forceinline__ void init_f16_row_factors(const float (&s)[kNK][4], F16RowFactors& f) {
  float m[2];
  row_abs_max(s, m);
  f = F16RowFactors{};
  update_f16_row_factors(m[0], m[1], f);
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
  const uint64_t dKgT = wgmma_desc_base(smem_address(rest + Tr::kRestKgT));
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
  if (Tr::kF16Keys && refresh_bound) row_abs_max(s, m_s);
  if constexpr (Tr::kF16Keys) {
    // S^T as an f16 A operand (m64 k16: a0 = (c0, c1) of accumulator tile 2 kk, a1 = (c2, c3),
    // a2 / a3 the same of tile 2 kk + 1, so the pack needs no permutation), each row times its
    // power-of-two factor inv (1 unless the range guard below moved it).
    uint32_t a[kNK / 2][4];
    const float inv[2] = {rf.inv[0], rf.inv[1]};
    const bool scaled = inv[0] != 1.0f || inv[1] != 1.0f;
    if (!scaled) {
#pragma unroll
      for (int kk = 0; kk < kNK / 2; ++kk) {
        a[kk][0] = pack_f16x2(s[2 * kk][0], s[2 * kk][1]);
        a[kk][1] = pack_f16x2(s[2 * kk][2], s[2 * kk][3]);
        a[kk][2] = pack_f16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        a[kk][3] = pack_f16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < kNK / 2; ++kk) {
        a[kk][0] = pack_f16x2(inv[0] * s[2 * kk][0], inv[0] * s[2 * kk][1]);
        a[kk][1] = pack_f16x2(inv[1] * s[2 * kk][2], inv[1] * s[2 * kk][3]);
        a[kk][2] = pack_f16x2(inv[0] * s[2 * kk + 1][0], inv[0] * s[2 * kk + 1][1]);
        a[kk][3] = pack_f16x2(inv[1] * s[2 * kk + 1][2], inv[1] * s[2 * kk + 1][3]);
      }
    }
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kNK / 2; ++k) {
      wgmma_f16_n32(&x[0][0], a[k], wgmma_desc_step<Tr::kBT>(dKe, k));
      if constexpr (kOut) wgmma_f16_n32(&o[0][0], a[k], wgmma_desc_step<Tr::kBT>(dQg, k));
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
    read_v_fragment<Tr>(p.v_dtype, rest + Tr::kRestV, vl, t, v);
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
  uint32_t va[kNJ][4];
#pragma unroll
  for (int nn = 0; nn < kNJ; ++nn) a_from_acc(vn[nn], va[nn]);

  // O^T += v_new^T A_qk^T (the blocks above the diagonal of A_qk are exact zeros) and
  // S^T += v_new^T kg (N = K; B = kg^T, rows d in pair order, so S^T keeps its column order),
  // one commit group. With f16 keys the first product goes to its own accumulator o2, and O^T =
  // fwd S^T qg^T + o2 after the wait: O^T's registers then keep the values their wgmma defined,
  // which ptxas needs to leave the late o store of the 8-warp scan without injected waits.
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
  if constexpr (kOut) {
#pragma unroll
    for (int kk = 0; kk < kNJ; ++kk)
      wgmma_tf32<Tr::kBT>(o_acc, va[kk], wgmma_desc_step<Tr::kBT>(dA, kk));
  }
#pragma unroll
  for (int kk = 0; kk < kNJ; ++kk)
    wgmma_tf32<Tr::kK>(&s[0][0], va[kk], wgmma_desc_step<Tr::kK>(dKgT, kk));
  wgmma_commit();
  if constexpr (Tr::kF16Keys) {  // while the state update runs: the next chunk's row factors
    float m_v[2] = {0.0f, 0.0f};
#pragma unroll
    for (int nn = 0; nn < kNJ; ++nn) {
      m_v[0] = fmaxf(m_v[0], fmaxf(fabsf(vn[nn][0]), fabsf(vn[nn][1])));
      m_v[1] = fmaxf(m_v[1], fmaxf(fabsf(vn[nn][2]), fabsf(vn[nn][3])));
    }
    // gamma <= 1 and |kg| <= 1 (f16_keys_apply), so the updated state's row is at most
    // (the row's bound of m_s) + BT (the row's maximum of m_v): the invariant of
    // update_f16_row_factors holds again.
    update_f16_row_factors(m_s[0] + Tr::kBT * m_v[0], m_s[1] + Tr::kBT * m_v[1], rf);
  }
  wgmma_wait<0>();
  if constexpr (kOut) wgmma_fence_operands<4 * kNJ>(o_acc);
  wgmma_fence_operands<4 * kNK>(&s[0][0]);
  if constexpr (kOut) {
#pragma unroll
    for (int nn = 0; nn < kNJ; ++nn)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        o_out[nn][e] =
            Tr::kF16Keys ? fmaf(fwd[e / 2] * ka[nn][e % 2], o[nn][e], o2[nn][e]) : o[nn][e];
  }
}

}  // namespace openkda::cuda::chunk_forward
