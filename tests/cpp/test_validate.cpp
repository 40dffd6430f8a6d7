// Validation: every can_implement failure returns kInvalidArgument with a message that names the
// argument and the values seen / expected ("<op>: <argument>...: <seen>; expected <expected>").
// Assertions are on substrings (argument name + key values), not on whole messages.
// Also: workspace sizing and a clean failure of run() with a too-small or misaligned workspace.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "kda_case.h"
#include "test_util.h"

namespace kdatest {
namespace {

::testing::AssertionResult Invalid(const openkda::Status& s,
                                   std::initializer_list<std::string> needles) {
  if (s.code() != openkda::StatusCode::kInvalidArgument)
    return ::testing::AssertionFailure() << "expected kInvalidArgument, got " << code_name(s.code())
                                         << ": \"" << s.message() << "\"";
  for (const std::string& n : needles) {
    auto r = HasSubstr(s.message(), n);
    if (!r) return r;
  }
  return ::testing::AssertionSuccess();
}

// A valid chunk_kda problem (B=2, T=64, H=2, HV=4, K=16, V=8, softplus gate + dt_bias, h0) whose
// args each test mutates.
class ChunkValidate : public ::testing::Test {
 protected:
  void SetUp() override {
    c.B = 2;
    c.T = 64;
    c.H = 2;
    c.HV = 4;
    c.K = 16;
    c.V = 8;
    c.gate = Gate::kSoftplusBias;
    c.beta = Beta::kLogits;
    c.h0 = true;
    in = make_inputs(c);
    out.o = HostTensor(DType::kF64, {c.B, c.T, c.HV, c.V});
    out.final_state = HostTensor(DType::kF64, c.state_shape(c.N()));
    out.h = HostTensor(DType::kF64, c.h_shape());
    args = make_fwd_args(c, in, out, Precision::kF64, Algorithm::kChunked, 0);
    ASSERT_TRUE(IsOk(openkda::can_implement(args)));
  }
  openkda::Status check() const { return openkda::can_implement(args); }

  Config c;
  Inputs in;
  FwdOut out;
  openkda::ChunkFwdArgs args;
};

TEST_F(ChunkValidate, WrongRank) {
  args.q.ndim = 3;
  EXPECT_TRUE(Invalid(check(), {"chunk_kda: ", "q: rank 3", "expected rank 4", "[B, T, H, K]"}));
}

TEST_F(ChunkValidate, WrongRankOfV) {
  args.v.ndim = 5;
  args.v.shape[4] = 1;
  args.v.stride[4] = 1;
  EXPECT_TRUE(Invalid(check(), {"v: rank 5", "expected rank 4"}));
}

TEST_F(ChunkValidate, KShapeDiffersFromQ) {
  args.k.shape[1] = 63;
  EXPECT_TRUE(Invalid(check(), {"k.shape [2, 63, 2, 16]", "[2, 64, 2, 16]"}));
}

TEST_F(ChunkValidate, VBatchOrTimeDiffers) {
  args.v.shape[1] = 60;
  EXPECT_TRUE(Invalid(check(), {"v.shape [2, 60, 4, 8]", "B = 2", "T = 64"}));
}

TEST_F(ChunkValidate, GShape) {
  args.g.shape[3] = 8;
  EXPECT_TRUE(Invalid(check(), {"g.shape [2, 64, 4, 8]", "[B, T, HV, K] = [2, 64, 4, 16]"}));
}

TEST_F(ChunkValidate, BetaShape) {
  args.beta.shape[2] = 2;
  EXPECT_TRUE(Invalid(check(), {"beta.shape [2, 64, 2]", "[B, T, HV] = [2, 64, 4]"}));
}

TEST_F(ChunkValidate, HeadwiseBetaRejectedByChunk) {
  HostTensor hw(DType::kF64, {c.B, c.T, c.HV, c.V});
  args.beta = hw.ref();
  EXPECT_TRUE(Invalid(check(), {"beta.shape [2, 64, 4, 8]", "[2, 64, 4]"}));
}

TEST_F(ChunkValidate, QDtype) {
  args.q.dtype = DType::kI32;
  EXPECT_TRUE(Invalid(check(), {"q.dtype i32", "f16, bf16, f32, f64"}));
}

TEST_F(ChunkValidate, KDtypeDiffersFromQ) {
  args.k.dtype = DType::kF32;
  EXPECT_TRUE(Invalid(check(), {"k.dtype f32", "q.dtype f64"}));
}

TEST_F(ChunkValidate, BetaDtype) {
  args.beta.dtype = DType::kI64;
  EXPECT_TRUE(Invalid(check(), {"beta.dtype i64"}));
}

TEST_F(ChunkValidate, DeviceMismatch) {
  args.v.device = openkda::Device{openkda::DeviceType::kCUDA, 0};
  EXPECT_TRUE(Invalid(check(), {"v.device cuda:0", "q.device cpu:0"}));
}

TEST_F(ChunkValidate, DeviceMismatchOfInitialState) {
  args.initial_state.device = openkda::Device{openkda::DeviceType::kCUDA, 1};
  EXPECT_TRUE(Invalid(check(), {"initial_state.device cuda:1", "cpu:0"}));
}

// On CUDA the kernels add their own limits (K, V in {64, 128}); without a CUDA build the whole op
// is unsupported there. Either way the answer is kNotSupported and names the op and the reason.
TEST_F(ChunkValidate, CudaTensorsOutsideTheKernelsAreNotSupported) {
  for (openkda::TensorRef* t :
       {&args.q, &args.k, &args.v, &args.g, &args.beta, &args.A_log, &args.dt_bias,
        &args.initial_state, &args.o, &args.final_state, &args.h})
    t->device = openkda::Device{openkda::DeviceType::kCUDA, 0};
  const openkda::Status s = check();
  EXPECT_EQ(s.code(), openkda::StatusCode::kNotSupported) << s.message();
  EXPECT_TRUE(HasSubstr(s.message(), "chunk_kda"));
  if (openkda::build_config().cuda)
    EXPECT_TRUE(HasSubstr(s.message(), "K) = " + std::to_string(c.K))) << s.message();
  else
    EXPECT_TRUE(HasSubstr(s.message(), "cuda")) << s.message();
}

// The CUDA launchers enqueue on the current device, so valid arguments that live on another
// device are refused before any launch, with the device named. (Device 7 is not current on a
// machine with fewer than 8 GPUs or none; without a CUDA build the op is unsupported on CUDA.)
TEST(CurrentDevice, ChunkTensorsOnAnotherDeviceAreRefused) {
  Config c;
  c.B = 1;
  c.T = 64;
  c.H = c.HV = 1;
  c.K = c.V = 64;
  Inputs in = make_inputs(c);
  FwdOut out;
  out.o = HostTensor(DType::kF64, {c.B, c.T, c.HV, c.V});
  openkda::ChunkFwdArgs a = make_fwd_args(c, in, out, Precision::kF64, Algorithm::kChunked, 0);
  ASSERT_TRUE(IsOk(openkda::can_implement(a)));
  for (openkda::TensorRef* t : {&a.q, &a.k, &a.v, &a.g, &a.beta, &a.o})
    t->device = openkda::Device{openkda::DeviceType::kCUDA, 7};
  const openkda::Status s = openkda::can_implement(a);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(openkda::workspace_bytes(a), 0u);
  if (openkda::build_config().cuda) {
    EXPECT_TRUE(HasSubstr(s.message(), "chunk_kda: q.device cuda:7; expected")) << s.message();
  }
}

// Under the CUDA scan's time split (few state chains, >= 32 kernel chunks of 32 tokens per
// sequence, whatever chunk_size) the last segment
// writes the final state while the first may still read the initial state: sharing memory is
// refused there, and only there.
TEST(TimeSplit, FinalStateSharingTheInitialStateIsRefused) {
  if (!openkda::build_config().cuda) GTEST_SKIP() << "no CUDA backend in this build";
  for (const int64_t T : {2048, 64}) {  // 64 kernel chunks: split; 2: serial scan
    Config c;
    c.B = 1;
    c.T = T;
    c.H = c.HV = 1;
    c.K = c.V = 64;
    c.h0 = true;
    c.set_all_dtypes(DType::kBF16);
    c.h0_dtype = c.state_dtype = DType::kF32;
    Inputs in = make_inputs(c);
    FwdOut out;
    out.o = HostTensor(DType::kBF16, {c.B, c.T, c.HV, c.V});
    out.final_state = HostTensor(DType::kF32, c.state_shape(c.N()));
    openkda::ChunkFwdArgs a = make_fwd_args(c, in, out, Precision::kF32, Algorithm::kChunked, 0);
    for (openkda::TensorRef* t : {&a.q, &a.k, &a.v, &a.g, &a.beta, &a.A_log, &a.dt_bias,
                                  &a.initial_state, &a.o, &a.final_state})
      t->device = openkda::Device{openkda::DeviceType::kCUDA, 0};
    const std::string shared = "final_state shares memory with initial_state";
    EXPECT_FALSE(HasSubstr(openkda::can_implement(a).message(), shared));
    a.final_state.data = a.initial_state.data;
    const openkda::Status s = openkda::can_implement(a);
    if (T == 2048) {
      EXPECT_EQ(s.code(), openkda::StatusCode::kNotSupported) << s.message();
      EXPECT_TRUE(HasSubstr(s.message(), shared)) << s.message();
    } else {
      EXPECT_FALSE(HasSubstr(s.message(), shared)) << s.message();
    }
  }
}

// The CUDA prep reads q, k and g (unless one of them is f64) and the scan a bf16 / f16 v by
// tensor-map boxes whose row coordinate is an int32 token row: more than 2^31 - 1 tokens are
// refused when any box is read, naming what is read that way, and not when nothing is (f64 q, k,
// g and an f32 v, whose rows go through the workspace). Only can_implement runs: the tensors keep
// their small buffers.
TEST(ChunkFwdCuda, TensorMapRowsAreBounded) {
  if (!openkda::build_config().cuda) GTEST_SKIP() << "no CUDA backend in this build";
  struct Case {
    DType qkg, v;
    const char* refusal;  // nullptr: not refused
  };
  for (const Case& k : {Case{DType::kBF16, DType::kBF16, "with q, k and g in bf16 / bf16 (read by"},
                        Case{DType::kF64, DType::kBF16, "with a bf16 v (read by"},
                        Case{DType::kF64, DType::kF32, nullptr}}) {
    Config c;
    c.B = 1;
    c.T = 64;
    c.H = c.HV = 1;
    c.K = c.V = 64;
    c.set_all_dtypes(DType::kF32);
    c.qk_dtype = c.g_dtype = k.qkg;
    c.v_dtype = k.v;
    Inputs in = make_inputs(c);
    FwdOut out;
    out.o = HostTensor(DType::kBF16, {c.B, c.T, c.HV, c.V});
    openkda::ChunkFwdArgs a = make_fwd_args(c, in, out, Precision::kF32, Algorithm::kChunked, 0);
    constexpr int64_t kTokens = int64_t{1} << 31;
    for (openkda::TensorRef* t : {&a.q, &a.k, &a.v, &a.g, &a.beta, &a.o}) {
      t->device = openkda::Device{openkda::DeviceType::kCUDA, 0};
      t->shape[1] = kTokens;  // B = 1: only the outer stride follows
      t->stride[0] = kTokens * t->stride[1];
    }
    const openkda::Status s = openkda::can_implement(a);
    const bool refused = HasSubstr(s.message(), "B T = 2147483648 tokens with");
    EXPECT_EQ(refused, k.refusal != nullptr) << s.message();
    if (refused) {
      EXPECT_EQ(s.code(), openkda::StatusCode::kNotSupported);
      EXPECT_TRUE(HasSubstr(s.message(), k.refusal)) << s.message();
      EXPECT_TRUE(HasSubstr(s.message(), "expected at most 2^31 - 1")) << s.message();
    }
  }
}

TEST_F(ChunkValidate, HVNotAMultipleOfH) {
  args.v.shape[2] = 3;
  EXPECT_TRUE(Invalid(check(), {"(HV) = 3", "multiple of H = 2"}));
}

TEST_F(ChunkValidate, NonContiguousInput) {
  args.q.stride[3] = 2;
  EXPECT_TRUE(Invalid(check(), {"q: non-contiguous", "contiguous"}));
  args = make_fwd_args(c, in, out, Precision::kF64, Algorithm::kChunked, 0);
  std::swap(args.g.stride[2], args.g.stride[3]);
  EXPECT_TRUE(Invalid(check(), {"g: non-contiguous"}));
}

TEST_F(ChunkValidate, SizeOneDimsMayHaveAnyStride) {
  Config one = c;
  one.B = 1;
  one.h0 = false;
  Inputs i1 = make_inputs(one);
  FwdOut o1;
  o1.o = HostTensor(DType::kF64, {1, one.T, one.HV, one.V});
  openkda::ChunkFwdArgs a = make_fwd_args(one, i1, o1, Precision::kF64, Algorithm::kChunked, 0);
  a.q.stride[0] = 12345;
  a.v.stride[0] = 7;
  EXPECT_TRUE(IsOk(openkda::can_implement(a)));
}

TEST_F(ChunkValidate, NullDataPointer) {
  args.k.data = nullptr;
  EXPECT_TRUE(Invalid(check(), {"k: null data"}));
}

TEST_F(ChunkValidate, KAbove256) {
  Config big = c;
  big.K = 300;
  big.T = 4;
  big.gate = Gate::kPre;
  big.h0 = false;
  Inputs bi = make_inputs(big);
  FwdOut bo;
  bo.o = HostTensor(DType::kF64, {big.B, big.T, big.HV, big.V});
  openkda::ChunkFwdArgs a = make_fwd_args(big, bi, bo, Precision::kF64, Algorithm::kChunked, 0);
  EXPECT_TRUE(Invalid(openkda::can_implement(a), {"(K) = 300", "K <= 256"}));
  // K = 256 is accepted.
  big.K = 256;
  Inputs bi2 = make_inputs(big);
  FwdOut bo2;
  bo2.o = HostTensor(DType::kF64, {big.B, big.T, big.HV, big.V});
  openkda::ChunkFwdArgs a2 = make_fwd_args(big, bi2, bo2, Precision::kF64, Algorithm::kChunked, 0);
  EXPECT_TRUE(IsOk(openkda::can_implement(a2)));
}

TEST_F(ChunkValidate, ChunkSize) {
  for (int cs : {16, 128, 0}) {
    args.chunk_size = cs;
    args.h = openkda::TensorRef{};  // h's NT depends on the chunk size
    EXPECT_TRUE(Invalid(check(), {"chunk_size = " + std::to_string(cs), "32 or 64"}));
  }
}

TEST_F(ChunkValidate, ALogMissingWhenRequired) {
  args.A_log = openkda::TensorRef{};
  EXPECT_TRUE(Invalid(check(), {"A_log is undefined", "HV elements", "lower_bound"}));
  // Not required with a lower bound, nor with a pre-gated g.
  args.lower_bound = -3.0;
  EXPECT_TRUE(IsOk(check()));
  args.lower_bound.reset();
  args.use_gate_in_kernel = false;
  EXPECT_TRUE(IsOk(check()));
}

TEST_F(ChunkValidate, ALogAndDtBiasElementCounts) {
  HostTensor a3(DType::kF64, {3});
  args.A_log = a3.ref();
  EXPECT_TRUE(Invalid(check(), {"A_log.shape [3]", "HV = 4"}));
  args = make_fwd_args(c, in, out, Precision::kF64, Algorithm::kChunked, 0);
  HostTensor b(DType::kF64, {4, 15});
  args.dt_bias = b.ref();
  EXPECT_TRUE(Invalid(check(), {"dt_bias.shape [4, 15]", "[HV * K] = [64]"}));
}

TEST_F(ChunkValidate, SafeGateLowerBoundRange) {
  args.safe_gate = true;
  args.lower_bound.reset();
  EXPECT_TRUE(Invalid(check(), {"lower_bound is not set", "[-5, 0)", "safe_gate"}));
  for (double lb : {-6.0, 0.0, 0.5, -5.0001}) {
    args.lower_bound = lb;
    std::ostringstream seen;
    seen << "lower_bound = " << lb;
    EXPECT_TRUE(Invalid(check(), {seen.str(), "[-5, 0)"})) << lb;
  }
  for (double lb : {-5.0, -0.001, -2.5}) {
    args.lower_bound = lb;
    EXPECT_TRUE(IsOk(check())) << lb;
  }
  // The value seen is printed with the digits that tell it from the bound it violates.
  args.lower_bound = -5.0000001;
  EXPECT_TRUE(Invalid(check(), {"lower_bound = -5.0000001;", "[-5, 0)"}));
  // The range is not enforced without safe_gate, nor for a pre-gated g.
  args.lower_bound = -8.0;
  args.safe_gate = false;
  EXPECT_TRUE(IsOk(check()));
  args.safe_gate = true;
  args.use_gate_in_kernel = false;
  EXPECT_TRUE(IsOk(check()));
}

TEST_F(ChunkValidate, AllowNegEigvalNeedsBetaSigmoid) {
  args.use_beta_sigmoid_in_kernel = false;
  args.allow_neg_eigval = true;
  EXPECT_TRUE(Invalid(check(), {"allow_neg_eigval", "use_beta_sigmoid_in_kernel = true"}));
}

TEST_F(ChunkValidate, InitialStateShape) {
  HostTensor bad(DType::kF64, {3, 4, 16, 8});
  args.initial_state = bad.ref();
  EXPECT_TRUE(
      Invalid(check(), {"initial_state.shape [3, 4, 16, 8]", "[N, HV, K, V] = [2, 4, 16, 8]"}));
}

TEST_F(ChunkValidate, InitialStateDtype) {
  for (DType dt : {DType::kF16, DType::kI32}) {
    args.initial_state.dtype = dt;
    EXPECT_TRUE(Invalid(check(), {std::string("initial_state.dtype ") + openkda::dtype_name(dt),
                                  "f32, f64, bf16"}));
  }
}

TEST_F(ChunkValidate, InitialStateLayout) {
  args.state_v_first = true;  // initial_state is still [N, HV, K, V] with K != V
  EXPECT_TRUE(Invalid(check(), {"initial_state.shape [2, 4, 16, 8]",
                                "[N, HV, V, K] = [2, 4, 8, 16]", "state_v_first = true"}));
}

TEST_F(ChunkValidate, FinalStateAndHShapesAndDtypes) {
  args.final_state.dtype = DType::kBF16;
  EXPECT_TRUE(Invalid(check(), {"final_state.dtype bf16", "f32, f64"}));
  args = make_fwd_args(c, in, out, Precision::kF64, Algorithm::kChunked, 0);
  args.h.shape[1] = 2;
  EXPECT_TRUE(
      Invalid(check(), {"h.shape [2, 2, 4, 16, 8]", "[B, NT, HV, K, V] = [2, 1, 4, 16, 8]"}));
  args = make_fwd_args(c, in, out, Precision::kF64, Algorithm::kChunked, 0);
  args.o = openkda::TensorRef{};
  EXPECT_TRUE(Invalid(check(), {"o is undefined", "[B, T, HV, V]"}));
  args = make_fwd_args(c, in, out, Precision::kF64, Algorithm::kChunked, 0);
  args.o.shape[3] = 16;
  EXPECT_TRUE(Invalid(check(), {"o.shape [2, 64, 4, 16]", "[2, 64, 4, 8]"}));
}

TEST_F(ChunkValidate, NonFiniteScale) {
  args.scale = std::nan("");
  EXPECT_TRUE(Invalid(check(), {"scale = ", "finite"}));
}

// ---- cu_seqlens
// ----------------------------------------------------------------------------------

class VarlenValidate : public ::testing::Test {
 protected:
  void SetUp() override {
    c.B = 1;
    c.T = 64;
    c.H = 1;
    c.HV = 2;
    c.K = 8;
    c.V = 8;
    c.cu = {0, 10, 30, 64};
    c.h0 = true;
    in = make_inputs(c);
    out.o = HostTensor(DType::kF64, {c.B, c.T, c.HV, c.V});
    out.final_state = HostTensor(DType::kF64, c.state_shape(c.N()));
    args = make_fwd_args(c, in, out, Precision::kF64, Algorithm::kChunked, 0);
    ASSERT_TRUE(IsOk(openkda::can_implement(args)));
  }
  void set_cu(std::vector<int64_t> v, DType dt = DType::kI64) {
    cu = HostTensor(dt, {static_cast<int64_t>(v.size())});
    for (size_t i = 0; i < v.size(); ++i)
      cu.set(static_cast<int64_t>(i), static_cast<double>(v[i]));
    args.cu_seqlens = cu.ref();
  }
  openkda::Status check() const { return openkda::can_implement(args); }

  Config c;
  Inputs in;
  FwdOut out;
  HostTensor cu;
  openkda::ChunkFwdArgs args;
};

TEST_F(VarlenValidate, NotStartingAtZero) {
  set_cu({1, 10, 30, 64});
  EXPECT_TRUE(Invalid(check(), {"cu_seqlens[0] = 1", "expected 0"}));
}

TEST_F(VarlenValidate, Decreasing) {
  set_cu({0, 30, 10, 64}, DType::kI32);
  EXPECT_TRUE(Invalid(check(), {"cu_seqlens[2] = 10", "cu_seqlens[1] = 30", "non-decreasing"}));
}

TEST_F(VarlenValidate, NotEndingAtT) {
  set_cu({0, 10, 30, 60});
  EXPECT_TRUE(Invalid(check(), {"cu_seqlens[-1] = 60", "T = 64"}));
}

TEST_F(VarlenValidate, WrongDtype) {
  set_cu({0, 10, 30, 64}, DType::kF32);
  EXPECT_TRUE(Invalid(check(), {"cu_seqlens.dtype f32", "i32, i64"}));
}

TEST_F(VarlenValidate, WrongRank) {
  HostTensor two(DType::kI64, {2, 2});
  args.cu_seqlens = two.ref();
  EXPECT_TRUE(Invalid(check(), {"cu_seqlens: rank 2", "[N + 1]"}));
}

TEST_F(VarlenValidate, BatchNotOne) {
  Config d = c;
  d.B = 2;
  d.cu.clear();
  d.h0 = false;
  Inputs di = make_inputs(d);
  FwdOut dout;
  dout.o = HostTensor(DType::kF64, {2, d.T, d.HV, d.V});
  openkda::ChunkFwdArgs a = make_fwd_args(d, di, dout, Precision::kF64, Algorithm::kChunked, 0);
  HostTensor cu2(DType::kI64, {3});
  cu2.set(0, 0);
  cu2.set(1, 10);
  cu2.set(2, 64);
  a.cu_seqlens = cu2.ref();
  EXPECT_TRUE(Invalid(openkda::can_implement(a), {"(B) = 2", "cu_seqlens", "expected 1"}));
}

TEST_F(VarlenValidate, InitialStateMustHaveNRows) {
  set_cu({0, 10, 64});  // N = 2, initial_state has N = 3 rows
  args.final_state = openkda::TensorRef{};
  EXPECT_TRUE(Invalid(check(), {"initial_state.shape [3, 2, 8, 8]", "[2, 2, 8, 8]"}));
}

TEST_F(VarlenValidate, EmptyAndSingleTokenSequencesAreValid) {
  set_cu({0, 0, 1, 1, 64});
  args.initial_state = openkda::TensorRef{};
  args.final_state = openkda::TensorRef{};
  EXPECT_TRUE(IsOk(check()));
}

// ---- chunk_kda backward
// ----------------------------------------------------------------------------

class ChunkBwdValidate : public ::testing::Test {
 protected:
  void SetUp() override {
    c.B = 1;
    c.T = 40;
    c.H = 1;
    c.HV = 2;
    c.K = 8;
    c.V = 4;
    c.gate = Gate::kLowerBound;
    c.beta = Beta::kLogits;
    c.h0 = true;
    in = make_inputs(c);
    d_o = HostTensor(DType::kF64, {c.B, c.T, c.HV, c.V});
    dht = HostTensor(DType::kF64, c.state_shape(c.N()));
    dq = HostTensor(DType::kF64, in.q.shape());
    dk = HostTensor(DType::kF64, in.k.shape());
    dv = HostTensor(DType::kF64, in.v.shape());
    dg = HostTensor(DType::kF64, in.g.shape());
    db = HostTensor(DType::kF64, in.beta.shape());
    dA = HostTensor(DType::kF64, in.A_log.shape());
    dbias = HostTensor(DType::kF64, in.dt_bias.shape());
    dh0 = HostTensor(DType::kF64, in.h0.shape());
    apply_options(c, Precision::kF64, Algorithm::kChunked, 0, args);
    fill_problem(c, in, args);
    args.d_o = d_o.ref();
    args.dht = dht.ref();
    args.dq = dq.ref();
    args.dk = dk.ref();
    args.dv = dv.ref();
    args.dg = dg.ref();
    args.dbeta = db.ref();
    args.dA_log = dA.ref();
    args.ddt_bias = dbias.ref();
    args.dh0 = dh0.ref();
    ASSERT_TRUE(IsOk(openkda::can_implement(args)));
  }
  openkda::Status check() const { return openkda::can_implement(args); }

  Config c;
  Inputs in;
  HostTensor d_o, dht, dq, dk, dv, dg, db, dA, dbias, dh0;
  openkda::ChunkBwdArgs args;
};

TEST_F(ChunkBwdValidate, OpNameAndProblemChecks) {
  args.chunk_size = 48;
  EXPECT_TRUE(Invalid(check(), {"chunk_kda_bwd: ", "chunk_size = 48"}));
}

TEST_F(ChunkBwdValidate, GradientShapes) {
  args.dq.shape[3] = 4;
  EXPECT_TRUE(Invalid(check(), {"dq.shape [1, 40, 1, 4]", "[1, 40, 1, 8]"}));
  args.dq = dq.ref();
  args.dbeta = openkda::TensorRef{};
  EXPECT_TRUE(Invalid(check(), {"dbeta is undefined", "[B, T, HV]"}));
  args.dbeta = db.ref();
  args.d_o = openkda::TensorRef{};
  EXPECT_TRUE(Invalid(check(), {"d_o is undefined"}));
  args.d_o = d_o.ref();
  HostTensor bad(DType::kF64, {1, 2, 4, 8});
  args.dht = bad.ref();
  EXPECT_TRUE(Invalid(check(), {"dht.shape [1, 2, 4, 8]", "[1, 2, 8, 4]"}));
}

TEST_F(ChunkBwdValidate, GradientsOfAbsentInputs) {
  args.initial_state = openkda::TensorRef{};
  EXPECT_TRUE(Invalid(check(), {"dh0 is defined but initial_state is undefined"}));
  args.initial_state = in.h0.ref();
  args.dt_bias = openkda::TensorRef{};
  EXPECT_TRUE(Invalid(check(), {"ddt_bias is defined but dt_bias is undefined"}));
  args.dt_bias = in.dt_bias.ref();
  args.A_log = openkda::TensorRef{};
  EXPECT_TRUE(Invalid(check(), {"dA_log is defined but A_log is undefined"}));
}

// ---- fused_recurrent_kda
// ---------------------------------------------------------------------------

class RecurrentValidate : public ::testing::Test {
 protected:
  void SetUp() override {
    c.B = 1;
    c.T = 5;
    c.H = 1;
    c.HV = 2;
    c.K = 8;
    c.V = 4;
    c.cu = {0, 1, 2, 3, 4, 5};
    c.gate = Gate::kSoftplus;
    in = make_inputs(c);
    in.A_log = HostTensor{};  // the recurrent op accepts the softplus gate without A_log
    pool = HostTensor(DType::kF32, {15, c.HV, c.K, c.V});
    pool.fill(0.0);
    idx = HostTensor(DType::kI32, {5});
    for (int i = 0; i < 5; ++i) idx.set(i, 3 * i);
    o = HostTensor(DType::kF64, {c.B, c.T, c.HV, c.V});
    apply_options(c, Precision::kF64, Algorithm::kChunked, 0, args);
    fill_inputs(in, args);
    args.initial_state = pool.ref();
    args.ssm_state_indices = idx.ref();
    args.inplace_final_state = true;
    args.o = o.ref();
    ASSERT_TRUE(IsOk(openkda::can_implement(args)));
  }
  openkda::Status check() const { return openkda::can_implement(args); }

  Config c;
  Inputs in;
  HostTensor pool, idx, o;
  openkda::RecurrentFwdArgs args;
};

TEST_F(RecurrentValidate, IndicesRank) {
  HostTensor three(DType::kI32, {5, 1, 1});
  args.ssm_state_indices = three.ref();
  EXPECT_TRUE(Invalid(check(), {"fused_recurrent_kda: ", "ssm_state_indices: rank 3"}));
}

TEST_F(RecurrentValidate, IndicesRows) {
  HostTensor four(DType::kI32, {4});
  args.ssm_state_indices = four.ref();
  EXPECT_TRUE(Invalid(check(), {"ssm_state_indices.shape[0] = 4", "N = 5"}));
}

TEST_F(RecurrentValidate, IndicesDtype) {
  HostTensor f(DType::kF32, {5});
  args.ssm_state_indices = f.ref();
  EXPECT_TRUE(Invalid(check(), {"ssm_state_indices.dtype f32", "i32, i64"}));
}

TEST_F(RecurrentValidate, SlotOutOfRange) {
  idx.set(1, 99);
  EXPECT_TRUE(Invalid(check(), {"ssm_state_indices[1, 0] = 99", "[0, 15)"}));
  idx.set(1, -1);
  EXPECT_TRUE(Invalid(check(), {"ssm_state_indices[1, 0] = -1"}));
}

TEST_F(RecurrentValidate, OneDimIndicesWithSeveralTokens) {
  HostTensor cu(DType::kI64, {6});
  const int64_t v[] = {0, 3, 3, 3, 4, 5};
  for (int i = 0; i < 6; ++i) cu.set(i, static_cast<double>(v[i]));
  args.cu_seqlens = cu.ref();
  EXPECT_TRUE(Invalid(
      check(), {"ssm_state_indices.shape [5]", "sequence 0 has 3 tokens", "max_tokens >= 3"}));
}

TEST_F(RecurrentValidate, NumAcceptedTokens) {
  HostTensor acc(DType::kI32, {5});
  acc.fill(1.0);
  args.num_accepted_tokens = acc.ref();
  EXPECT_TRUE(IsOk(check()));
  acc.set(2, 0);
  EXPECT_TRUE(Invalid(check(), {"num_accepted_tokens[2] = 0", "[1, 1]"}));
  acc.set(2, 1);
  args.ssm_state_indices = openkda::TensorRef{};
  args.inplace_final_state = false;
  args.initial_state = openkda::TensorRef{};
  EXPECT_TRUE(Invalid(check(), {"num_accepted_tokens", "without ssm_state_indices"}));
}

TEST_F(RecurrentValidate, NumAcceptedTokensCheckedBeforeItIsRead) {
  // check_state_indices reads num_accepted_tokens on the host: a wrong shape or dtype must be
  // reported first (an empty tensor used to be read past its end).
  HostTensor empty(DType::kI32, {0});
  args.num_accepted_tokens = empty.ref();
  EXPECT_TRUE(Invalid(check(), {"num_accepted_tokens.shape [0]", "[N]"}));
  HostTensor f(DType::kF32, {5});
  f.fill(1.0);
  args.num_accepted_tokens = f.ref();
  EXPECT_TRUE(Invalid(check(), {"num_accepted_tokens.dtype f32", "i32, i64"}));
}

TEST_F(RecurrentValidate, DeviceIndicesCoverEveryTokenWithoutCuSeqlens) {
  // A dense batch (no cu_seqlens) of T = 5 tokens with one slot column: rejected from the shape
  // alone when the indices are on the device (they are never read on the host). Validation runs
  // before any backend, so the tensors only need a CUDA device tag here.
  args.cu_seqlens = openkda::TensorRef{};
  for (openkda::TensorRef* t : {&args.q, &args.k, &args.v, &args.g, &args.beta, &args.o,
                                &args.initial_state, &args.ssm_state_indices})
    t->device = openkda::Device{openkda::DeviceType::kCUDA, 0};
  HostTensor one(DType::kI32, {1});
  args.ssm_state_indices = one.ref();
  args.ssm_state_indices.device = openkda::Device{openkda::DeviceType::kCUDA, 0};
  EXPECT_TRUE(Invalid(check(), {"ssm_state_indices.shape [1]", "T = 5 tokens", "max_tokens >= 5"}));
  HostTensor five(DType::kI32, {1, 5});  // one sequence, a column per token: past validation
  args.ssm_state_indices = five.ref();
  args.ssm_state_indices.device = openkda::Device{openkda::DeviceType::kCUDA, 0};
  // Past the core's validation: Ok, or kNotSupported from a backend (no CUDA in this build, or
  // the kernels' own limits), never kInvalidArgument.
  const openkda::Status s = check();
  EXPECT_NE(s.code(), openkda::StatusCode::kInvalidArgument) << s.message();
}

TEST_F(RecurrentValidate, InPlaceNeedsInitialState) {
  args.ssm_state_indices = openkda::TensorRef{};
  args.initial_state = openkda::TensorRef{};
  EXPECT_TRUE(Invalid(check(), {"initial_state is undefined", "inplace_final_state = true"}));
}

TEST_F(RecurrentValidate, HeadwiseBetaShape) {
  HostTensor hw(DType::kF64, {c.B, c.T, c.HV, c.V + 1});
  args.beta = hw.ref();
  EXPECT_TRUE(
      Invalid(check(), {"beta.shape [1, 5, 2, 5]", "headwise [B, T, HV, V]", "[1, 5, 2, 4]"}));
}

TEST_F(RecurrentValidate, PerTokenFinalStateShape) {
  args.inplace_final_state = false;
  HostTensor fs(DType::kF32,
                {c.N(), c.HV, c.K, c.V});  // per-token would be [B * T, ...] = [5, ...]
  args.final_state = fs.ref();
  EXPECT_TRUE(IsOk(check()));  // N == B * T here
  HostTensor bad(DType::kF32, {4, c.HV, c.K, c.V});
  args.final_state = bad.ref();
  EXPECT_TRUE(Invalid(check(), {"final_state.shape [4, 2, 8, 4]", "[5, 2, 8, 4]"}));
}

TEST_F(RecurrentValidate, AllowNegEigvalNeedsBetaSigmoid) {
  args.allow_neg_eigval = true;
  args.use_beta_sigmoid_in_kernel = false;
  EXPECT_TRUE(Invalid(
      check(), {"fused_recurrent_kda: ", "allow_neg_eigval", "use_beta_sigmoid_in_kernel = true"}));
}

TEST_F(RecurrentValidate, InitialStateWithoutPoolHasNRows) {
  args.ssm_state_indices = openkda::TensorRef{};
  EXPECT_TRUE(Invalid(check(), {"initial_state.shape [15, 2, 8, 4]", "[5, 2, 8, 4]"}));
}

// ---- fused_kda_gate
// ----------------------------------------------------------------------------------

TEST(GateValidate, Messages) {
  HostTensor g(DType::kF32, {3, 4, 8}), y(DType::kF32, {3, 4, 8}), A(DType::kF32, {4}),
      b(DType::kF32, {32}), dy(DType::kF32, {3, 4, 8}), dg(DType::kF32, {3, 4, 8}),
      dA(DType::kF32, {4}), db(DType::kF32, {32});
  openkda::GateFwdArgs f;
  f.g = g.ref();
  f.y = y.ref();
  f.dt_bias = b.ref();
  EXPECT_TRUE(Invalid(openkda::can_implement(f),
                      {"fused_kda_gate: ", "A_log is undefined", "lower_bound is not set"}));
  f.lower_bound = -5.0;
  EXPECT_TRUE(IsOk(openkda::can_implement(f)));
  f.A_log = A.ref();
  f.lower_bound.reset();
  EXPECT_TRUE(IsOk(openkda::can_implement(f)));
  f.y.shape[2] = 4;
  EXPECT_TRUE(Invalid(openkda::can_implement(f), {"y.shape [3, 4, 4]", "[3, 4, 8]"}));
  f.y = y.ref();
  f.g.ndim = 1;
  EXPECT_TRUE(Invalid(openkda::can_implement(f), {"g: rank 1", "[..., HV, K]"}));
  f.g = g.ref();
  HostTensor b2(DType::kF32, {31});
  f.dt_bias = b2.ref();
  EXPECT_TRUE(Invalid(openkda::can_implement(f), {"dt_bias.shape [31]", "[HV * K] = [32]"}));
  f.dt_bias = b.ref();
  f.lower_bound = std::nan("");
  EXPECT_TRUE(Invalid(openkda::can_implement(f), {"lower_bound = ", "finite"}));

  openkda::GateBwdArgs bw;
  bw.g = g.ref();
  bw.dy = dy.ref();
  bw.dg = dg.ref();
  bw.lower_bound = -5.0;
  bw.dA_log = dA.ref();
  EXPECT_TRUE(Invalid(openkda::can_implement(bw),
                      {"fused_kda_gate_bwd: ", "dA_log is defined but A_log is undefined"}));
  bw.dA_log = openkda::TensorRef{};
  EXPECT_TRUE(IsOk(openkda::can_implement(bw)));
  bw.dg.shape[0] = 2;
  EXPECT_TRUE(Invalid(openkda::can_implement(bw), {"dg.shape [2, 4, 8]", "[3, 4, 8]"}));
}

// Zero-sized dimensions: a zero leading dimension runs as a no-op; HV = 0 or K = 0 is rejected with
// kInvalidArgument. Never a crash: run in a child process so that a crash fails only this test.
void gate_call_exits_cleanly(std::vector<int64_t> shape, bool expect_ok) {
  HostTensor g(DType::kF32, shape), y(DType::kF32, shape), dy(DType::kF32, shape),
      dg(DType::kF32, shape);
  const auto as_expected = [expect_ok](const openkda::Status& s) {
    return expect_ok ? s.ok() : s.code() == openkda::StatusCode::kInvalidArgument;
  };
  openkda::GateFwdArgs f;
  f.g = g.ref();
  f.y = y.ref();
  f.lower_bound = -5.0;
  if (!as_expected(openkda::run(f, openkda::Workspace{}))) std::exit(2);
  openkda::GateBwdArgs b;
  b.g = g.ref();
  b.dy = dy.ref();
  b.dg = dg.ref();
  b.lower_bound = -5.0;
  if (!as_expected(openkda::run(b, openkda::Workspace{}))) std::exit(3);
  std::exit(0);
}

TEST(EmptyProblems, GateZeroSizedDimsDoNotCrash) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (auto [shape, ok] : {std::pair{std::vector<int64_t>{0, 4, 8}, true},
                           std::pair{std::vector<int64_t>{2, 0, 8}, false},
                           std::pair{std::vector<int64_t>{2, 4, 0}, false}}) {
    EXPECT_EXIT(gate_call_exits_cleanly(shape, ok), ::testing::ExitedWithCode(0), "")
        << "fused_kda_gate with g.shape [" << shape[0] << ", " << shape[1] << ", " << shape[2]
        << "]; expected " << (ok ? "a no-op" : "kInvalidArgument");
  }
}

TEST(EmptyProblems, ZeroBatchRunsAsNoOp) {
  Config c;
  c.B = 0;
  c.T = 5;
  c.H = 1;
  c.HV = 2;
  c.K = 4;
  c.V = 4;
  c.h0 = true;
  Inputs in = make_inputs(c);
  FwdOut out = run_chunk_fwd(c, in, Precision::kF64, Algorithm::kChunked);
  EXPECT_TRUE(IsOk(out.status));
  HostTensor d_o(DType::kF64, {0, 5, 2, 4}), dht;
  BwdOut b = run_chunk_bwd(c, in, d_o, dht, Precision::kF64, Algorithm::kChunked);
  EXPECT_TRUE(IsOk(b.status));
}

// ---- workspace
// -------------------------------------------------------------------------------------

TEST_F(ChunkValidate, WorkspaceSizedAndTooSmallFailsCleanly) {
  const size_t need = openkda::workspace_bytes(args);
  EXPECT_GT(need, 0u) << "the chunked CPU path needs scratch";
  out.o.fill_nan();
  HostWorkspace ws(need);
  const openkda::Status s = openkda::run(args, ws.get(need - 1));
  EXPECT_TRUE(Invalid(s, {"chunk_kda: ", "workspace", std::to_string(need - 1),
                          "at least " + std::to_string(need)}));
  EXPECT_FALSE(AllFinite("o", out.o.to_double())) << "o was written by a failing run";
  const openkda::Status z = openkda::run(args, openkda::Workspace{});
  EXPECT_TRUE(Invalid(z, {"workspace"}));
  // Misaligned workspace.
  HostWorkspace big(need + 64);
  openkda::Workspace mis = big.get(need + 8);
  mis.data = static_cast<char*>(mis.data) + 8;
  mis.bytes = need;
  EXPECT_TRUE(Invalid(openkda::run(args, mis), {"workspace", "16-byte"}));
  // Invalid args size to zero.
  openkda::ChunkFwdArgs bad = args;
  bad.chunk_size = 16;
  EXPECT_EQ(openkda::workspace_bytes(bad), 0u);
  // The reference algorithm sizes its own workspace.
  args.algorithm = Algorithm::kRecurrentReference;
  const size_t need_ref = openkda::workspace_bytes(args);
  HostWorkspace wr(need_ref);
  EXPECT_TRUE(IsOk(openkda::run(args, wr.get())));
  EXPECT_TRUE(AllFinite("o", out.o.to_double()));
}

TEST_F(ChunkBwdValidate, WorkspaceSizedAndTooSmallFailsCleanly) {
  const size_t need = openkda::workspace_bytes(args);
  EXPECT_GT(need, 0u);
  dq.fill_nan();
  HostWorkspace ws(need);
  EXPECT_TRUE(Invalid(openkda::run(args, ws.get(need / 2)),
                      {"chunk_kda_bwd: ", "workspace", "at least " + std::to_string(need)}));
  EXPECT_FALSE(AllFinite("dq", dq.to_double())) << "dq was written by a failing run";
  EXPECT_TRUE(IsOk(openkda::run(args, ws.get())));
  EXPECT_TRUE(AllFinite("dq", dq.to_double()));
}

TEST_F(ChunkValidate, RunRevalidates) {
  args.chunk_size = 16;
  HostWorkspace ws(1 << 20);
  EXPECT_TRUE(Invalid(openkda::run(args, ws.get()), {"chunk_size = 16"}));
}

TEST_F(RecurrentValidate, RunRevalidates) {
  idx.set(0, 1000);
  EXPECT_TRUE(
      Invalid(openkda::run(args, openkda::Workspace{}), {"ssm_state_indices[0, 0] = 1000"}));
}

}  // namespace
}  // namespace kdatest
