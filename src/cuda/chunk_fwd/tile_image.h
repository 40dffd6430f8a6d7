// The layouts of the workspace tiles that the prep kernel writes and the scan kernel copies into
// its shared memory whole, with one bulk copy per tile and chunk (cp.async.bulk; no per-thread
// address arithmetic in the scan). Each tile of one (chunk slot, value head) is stored exactly as
// the scan's shared memory holds it, rows past the chunk included (zero or finite garbage that
// the scan masks: state.cuh), so the copy is a contiguous byte range.
//
//   ke, qg  [BT][K]   wgmma B operands of X^T = S^T ke^T and O^T = S^T qg^T: 128-byte swizzled,
//                     K-major (wgmma.cuh), rows in pair order (below)
//   A_qk    [BT][BT]  the B operand of O^T += v_new^T A_qk^T: the same layout with BT columns
//   Tinv'   [BT][BT]  the B operand of v_new^T = R^T Tinv'^T: the same layout
//   kg^T    [K][BT]   the B operand of the state update: the same layout, rows d in pair order
//                     (with f16 keys kg [BT][K] f16 instead, in ke's image, read MN-major)
//   v       [V / 64][BT][64]  f32 / f64 v: its rows in f32, in slices of 64 value columns (a 4-warp
//                     scan CTA copies one slice, an 8-warp one two); within a row, column c at
//                     c ^ (8 (j % 4)): the scan reads (row j = 8 nn + t + 4 (e % 2), column
//                     16 w + g + 8 h), so the XOR by 8 t puts the 32 lanes of a warp on 32
//                     distinct banks without padding
//   (bf16 / f16 v has no workspace image: the scan loads its rows from v itself by tensor-map
//   boxes, [V / 64][BT][64] 16-bit values with the 128-byte swizzle, v_box_offset)
//   gamma   [K]       plain
//
// Pair order (state.cuh says why): physical row (or column) p of a tile holds the chunk row
// scan_row(p), i.e. within each 8-row group the rows 0, 4, 1, 5, 2, 6, 3, 7; pair_row is the
// inverse (the physical row of chunk row r).
//
// Plain C++ (host and device): tests/cpp/test_tile_image.cpp checks on the CPU that every map is a
// bijection onto its tile, that the pair order inverts, and that the scan's v reads are free of
// bank conflicts.
#pragma once

#include <cstdint>

#include "openkda/tensor_ref.h"  // OPENKDA_HOST_DEVICE

namespace openkda::cuda::chunk_forward {

// Byte offset of 16-byte chunk c16 (along K) of row r in a 128-byte swizzled K-major tile of kRows
// rows (wgmma.cuh): kCols / 32 regions of kRows rows x 128 bytes; in a region, chunk c of row r at
// r * 128 + ((c ^ r % 8) * 16). Every index here is >= 0, and the maps compute in unsigned
// arithmetic, so that the divisions and remainders are shifts and masks without sign fix-ups.
template <int kRows>
OPENKDA_HOST_DEVICE constexpr uint32_t swizzled_offset(uint32_t r, uint32_t c16) {
  return (c16 / 8) * (kRows * 128u) + r * 128u + (((c16 % 8) ^ (r % 8)) * 16u);
}

OPENKDA_HOST_DEVICE constexpr uint32_t scan_row(uint32_t p) {
  return (p & ~7u) | ((p & 7u) >> 1) | ((p & 1u) << 2);
}
OPENKDA_HOST_DEVICE constexpr uint32_t pair_row(uint32_t r) {
  return (r & ~7u) | ((r & 3u) << 1) | ((r >> 2) & 1u);
}

// Byte offset of element (row r, column d) of a swizzled K-major tile image of kRows rows in
// pair order (ke, qg, A_qk, Tinv': r = chunk row; kg^T: r = d, the column the chunk row j).
template <int kRows>
OPENKDA_HOST_DEVICE constexpr uint32_t pair_image_offset(uint32_t r, uint32_t d) {
  return swizzled_offset<kRows>(pair_row(r), d / 4) + 4 * (d % 4);
}

// Byte offset of element (row r, column d) of a swizzled K-major f16 tile image of kRows rows (ke,
// qg): rows in pair order as pair_image_offset, 64 columns per 128-byte region, and within each
// 8-column group (one 16-byte chunk) the columns in pair order too (physical column q holds d =
// 8 (q / 8) + scan_row(q % 8)), the order of S^T's accumulator columns, so that the m64k16 f16 A
// fragment packed from its accumulator tiles as they stand meets the B columns of the same d.
template <int kRows>
OPENKDA_HOST_DEVICE constexpr uint32_t half_pair_image_offset(uint32_t r, uint32_t d) {
  return swizzled_offset<kRows>(pair_row(r), d / 8) + 2 * pair_row(d % 8);
}

// The prep's 4-byte stores of an f16 A_qk image (intra.cuh: store_aqk_pair): the mma accumulator
// pair of thread t of a quad holds columns (j, j + 1), j = 8 m + 2 t, which the pair order puts
// two slots apart; threads t and t ^ 2 swap one value, and each stores the logical columns
// (f16_pair_first(j), f16_pair_second(j)), physically adjacent at an even slot: t < 2 its j and
// the partner's j + 4, t >= 2 the partner's j - 3 and its j + 1.
OPENKDA_HOST_DEVICE constexpr uint32_t f16_pair_first(uint32_t j) {
  return j % 8 < 4 ? j : j - 3;
}
OPENKDA_HOST_DEVICE constexpr uint32_t f16_pair_second(uint32_t j) {
  return j % 8 < 4 ? j + 4 : j + 1;
}

// The byte offsets of a wgmma descriptor that reads an f16 image of kRows rows (half_pair_image_
// offset: rows = the product's K, columns = its N) MN-major (wgmma.cuh: wgmma_desc_mn): the next
// 64 N values are the image's next region (the leading byte offset), the next 8 K rows 1024 bytes
// on (the stride byte offset), and product kk (16 K rows) starts kk x 2048 bytes on. With them the
// canonical 128-byte-swizzled MN-major layout of the PTX ISA is the image itself
// (test_tile_image.cpp).
template <int kRows>
constexpr uint32_t kMnLeadingBytes = kRows * 128u;
constexpr uint32_t kMnStrideBytes = 1024u;
constexpr uint32_t kMnStepBytes = 16u * 128u;

// Float index of element (chunk row j, value column c) of a v image of kBT rows (c relative to the
// first column of the image, a multiple of 64).
template <int kBT>
OPENKDA_HOST_DEVICE constexpr uint32_t v_image_index(uint32_t j, uint32_t c) {
  return ((c / 64) * kBT + j) * 64 + ((c % 64) ^ (8 * (j % 4)));
}

// Byte offset of element (chunk row j, value column c) of the scan's 16-bit v boxes (c relative to
// the first column of the CTA's slices): one tensor-map box of kBT rows x 64 columns per slice,
// 128 bytes per row, 16-byte chunks XOR-swizzled by row (the 128-byte swizzle of the TMA unit,
// tensor_map.h), i.e. the layout of swizzled_offset with 8 values per chunk. The scan reads them
// by ldmatrix (v_box_ldmatrix_row).
template <int kBT>
OPENKDA_HOST_DEVICE constexpr uint32_t v_box_offset(uint32_t j, uint32_t c) {
  return swizzled_offset<kBT>(j, c / 8) + 2 * (c % 8);
}

// The scan's reads of the 16-bit v boxes, by ldmatrix .x4 .trans (scan_io.cuh: read_v_fragment).
// Load q of a warp whose 16 value columns start at c0 (a multiple of 16) reads chunk rows
// 16 q .. 16 q + 15: lane l gives the row address of its matrix m = l / 8, row r = l % 8, where
// matrix m is the 8-row tile nn = 2 q + m / 2 and the column half h = m % 2, and its row r is the
// 16-byte chunk of chunk row 8 nn + scan_row(r) that holds columns c0 + 8 h .. c0 + 8 h + 7.
// .trans hands thread (g = lane / 4, t = lane % 4) the values of rows 2 t and 2 t + 1 of each
// matrix in column g: chunk rows 8 nn + t and 8 nn + t + 4 of value column c0 + 8 h + g, the
// scan's fragment layout of x. The 8 rows of a matrix fall on 8 distinct 16-byte bank groups.
template <int kBT>
OPENKDA_HOST_DEVICE constexpr uint32_t v_box_ldmatrix_row(uint32_t lane, uint32_t c0, uint32_t q) {
  return v_box_offset<kBT>(16 * q + 8 * (lane / 16) + scan_row(lane % 8),
                           c0 + 8 * ((lane / 8) % 2));
}

// The prep's f16 ke / qg writer (wy.cuh: write_gated_keys): lane l of a warp takes the 8-column
// chunk f16_writer_chunk(l) of row f16_writer_row(l) among the 32 / (kK / 8) rows the warp holds,
// and reads each of its rows of sQ, sK, sG (leading dimension kLdX = 4 mod 32) as two float4. The
// 8 lanes of a 16-byte read phase take two adjacent rows at four chunks 8 columns apart, so they
// meet 32 distinct banks (consecutive lanes on one row would meet every bank twice). A row's
// lanes differ in lane bits 0, 1 and 3 .. 2 + log2(kK / 32) (the writer's shuffles).
template <int kK>
OPENKDA_HOST_DEVICE constexpr uint32_t f16_writer_chunk(uint32_t lane) {
  return lane % 4 + 4 * ((lane / 8) % (kK / 32));
}
template <int kK>
OPENKDA_HOST_DEVICE constexpr uint32_t f16_writer_row(uint32_t lane) {
  return 2 * ((lane / 8) / (kK / 32)) + (lane / 4) % 2;
}

}  // namespace openkda::cuda::chunk_forward
