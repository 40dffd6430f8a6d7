// The CUDA forward's grid plans (src/cuda/chunk_fwd/plan.h), at chosen multiprocessor counts:
// plan_scan's V split and time split, and plan_prep's prep / scan hand-off (taken only where the
// scan's one 8-warp CTA per state chain leaves multiprocessors idle, at K = V = 128, dense, with
// enough chunks; the scan then keeps 8 warps where it would otherwise split V), its persistent
// grid, keepers and exit item. Host-side plain C++; the GPU tests
// (tests/python/test_gpu_chunk_fwd.py: test_handoff*) check on the H200 that the kernels take the
// hand-off where these plans say.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/chunk_fwd/plan.h"

namespace {

using namespace openkda::cuda::chunk_forward;  // NOLINT: the plans and their types (plan.h)

constexpr int kH200Sms = 132;

PlanShape dense(int64_t B, int64_t T, int64_t HV, int64_t K = 128, int64_t V = 128) {
  PlanShape s;
  s.N = B;
  s.T = T;
  s.HV = HV;
  s.K = K;
  s.V = V;
  return s;
}

PlanShape varlen(int64_t N, int64_t total_tokens, int64_t HV) {
  PlanShape s = dense(1, total_tokens, HV);
  s.N = N;
  s.varlen = true;
  return s;
}

int64_t dense_slots(const PlanShape& s) {
  return s.N * ((s.T + s.BT - 1) / s.BT);
}

PrepPlan prep_of(const PlanShape& s, int sms = kH200Sms) {
  return plan_prep(s, plan_scan(s, sms), dense_slots(s), sms);
}

TEST(ChunkFwdPlan, KernelChunkIs32) {
  EXPECT_EQ(kKernelChunk, 32);
}

TEST(ChunkFwdPlan, ScanSplitsVWhileTwoCtasPerChainFitOneWave) {
  // The cases on 132 multiprocessors.
  const ScanPlan h96 = plan_scan(dense(1, 8192, 96), kH200Sms);
  EXPECT_EQ(h96.vsplit, 1);
  EXPECT_EQ(h96.nseg, 1);
  EXPECT_EQ(plan_scan(varlen(8, 8 * 4096, 32), kH200Sms).vsplit, 1);  // 256 chains
  EXPECT_EQ(plan_scan(varlen(2, 8192, 32), kH200Sms).vsplit, 2);      // 64 chains, no hand-off
  // Dense calls the hand-off does not take: 63 chunks (T = 2016), or K = 64.
  EXPECT_EQ(plan_scan(dense(1, 2016, 66), kH200Sms).vsplit, 2);  // 132 CTAs: one wave
  EXPECT_EQ(plan_scan(dense(1, 2016, 67), kH200Sms).vsplit, 1);  // 134: not
  EXPECT_EQ(plan_scan(dense(1, 8192, 64, 64, 128), kH200Sms).vsplit, 2);
  EXPECT_EQ(plan_scan(dense(1, 8192, 64, 128, 64), kH200Sms).vsplit, 1);  // V = 64: no split
}

TEST(ChunkFwdPlan, ScanKeepsEightWarpsWhereTheHandoffFits) {
  // B1-T8192-H64: 64 chains would fit two 4-warp CTAs each in one wave, but the hand-off fits, so
  // one 8-warp CTA per chain runs beside the prep on the other 68 multiprocessors.
  const PlanShape h64 = dense(1, 8192, 64);
  EXPECT_TRUE(handoff_fits(h64, kH200Sms));
  const ScanPlan scan = plan_scan(h64, kH200Sms);
  EXPECT_EQ(scan.vsplit, 1);
  EXPECT_EQ(scan.nseg, 1);
  const PrepPlan p = prep_of(h64);
  ASSERT_TRUE(p.handoff);
  EXPECT_EQ(p.keeper_sms, kH200Sms - 64);
  // items - keepers x chunks x 1.77 / 2.87 = 16384 - 68 x 256 x 0.6167 = 5648.
  EXPECT_EQ(p.exit_item, 5648);
  // Few enough chains for the time split (33 x 2 x 2 <= 132): that takes the call instead.
  EXPECT_TRUE(handoff_fits(dense(1, 8192, 33), kH200Sms));
  EXPECT_EQ(plan_scan(dense(1, 8192, 33), kH200Sms).nseg, 4);
  EXPECT_FALSE(prep_of(dense(1, 8192, 33)).handoff);
}

TEST(ChunkFwdPlan, TimeSplitForFewChainsOfDenseBatches) {
  // B1-T65536-H16: 32 output CTAs at vs = 64; min(2 * 132 / 32, 2048 / 16) = 8 segments.
  const ScanPlan p = plan_scan(dense(1, 65536, 16), kH200Sms);
  EXPECT_EQ(p.vsplit, 2);
  EXPECT_EQ(p.nseg, 8);
  EXPECT_EQ(p.seg_chunks, 256);
  // Segments of at least 16 chunks: T = 1024 (32 chunks) gives 2, T = 992 (31 chunks) none.
  EXPECT_EQ(plan_scan(dense(1, 1024, 16), kH200Sms).nseg, 2);
  EXPECT_EQ(plan_scan(dense(1, 992, 16), kH200Sms).nseg, 1);
  // More than half the multiprocessors' worth of output CTAs (34 chains x 2 > 66): no split.
  EXPECT_EQ(plan_scan(dense(1, 65536, 34), kH200Sms).nseg, 1);
  EXPECT_EQ(plan_scan(dense(1, 65536, 33), kH200Sms).nseg, 4);
  // One varlen sequence splits as a dense row of all T tokens would (its segments cover at most
  // ceil(T / BT) chunks); several never do (their lengths live on the device).
  const ScanPlan one = plan_scan(varlen(1, 65536, 16), kH200Sms);
  EXPECT_EQ(one.vsplit, 2);
  EXPECT_EQ(one.nseg, 8);
  EXPECT_EQ(one.seg_chunks, 256);
  EXPECT_EQ(plan_scan(varlen(1, 2100, 2), kH200Sms).nseg, 4);  // 66 chunks: 4 of 17
  EXPECT_EQ(plan_scan(varlen(2, 65536, 16), kH200Sms).nseg, 1);
  EXPECT_EQ(plan_scan(varlen(2, 65536, 16), kH200Sms).vsplit, 2);
}

TEST(ChunkFwdPlan, HandoffAtH96WithItsKeepersAndExitItem) {
  const PlanShape s = dense(1, 8192, 96);
  const PrepPlan p = prep_of(s);
  ASSERT_TRUE(p.handoff);
  const int64_t items = 256 * 96;
  EXPECT_EQ(p.ctas, 4 * kH200Sms);  // four persistent CTAs per multiprocessor
  EXPECT_EQ(p.keeper_sms, kH200Sms - 96);
  // items - keepers x chunks x 1.77 / 2.87 = 24576 - 36 x 256 x 0.6167 = 18892.
  EXPECT_EQ(p.exit_item, 18892);
  EXPECT_LT(p.exit_item, items);
  EXPECT_GT(p.exit_item, items / 2);
}

TEST(ChunkFwdPlan, HandoffOnlyWhereTheScanLeavesMultiprocessorsIdle) {
  // 34..124 chains on 132 multiprocessors (below 34 the time split; at least 8 keepers).
  EXPECT_FALSE(prep_of(dense(1, 8192, 33)).handoff);
  EXPECT_TRUE(prep_of(dense(1, 8192, 34)).handoff);
  EXPECT_TRUE(prep_of(dense(1, 8192, 66)).handoff);
  EXPECT_TRUE(prep_of(dense(1, 8192, 67)).handoff);
  EXPECT_TRUE(prep_of(dense(1, 8192, 124)).handoff);
  EXPECT_FALSE(prep_of(dense(1, 8192, 125)).handoff);  // fewer than 8 idle
  EXPECT_FALSE(prep_of(dense(2, 8192, 64)).handoff);   // 128 chains
  EXPECT_TRUE(prep_of(dense(2, 4096, 48)).handoff);    // 96 chains over two rows
  // At least 64 chunks per sequence.
  EXPECT_TRUE(prep_of(dense(1, 2048, 96)).handoff);
  EXPECT_FALSE(prep_of(dense(1, 2016, 96)).handoff);
  // K = V = 128 only, dense only.
  EXPECT_FALSE(prep_of(dense(1, 8192, 96, 64, 128)).handoff);
  EXPECT_FALSE(prep_of(dense(1, 8192, 96, 128, 64)).handoff);
  const PlanShape v = varlen(6, 8192, 96);
  EXPECT_FALSE(plan_prep(v, plan_scan(v, kH200Sms), 8192 / 32 + 6, kH200Sms).handoff);
  // Another multiprocessor count moves the window: 114 (H100 PCIe) takes 29..106 chains.
  EXPECT_TRUE(prep_of(dense(1, 8192, 96), 114).handoff);
  EXPECT_FALSE(prep_of(dense(1, 8192, 107), 114).handoff);
  EXPECT_TRUE(prep_of(dense(1, 8192, 29), 114).handoff);
  EXPECT_FALSE(prep_of(dense(1, 8192, 28), 114).handoff);
}

TEST(ChunkFwdPlan, HandoffGridNeverExceedsItsItems) {
  // 64 chunks x 67 heads = 4288 items: more than four per multiprocessor. With fewer items the
  // grid has one CTA per item.
  const PrepPlan p = prep_of(dense(1, 2048, 67));
  ASSERT_TRUE(p.handoff);
  EXPECT_EQ(p.ctas, 4 * kH200Sms);
  const PlanShape s = dense(1, 2048, 96);
  const PrepPlan small = plan_prep(s, plan_scan(s, kH200Sms), 4, kH200Sms);  // 4 slots x 96
  ASSERT_TRUE(small.handoff);
  EXPECT_EQ(small.ctas, 4 * 96);
  EXPECT_GE(small.exit_item, 0);
}

}  // namespace
