// Layout maps of the chunk_kda forward's workspace tile images (src/cuda/chunk_fwd/tile_image.h):
// the prep kernel writes every tile exactly as the scan kernel's shared memory holds it, and the
// scan copies it whole. These host-side checks pin the maps that both kernels share: each is a
// bijection onto its tile, the pair order inverts, the image of a swizzled tile is the layout the
// scan's wgmma descriptors read (physical row p holds chunk row scan_row(p)), the prep's vector
// stores stay contiguous, and the scan's reads of v (f32, or 16-bit row pairs) hit 32 distinct
// banks per warp.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <set>
#include <vector>

#include "cuda/chunk_fwd/tile_image.h"

namespace {

using openkda::cuda::chunk_forward::pair_half;
using openkda::cuda::chunk_forward::pair_image_offset;
using openkda::cuda::chunk_forward::pair_row;
using openkda::cuda::chunk_forward::scan_row;
using openkda::cuda::chunk_forward::swizzled_offset;
using openkda::cuda::chunk_forward::v_image_index;
using openkda::cuda::chunk_forward::v_pair_word_index;

TEST(TileImage, PairOrderInverts) {
  const int expected[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // chunk rows of physical rows 0..7
  for (int p = 0; p < 8; ++p) EXPECT_EQ(scan_row(p), expected[p]) << "p = " << p;
  for (int r = 0; r < 256; ++r) {
    EXPECT_EQ(scan_row(pair_row(r)), r) << "r = " << r;
    EXPECT_EQ(pair_row(scan_row(r)), r) << "p = " << r;
    EXPECT_EQ(pair_row(r) / 8, r / 8) << "r = " << r;  // stays in its 8-row group
  }
}

// A swizzled K-major tile of kRows rows and `cols` f32 columns (w / qg: 32 x K; A_qk: 32 x 32;
// kg^T: K x 32).
template <int kRows>
void check_pair_image(int cols) {
  SCOPED_TRACE(testing::Message() << kRows << " x " << cols);
  const uint32_t bytes = 4u * kRows * cols;
  std::set<uint32_t> seen;
  for (int r = 0; r < kRows; ++r) {
    for (int d = 0; d < cols; ++d) {
      const uint32_t at = pair_image_offset<kRows>(r, d);
      ASSERT_LT(at, bytes) << "(" << r << ", " << d << ")";
      ASSERT_EQ(at % 4, 0u);
      ASSERT_TRUE(seen.insert(at).second) << "(" << r << ", " << d << ") collides";
      // The prep's stores: 8 bytes at even d (float2), 16 at d % 4 == 0 (float4) stay contiguous.
      if (d % 4 != 3) {
        ASSERT_EQ(pair_image_offset<kRows>(r, d + 1), at + 4);
      }
    }
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(kRows) * cols);
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

// The checks both v images share, over every element (j, c) of a kBT x V image: word(j, c) is its
// 4-byte word, slot(j, c) its element slot, and every slot is hit once (a bijection onto the tile);
// a 4-warp scan CTA copies the 64-column slice of its v0 alone, so a slice (slice_words words) is
// one contiguous block that indexes the same way from its own start; the prep's 16-byte stores
// (four words from c % 4 = 0) stay contiguous.
template <class Word, class Slot>
void check_v_image(int kBT, int V, int slice_words, Word word, Slot slot) {
  std::vector<int> hits(kBT * V, 0);
  for (int j = 0; j < kBT; ++j) {
    for (int c = 0; c < V; ++c) {
      const int at = static_cast<int>(slot(j, c));
      ASSERT_GE(at, 0);
      ASSERT_LT(at, kBT * V);
      ++hits[at];
      const uint32_t w = word(j, c);
      ASSERT_EQ(w, (c / 64) * slice_words + word(j, c % 64)) << "j " << j << ", c " << c;
      if (c % 4 == 0) {
        for (int k = 1; k < 4; ++k) ASSERT_EQ(word(j, c + k), w + k) << "j " << j << ", c " << c;
      }
    }
  }
  for (int i = 0; i < kBT * V; ++i) ASSERT_EQ(hits[i], 1) << "V = " << V << ", slot " << i;
}

TEST(TileImage, VImageIsABijectionOfSlices) {
  constexpr int kBT = 32;
  for (int V : {64, 128}) {
    const auto index = [](int j, int c) { return v_image_index<kBT>(j, c); };
    check_v_image(kBT, V, kBT * 64, index, index);
  }
}

// The 4-byte banks (of 32) that one warp's read hits: lane (g = lane / 4, t = lane % 4) reads the
// word at index(g, t).
template <class Index>
size_t warp_banks(Index index) {
  std::set<int> banks;
  for (int lane = 0; lane < 32; ++lane)
    banks.insert(static_cast<int>(index(lane / 4, lane % 4)) % 32);
  return banks.size();
}

TEST(TileImage, ScanReadsOfVAreConflictFree) {
  // scan_step's read: lane (g, t) of warp w loads row j = 8 nn + t + 4 s and column 16 w + g + 8 h
  // (s, h in {0, 1}).
  constexpr int kBT = 32;
  for (int w = 0; w < 8; ++w) {
    for (int nn = 0; nn < kBT / 8; ++nn) {
      for (int s = 0; s < 2; ++s) {
        for (int h = 0; h < 2; ++h) {
          const size_t banks = warp_banks([&](int g, int t) {
            return v_image_index<kBT>(8 * nn + t + 4 * s, 16 * w + g + 8 * h);
          });
          EXPECT_EQ(banks, 32u) << "w " << w << " nn " << nn << " s " << s << " h " << h;
        }
      }
    }
  }
}

TEST(TileImage, VPairImageIsABijectionOfHalfWords) {
  // The 16-bit image: element (j, c) is half pair_half(j) of word v_pair_word_index(j, c); rows j
  // and j + 4 (j % 8 < 4) share a word, j in the low half.
  constexpr int kBT = 32;
  for (int j = 0; j < kBT; ++j) {
    ASSERT_EQ(pair_half(j), static_cast<uint32_t>(j % 8 >= 4)) << "j " << j;
    if (j % 8 < 4) {
      for (int c = 0; c < 128; ++c) {
        ASSERT_EQ(v_pair_word_index<kBT>(j + 4, c), v_pair_word_index<kBT>(j, c)) << "j " << j;
      }
    }
  }
  for (int V : {64, 128}) {
    check_v_image(
        kBT, V, kBT / 2 * 64, [](int j, int c) { return v_pair_word_index<kBT>(j, c); },
        [](int j, int c) { return 2 * v_pair_word_index<kBT>(j, c) + pair_half(j); });
  }
}

TEST(TileImage, ScanReadsOfVPairsAreConflictFree) {
  // scan_step's read of a 16-bit image: lane (g, t) of warp w loads the word of rows 8 nn + t and
  // 8 nn + t + 4, column 16 w + g + 8 h.
  constexpr int kBT = 32;
  for (int w = 0; w < 8; ++w) {
    for (int nn = 0; nn < kBT / 8; ++nn) {
      for (int h = 0; h < 2; ++h) {
        const size_t banks = warp_banks(
            [&](int g, int t) { return v_pair_word_index<kBT>(8 * nn + t, 16 * w + g + 8 * h); });
        EXPECT_EQ(banks, 32u) << "w " << w << " nn " << nn << " h " << h;
      }
    }
  }
}

}  // namespace
