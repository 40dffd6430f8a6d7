// chunk_kda forward: the chunked CPU path (double and float) against the per-token recurrent
// reference, the reference against the test's own per-token loop, intermediate states h, state
// carry, varlen vs separate sequences, extreme decays, low-precision storage, determinism.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>
#include <utility>

#include "grid.h"
#include "kda_case.h"
#include "test_util.h"

namespace kdatest {
namespace {

const std::vector<int64_t> kGridTs = {1, 15, 63, 64, 65, 200};

// Checks the three outputs of a chunk forward against vectors of a reference.
void expect_fwd_close(const std::string& what, const FwdOut& got, const std::vector<double>& o,
                      const std::vector<double>& fs, const std::vector<double>& h, double tol) {
  EXPECT_TRUE(Close(what + " o", o, got.o.to_double(), tol));
  if (got.final_state.defined()) {
    EXPECT_TRUE(Close(what + " final_state", fs, got.final_state.to_double(), tol));
  }
  if (got.h.defined()) {
    EXPECT_TRUE(Close(what + " h", h, got.h.to_double(), tol));
  }
}

// ---- the grid: chunked (f64) == reference == the test's own loop -------------------------------

class ChunkFwdF64 : public ::testing::TestWithParam<Config> {};

TEST_P(ChunkFwdF64, ChunkedEqualsRecurrentReference) {
  const Config c = GetParam();
  Inputs in = make_inputs(c);
  const NaiveOut naive = naive_forward(c, in);
  FwdOut ref = run_chunk_fwd(c, in, Precision::kF64, Algorithm::kRecurrentReference);
  ASSERT_TRUE(IsOk(ref.status)) << "reference";
  FwdOut chk = run_chunk_fwd(c, in, Precision::kF64, Algorithm::kChunked);
  ASSERT_TRUE(IsOk(chk.status)) << "chunked";
  // The core's reference against the loop written here from the spec.
  expect_fwd_close("reference vs test loop:", ref, naive.o, naive.final, naive.h, 1e-12);
  // The chunked path against the core's reference.
  expect_fwd_close("chunked vs reference:", chk, ref.o.to_double(), ref.final_state.to_double(),
                   ref.h.to_double(), 1e-10);
}

INSTANTIATE_TEST_SUITE_P(Grid, ChunkFwdF64,
                         ::testing::ValuesIn(reference_grid(DType::kF64, kGridTs)), case_name);
INSTANTIATE_TEST_SUITE_P(LargeDims, ChunkFwdF64, ::testing::ValuesIn(large_dim_grid(DType::kF64)),
                         case_name);

// Every value of every axis of the grid meets every gate mode and every beta mode.
TEST(GridCoverage, EveryAxisValueMeetsEveryGateAndBetaMode) {
  const auto grid = reference_grid(DType::kF64, kGridTs);
  std::map<std::string, std::set<std::string>> seen;
  for (const Config& c : grid) {
    const std::string axes[] = {
        std::string("l2=") + (c.l2norm ? "1" : "0"),
        std::string("varlen=") + (c.varlen() ? openkda::dtype_name(c.cu_dtype) : "dense"),
        "KV=" + std::to_string(c.K) + "x" + std::to_string(c.V),
        "H=" + std::to_string(c.H),
        "G=" + std::to_string(c.HV / c.H),
        "chunk=" + std::to_string(c.chunk),
        std::string("h0=") + (c.h0 ? "1" : "0"),
        std::string("vfirst=") + (c.v_first ? "1" : "0"),
        std::string("scale=") + (c.scale ? "1" : "0"),
        "T=" + std::to_string(c.T)};
    for (const std::string& a : axes) {
      seen[std::string("gate ") + gate_name(c.gate)].insert(a);
      seen[std::string("beta ") + beta_name(c.beta)].insert(a);
    }
  }
  // 2 + 3 + 5 + 2 + 3 + 2 + 2 + 2 + 2 + 6 axis values.
  for (const auto& [mode, values] : seen) EXPECT_EQ(values.size(), 29u) << mode;
  EXPECT_EQ(seen.size(), 10u);
}

// ---- the grid in float: chunked (Precision::kF32, f32 tensors) vs the reference ----------------

class ChunkFwdF32 : public ::testing::TestWithParam<Config> {};

TEST_P(ChunkFwdF32, ChunkedEqualsRecurrentReference) {
  const Config c = GetParam();
  Inputs in = make_inputs(c);
  const NaiveOut naive = naive_forward(c, in);  // double, on the f32 inputs
  FwdOut ref = run_chunk_fwd(c, in, Precision::kF32, Algorithm::kRecurrentReference);
  ASSERT_TRUE(IsOk(ref.status)) << "reference";
  FwdOut chk = run_chunk_fwd(c, in, Precision::kF32, Algorithm::kChunked);
  ASSERT_TRUE(IsOk(chk.status)) << "chunked";
  // The reference runs in double and rounds its outputs to f32 once.
  expect_fwd_close("reference vs test loop:", ref, naive.o, naive.final, naive.h, 1e-7);
  expect_fwd_close("chunked f32 vs reference:", chk, naive.o, naive.final, naive.h, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Grid, ChunkFwdF32,
                         ::testing::ValuesIn(reference_grid(DType::kF32, kGridTs)), case_name);
INSTANTIATE_TEST_SUITE_P(LargeDims, ChunkFwdF32, ::testing::ValuesIn(large_dim_grid(DType::kF32)),
                         case_name);

// ---- intermediate states: h[:, c] is the state after token c * BT - 1 (or h0 for c = 0) --------

TEST(ChunkFwd, IntermediateStatesAreStatesAtChunkStarts) {
  for (int chunk : {32, 64}) {
    for (bool v_first : {false, true}) {
      Config c;
      c.B = 2;
      c.T = 150;
      c.H = 1;
      c.HV = 2;
      c.K = 8;
      c.V = 16;
      c.chunk = chunk;
      c.v_first = v_first;
      c.h0 = true;
      c.gate = Gate::kSoftplusBias;
      c.l2norm = true;
      Inputs in = make_inputs(c);
      const NaiveOut naive = naive_forward(c, in);
      const auto h0 = in.h0.to_double();
      const int64_t KV = c.K * c.V, NT = c.NT_b();
      std::vector<double> expect(static_cast<size_t>(c.B * NT * c.HV * KV));
      for (int64_t b = 0; b < c.B; ++b)
        for (int64_t ci = 0; ci < NT; ++ci)
          for (int64_t hv = 0; hv < c.HV; ++hv)
            for (int64_t x = 0; x < KV; ++x) {
              const size_t dst = static_cast<size_t>(((b * NT + ci) * c.HV + hv) * KV + x);
              expect[dst] = ci == 0 ? h0[static_cast<size_t>((b * c.HV + hv) * KV + x)]
                                    : naive.states[static_cast<size_t>(
                                          ((b * c.T + ci * chunk - 1) * c.HV + hv) * KV + x)];
            }
      for (Algorithm a : {Algorithm::kRecurrentReference, Algorithm::kChunked}) {
        FwdOut out = run_chunk_fwd(c, in, Precision::kF64, a);
        ASSERT_TRUE(IsOk(out.status));
        EXPECT_TRUE(Close("h (" + c.name() + ", algorithm " + std::to_string(int(a)) + ")", expect,
                          out.h.to_double(), 1e-10));
      }
    }
  }
}

// ---- state carry: T1 then T2 equals T1 + T2 in one pass -----------------------------------------

// Copies tokens [t0, t0 + len) of every batch row of `src` ([B, T, ...]) into a new tensor.
HostTensor slice_time(const HostTensor& src, int64_t t0, int64_t len) {
  if (!src.defined()) return HostTensor{};
  std::vector<int64_t> shape = src.shape();
  const int64_t B = shape[0], T = shape[1];
  int64_t inner = 1;
  for (size_t i = 2; i < shape.size(); ++i) inner *= shape[i];
  shape[1] = len;
  HostTensor dst(src.dtype(), shape);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < len; ++t)
      for (int64_t x = 0; x < inner; ++x)
        dst.set((b * len + t) * inner + x, src.get((b * T + t0 + t) * inner + x));
  return dst;
}

TEST(ChunkFwd, StateCarryEqualsOnePass) {
  struct Split {
    int64_t T1, T2;
  };
  uint64_t seed = 40;
  for (Split s : {Split{30, 50}, Split{64, 64}, Split{1, 70}, Split{65, 1}, Split{100, 37}}) {
    for (Precision p : {Precision::kF64, Precision::kF32}) {
      const DType dt = p == Precision::kF64 ? DType::kF64 : DType::kF32;
      Config c;
      c.B = 2;
      c.T = s.T1 + s.T2;
      c.H = 1;
      c.HV = 2;
      c.K = 16;
      c.V = 8;
      c.gate = (seed % 2) ? Gate::kLowerBound : Gate::kPre;
      c.beta = Beta::kLogits;
      c.l2norm = true;
      c.h0 = (seed % 3) != 0;
      c.v_first = (seed % 2) == 0;
      c.chunk = (seed % 4) < 2 ? 64 : 32;
      c.seed = seed++;
      c.set_all_dtypes(dt);
      Inputs in = make_inputs(c);
      FwdOut full = run_chunk_fwd(c, in, p, Algorithm::kChunked);
      ASSERT_TRUE(IsOk(full.status));

      Config c1 = c, c2 = c;
      c1.T = s.T1;
      c2.T = s.T2;
      c2.h0 = true;
      Inputs in1 = in, in2 = in;
      for (auto [dst1, dst2, src] :
           {std::tuple{&in1.q, &in2.q, &in.q}, std::tuple{&in1.k, &in2.k, &in.k},
            std::tuple{&in1.v, &in2.v, &in.v}, std::tuple{&in1.g, &in2.g, &in.g},
            std::tuple{&in1.beta, &in2.beta, &in.beta}}) {
        *dst1 = slice_time(*src, 0, s.T1);
        *dst2 = slice_time(*src, s.T1, s.T2);
      }
      FwdOut first = run_chunk_fwd(c1, in1, p, Algorithm::kChunked);
      ASSERT_TRUE(IsOk(first.status));
      in2.h0 = HostTensor(c.state_dtype, c.state_shape(c.N()));
      in2.h0.assign(first.final_state.to_double());
      c2.h0_dtype = c.state_dtype;
      FwdOut second = run_chunk_fwd(c2, in2, p, Algorithm::kChunked);
      ASSERT_TRUE(IsOk(second.status));

      // Stitch o of the two passes back together.
      HostTensor o = full.o;
      const int64_t inner = c.HV * c.V;
      for (int64_t b = 0; b < c.B; ++b)
        for (int64_t t = 0; t < c.T; ++t)
          for (int64_t x = 0; x < inner; ++x)
            o.set((b * c.T + t) * inner + x, t < s.T1
                                                 ? first.o.get((b * s.T1 + t) * inner + x)
                                                 : second.o.get((b * s.T2 + t - s.T1) * inner + x));
      const double tol = p == Precision::kF64 ? 1e-11 : 2e-6;
      const std::string tag = " T1=" + std::to_string(s.T1) + " T2=" + std::to_string(s.T2) +
                              (p == Precision::kF64 ? " f64 " : " f32 ") + c.name();
      EXPECT_TRUE(Close("o" + tag, full.o.to_double(), o.to_double(), tol));
      EXPECT_TRUE(Close("final_state" + tag, full.final_state.to_double(),
                        second.final_state.to_double(), tol));
    }
  }
}

// ---- varlen equals running each sequence alone --------------------------------------------------

TEST(ChunkFwd, VarlenEqualsSeparateSequences) {
  const std::vector<std::vector<int64_t>> cus = {
      {0, 0, 1, 1, 65, 130, 131},  // empty, 1-token, 64, 65, 1
      {0, 200},
      {0, 31, 32, 33, 97, 97},
      {0, 3, 70, 70, 140},
  };
  uint64_t seed = 70;
  for (const auto& cu : cus) {
    for (Precision p : {Precision::kF64, Precision::kF32}) {
      const DType dt = p == Precision::kF64 ? DType::kF64 : DType::kF32;
      Config c;
      c.B = 1;
      c.T = cu.back();
      c.H = 2;
      c.HV = 4;
      c.K = 8;
      c.V = 16;
      c.cu = cu;
      c.cu_dtype = (seed % 2) ? DType::kI32 : DType::kI64;
      c.gate = (seed % 3 == 0) ? Gate::kSafeInKernel : Gate::kSoftplusBias;
      c.lower_bound = -4.0;
      c.beta = Beta::kLogitsNeg;
      c.l2norm = true;
      c.h0 = true;
      c.v_first = seed % 2 == 0;
      c.chunk = (seed % 4) < 2 ? 32 : 64;
      c.seed = seed++;
      c.set_all_dtypes(dt);
      Inputs in = make_inputs(c);
      FwdOut packed = run_chunk_fwd(c, in, p, Algorithm::kChunked);
      ASSERT_TRUE(IsOk(packed.status)) << c.name();
      const double tol = p == Precision::kF64 ? 1e-13 : 1e-6;
      const int64_t KV = c.K * c.V;
      int64_t chunk_off = 0;
      for (size_t n = 0; n + 1 < cu.size(); ++n) {
        const int64_t bos = cu[n], len = cu[n + 1] - cu[n];
        Config s = c;
        s.cu.clear();
        s.B = 1;
        s.T = len;
        Inputs si = in;
        si.cu = HostTensor{};
        for (auto [dst, src] :
             {std::pair{&si.q, &in.q}, std::pair{&si.k, &in.k}, std::pair{&si.v, &in.v},
              std::pair{&si.g, &in.g}, std::pair{&si.beta, &in.beta}})
          *dst = slice_time(*src, bos, len);
        si.h0 = HostTensor(c.h0_dtype, c.state_shape(1));
        for (int64_t x = 0; x < c.HV * KV; ++x) si.h0.set(x, in.h0.get(n * c.HV * KV + x));
        const std::string tag =
            " seq " + std::to_string(n) + " (len " + std::to_string(len) + ") of " + c.name();
        std::vector<double> fs_packed(static_cast<size_t>(c.HV * KV));
        for (int64_t x = 0; x < c.HV * KV; ++x)
          fs_packed[static_cast<size_t>(x)] = packed.final_state.get(n * c.HV * KV + x);
        if (len == 0) {
          // An empty sequence passes its initial state through.
          EXPECT_TRUE(Close("final_state" + tag, si.h0.to_double(), fs_packed, 0.0));
          continue;
        }
        FwdOut alone = run_chunk_fwd(s, si, p, Algorithm::kChunked);
        ASSERT_TRUE(IsOk(alone.status)) << tag;
        std::vector<double> o_packed(static_cast<size_t>(len * c.HV * c.V));
        for (int64_t x = 0; x < len * c.HV * c.V; ++x)
          o_packed[static_cast<size_t>(x)] = packed.o.get(bos * c.HV * c.V + x);
        EXPECT_TRUE(Close("o" + tag, alone.o.to_double(), o_packed, tol));
        EXPECT_TRUE(Close("final_state" + tag, alone.final_state.to_double(), fs_packed, tol));
        const int64_t nt = s.NT_b();
        std::vector<double> h_packed(static_cast<size_t>(nt * c.HV * KV));
        for (int64_t x = 0; x < nt * c.HV * KV; ++x)
          h_packed[static_cast<size_t>(x)] = packed.h.get(chunk_off * c.HV * KV + x);
        EXPECT_TRUE(Close("h" + tag, alone.h.to_double(), h_packed, tol));
        chunk_off += nt;
      }
      EXPECT_EQ(chunk_off, c.NT_b());
    }
  }
}

// ---- extreme decays (g = -1000) stay finite on the non-safe path --------------------------------

TEST(ChunkFwd, ExtremeDecayIsFinite) {
  for (Precision p : {Precision::kF64, Precision::kF32}) {
    for (double prob : {0.1, 0.9}) {
      const DType dt = p == Precision::kF64 ? DType::kF64 : DType::kF32;
      Config c;
      c.B = 1;
      c.T = 150;
      c.H = 1;
      c.HV = 2;
      c.K = 16;
      c.V = 16;
      c.gate = Gate::kPre;
      c.extreme_gate_prob = prob;
      c.extreme_gate_value = -1000.0;
      c.h0 = true;
      c.l2norm = true;
      c.set_all_dtypes(dt);
      Inputs in = make_inputs(c);
      const NaiveOut naive = naive_forward(c, in);
      FwdOut out = run_chunk_fwd(c, in, p, Algorithm::kChunked);
      ASSERT_TRUE(IsOk(out.status));
      EXPECT_TRUE(AllFinite("o", out.o.to_double()));
      EXPECT_TRUE(AllFinite("final_state", out.final_state.to_double()));
      EXPECT_TRUE(AllFinite("h", out.h.to_double()));
      // NOTE: the chunk-local cumsum G reaches about -64 * 1000 / ln 2; an fp32 G (as in FLA)
      // would carry ~1e-3 relative error into exp2(G_i - G_j). The CPU backend keeps G in double
      // in every precision, so f32 holds the same tolerance as on every other case.
      const double tol = p == Precision::kF64 ? 1e-10 : 1e-5;
      expect_fwd_close("extreme decay p=" + std::to_string(prob) + ":", out, naive.o, naive.final,
                       naive.h, tol);
    }
  }
}

// Safe gate at the bound: constant g = -5 (pre-gated) with chunk 64 stays finite and accurate.
TEST(ChunkFwd, SafeGateAtLowerBoundIsFinite) {
  for (Precision p : {Precision::kF64, Precision::kF32}) {
    const DType dt = p == Precision::kF64 ? DType::kF64 : DType::kF32;
    Config c;
    c.B = 1;
    c.T = 128;
    c.H = 1;
    c.HV = 1;
    c.K = 16;
    c.V = 16;
    c.gate = Gate::kSafePre;
    c.l2norm = true;
    c.set_all_dtypes(dt);
    Inputs in = make_inputs(c);
    in.g.fill(-5.0);
    const NaiveOut naive = naive_forward(c, in);
    FwdOut out = run_chunk_fwd(c, in, p, Algorithm::kChunked);
    ASSERT_TRUE(IsOk(out.status));
    expect_fwd_close("safe gate g=-5:", out, naive.o, naive.final, naive.h,
                     p == Precision::kF64 ? 1e-10 : 1e-5);
  }
}

// ---- low-precision storage: bf16 / f16 inputs, states and h
// ---------------------------------------

TEST(ChunkFwd, LowPrecisionStorage) {
  struct Case {
    DType qk, v, g, beta, h0, h;
    double tol_o;  // rounding of o (and h) to the storage dtype
  };
  const Case cases[] = {
      {DType::kBF16, DType::kBF16, DType::kF32, DType::kBF16, DType::kBF16, DType::kBF16, 8e-3},
      {DType::kF16, DType::kF16, DType::kF16, DType::kF32, DType::kF32, DType::kF32, 1e-3},
      {DType::kF32, DType::kBF16, DType::kBF16, DType::kF16, DType::kF32, DType::kF16, 1e-3},
  };
  uint64_t seed = 90;
  for (const Case& k : cases) {
    for (Gate gate : {Gate::kPre, Gate::kLowerBound}) {
      Config c;
      c.B = 2;
      c.T = 77;
      c.H = 1;
      c.HV = 2;
      c.K = 16;
      c.V = 16;
      c.gate = gate;
      c.beta = gate == Gate::kPre ? Beta::kPost : Beta::kLogits;
      c.l2norm = true;
      c.h0 = true;
      c.qk_dtype = k.qk;
      c.v_dtype = k.v;
      c.g_dtype = k.g;
      c.beta_dtype = k.beta;
      c.param_dtype = DType::kF32;
      c.h0_dtype = k.h0;
      c.state_dtype = DType::kF32;
      c.seed = seed++;
      Inputs in = make_inputs(c);
      const NaiveOut naive = naive_forward(c, in);
      FwdOut out;
      out.o = HostTensor(c.qk_dtype, {c.B, c.T, c.HV, c.V});
      out.final_state = HostTensor(DType::kF32, c.state_shape(c.N()));
      out.h = HostTensor(k.h, c.h_shape());
      out.o.fill_nan();
      out.final_state.fill_nan();
      out.h.fill_nan();
      openkda::ChunkFwdArgs args =
          make_fwd_args(c, in, out, Precision::kF32, Algorithm::kChunked, 0);
      ASSERT_TRUE(IsOk(run_on_host(args))) << c.name();
      const std::string tag = std::string(" ") + openkda::dtype_name(k.qk) + "/" +
                              openkda::dtype_name(k.v) + " " + c.name();
      EXPECT_TRUE(Close("o" + tag, naive.o, out.o.to_double(), k.tol_o));
      EXPECT_TRUE(Close("final_state" + tag, naive.final, out.final_state.to_double(), 1e-5));
      EXPECT_TRUE(
          Close("h" + tag, naive.h, out.h.to_double(), k.h == DType::kF32 ? 1e-5 : k.tol_o));
    }
  }
}

// ---- optional outputs, A_log shape, explicit scale
// -------------------------------------------------

TEST(ChunkFwd, OptionalOutputsMayBeUndefined) {
  Config c;
  c.T = 70;
  c.gate = Gate::kSoftplusBias;
  c.h0 = true;
  Inputs in = make_inputs(c);
  FwdOut all = run_chunk_fwd(c, in, Precision::kF64, Algorithm::kChunked);
  ASSERT_TRUE(IsOk(all.status));
  FwdOut only_o = run_chunk_fwd(c, in, Precision::kF64, Algorithm::kChunked, 0, false, false);
  ASSERT_TRUE(IsOk(only_o.status));
  EXPECT_TRUE(Close("o without final_state/h", all.o.to_double(), only_o.o.to_double(), 1e-14));
  FwdOut only_h = run_chunk_fwd(c, in, Precision::kF64, Algorithm::kChunked, 0, false, true);
  ASSERT_TRUE(IsOk(only_h.status));
  EXPECT_TRUE(Close("h without final_state", all.h.to_double(), only_h.h.to_double(), 1e-14));
}

TEST(ChunkFwd, ALogAnyShapeWithHVElements) {
  Config c;
  c.T = 40;
  c.HV = 4;
  c.gate = Gate::kSoftplusBias;
  Config c4 = c;
  c4.a_log_4d = true;
  Inputs in = make_inputs(c), in4 = make_inputs(c4);
  FwdOut a = run_chunk_fwd(c, in, Precision::kF64, Algorithm::kChunked);
  FwdOut b = run_chunk_fwd(c4, in4, Precision::kF64, Algorithm::kChunked);
  ASSERT_TRUE(IsOk(a.status));
  ASSERT_TRUE(IsOk(b.status)) << "A_log [1, 1, HV, 1]";
  EXPECT_TRUE(Close("o with A_log [1,1,HV,1]", a.o.to_double(), b.o.to_double(), 0.0));
}

TEST(ChunkFwd, ExplicitScaleIsUsed) {
  Config c;
  c.T = 33;
  Inputs in = make_inputs(c);
  Config s = c;
  s.scale = 2.0 / std::sqrt(static_cast<double>(c.K));
  FwdOut a = run_chunk_fwd(c, in, Precision::kF64, Algorithm::kChunked);
  FwdOut b = run_chunk_fwd(s, in, Precision::kF64, Algorithm::kChunked);
  ASSERT_TRUE(IsOk(a.status));
  ASSERT_TRUE(IsOk(b.status));
  // o is linear in scale: o(2 * default) = 2 * o(default); the states do not depend on it.
  std::vector<double> twice = a.o.to_double();
  for (double& x : twice) x *= 2;
  EXPECT_TRUE(Close("o(2 scale)", twice, b.o.to_double(), 1e-13));
  EXPECT_TRUE(
      Close("final_state(2 scale)", a.final_state.to_double(), b.final_state.to_double(), 1e-14));
}

// ---- empty problems --------------------------------------------------------------------------

TEST(ChunkFwd, ZeroTokensPassInitialStateThrough) {
  for (bool varlen : {false, true}) {
    Config c;
    c.B = varlen ? 1 : 2;
    c.T = 0;
    c.H = 1;
    c.HV = 2;
    c.K = 8;
    c.V = 4;
    c.h0 = true;
    if (varlen) c.cu = {0, 0, 0, 0};
    Inputs in = make_inputs(c);
    for (Algorithm a : {Algorithm::kChunked, Algorithm::kRecurrentReference}) {
      FwdOut out = run_chunk_fwd(c, in, Precision::kF64, a);
      ASSERT_TRUE(IsOk(out.status)) << c.name();
      EXPECT_EQ(out.h.numel(), 0);
      EXPECT_TRUE(
          Close("final_state " + c.name(), in.h0.to_double(), out.final_state.to_double(), 0.0));
    }
  }
}

// ---- determinism
// ---------------------------------------------------------------------------------

TEST(ChunkFwd, DeterministicAcrossRunsAndThreadCounts) {
  Config c;
  c.B = 2;
  c.T = 150;
  c.H = 2;
  c.HV = 4;
  c.gate = Gate::kSoftplusBias;
  c.beta = Beta::kLogits;
  c.h0 = true;
  c.l2norm = true;
  for (Precision p : {Precision::kF64, Precision::kF32}) {
    const DType dt = p == Precision::kF64 ? DType::kF64 : DType::kF32;
    c.set_all_dtypes(dt);
    Inputs in = make_inputs(c);
    FwdOut a = run_chunk_fwd(c, in, p, Algorithm::kChunked, 1);
    FwdOut b = run_chunk_fwd(c, in, p, Algorithm::kChunked, 1);
    FwdOut d = run_chunk_fwd(c, in, p, Algorithm::kChunked, 3);
    ASSERT_TRUE(IsOk(a.status));
    ASSERT_TRUE(IsOk(b.status));
    ASSERT_TRUE(IsOk(d.status));
    EXPECT_EQ(a.o.raw(), b.o.raw()) << "two runs differ";
    EXPECT_EQ(a.final_state.raw(), b.final_state.raw()) << "two runs differ";
    EXPECT_EQ(a.o.raw(), d.o.raw()) << "1 vs 3 threads differ";
    EXPECT_EQ(a.final_state.raw(), d.final_state.raw()) << "1 vs 3 threads differ";
    EXPECT_EQ(a.h.raw(), d.h.raw()) << "1 vs 3 threads differ";
  }
}

}  // namespace
}  // namespace kdatest
