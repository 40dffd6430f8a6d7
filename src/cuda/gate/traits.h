// Compile-time configuration of the gate kernels (fused_kda_gate forward and backward) and the
// launch plan derived from the problem size.
//
// The gate works on g viewed as a row-major matrix [M, C]: M = numel / (HV * K) token rows and
// C = HV * K columns (column c belongs to head c / K and uses dt_bias[c]). A block is
// kBlockX x kBlockY = 256 threads: threadIdx.x walks column groups of kVec columns (coalesced
// along a row), threadIdx.y walks rows. A thread keeps its columns' parameters (dt_bias, the
// head's exp(A_log)) in registers for every row it visits, and in the backward pass it also keeps
// its columns' running sums of ddt_bias and dA_log.
#pragma once

#include <algorithm>
#include <cstdint>

namespace openkda::cuda {

struct GateTraits {
  static constexpr int kThreads = 256;   // threads per block (fwd and bwd)
  static constexpr int kVec = 8;         // columns per thread on the vector path: 16 B of bf16
  static constexpr int kMaxBlockX = 32;  // column groups per block: one warp wide along a row
  static constexpr int kUnroll = 4;      // forward: rows loaded before the first is used
  static constexpr int kFwdRowsPerThread = 4;  // forward: rows per thread before the grid grows
  static constexpr int kBwdRowsPerThread = 4;  // backward: at least this many rows per thread
  // NOTE: the backward grid is capped near one wave of 256-thread blocks on an H100/H200 (132
  // SMs x 8); every block row writes one row of per-column partial sums, so the cap also bounds
  // the workspace to 2 * kBwdTargetBlocks / grid_x * C floats.
  static constexpr int kBwdTargetBlocks = 1024;
  // NOTE: 2 resident blocks per SM caps the backward kernel at 128 registers; uncapped, the f32
  // variants take 144+ and only one 256-thread block fits on an SM.
  static constexpr int kBwdMinBlocksPerSm = 2;
  static constexpr int kMaxGridY = 65535;     // hardware limit of gridDim.y
  static constexpr int kReduceThreads = 256;  // second (fixed-order) reduction pass
  static constexpr int kReduceCols = 32;      // ddt_bias columns per reduction block
  static constexpr int kReduceRows = kReduceThreads / kReduceCols;
  static constexpr int kWorkspaceAlign = 128;  // bytes; each partial-sum buffer starts aligned

  // Backward: rows loaded before the first is used, so that a thread holds at most 128 B of g and
  // dy packs (4 rows of bf16 + bf16, 2 of bf16 + f32 or f32 + f32, 1 of f64 + f64).
  template <typename TG, typename TDy, int kCols>
  static constexpr int kBwdRowBytes = kCols* static_cast<int>(sizeof(TG) + sizeof(TDy));
  template <typename TG, typename TDy, int kCols>
  static constexpr int kBwdUnroll = std::max(1, std::min(4, 128 / kBwdRowBytes<TG, TDy, kCols>));

  static_assert(kThreads % kMaxBlockX == 0, "a block holds whole column-group rows");
  static_assert((kThreads & (kThreads - 1)) == 0, "the row tree reduction halves kBlockY");
  static_assert((kMaxBlockX & (kMaxBlockX - 1)) == 0, "kBlockX is a power of two");
  static_assert(kVec == 8, "the vector path moves 16 B of a 2-byte dtype per access");
  static_assert(kReduceThreads % kReduceCols == 0, "reduction block holds whole column rows");
  static_assert((kReduceRows & (kReduceRows - 1)) == 0, "tree over kReduceRows halves it");
  static_assert((kReduceThreads & (kReduceThreads - 1)) == 0, "tree over the block halves it");
};

// Launch plan of one call. It depends only on (M, C): never on pointer alignment or on whether
// the vector path runs, so the backward reduction order (and thus every bit of dA_log and
// ddt_bias) is the same for the same shapes.
struct GatePlan {
  int block_x = 1;     // column groups per block (power of two, <= kMaxBlockX)
  int block_y = 1;     // rows per block pass: kThreads / block_x
  int64_t grid_y = 0;  // row blocks; in backward also the number of partial-sum rows
};

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

inline GatePlan make_gate_plan(int64_t rows, int64_t cols, bool backward) {
  using Tr = GateTraits;
  GatePlan plan;
  const int64_t groups = ceil_div(cols, Tr::kVec);  // nominal groups, vector path or not
  while (plan.block_x < Tr::kMaxBlockX && plan.block_x < groups) plan.block_x *= 2;
  plan.block_y = Tr::kThreads / plan.block_x;
  const int64_t grid_x = std::max<int64_t>(1, ceil_div(groups, plan.block_x));
  if (backward) {
    const int64_t by_rows = ceil_div(rows, int64_t{plan.block_y} * Tr::kBwdRowsPerThread);
    const int64_t by_wave = std::max<int64_t>(1, ceil_div(Tr::kBwdTargetBlocks, grid_x));
    plan.grid_y = std::max<int64_t>(1, std::min(by_rows, by_wave));
  } else {
    const int64_t by_rows = ceil_div(rows, int64_t{plan.block_y} * Tr::kFwdRowsPerThread);
    plan.grid_y = std::min<int64_t>(by_rows, Tr::kMaxGridY);
  }
  return plan;
}

}  // namespace openkda::cuda
