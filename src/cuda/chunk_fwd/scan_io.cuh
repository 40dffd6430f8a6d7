// The scan kernel's chunk I/O (stages 4-5, state.cuh): the bulk copies that bring one chunk's
// prep tiles and v into shared memory, the reads of v's fragment out of it, and the stores of o.
// state.cuh's scan_step and the kernels' pipeline (kernels.cuh, segments.cuh) call them.
//
// Inputs: the prep's workspace images of ke, qg (ka), A_qk, Tinv', kg^T, gamma and an f32 / f64
// v (tile_image.h), or a 16-bit v by tensor-map boxes; outputs: o rows of one chunk and warp.
// Threads: the loads are issued by one thread and complete on an mbarrier; v reads and o stores
// are per thread, in the accumulators' fragment layout (state.cuh's header: pair order).
// Shared memory: the WQ and REST buffers of ScanTraits (traits.h), which this file only fills and
// reads.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/chunk_fwd/chunk_index.cuh"
#include "cuda/chunk_fwd/mma.cuh"
#include "cuda/chunk_fwd/params.h"
#include "cuda/chunk_fwd/tile_image.h"
#include "cuda/chunk_fwd/traits.h"
#include "cuda/common/bulk_copy.cuh"

namespace openkda::cuda::chunk_forward {

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
  constexpr uint32_t kKBytes = Tr::kKeyBytes * Tr::kBT * Tr::kK;  // sKgT (tf32) or sKg (f16)
  constexpr uint32_t kBTBytes = sizeof(float) * Tr::kBT * Tr::kBT;
  constexpr uint32_t kGammaBytes = sizeof(float) * Tr::kK;
  const bool image = !v_by_tensor_map(scan_v_dtype<Tr>(p));
  const uint32_t v_bytes = (image ? 4 : 2) * Tr::kBT * kVs;  // f32 image or 16-bit boxes
  const int64_t at = tile * Tr::kBT * Tr::kK, at_bt = tile * Tr::kBT * Tr::kBT;
  mbarrier_expect_tx(bar_rest, (Tr::kTransition ? 1 : 2) * kBTBytes + kKBytes + kGammaBytes +
                                   (with_v ? v_bytes : 0));
  if constexpr (!Tr::kTransition)
    bulk_load(smem_address(rest + Tr::kRestA), p.aqk + at_bt, kBTBytes, bar_rest);
  bulk_load(smem_address(rest + Tr::kRestTinv), p.tinv + at_bt, kBTBytes, bar_rest);
  bulk_load(smem_address(rest + Tr::kRestKgT),
            reinterpret_cast<const char*>(p.kgT) + at * Tr::kKeyBytes, kKBytes, bar_rest);
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
  switch (scan_o_dtype<Tr>(p)) {
    case DType::kBF16: store_2byte(__nv_bfloat16{}); break;
    case DType::kF16: store_2byte(__half{}); break;
    case DType::kF64: store_o_rows<double>(p, o_base, t, nv, o); break;
    default: store_o_rows<float>(p, o_base, t, nv, o); break;
  }
}

}  // namespace openkda::cuda::chunk_forward
