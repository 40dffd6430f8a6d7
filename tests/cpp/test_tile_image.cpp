// Layout maps of the chunk_kda forward's workspace tile images (src/cuda/chunk_fwd/tile_image.h):
// the prep kernel writes every tile exactly as the scan kernel's shared memory holds it, and the
// scan copies it whole. These host-side checks pin the maps that both kernels share: each is a
// bijection onto its tile, the pair order inverts, the image of a swizzled tile is the layout the
// scan's wgmma descriptors read (physical row p holds chunk row scan_row(p)), the prep's vector
// stores stay contiguous, the scan's 16-bit v boxes are the TMA unit's 128-byte swizzle, and the
// scan's reads of v (the f32 image or the 16-bit boxes) are free of bank conflicts.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <set>
#include <vector>

#include "cuda/chunk_fwd/tile_image.h"

namespace {

using openkda::cuda::chunk_forward::f16_pair_first;
using openkda::cuda::chunk_forward::f16_pair_second;
using openkda::cuda::chunk_forward::f16_writer_chunk;
using openkda::cuda::chunk_forward::f16_writer_row;
using openkda::cuda::chunk_forward::half_pair_image_offset;
using openkda::cuda::chunk_forward::kMnLeadingBytes;
using openkda::cuda::chunk_forward::kMnStepBytes;
using openkda::cuda::chunk_forward::kMnStrideBytes;
using openkda::cuda::chunk_forward::pair_image_offset;
using openkda::cuda::chunk_forward::pair_row;
using openkda::cuda::chunk_forward::scan_row;
using openkda::cuda::chunk_forward::swizzled_offset;
using openkda::cuda::chunk_forward::v_box_ldmatrix_row;
using openkda::cuda::chunk_forward::v_box_offset;
using openkda::cuda::chunk_forward::v_image_index;

TEST(TileImage, PairOrderInverts) {
  const int expected[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // chunk rows of physical rows 0..7
  for (int p = 0; p < 8; ++p) EXPECT_EQ(scan_row(p), expected[p]) << "p = " << p;
  for (int r = 0; r < 256; ++r) {
    EXPECT_EQ(scan_row(pair_row(r)), r) << "r = " << r;
    EXPECT_EQ(pair_row(scan_row(r)), r) << "p = " << r;
    EXPECT_EQ(pair_row(r) / 8, r / 8) << "r = " << r;  // stays in its 8-row group
  }
}

// offset(r, d) maps the rows x cols elements of `elem` bytes one to one onto the tile's
// elem-aligned slots (a tile of tile_bytes when given: then into it, leaving slots unused).
void expect_bijection(int rows, int cols, uint32_t elem, uint32_t (*offset)(uint32_t, uint32_t),
                      uint32_t tile_bytes = 0) {
  const uint32_t bytes = tile_bytes != 0 ? tile_bytes : elem * rows * cols;
  std::set<uint32_t> seen;
  for (int r = 0; r < rows; ++r) {
    for (int d = 0; d < cols; ++d) {
      const uint32_t at = offset(r, d);
      ASSERT_LT(at, bytes) << "(" << r << ", " << d << ")";
      ASSERT_EQ(at % elem, 0u);
      ASSERT_TRUE(seen.insert(at).second) << "(" << r << ", " << d << ") collides";
    }
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(rows) * cols);
}

// A swizzled K-major tile of kRows rows and `cols` f32 columns (w / qg: 32 x K; A_qk: 32 x 32;
// kg^T: K x 32).
template <int kRows>
void check_pair_image(int cols) {
  SCOPED_TRACE(testing::Message() << kRows << " x " << cols);
  expect_bijection(kRows, cols, 4, pair_image_offset<kRows>);
  // The prep's stores: 8 bytes at even d (float2), 16 at d % 4 == 0 (float4) stay contiguous.
  for (int r = 0; r < kRows; ++r) {
    for (int d = 0; d < cols; ++d) {
      if (d % 4 != 3) {
        ASSERT_EQ(pair_image_offset<kRows>(r, d + 1), pair_image_offset<kRows>(r, d) + 4);
      }
    }
  }
  // What the scan's wgmma reads: 16-byte chunk c of physical row p (swizzled_offset, the layout
  // of the descriptors in wgmma.cuh) holds chunk row scan_row(p), columns 4c .. 4c + 3.
  for (int p = 0; p < kRows; ++p) {
    for (int c = 0; c < cols / 4; ++c) {
      ASSERT_EQ(pair_image_offset<kRows>(scan_row(p), 4 * c), swizzled_offset<kRows>(p, c))
          << "p = " << p << ", c = " << c;
    }
  }
}

TEST(TileImage, SwizzledTilesAreBijectionsInPairOrder) {
  check_pair_image<32>(64);   // ke, qg at K = 64
  check_pair_image<32>(128);  // ke, qg at K = 128
  check_pair_image<32>(32);   // A_qk, Tinv'
  check_pair_image<64>(32);   // kg^T at K = 64
  check_pair_image<128>(32);  // kg^T at K = 128
}

// The f16 ke / qg images (32 x K, f16 keys): a bijection onto the tile's 2-byte slots; 16-byte
// chunk c of physical row p (the descriptors' layout, as for f32) holds chunk row scan_row(p) and
// columns 8c .. 8c + 7, with physical column q of the chunk holding d = 8c + scan_row(q): the
// order of S^T's accumulator columns, whose (c0, c1) pairs are the f16 A fragment (state.cuh).
template <int kRows>
void check_half_pair_image(int cols, uint32_t tile_bytes = 0) {
  SCOPED_TRACE(testing::Message() << kRows << " x " << cols << " f16");
  expect_bijection(kRows, cols, 2, half_pair_image_offset<kRows>, tile_bytes);
  for (int p = 0; p < kRows; ++p) {
    for (int c = 0; c < cols / 8; ++c) {
      for (int q = 0; q < 8; ++q) {
        ASSERT_EQ(half_pair_image_offset<kRows>(scan_row(p), 8 * c + scan_row(q)),
                  swizzled_offset<kRows>(p, c) + 2 * q)
            << "p = " << p << ", c = " << c << ", q = " << q;
      }
    }
  }
}

TEST(TileImage, HalfTilesAreBijectionsInPairOrder) {
  check_half_pair_image<32>(64);   // ke, qg at K = 64
  check_half_pair_image<32>(128);  // ke, qg at K = 128
  // A_qk (BT x BT, f16 keys): half of every 128-byte row of the f32 tile's 4 KB (intra.cuh:
  // store_aqk), the chunks the descriptors' two k steps read.
  check_half_pair_image<32>(32, 32 * 128);
}

// The prep's f16 A_qk pair stores (intra.cuh: store_aqk_pair): thread t of a quad, holding the
// accumulator columns (j, j + 1), j = 8 m + 2 t, stores f16_pair_first(j) and f16_pair_second(j)
// as one aligned 4-byte word (adjacent slots), the swap keeps each value in its quad's pair of
// threads (t, t ^ 2), and the quad's stores cover the 8 columns of its group once.
TEST(TileImage, F16PairStoresAreAdjacentAndCoverTheGroup) {
  for (uint32_t i = 0; i < 32; ++i) {
    for (uint32_t m = 0; m < 4; ++m) {
      std::set<uint32_t> cols;
      for (uint32_t t = 0; t < 4; ++t) {
        const uint32_t j = 8 * m + 2 * t, first = f16_pair_first(j), second = f16_pair_second(j);
        const uint32_t at = half_pair_image_offset<32>(i, first);
        EXPECT_EQ(at % 4, 0u) << "i = " << i << ", j = " << j;
        EXPECT_EQ(half_pair_image_offset<32>(i, second), at + 2) << "i = " << i << ", j = " << j;
        const uint32_t partner = 8 * m + 2 * (t ^ 2);  // the columns of thread t ^ 2
        for (uint32_t c : {first, second}) {
          EXPECT_TRUE(c == j || c == j + 1 || c == partner || c == partner + 1) << "j = " << j;
          EXPECT_TRUE(cols.insert(c).second) << "column " << c << " stored twice";
        }
      }
      EXPECT_EQ(cols.size(), 8u);
      EXPECT_EQ(*cols.begin(), 8 * m);
    }
  }
}

// The f32 v image, over every element (j, c) of a kBT x V image: every float slot is hit once (a
// bijection onto the tile); a 4-warp scan CTA copies the 64-column slice of its v0 alone, so a
// slice (kBT * 64 floats) is one contiguous block that indexes the same way from its own start;
// the prep's 16-byte stores (four floats from c % 4 = 0) stay contiguous.
TEST(TileImage, VImageIsABijectionOfSlices) {
  constexpr int kBT = 32;
  for (int V : {64, 128}) {
    std::vector<int> hits(kBT * V, 0);
    for (int j = 0; j < kBT; ++j) {
      for (int c = 0; c < V; ++c) {
        const uint32_t at = v_image_index<kBT>(j, c);
        ASSERT_LT(at, static_cast<uint32_t>(kBT * V));
        ++hits[at];
        ASSERT_EQ(at, (c / 64) * kBT * 64 + v_image_index<kBT>(j, c % 64))
            << "j " << j << " c " << c;
        if (c % 4 == 0) {
          for (int k = 1; k < 4; ++k) ASSERT_EQ(v_image_index<kBT>(j, c + k), at + k);
        }
      }
    }
    for (int i = 0; i < kBT * V; ++i) ASSERT_EQ(hits[i], 1) << "V = " << V << ", slot " << i;
  }
}

// The 16-bit v boxes that the scan's tensor-map loads write: one box of kBT rows x 64 columns per
// 64-column slice (4 KB), each the TMA unit's 128-byte swizzle of the box's row-major bytes (the
// swizzle as CUTLASS's Swizzle<3, 4, 3> states it: byte bits 4-6 XOR bits 7-9).
TEST(TileImage, VBoxesAreTheTensorMapsSwizzle) {
  constexpr int kBT = 32;
  for (int V : {64, 128}) {
    std::set<uint32_t> seen;
    for (int j = 0; j < kBT; ++j) {
      for (int c = 0; c < V; ++c) {
        const uint32_t linear = j * 128u + (c % 64) * 2u;
        const uint32_t swizzled = linear ^ (((linear >> 7) & 7u) << 4);
        const uint32_t at = v_box_offset<kBT>(j, c);
        ASSERT_EQ(at, (c / 64) * kBT * 128u + swizzled) << "j " << j << " c " << c;
        ASSERT_TRUE(seen.insert(at).second) << "j " << j << " c " << c << " collides";
      }
    }
    EXPECT_EQ(seen.size(), static_cast<size_t>(kBT * V));
    EXPECT_EQ(*seen.rbegin(), 2u * kBT * V - 2);
  }
}

// scan_step's reads of the f32 v image: lane (g = lane / 4, t = lane % 4) of warp w loads chunk row
// j = 8 nn + t + 4 s and value column c = 16 w + g + 8 h (s, h in {0, 1}), the 4-byte word
// word(j, c) of shared memory. Lanes reading one word make one access, so a read is conflict-free
// when no two distinct words share a bank (of 32); every read must touch `words` distinct words.
template <class Word>
void check_scan_v_reads(size_t words, Word word) {
  constexpr int kBT = 32;
  for (int w = 0; w < 8; ++w) {
    for (int nn = 0; nn < kBT / 8; ++nn) {
      for (int s = 0; s < 2; ++s) {
        for (int h = 0; h < 2; ++h) {
          std::set<uint32_t> seen;
          std::set<uint32_t> banks;
          for (int lane = 0; lane < 32; ++lane) {
            const uint32_t at = word(8 * nn + lane % 4 + 4 * s, 16 * w + lane / 4 + 8 * h);
            seen.insert(at);
            banks.insert(at % 32);
          }
          EXPECT_EQ(seen.size(), words) << "w " << w << " nn " << nn << " s " << s << " h " << h;
          EXPECT_EQ(banks.size(), seen.size())
              << "w " << w << " nn " << nn << " s " << s << " h " << h;
        }
      }
    }
  }
}

TEST(TileImage, ScanReadsOfVAreConflictFree) {
  // The f32 image: one word per lane (the 16-bit boxes are read by ldmatrix: above).
  check_scan_v_reads(32, [](int j, int c) { return v_image_index<32>(j, c); });
}

// ldmatrix .x4 .trans as the scan issues it on the v boxes: thread (g, t) gets, in register m of
// load q, rows 2 t and 2 t + 1 of matrix m in column g; it must be the fragment's values
// (chunk rows 8 nn + t and + 4, value column c0 + 8 h + g; nn = 2 q + m / 2, h = m % 2).
TEST(TileImage, VBoxLdmatrixReadsAreTheFragment) {
  constexpr int kBT = 32;
  for (uint32_t c0 = 0; c0 < 128; c0 += 16) {
    for (uint32_t q = 0; q < kBT / 16; ++q) {
      for (uint32_t m = 0; m < 4; ++m) {
        std::set<uint32_t> groups;
        for (uint32_t r = 0; r < 8; ++r) {
          groups.insert((v_box_ldmatrix_row<kBT>(8 * m + r, c0, q) / 16) % 8);
        }
        EXPECT_EQ(groups.size(), 8u) << "c0 " << c0 << " q " << q << " m " << m;
        const uint32_t nn = 2 * q + m / 2, h = m % 2;
        for (uint32_t lane = 0; lane < 32; ++lane) {
          const uint32_t g = lane / 4, t = lane % 4;
          for (uint32_t s = 0; s < 2; ++s) {
            const uint32_t row_at = v_box_ldmatrix_row<kBT>(8 * m + 2 * t + s, c0, q);
            ASSERT_EQ(row_at % 16, 0u);
            EXPECT_EQ(row_at + 2 * g, v_box_offset<kBT>(8 * nn + t + 4 * s, c0 + 8 * h + g))
                << "c0 " << c0 << " q " << q << " m " << m << " lane " << lane << " s " << s;
          }
        }
      }
    }
  }
}

// The prep's f16 key writer (wy.cuh): its lane map covers the warp's rows x chunks once, the 8
// lanes of each 16-byte read phase meet 32 distinct banks of a row-major tile with leading
// dimension K + 4 (sQ, sK, sG), and a row's lanes are closed under the writer's shuffle masks.
template <int kK>
void check_f16_writer() {
  constexpr uint32_t kC8 = kK / 8, kRows = 32 / kC8, kLd = kK + 4;
  std::set<std::pair<uint32_t, uint32_t>> cells;
  for (uint32_t l = 0; l < 32; ++l) {
    EXPECT_LT(f16_writer_row<kK>(l), kRows) << "lane " << l;
    EXPECT_LT(f16_writer_chunk<kK>(l), kC8) << "lane " << l;
    cells.insert({f16_writer_row<kK>(l), f16_writer_chunk<kK>(l)});
  }
  EXPECT_EQ(cells.size(), 32u) << "K " << kK;
  for (uint32_t h = 0; h < 2; ++h) {
    for (uint32_t phase = 0; phase < 4; ++phase) {
      std::set<uint32_t> banks;
      for (uint32_t l = 8 * phase; l < 8 * phase + 8; ++l) {
        const uint32_t word = f16_writer_row<kK>(l) * kLd + 8 * f16_writer_chunk<kK>(l) + 4 * h;
        for (uint32_t w = 0; w < 4; ++w) banks.insert((word + w) % 32);
      }
      EXPECT_EQ(banks.size(), 32u) << "K " << kK << " phase " << phase << " half " << h;
    }
  }
  for (uint32_t l = 0; l < 32; ++l) {
    std::set<uint32_t> mates{l};
    for (uint32_t mask = 1; mask < 32; mask *= 2) {
      if (mask == 4 || mask >= 8 * (kK / 32)) continue;  // the writer's masks: 1, 2, 8, ...
      std::set<uint32_t> next = mates;
      for (uint32_t m : mates) next.insert(m ^ mask);
      mates = next;
    }
    EXPECT_EQ(mates.size(), kC8) << "K " << kK << " lane " << l;
    for (uint32_t m : mates) EXPECT_EQ(f16_writer_row<kK>(m), f16_writer_row<kK>(l)) << m;
  }
}

TEST(TileImage, F16KeyWriterReadsAreConflictFree) {
  check_f16_writer<64>();
  check_f16_writer<128>();
}

}  // namespace

// The f16 kg image read MN-major by the state update (wgmma_desc_mn): for product kk, element
// (K row k < 16, N column n < kK) of B is chunk row j = 16 kk + k's physical row and column n of
// the image. The PTX ISA's canonical 128-byte-swizzled MN-major layout puts it at
//   Swizzle<3,4,3>(start + 2 (n % 8) + 16 ((n / 8) % 8) + LBO (n / 64) + 128 (k % 8) + SBO (k / 8))
// (in elements ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)), T = 8 f16 per 16 bytes), the swizzle XORing
// address bits 4-6 with bits 7-9; the image must hold it at half_pair_image_offset's address of
// the same physical row and column.
template <int kK>
void check_mn_major_image() {
  SCOPED_TRACE(testing::Message() << "K = " << kK);
  constexpr int kBT = 32;
  const auto swizzle = [](uint32_t a) { return a ^ (((a >> 7) & 7u) << 4); };
  for (uint32_t kk = 0; kk < kBT / 16; ++kk) {
    for (uint32_t k = 0; k < 16; ++k) {
      for (uint32_t n = 0; n < kK; ++n) {
        const uint32_t linear = kk * kMnStepBytes + 2 * (n % 8) + 16 * ((n / 8) % 8) +
                                kMnLeadingBytes<kBT> * (n / 64) + 128 * (k % 8) +
                                kMnStrideBytes * (k / 8);
        // The image's element of physical row p = 16 kk + k, physical column n: the chunk row
        // scan_row(p) and the column d whose pair-order position is n.
        const uint32_t p = 16 * kk + k;
        const uint32_t d = 8 * (n / 8) + scan_row(n % 8);
        ASSERT_EQ(swizzle(linear), half_pair_image_offset<kBT>(scan_row(p), d))
            << "kk " << kk << ", k " << k << ", n " << n;
      }
    }
  }
}

TEST(TileImage, F16ImagesReadMnMajorAreTheCanonicalLayout) {
  check_mn_major_image<64>();
  check_mn_major_image<128>();
}
