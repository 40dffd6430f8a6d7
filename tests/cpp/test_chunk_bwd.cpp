// chunk_kda backward: central finite differences (double) of
//   L = sum(o * d_o) + sum(final_state * dht)
// computed with the chunked forward in f64, against the chunked backward and the reference
// backward; then the chunked backward against the reference backward on a larger grid.
#include <gtest/gtest.h>

#include <functional>

#include "grid.h"
#include "kda_case.h"
#include "test_util.h"

namespace kdatest {
namespace {

struct Cotangents {
  HostTensor d_o, dht;
};

Cotangents make_cotangents(const Config& c, bool with_dht, uint64_t seed) {
  Rng rng(seed * 31 + 5);
  Cotangents ct;
  ct.d_o = random_tensor(rng, c.state_dtype, {c.B, c.T, c.HV, c.V});
  if (with_dht) ct.dht = random_tensor(rng, c.state_dtype, c.state_shape(c.N()));
  return ct;
}

// L(inputs) with the chunked forward in double.
double loss(const Config& c, Inputs& in, const Cotangents& ct) {
  FwdOut out = run_chunk_fwd(c, in, Precision::kF64, Algorithm::kChunked, 1,
                             /*want_final=*/ct.dht.defined(), /*want_h=*/false);
  EXPECT_TRUE(IsOk(out.status));
  return loss_of(out.o.to_double(), ct.d_o.to_double(),
                 ct.dht.defined() ? out.final_state.to_double() : std::vector<double>{},
                 ct.dht.defined() ? ct.dht.to_double() : std::vector<double>{});
}

// Checks one gradient tensor `grad` of the input `x` by central differences: a few random
// directions (each checks the whole tensor at once) and single coordinates (all of them when the
// tensor is small).
void check_gradient(const std::string& what, const Config& c, Inputs& in, const Cotangents& ct,
                    HostTensor& x, const std::vector<double>& grad, Rng& rng) {
  ASSERT_EQ(static_cast<int64_t>(grad.size()), x.numel()) << what;
  ASSERT_TRUE(AllFinite(what, grad));
  const double eps = 1e-5;
  const std::vector<double> x0 = x.to_double();
  const double grad_rms = rms(grad);
  auto fd_along = [&](const std::vector<double>& u) {
    std::vector<double> xp(x0), xm(x0);
    for (size_t i = 0; i < x0.size(); ++i) {
      xp[i] += eps * u[i];
      xm[i] -= eps * u[i];
    }
    x.assign(xp);
    const double lp = loss(c, in, ct);
    x.assign(xm);
    const double lm = loss(c, in, ct);
    x.assign(x0);
    return (lp - lm) / (2 * eps);
  };
  // Directions.
  for (int r = 0; r < 3; ++r) {
    std::vector<double> u = rng.normals(x.numel());
    double analytic = 0, mag = 0;
    for (size_t i = 0; i < u.size(); ++i) {
      analytic += grad[i] * u[i];
      mag += std::fabs(grad[i] * u[i]);
    }
    const double fd = fd_along(u);
    EXPECT_LE(std::fabs(fd - analytic), 1e-6 * mag + 1e-8)
        << what << " direction " << r << ": finite difference " << fd << ", analytic " << analytic
        << " (" << c.name() << ")";
  }
  // Coordinates: the first, the last, and random ones (every one for small tensors).
  std::vector<int64_t> idx;
  if (x.numel() <= 32) {
    for (int64_t i = 0; i < x.numel(); ++i) idx.push_back(i);
  } else {
    idx = {0, x.numel() - 1};
    for (int i = 0; i < 6; ++i) idx.push_back(rng.integer(0, x.numel() - 1));
  }
  for (int64_t i : idx) {
    std::vector<double> u(x0.size(), 0.0);
    u[static_cast<size_t>(i)] = 1.0;
    const double fd = fd_along(u);
    const double an = grad[static_cast<size_t>(i)];
    EXPECT_LE(std::fabs(fd - an), 1e-6 * (std::fabs(an) + grad_rms) + 1e-8)
        << what << "[" << i << "]: finite difference " << fd << ", analytic " << an << " ("
        << c.name() << ")";
  }
}

std::vector<Config> fd_grid() {
  std::vector<Config> grid;
  uint64_t i = 0;
  for (Gate gate : kAllGates) {
    for (Beta beta : kAllBetas) {
      Config c;
      c.H = 1;
      c.HV = 2;
      c.K = 8;
      c.V = (i % 3 == 0) ? 4 : 8;
      c.gate = gate;
      c.beta = beta;
      c.l2norm = (i % 2) == 0;
      c.chunk = ((i / 2) % 2) ? 32 : 64;
      c.h0 = (i % 5) != 4;
      c.v_first = (i % 4) == 1;
      if (gate == Gate::kSafeInKernel) c.lower_bound = -5.0;
      c.seed = 300 + i;
      if (i % 3 == 1) {  // varlen: an empty, a 1-token and a sequence with a partial tail chunk
        c.B = 1;
        c.T = 70;
        c.cu = {0, 1, 1, 38, 70};
        c.cu_dtype = (i % 2) ? DType::kI32 : DType::kI64;
      } else {
        c.B = 2;
        c.T = c.chunk == 64 ? 70 : 45;  // partial tail chunk
      }
      grid.push_back(c);
      ++i;
    }
  }
  // GVA 4 with two q/k heads, the scale option, and A_log / dt_bias passed to a pre-gated call
  // (their gradients must then be zero).
  Config a;
  a.B = 1;
  a.T = 20;
  a.H = 2;
  a.HV = 8;
  a.K = 4;
  a.V = 4;
  a.gate = Gate::kSoftplusBias;
  a.beta = Beta::kLogits;
  a.l2norm = true;
  a.h0 = true;
  a.scale = 0.8;
  a.chunk = 32;
  a.a_log_4d = true;  // A_log [1, 1, HV, 1]: dA_log comes back in that shape
  a.seed = 400;
  grid.push_back(a);
  Config p = a;
  p.gate = Gate::kPre;
  p.params_when_pregated = true;
  p.seed = 401;
  grid.push_back(p);
  return grid;
}

class ChunkBwdFiniteDifference : public ::testing::TestWithParam<Config> {};

TEST_P(ChunkBwdFiniteDifference, GradientsMatchCentralDifferences) {
  const Config c = GetParam();
  Inputs in = make_inputs(c);
  const bool with_dht = (c.seed % 3) != 2;
  Cotangents ct = make_cotangents(c, with_dht, c.seed);
  HostTensor d_o = ct.d_o, dht = ct.dht;
  BwdOut chk = run_chunk_bwd(c, in, d_o, dht, Precision::kF64, Algorithm::kChunked, 1);
  ASSERT_TRUE(IsOk(chk.status)) << "chunked backward";
  BwdOut ref = run_chunk_bwd(c, in, d_o, dht, Precision::kF64, Algorithm::kRecurrentReference, 1);
  ASSERT_TRUE(IsOk(ref.status)) << "reference backward";

  Rng rng(c.seed + 99);
  struct Item {
    const char* name;
    HostTensor* x;
    HostTensor* g_chk;
    HostTensor* g_ref;
  };
  std::vector<Item> items = {{"dq", &in.q, &chk.dq, &ref.dq},
                             {"dk", &in.k, &chk.dk, &ref.dk},
                             {"dv", &in.v, &chk.dv, &ref.dv},
                             {"dg", &in.g, &chk.dg, &ref.dg},
                             {"dbeta", &in.beta, &chk.dbeta, &ref.dbeta}};
  if (in.A_log.defined()) items.push_back({"dA_log", &in.A_log, &chk.dA_log, &ref.dA_log});
  if (in.dt_bias.defined())
    items.push_back({"ddt_bias", &in.dt_bias, &chk.ddt_bias, &ref.ddt_bias});
  if (in.h0.defined()) items.push_back({"dh0", &in.h0, &chk.dh0, &ref.dh0});
  for (const Item& it : items) {
    ASSERT_TRUE(it.g_chk->defined()) << it.name;
    check_gradient(std::string("chunked ") + it.name, c, in, ct, *it.x, it.g_chk->to_double(), rng);
    EXPECT_TRUE(Close(std::string("reference vs chunked ") + it.name, it.g_chk->to_double(),
                      it.g_ref->to_double(), 1e-10, 1e-13));
  }
  if (c.params_when_pregated) {
    EXPECT_EQ(max_abs(chk.dA_log.to_double()), 0.0) << "dA_log of a pre-gated call";
    EXPECT_EQ(max_abs(chk.ddt_bias.to_double()), 0.0) << "ddt_bias of a pre-gated call";
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, ChunkBwdFiniteDifference, ::testing::ValuesIn(fd_grid()), case_name);

// ---- chunked backward == reference backward (f64), and the f32 chunked backward ----------------

void compare_grads(const std::string& tag, const BwdOut& ref, const BwdOut& got, double tol,
                   double tol_params) {
  auto cmp = [&](const char* name, const HostTensor& r, const HostTensor& g, double t) {
    ASSERT_EQ(r.defined(), g.defined()) << name;
    if (!r.defined()) return;
    EXPECT_TRUE(AllFinite(tag + name, g.to_double()));
    EXPECT_TRUE(Close(tag + name, r.to_double(), g.to_double(), t, 1e-13));
  };
  cmp("dq", ref.dq, got.dq, tol);
  cmp("dk", ref.dk, got.dk, tol);
  cmp("dv", ref.dv, got.dv, tol);
  cmp("dg", ref.dg, got.dg, tol);
  cmp("dbeta", ref.dbeta, got.dbeta, tol);
  cmp("dA_log", ref.dA_log, got.dA_log, tol_params);
  cmp("ddt_bias", ref.ddt_bias, got.ddt_bias, tol_params);
  cmp("dh0", ref.dh0, got.dh0, tol);
}

// The chunked backward against the per-token reference backward, both in precision p, on the
// grid case's inputs and cotangents (dht for 3 of 4 seeds).
void expect_chunked_bwd_matches_reference(const Config& c, Precision p, const std::string& tag,
                                          double tol, double tol_params) {
  Inputs in = make_inputs(c);
  Cotangents ct = make_cotangents(c, (c.seed % 4) != 3, c.seed);
  BwdOut ref = run_chunk_bwd(c, in, ct.d_o, ct.dht, p, Algorithm::kRecurrentReference);
  ASSERT_TRUE(IsOk(ref.status)) << "reference backward";
  BwdOut chk = run_chunk_bwd(c, in, ct.d_o, ct.dht, p, Algorithm::kChunked);
  ASSERT_TRUE(IsOk(chk.status)) << "chunked backward";
  compare_grads(tag, ref, chk, tol, tol_params);
}

class ChunkBwdF64 : public ::testing::TestWithParam<Config> {};

TEST_P(ChunkBwdF64, ChunkedEqualsReferenceBackward) {
  expect_chunked_bwd_matches_reference(GetParam(), Precision::kF64, "chunked vs reference ", 1e-10,
                                       1e-10);
}

INSTANTIATE_TEST_SUITE_P(Grid, ChunkBwdF64,
                         ::testing::ValuesIn(reference_grid(DType::kF64, {1, 15, 63, 64, 65, 200})),
                         case_name);
INSTANTIATE_TEST_SUITE_P(LargeDims, ChunkBwdF64, ::testing::ValuesIn(large_dim_grid(DType::kF64)),
                         case_name);

class ChunkBwdF32 : public ::testing::TestWithParam<Config> {};

TEST_P(ChunkBwdF32, ChunkedEqualsReferenceBackward) {
  // dA_log and ddt_bias are sums over all tokens of terms of both signs: looser.
  expect_chunked_bwd_matches_reference(GetParam(), Precision::kF32, "chunked f32 vs reference ",
                                       1e-4, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Grid, ChunkBwdF32,
                         ::testing::ValuesIn(reference_grid(DType::kF32, {15, 65, 200})),
                         case_name);

// ---- optional gradient outputs
// ----------------------------------------------------------------------

TEST(ChunkBwd, Dh0MayBeUndefinedWithInitialState) {
  Config c;
  c.T = 70;
  c.gate = Gate::kLowerBound;
  c.beta = Beta::kLogits;
  c.h0 = true;
  c.l2norm = true;
  Inputs in = make_inputs(c);
  Cotangents ct = make_cotangents(c, true, 7);
  BwdOut all = run_chunk_bwd(c, in, ct.d_o, ct.dht, Precision::kF64, Algorithm::kChunked);
  ASSERT_TRUE(IsOk(all.status));

  BwdOut part;
  for (auto [dst, src] :
       {std::pair{&part.dq, &all.dq}, std::pair{&part.dk, &all.dk}, std::pair{&part.dv, &all.dv},
        std::pair{&part.dg, &all.dg}, std::pair{&part.dbeta, &all.dbeta},
        std::pair{&part.dA_log, &all.dA_log}, std::pair{&part.ddt_bias, &all.ddt_bias}}) {
    *dst = HostTensor(src->dtype(), src->shape());
    dst->fill_nan();
  }
  openkda::ChunkBwdArgs args;
  apply_options(c, Precision::kF64, Algorithm::kChunked, 0, args);
  fill_problem(c, in, args);
  args.d_o = ct.d_o.ref();
  args.dht = ct.dht.ref();
  args.dq = part.dq.ref();
  args.dk = part.dk.ref();
  args.dv = part.dv.ref();
  args.dg = part.dg.ref();
  args.dbeta = part.dbeta.ref();
  args.dA_log = part.dA_log.ref();
  args.ddt_bias = part.ddt_bias.ref();
  ASSERT_TRUE(IsOk(run_on_host(args)));
  // Every gradient (all were NaN-poisoned): the same bits as the run that also wrote dh0.
  for (auto [name, got, want] :
       {std::tuple{"dq", &part.dq, &all.dq}, std::tuple{"dk", &part.dk, &all.dk},
        std::tuple{"dv", &part.dv, &all.dv}, std::tuple{"dg", &part.dg, &all.dg},
        std::tuple{"dbeta", &part.dbeta, &all.dbeta},
        std::tuple{"dA_log", &part.dA_log, &all.dA_log},
        std::tuple{"ddt_bias", &part.ddt_bias, &all.ddt_bias}}) {
    EXPECT_TRUE(
        Close(std::string(name) + " without dh0", want->to_double(), got->to_double(), 0.0));
  }
}

// bf16 / f16 storage of inputs and gradients: the f32 chunked backward against the reference
// backward on the same (rounded) inputs; gradients are rounded to their input's dtype.
TEST(ChunkBwd, LowPrecisionStorage) {
  for (DType dt : {DType::kBF16, DType::kF16}) {
    Config c;
    c.B = 1;
    c.T = 90;
    c.H = 1;
    c.HV = 2;
    c.K = 16;
    c.V = 8;
    c.gate = Gate::kSafeInKernel;
    c.lower_bound = -5.0;
    c.beta = Beta::kLogits;
    c.l2norm = true;
    c.h0 = true;
    c.v_first = dt == DType::kF16;
    c.qk_dtype = c.v_dtype = c.g_dtype = c.beta_dtype = dt;
    c.param_dtype = c.h0_dtype = c.state_dtype = DType::kF32;
    Inputs in = make_inputs(c);
    Cotangents ct = make_cotangents(c, true, 21);
    BwdOut ref =
        run_chunk_bwd(c, in, ct.d_o, ct.dht, Precision::kF32, Algorithm::kRecurrentReference);
    BwdOut chk = run_chunk_bwd(c, in, ct.d_o, ct.dht, Precision::kF32, Algorithm::kChunked);
    ASSERT_TRUE(IsOk(ref.status));
    ASSERT_TRUE(IsOk(chk.status));
    const double tol = dt == DType::kBF16 ? 1e-2 : 2e-3;
    compare_grads(std::string(openkda::dtype_name(dt)) + " ", ref, chk, tol, tol);
  }
}

TEST(ChunkBwd, ExtremeDecayGradientsAreFinite) {
  for (Precision p : {Precision::kF64, Precision::kF32}) {
    const DType dt = p == Precision::kF64 ? DType::kF64 : DType::kF32;
    Config c;
    c.B = 1;
    c.T = 140;
    c.H = 1;
    c.HV = 2;
    c.K = 16;
    c.V = 8;
    c.gate = Gate::kPre;
    c.extreme_gate_prob = 0.2;
    c.h0 = true;
    c.l2norm = true;
    c.set_all_dtypes(dt);
    Inputs in = make_inputs(c);
    Cotangents ct = make_cotangents(c, true, 11);
    BwdOut ref = run_chunk_bwd(c, in, ct.d_o, ct.dht, p, Algorithm::kRecurrentReference);
    BwdOut chk = run_chunk_bwd(c, in, ct.d_o, ct.dht, p, Algorithm::kChunked);
    ASSERT_TRUE(IsOk(ref.status));
    ASSERT_TRUE(IsOk(chk.status));
    // f32: the tolerances of the other f32 backward cases (G is kept in double, see
    // ChunkFwd.ExtremeDecayIsFinite).
    compare_grads(p == Precision::kF64 ? "extreme decay f64 " : "extreme decay f32 ", ref, chk,
                  p == Precision::kF64 ? 1e-10 : 1e-4, p == Precision::kF64 ? 1e-10 : 1e-3);
  }
}

}  // namespace
}  // namespace kdatest
