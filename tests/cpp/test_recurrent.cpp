// fused_recurrent_kda (RecurrentFwdArgs): against the chunk reference forward and the test's own
// per-token loop; state carry; the state pool of the serving entry point (1-D and 2-D
// ssm_state_indices, num_accepted_tokens, in place or per-token states, untouched slots
// bit-identical); headwise beta; the softplus gate without A_log.
#include <gtest/gtest.h>

#include <numeric>
#include <utility>

#include "grid.h"
#include "kda_case.h"
#include "test_util.h"

namespace kdatest {
namespace {

struct RecOut {
  HostTensor o, final_state;
  openkda::Status status;
  size_t workspace = 0;
};

openkda::RecurrentFwdArgs make_rec_args(const Config& c, Inputs& in, Precision p, int threads) {
  openkda::RecurrentFwdArgs args;
  apply_options(c, p, Algorithm::kChunked, threads, args);
  fill_inputs(in, args);
  return args;
}

RecOut run_recurrent(const Config& c, Inputs& in, Precision p, int threads = 0,
                     bool want_final = true) {
  RecOut out;
  out.o = HostTensor(c.v_dtype, {c.B, c.T, c.HV, c.V});
  out.o.fill_nan();
  if (want_final) {
    out.final_state = HostTensor(c.state_dtype, c.state_shape(c.N()));
    out.final_state.fill_nan();
  }
  openkda::RecurrentFwdArgs args = make_rec_args(c, in, p, threads);
  args.o = out.o.ref();
  args.final_state = out.final_state.ref();
  out.status = run_on_host(args, &out.workspace);
  return out;
}

// ---- against the chunk reference forward and the test loop ------------------------------------

class RecurrentF64 : public ::testing::TestWithParam<Config> {};

TEST_P(RecurrentF64, EqualsChunkReferenceForward) {
  const Config c = GetParam();
  Inputs in = make_inputs(c);
  FwdOut ref = run_chunk_fwd(c, in, Precision::kF64, Algorithm::kRecurrentReference);
  ASSERT_TRUE(IsOk(ref.status));
  RecOut rec = run_recurrent(c, in, Precision::kF64);
  ASSERT_TRUE(IsOk(rec.status));
  EXPECT_TRUE(Close("o", ref.o.to_double(), rec.o.to_double(), 1e-12));
  EXPECT_TRUE(
      Close("final_state", ref.final_state.to_double(), rec.final_state.to_double(), 1e-12));
}

INSTANTIATE_TEST_SUITE_P(Grid, RecurrentF64,
                         ::testing::ValuesIn(reference_grid(DType::kF64, {1, 15, 65})), case_name);

class RecurrentF32 : public ::testing::TestWithParam<Config> {};

TEST_P(RecurrentF32, EqualsTestLoop) {
  const Config c = GetParam();
  Inputs in = make_inputs(c);
  const NaiveOut naive = naive_forward(c, in);
  RecOut rec = run_recurrent(c, in, Precision::kF32);
  ASSERT_TRUE(IsOk(rec.status));
  EXPECT_TRUE(Close("o", naive.o, rec.o.to_double(), 1e-5));
  EXPECT_TRUE(Close("final_state", naive.final, rec.final_state.to_double(), 1e-5));
}

INSTANTIATE_TEST_SUITE_P(Grid, RecurrentF32,
                         ::testing::ValuesIn(reference_grid(DType::kF32, {15, 64})), case_name);

// The recurrent op accepts the softplus gate without A_log and then uses exp(A_log) = e (FLA).
TEST(Recurrent, SoftplusGateWithoutALogUsesE) {
  for (Gate gate : {Gate::kSoftplus, Gate::kSoftplusBias}) {
    Config c;
    c.T = 30;
    c.gate = gate;
    c.h0 = true;
    Inputs in = make_inputs(c);
    in.A_log = HostTensor{};
    const NaiveOut naive = naive_forward(c, in);  // A_log null -> factor e
    RecOut rec = run_recurrent(c, in, Precision::kF64);
    ASSERT_TRUE(IsOk(rec.status));
    EXPECT_TRUE(Close("o", naive.o, rec.o.to_double(), 1e-12));
    EXPECT_TRUE(Close("final_state", naive.final, rec.final_state.to_double(), 1e-12));
  }
}

TEST(Recurrent, StateCarryEqualsOnePass) {
  for (int64_t T1 : {1, 7, 40}) {
    Config c;
    c.B = 2;
    c.T = T1 + 23;
    c.H = 1;
    c.HV = 2;
    c.gate = Gate::kLowerBound;
    c.beta = Beta::kLogitsNeg;
    c.l2norm = true;
    c.h0 = true;
    c.v_first = T1 == 7;
    Inputs in = make_inputs(c);
    RecOut full = run_recurrent(c, in, Precision::kF64);
    ASSERT_TRUE(IsOk(full.status));
    // First part: the first T1 tokens; second part: the rest from the first part's final state.
    auto part = [&](int64_t t0, int64_t len, const HostTensor& h0) {
      Config s = c;
      s.T = len;
      Inputs si = in;
      for (auto [dst, src] :
           {std::pair{&si.q, &in.q}, std::pair{&si.k, &in.k}, std::pair{&si.v, &in.v},
            std::pair{&si.g, &in.g}, std::pair{&si.beta, &in.beta}}) {
        std::vector<int64_t> shape = src->shape();
        const int64_t inner = src->numel() / (shape[0] * shape[1]);
        shape[1] = len;
        HostTensor t(src->dtype(), shape);
        for (int64_t b = 0; b < c.B; ++b)
          for (int64_t x = 0; x < len * inner; ++x)
            t.set(b * len * inner + x, src->get((b * c.T + t0) * inner + x));
        *dst = t;
      }
      si.h0 = h0;
      return std::make_pair(s, si);
    };
    auto [c1, in1] = part(0, T1, in.h0);
    RecOut r1 = run_recurrent(c1, in1, Precision::kF64);
    ASSERT_TRUE(IsOk(r1.status));
    auto [c2, in2] = part(T1, c.T - T1, r1.final_state);
    RecOut r2 = run_recurrent(c2, in2, Precision::kF64);
    ASSERT_TRUE(IsOk(r2.status));
    EXPECT_TRUE(Close("final_state T1=" + std::to_string(T1), full.final_state.to_double(),
                      r2.final_state.to_double(), 1e-13));
    const int64_t inner = c.HV * c.V;
    std::vector<double> stitched(static_cast<size_t>(c.B * c.T * inner));
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t t = 0; t < c.T; ++t)
        for (int64_t x = 0; x < inner; ++x)
          stitched[static_cast<size_t>((b * c.T + t) * inner + x)] =
              t < T1 ? r1.o.get((b * T1 + t) * inner + x)
                     : r2.o.get((b * (c.T - T1) + t - T1) * inner + x);
    EXPECT_TRUE(Close("o T1=" + std::to_string(T1), full.o.to_double(), stitched, 1e-13));
  }
}

// Decoding token by token (T = 1 per call, state passed on) equals one recurrent call.
TEST(Recurrent, DecodeStepsEqualOneCall) {
  Config c;
  c.B = 2;
  c.T = 9;
  c.H = 2;
  c.HV = 4;
  c.K = 8;
  c.V = 8;
  c.gate = Gate::kSoftplusBias;
  c.beta = Beta::kLogits;
  c.l2norm = true;
  c.h0 = true;
  Inputs in = make_inputs(c);
  RecOut full = run_recurrent(c, in, Precision::kF64);
  ASSERT_TRUE(IsOk(full.status));
  HostTensor state = in.h0;
  for (int64_t t = 0; t < c.T; ++t) {
    Config s = c;
    s.T = 1;
    Inputs si = in;
    for (auto [dst, src] :
         {std::pair{&si.q, &in.q}, std::pair{&si.k, &in.k}, std::pair{&si.v, &in.v},
          std::pair{&si.g, &in.g}, std::pair{&si.beta, &in.beta}}) {
      std::vector<int64_t> shape = src->shape();
      const int64_t inner = src->numel() / (shape[0] * shape[1]);
      shape[1] = 1;
      HostTensor x(src->dtype(), shape);
      for (int64_t b = 0; b < c.B; ++b)
        for (int64_t j = 0; j < inner; ++j)
          x.set(b * inner + j, src->get((b * c.T + t) * inner + j));
      *dst = x;
    }
    si.h0 = state;
    RecOut step = run_recurrent(s, si, Precision::kF64);
    ASSERT_TRUE(IsOk(step.status));
    const int64_t inner = c.HV * c.V;
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t j = 0; j < inner; ++j)
        EXPECT_NEAR(step.o.get(b * inner + j), full.o.get((b * c.T + t) * inner + j), 1e-13)
            << "token " << t;
    state = step.final_state;
  }
  EXPECT_TRUE(Close("final_state", full.final_state.to_double(), state.to_double(), 1e-13));
}

// inplace_final_state without a pool: the final state of sequence n overwrites initial_state[n].
TEST(Recurrent, InPlaceFinalStateWithoutPool) {
  for (bool varlen : {false, true}) {
    Config c;
    c.B = varlen ? 1 : 2;
    c.T = 21;
    c.H = 1;
    c.HV = 2;
    c.K = 8;
    c.V = 8;
    c.gate = Gate::kSoftplusBias;
    c.h0 = true;
    c.v_first = varlen;
    if (varlen) c.cu = {0, 5, 5, 21};
    Inputs in = make_inputs(c);
    const NaiveOut naive = naive_forward(c, in);
    openkda::RecurrentFwdArgs args = make_rec_args(c, in, Precision::kF64, 0);
    HostTensor o(c.v_dtype, {c.B, c.T, c.HV, c.V});
    o.fill_nan();
    args.o = o.ref();
    args.inplace_final_state = true;
    ASSERT_TRUE(IsOk(run_on_host(args)));
    EXPECT_TRUE(Close("o", naive.o, o.to_double(), 1e-12));
    EXPECT_TRUE(Close("initial_state after the call", naive.final, in.h0.to_double(), 1e-12));
  }
}

// ---- headwise beta [B, T, HV, V]
// -------------------------------------------------------------------

TEST(Recurrent, HeadwiseBeta) {
  uint64_t seed = 600;
  for (Beta beta : kAllBetas) {
    for (bool varlen : {false, true}) {
      for (Precision p : {Precision::kF64, Precision::kF32}) {
        const DType dt = p == Precision::kF64 ? DType::kF64 : DType::kF32;
        Config c;
        c.B = varlen ? 1 : 2;
        c.T = 37;
        c.H = 1;
        c.HV = 2;
        c.K = 8;
        c.V = 12;
        c.gate = Gate::kLowerBoundNoA;
        c.beta = beta;
        c.headwise_beta = true;
        c.l2norm = true;
        c.h0 = true;
        c.v_first = varlen;
        if (varlen) c.cu = {0, 10, 10, 11, 37};
        c.seed = seed++;
        c.set_all_dtypes(dt);
        Inputs in = make_inputs(c);
        const NaiveOut naive = naive_forward(c, in);
        RecOut rec = run_recurrent(c, in, p);
        ASSERT_TRUE(IsOk(rec.status)) << c.name();
        const double tol = p == Precision::kF64 ? 1e-12 : 1e-5;
        EXPECT_TRUE(Close("o " + c.name(), naive.o, rec.o.to_double(), tol));
        EXPECT_TRUE(
            Close("final_state " + c.name(), naive.final, rec.final_state.to_double(), tol));
      }
    }
  }
}

// A headwise beta whose V entries are all equal equals the scalar beta.
TEST(Recurrent, HeadwiseBetaConstantEqualsScalar) {
  Config c;
  c.T = 20;
  c.beta = Beta::kLogits;
  c.h0 = true;
  Inputs in = make_inputs(c);
  Inputs hw = in;
  hw.beta = HostTensor(c.beta_dtype, {c.B, c.T, c.HV, c.V});
  for (int64_t i = 0; i < in.beta.numel(); ++i)
    for (int64_t e = 0; e < c.V; ++e) hw.beta.set(i * c.V + e, in.beta.get(i));
  Config chw = c;
  chw.headwise_beta = true;
  RecOut a = run_recurrent(c, in, Precision::kF64);
  RecOut b = run_recurrent(chw, hw, Precision::kF64);
  ASSERT_TRUE(IsOk(a.status));
  ASSERT_TRUE(IsOk(b.status));
  EXPECT_TRUE(Close("o", a.o.to_double(), b.o.to_double(), 1e-15));
  EXPECT_TRUE(Close("final_state", a.final_state.to_double(), b.final_state.to_double(), 1e-15));
}

// ---- the state pool (ssm_state_indices)
// ----------------------------------------------------------

struct PoolCase {
  std::string name;
  Config c;  // its h0 field is ignored: the pool is the source
  int64_t slots = 0;
  std::vector<std::vector<int64_t>> idx;  // [N][M]; M == 1 and two_d false: 1-D indices
  bool two_d = false;
  std::vector<int64_t> accepted;  // num_accepted_tokens, empty: none
  DType idx_dtype = DType::kI32;
  DType pool_dtype = DType::kF32;
  bool inplace = true;
};

void run_pool_case(const PoolCase& pc) {
  SCOPED_TRACE(pc.name);
  const Config& c = pc.c;
  const int64_t N = c.N(), HV = c.HV, KV = c.K * c.V, slot_elems = HV * KV;
  const auto seqs = sequences(c);
  Inputs in = make_inputs(c);
  Rng rng(c.seed + 1234);

  // The pool: every slot NaN-poisoned, then the slots read as initial states filled.
  HostTensor pool(pc.pool_dtype, c.state_shape(pc.slots));
  pool.fill_nan();
  std::vector<int64_t> init_slot(static_cast<size_t>(N));
  for (int64_t n = 0; n < N; ++n) {
    const int64_t t0 = pc.accepted.empty() ? 0 : pc.accepted[static_cast<size_t>(n)] - 1;
    init_slot[static_cast<size_t>(n)] = pc.idx[static_cast<size_t>(n)][static_cast<size_t>(t0)];
    if (seqs[static_cast<size_t>(n)].len == 0) continue;  // never read
    for (int64_t x = 0; x < slot_elems; ++x)
      pool.set(init_slot[static_cast<size_t>(n)] * slot_elems + x, 0.5 * rng.normal());
  }
  const HostTensor pool_before = pool;

  // Indices and accepted-token counts.
  const int64_t M = static_cast<int64_t>(pc.idx[0].size());
  HostTensor idx = pc.two_d ? HostTensor(pc.idx_dtype, {N, M}) : HostTensor(pc.idx_dtype, {N});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t m = 0; m < (pc.two_d ? M : 1); ++m)
      idx.set(n * (pc.two_d ? M : 1) + m, pc.idx[static_cast<size_t>(n)][static_cast<size_t>(m)]);
  HostTensor accepted;
  if (!pc.accepted.empty()) {
    accepted = HostTensor(pc.idx_dtype, {N});
    for (int64_t n = 0; n < N; ++n) accepted.set(n, pc.accepted[static_cast<size_t>(n)]);
  }

  // Expected values from the test loop, started from the pool slots.
  std::vector<double> initial(static_cast<size_t>(N * slot_elems), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    if (seqs[static_cast<size_t>(n)].len == 0) continue;
    for (int64_t x = 0; x < slot_elems; ++x)
      initial[static_cast<size_t>(n * slot_elems + x)] =
          pool_before.get(init_slot[static_cast<size_t>(n)] * slot_elems + x);
  }
  const NaiveOut naive = naive_forward(c, in, &initial);

  openkda::RecurrentFwdArgs args =
      make_rec_args(c, in, c.state_dtype == DType::kF64 ? Precision::kF64 : Precision::kF32, 0);
  HostTensor o(c.v_dtype, {c.B, c.T, c.HV, c.V});
  o.fill_nan();
  HostTensor per_token;
  args.initial_state = pool.ref();
  args.ssm_state_indices = idx.ref();
  args.num_accepted_tokens = accepted.ref();
  args.inplace_final_state = pc.inplace;
  args.o = o.ref();
  // Not in place: the per-token states. In place: final_state is ignored (must stay untouched).
  per_token = HostTensor(c.state_dtype, c.state_shape(c.B * c.T));
  per_token.fill_nan();
  args.final_state = per_token.ref();
  ASSERT_TRUE(IsOk(run_on_host(args)));

  const bool f64 = c.state_dtype == DType::kF64 && pc.pool_dtype == DType::kF64;
  // Written slots are rounded to the pool's dtype; o is computed from the unrounded state.
  const double tol = pc.pool_dtype == DType::kBF16  ? 5e-3
                     : pc.pool_dtype == DType::kF16 ? 1e-3
                     : f64                          ? 1e-12
                                                    : 1e-5;
  EXPECT_TRUE(Close("o", naive.o, o.to_double(), f64 ? 1e-12 : 1e-5));

  // Slots written: in place, idx[n][t] for every token t of sequence n.
  std::vector<int64_t> written(static_cast<size_t>(pc.slots), -1);  // -> packed token row
  if (pc.inplace) {
    for (int64_t n = 0; n < N; ++n) {
      const SeqSpan sp = seqs[static_cast<size_t>(n)];
      for (int64_t t = 0; t < sp.len; ++t) {
        const int64_t slot =
            pc.two_d ? pc.idx[static_cast<size_t>(n)][static_cast<size_t>(t)]
                     : pc.idx[static_cast<size_t>(n)][0] + t;  // 1-D: only T = 1 is meaningful
        written[static_cast<size_t>(slot)] = sp.bos + t;
      }
    }
  }
  const auto before_raw = pool_before.raw(), after_raw = pool.raw();
  const size_t slot_bytes = static_cast<size_t>(slot_elems) * openkda::dtype_size(pc.pool_dtype);
  for (int64_t s = 0; s < pc.slots; ++s) {
    const int64_t row = written[static_cast<size_t>(s)];
    if (row < 0) {
      EXPECT_TRUE(std::equal(before_raw.begin() + s * slot_bytes,
                             before_raw.begin() + (s + 1) * slot_bytes,
                             after_raw.begin() + s * slot_bytes))
          << "untouched pool slot " << s << " changed";
      continue;
    }
    std::vector<double> got(static_cast<size_t>(slot_elems)), want(static_cast<size_t>(slot_elems));
    for (int64_t x = 0; x < slot_elems; ++x) {
      got[static_cast<size_t>(x)] = pool.get(s * slot_elems + x);
      want[static_cast<size_t>(x)] = naive.states[static_cast<size_t>(row * slot_elems + x)];
    }
    EXPECT_TRUE(Close("pool slot " + std::to_string(s) + " (token row " + std::to_string(row) + ")",
                      want, got, tol));
  }
  if (pc.inplace) {
    for (double x : per_token.to_double()) {
      if (!std::isnan(x)) {
        ADD_FAILURE() << "final_state was written although inplace_final_state is true";
        break;
      }
    }
  } else {
    EXPECT_EQ(before_raw, after_raw) << "the pool changed although inplace_final_state is false";
    // Per-token states: row bos + t holds the state after token t. Rows of tokens outside every
    // sequence (none here) would stay unwritten.
    EXPECT_TRUE(Close("per-token final_state", naive.states, per_token.to_double(), tol));
  }
}

PoolCase decode_case(bool varlen, DType idx_dtype, DType pool_dtype, bool v_first, uint64_t seed) {
  PoolCase pc;
  Config& c = pc.c;
  const int64_t N = 5;
  c.H = 2;
  c.HV = 4;
  c.K = 8;
  c.V = 16;
  c.gate = Gate::kSafeInKernel;
  c.lower_bound = -5.0;
  c.beta = Beta::kLogits;
  c.l2norm = true;
  c.v_first = v_first;
  c.seed = seed;
  if (varlen) {
    c.B = 1;
    c.T = N;
    c.cu.resize(N + 1);
    std::iota(c.cu.begin(), c.cu.end(), 0);
    c.cu_dtype = idx_dtype;
  } else {
    c.B = N;
    c.T = 1;
  }
  pc.slots = 3 * N;
  const int64_t perm[] = {7, 2, 13, 0, 9};
  for (int64_t n = 0; n < N; ++n) pc.idx.push_back({perm[n]});
  pc.idx_dtype = idx_dtype;
  pc.pool_dtype = pool_dtype;
  pc.name = std::string("decode ") + (varlen ? "varlen " : "dense ") +
            openkda::dtype_name(idx_dtype) + " pool " + openkda::dtype_name(pool_dtype) +
            (v_first ? " v_first" : "");
  return pc;
}

TEST(RecurrentPool, DecodeOneDimIndicesInPlace) {
  uint64_t seed = 700;
  for (bool varlen : {true, false})
    for (DType idx : {DType::kI32, DType::kI64})
      for (DType pool : {DType::kF32, DType::kBF16, DType::kF16})
        run_pool_case(decode_case(varlen, idx, pool, idx == DType::kI64, seed++));
}

TEST(RecurrentPool, DecodeOneDimIndicesF64) {
  PoolCase pc = decode_case(true, DType::kI64, DType::kF64, false, 710);
  pc.c.qk_dtype = pc.c.v_dtype = pc.c.g_dtype = pc.c.beta_dtype = pc.c.param_dtype =
      pc.c.state_dtype = DType::kF64;
  run_pool_case(pc);
}

// Speculative decoding: 2-D indices [N, max_tokens], num_accepted_tokens, varlen verify batch.
PoolCase spec_case(bool inplace, bool with_accepted, DType idx_dtype, bool v_first, uint64_t seed) {
  PoolCase pc;
  Config& c = pc.c;
  const std::vector<int64_t> lens = {3, 1, 4, 0, 2};
  const int64_t N = static_cast<int64_t>(lens.size()), M = 4;
  c.B = 1;
  c.cu = {0};
  for (int64_t l : lens) c.cu.push_back(c.cu.back() + l);
  c.T = c.cu.back();
  c.cu_dtype = idx_dtype;
  c.H = 1;
  c.HV = 2;
  c.K = 16;
  c.V = 8;
  c.gate = Gate::kSoftplusBias;
  c.beta = Beta::kLogitsNeg;
  c.l2norm = true;
  c.v_first = v_first;
  c.seed = seed;
  // Distinct slots for every (n, m), shuffled over a pool twice as large.
  pc.slots = 2 * N * M;
  std::vector<int64_t> all(static_cast<size_t>(pc.slots));
  std::iota(all.begin(), all.end(), 0);
  Rng rng(seed);
  for (size_t i = all.size() - 1; i > 0; --i)
    std::swap(all[i], all[static_cast<size_t>(rng.integer(0, static_cast<int64_t>(i)))]);
  for (int64_t n = 0; n < N; ++n) {
    std::vector<int64_t> row;
    for (int64_t m = 0; m < M; ++m) row.push_back(all[static_cast<size_t>(n * M + m)]);
    pc.idx.push_back(row);
  }
  pc.two_d = true;
  if (with_accepted) pc.accepted = {2, 1, 4, 3, 1};
  pc.idx_dtype = idx_dtype;
  pc.pool_dtype = DType::kF32;
  pc.inplace = inplace;
  pc.name = std::string("spec ") + (inplace ? "inplace " : "per-token ") +
            (with_accepted ? "accepted " : "") + openkda::dtype_name(idx_dtype) +
            (v_first ? " v_first" : "");
  return pc;
}

// Dense batch (no cu_seqlens) with 2-D indices: B sequences of T tokens each.
PoolCase dense_two_d_case(bool inplace, uint64_t seed) {
  PoolCase pc;
  Config& c = pc.c;
  c.B = 3;
  c.T = 3;
  c.H = 1;
  c.HV = 2;
  c.K = 8;
  c.V = 8;
  c.gate = Gate::kLowerBoundNoA;
  c.beta = Beta::kPost;
  c.seed = seed;
  pc.slots = 20;
  pc.idx = {{4, 11, 2, 19}, {0, 7, 15, 8}, {16, 3, 9, 12}};  // max_tokens 4 > T
  pc.two_d = true;
  pc.accepted = {1, 3, 2};
  pc.idx_dtype = DType::kI64;
  pc.pool_dtype = DType::kF64;
  pc.inplace = inplace;
  pc.name = std::string("dense 2-D ") + (inplace ? "inplace" : "per-token");
  return pc;
}

TEST(RecurrentPool, DenseBatchTwoDimIndices) {
  run_pool_case(dense_two_d_case(true, 750));
  run_pool_case(dense_two_d_case(false, 751));
}

TEST(RecurrentPool, TwoDimIndicesInPlace) {
  run_pool_case(spec_case(true, false, DType::kI32, false, 720));
  run_pool_case(spec_case(true, false, DType::kI64, true, 721));
}

TEST(RecurrentPool, NumAcceptedTokensSelectsInitialSlot) {
  run_pool_case(spec_case(true, true, DType::kI32, false, 730));
  run_pool_case(spec_case(true, true, DType::kI64, true, 731));
}

TEST(RecurrentPool, PerTokenStatesWhenNotInPlace) {
  run_pool_case(spec_case(false, false, DType::kI64, false, 740));
  run_pool_case(spec_case(false, true, DType::kI32, true, 741));
  PoolCase d = decode_case(false, DType::kI32, DType::kF32, false, 742);
  d.inplace = false;
  run_pool_case(d);
}

}  // namespace
}  // namespace kdatest
