// The CUDA forward's compiled-path choices (src/cuda/chunk_fwd/params.h): prep_path_of picks a
// fixed prep path (traits.h: PrepPath) and scan_io_of a fixed scan format (ScanIo) exactly for the
// safe-gate serving configuration, and the accessors that the stages read fold to that
// configuration's values on a fixed path and pass the parameters through on the generic one.
// Host-side and plain C++ (params.h needs only the CUDA headers' CUtensorMap); the GPU tests
// (tests/python/test_gpu_chunk_fwd.py: test_kernel_paths) check the same choices on the kernels
// that run. Built with the CUDA backend only.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "cuda/chunk_fwd/params.h"

namespace {

using openkda::DType;
using openkda::cuda::chunk_forward::ChunkFwdParams;
using openkda::cuda::chunk_forward::GateMode;
using openkda::cuda::chunk_forward::prep_path_of;
using openkda::cuda::chunk_forward::PrepPath;
using openkda::cuda::chunk_forward::scan_io_of;
using openkda::cuda::chunk_forward::ScanIo;

// The serving configuration in 16-bit dtype t: what both fixed paths are compiled for.
ChunkFwdParams serving(DType t) {
  ChunkFwdParams p;
  p.qk_dtype = p.g_dtype = p.v_dtype = p.o_dtype = t;
  p.beta_dtype = t;
  p.gate_mode = GateMode::kLowerBound;
  p.lower_bound = -5.0f;
  p.l2norm = true;
  p.exact_diag = false;
  p.f16_keys = true;
  return p;
}

TEST(ChunkFwdPaths, ServingConfigurationTakesTheFixedPaths) {
  EXPECT_EQ(prep_path_of(serving(DType::kBF16)), PrepPath::kSafeBF16);
  EXPECT_EQ(prep_path_of(serving(DType::kF16)), PrepPath::kSafeF16);
  EXPECT_EQ(scan_io_of(serving(DType::kBF16)), ScanIo::kBF16);
  EXPECT_EQ(scan_io_of(serving(DType::kF16)), ScanIo::kF16);
  ChunkFwdParams varlen = serving(DType::kBF16);
  int32_t cu[2] = {0, 1};
  varlen.cu_seqlens = cu;  // dense or varlen: the same paths
  EXPECT_EQ(prep_path_of(varlen), PrepPath::kSafeBF16);
  EXPECT_EQ(scan_io_of(varlen), ScanIo::kBF16);
}

// Every condition of the prep's fixed path, broken one at a time.
TEST(ChunkFwdPaths, PrepFallsBackToGenericWhenOneConditionFails) {
  const std::vector<std::pair<std::string, std::function<void(ChunkFwdParams&)>>> breaks = {
      {"softplus gate", [](ChunkFwdParams& p) { p.gate_mode = GateMode::kSoftplus; }},
      {"pre-gated", [](ChunkFwdParams& p) { p.gate_mode = GateMode::kPre; }},
      {"tf32 keys", [](ChunkFwdParams& p) { p.f16_keys = false; }},
      {"exact diagonal", [](ChunkFwdParams& p) { p.exact_diag = true; }},
      {"no l2norm", [](ChunkFwdParams& p) { p.l2norm = false; }},
      {"f32 v", [](ChunkFwdParams& p) { p.v_dtype = DType::kF32; }},
      {"f32 g", [](ChunkFwdParams& p) { p.g_dtype = DType::kF32; }},
      {"f16 g with bf16 q, k", [](ChunkFwdParams& p) { p.g_dtype = DType::kF16; }},
      {"f32 q, k, g", [](ChunkFwdParams& p) { p.qk_dtype = p.g_dtype = DType::kF32; }},
  };
  for (const auto& [what, apply] : breaks) {
    ChunkFwdParams p = serving(DType::kBF16);
    apply(p);
    EXPECT_EQ(prep_path_of(p), PrepPath::kGeneric) << what;
  }
}

// Every condition of the scan's fixed formats, broken one at a time.
TEST(ChunkFwdPaths, ScanFallsBackToGenericWhenOneConditionFails) {
  int h_storage = 0;
  const std::vector<std::pair<std::string, std::function<void(ChunkFwdParams&)>>> breaks = {
      {"tf32 keys", [](ChunkFwdParams& p) { p.f16_keys = false; }},
      {"h snapshots", [&h_storage](ChunkFwdParams& p) { p.h = &h_storage; }},
      {"f32 o", [](ChunkFwdParams& p) { p.o_dtype = DType::kF32; }},
      {"f32 v", [](ChunkFwdParams& p) { p.v_dtype = DType::kF32; }},
      {"f16 o with a bf16 v", [](ChunkFwdParams& p) { p.o_dtype = DType::kF16; }},
  };
  for (const auto& [what, apply] : breaks) {
    ChunkFwdParams p = serving(DType::kBF16);
    apply(p);
    EXPECT_EQ(scan_io_of(p), ScanIo::kGeneric) << what;
  }
  // The scan's formats do not depend on the prep's conditions.
  ChunkFwdParams p = serving(DType::kBF16);
  p.gate_mode = GateMode::kSoftplus;
  p.exact_diag = true;
  p.g_dtype = DType::kF32;
  EXPECT_EQ(scan_io_of(p), ScanIo::kBF16);
}

// Traits stand-ins: the accessors read only kSafePath (prep) and kIo (scan).
struct FixedPrep {
  static constexpr bool kSafePath = true;
};
struct GenericPrep {
  static constexpr bool kSafePath = false;
};
template <ScanIo kIo_>
struct Scan {
  static constexpr ScanIo kIo = kIo_;
};

TEST(ChunkFwdPaths, AccessorsFoldOnFixedPathsAndPassThroughOnGeneric) {
  using namespace openkda::cuda::chunk_forward;
  ChunkFwdParams p;  // the generic values of every option the fixed paths fix
  p.gate_mode = GateMode::kPre;
  p.f16_keys = false;
  p.exact_diag = true;
  p.l2norm = false;
  p.qk_dtype = p.g_dtype = p.v_dtype = p.o_dtype = DType::kF32;
  int h_storage = 0;
  p.h = &h_storage;
  EXPECT_TRUE(prep_f16_keys<FixedPrep>(p));
  EXPECT_FALSE(prep_exact_diag<FixedPrep>(p));
  EXPECT_TRUE(prep_l2norm<FixedPrep>(p));
  EXPECT_EQ(prep_gate_mode<FixedPrep>(p), GateMode::kLowerBound);
  EXPECT_TRUE(prep_inputs_by_tensor_map<FixedPrep>(p));
  EXPECT_TRUE(prep_v_by_tensor_map<FixedPrep>(p));

  EXPECT_FALSE(prep_f16_keys<GenericPrep>(p));
  EXPECT_TRUE(prep_exact_diag<GenericPrep>(p));
  EXPECT_FALSE(prep_l2norm<GenericPrep>(p));
  EXPECT_EQ(prep_gate_mode<GenericPrep>(p), GateMode::kPre);
  EXPECT_TRUE(prep_inputs_by_tensor_map<GenericPrep>(p));  // f32: boxes too
  EXPECT_FALSE(prep_v_by_tensor_map<GenericPrep>(p));      // f32 v: the workspace copy

  EXPECT_EQ(scan_v_dtype<Scan<ScanIo::kBF16>>(p), DType::kBF16);
  EXPECT_EQ(scan_o_dtype<Scan<ScanIo::kF16>>(p), DType::kF16);
  EXPECT_FALSE(scan_h_snapshots<Scan<ScanIo::kBF16>>(p));
  EXPECT_EQ(scan_v_dtype<Scan<ScanIo::kGeneric>>(p), DType::kF32);
  EXPECT_EQ(scan_o_dtype<Scan<ScanIo::kGeneric>>(p), DType::kF32);
  EXPECT_TRUE(scan_h_snapshots<Scan<ScanIo::kGeneric>>(p));
}

}  // namespace
