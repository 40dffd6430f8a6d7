// fused_kda_gate forward and backward (GateFwdArgs / GateBwdArgs) against formulas written here,
// central finite differences, and extreme inputs g in [-30, 30].
//   softplus:    y = -exp(A_log[hv]) * softplus(x),          x = g + dt_bias[hv * K + d]
//   lower bound: y = L * sigmoid(a * x),  a = exp(A_log[hv]) (1 without A_log)
#include <gtest/gtest.h>

#include "test_util.h"

namespace kdatest {
namespace {

struct GateCase {
  std::vector<int64_t> shape;  // [..., HV, K]
  bool has_A_log = true;
  bool has_bias = true;
  std::optional<double> lower_bound;
  DType g_dtype = DType::kF64, y_dtype = DType::kF64, param_dtype = DType::kF64;
  double g_sigma = 3.0;

  int64_t HV() const { return shape[shape.size() - 2]; }
  int64_t K() const { return shape.back(); }
  std::string name() const {
    std::string s = std::string(has_A_log ? "A" : "noA") + (has_bias ? "_bias" : "") +
                    (lower_bound ? "_lb" + std::to_string(*lower_bound) : "_softplus") + "_g" +
                    openkda::dtype_name(g_dtype) + "_y" + openkda::dtype_name(y_dtype) + "_rank" +
                    std::to_string(shape.size());
    return s;
  }
};

struct GateData {
  HostTensor g, A_log, dt_bias;
};

GateData make_gate_data(const GateCase& gc, uint64_t seed) {
  Rng rng(seed);
  GateData d;
  d.g = random_tensor(rng, gc.g_dtype, gc.shape, gc.g_sigma);
  if (gc.has_A_log) d.A_log = random_tensor(rng, gc.param_dtype, {gc.HV()}, 0.7);
  if (gc.has_bias) d.dt_bias = random_tensor(rng, gc.param_dtype, {gc.HV() * gc.K()});
  return d;
}

// Formula values: y and the local derivatives dy/dx and dy/dA_log per element.
struct GateRef {
  std::vector<double> y, dydx, dydA;
};

GateRef gate_formula(const GateCase& gc, const GateData& d) {
  const auto g = d.g.to_double();
  const auto A = d.A_log.defined() ? d.A_log.to_double() : std::vector<double>{};
  const auto b = d.dt_bias.defined() ? d.dt_bias.to_double() : std::vector<double>{};
  const int64_t HV = gc.HV(), K = gc.K();
  GateRef r;
  r.y.resize(g.size());
  r.dydx.resize(g.size());
  r.dydA.resize(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    const int64_t d_ = static_cast<int64_t>(i) % K, hv = (static_cast<int64_t>(i) / K) % HV;
    const double x = g[i] + (b.empty() ? 0.0 : b[static_cast<size_t>(hv * K + d_)]);
    if (gc.lower_bound) {
      const double L = *gc.lower_bound;
      const double a = A.empty() ? 1.0 : std::exp(A[static_cast<size_t>(hv)]);
      const double s = sigmoid(a * x);
      r.y[i] = L * s;
      r.dydx[i] = L * s * (1 - s) * a;
      r.dydA[i] = A.empty() ? 0.0 : L * s * (1 - s) * a * x;
    } else {
      const double a = std::exp(A[static_cast<size_t>(hv)]);
      r.y[i] = -a * softplus(x);
      r.dydx[i] = -a * sigmoid(x);
      r.dydA[i] = r.y[i];
    }
  }
  return r;
}

openkda::GateFwdArgs fwd_args(const GateCase& gc, GateData& d, HostTensor& y) {
  openkda::GateFwdArgs a;
  a.g = d.g.ref();
  a.A_log = d.A_log.ref();
  a.dt_bias = d.dt_bias.ref();
  a.lower_bound = gc.lower_bound;
  a.y = y.ref();
  return a;
}

HostTensor run_gate_fwd(const GateCase& gc, GateData& d) {
  HostTensor y(gc.y_dtype, gc.shape);
  y.fill_nan();
  openkda::GateFwdArgs a = fwd_args(gc, d, y);
  EXPECT_TRUE(IsOk(run_on_host(a))) << gc.name();
  return y;
}

struct GateGrads {
  HostTensor dg, dA_log, ddt_bias;
};

GateGrads run_gate_bwd(const GateCase& gc, GateData& d, HostTensor& dy, int threads = 0) {
  GateGrads gr;
  gr.dg = HostTensor(gc.g_dtype, gc.shape);
  gr.dg.fill_nan();
  if (d.A_log.defined()) {
    gr.dA_log = HostTensor(d.A_log.dtype(), d.A_log.shape());
    gr.dA_log.fill_nan();
  }
  if (d.dt_bias.defined()) {
    gr.ddt_bias = HostTensor(d.dt_bias.dtype(), d.dt_bias.shape());
    gr.ddt_bias.fill_nan();
  }
  openkda::GateBwdArgs a;
  a.g = d.g.ref();
  a.A_log = d.A_log.ref();
  a.dt_bias = d.dt_bias.ref();
  a.lower_bound = gc.lower_bound;
  a.dy = dy.ref();
  a.dg = gr.dg.ref();
  a.dA_log = gr.dA_log.ref();
  a.ddt_bias = gr.ddt_bias.ref();
  a.num_threads = threads;
  EXPECT_TRUE(IsOk(run_on_host(a))) << gc.name();
  return gr;
}

std::vector<GateCase> gate_cases() {
  std::vector<GateCase> cases;
  const std::vector<std::vector<int64_t>> shapes = {{2, 33, 4, 16}, {5, 3, 12}, {2, 8}};
  int i = 0;
  for (bool has_A : {true, false}) {
    for (bool has_bias : {true, false}) {
      for (std::optional<double> lb :
           {std::optional<double>{}, std::optional<double>{-5.0}, std::optional<double>{-0.5}}) {
        if (!has_A && !lb) continue;  // the softplus gate needs A_log
        GateCase gc;
        gc.shape = shapes[static_cast<size_t>(i++ % 3)];
        gc.has_A_log = has_A;
        gc.has_bias = has_bias;
        gc.lower_bound = lb;
        cases.push_back(gc);
      }
    }
  }
  return cases;
}

// Sums of the local derivatives: dA_log[hv] = sum dy * dy/dA, ddt_bias[hv*K+d] = sum dy * dy/dx.
void expected_grads(const GateCase& gc, const GateRef& r, const std::vector<double>& dy,
                    std::vector<double>& dg, std::vector<double>& dA, std::vector<double>& db) {
  const int64_t HV = gc.HV(), K = gc.K();
  dg.assign(dy.size(), 0.0);
  dA.assign(static_cast<size_t>(HV), 0.0);
  db.assign(static_cast<size_t>(HV * K), 0.0);
  for (size_t i = 0; i < dy.size(); ++i) {
    const int64_t d_ = static_cast<int64_t>(i) % K, hv = (static_cast<int64_t>(i) / K) % HV;
    dg[i] = dy[i] * r.dydx[i];
    dA[static_cast<size_t>(hv)] += dy[i] * r.dydA[i];
    db[static_cast<size_t>(hv * K + d_)] += dg[i];
  }
}

TEST(Gate, ForwardAndBackwardMatchFormulas) {
  uint64_t seed = 1;
  for (const GateCase& gc : gate_cases()) {
    SCOPED_TRACE(gc.name());
    GateData d = make_gate_data(gc, seed++);
    const GateRef r = gate_formula(gc, d);
    HostTensor y = run_gate_fwd(gc, d);
    EXPECT_TRUE(Close("y", r.y, y.to_double(), 1e-14));
    Rng rng(seed * 13);
    HostTensor dy = random_tensor(rng, gc.g_dtype, gc.shape);
    std::vector<double> dg, dA, db;
    expected_grads(gc, r, dy.to_double(), dg, dA, db);
    GateGrads gr = run_gate_bwd(gc, d, dy);
    EXPECT_TRUE(Close("dg", dg, gr.dg.to_double(), 1e-13));
    if (gc.has_A_log) {
      EXPECT_TRUE(Close("dA_log", dA, gr.dA_log.to_double(), 1e-12));
    }
    if (gc.has_bias) {
      EXPECT_TRUE(Close("ddt_bias", db, gr.ddt_bias.to_double(), 1e-12));
    }
  }
}

TEST(Gate, BackwardMatchesFiniteDifferences) {
  uint64_t seed = 50;
  for (const GateCase& base : gate_cases()) {
    GateCase gc = base;
    gc.shape = {3, 2, 4};
    SCOPED_TRACE(gc.name());
    GateData d = make_gate_data(gc, seed++);
    Rng rng(seed * 7);
    HostTensor dy = random_tensor(rng, DType::kF64, gc.shape);
    GateGrads gr = run_gate_bwd(gc, d, dy);
    const auto dyv = dy.to_double();
    auto loss = [&]() {
      HostTensor y = run_gate_fwd(gc, d);
      const auto yv = y.to_double();
      double L = 0;
      for (size_t i = 0; i < yv.size(); ++i) L += yv[i] * dyv[i];
      return L;
    };
    const double eps = 1e-6;
    auto check_all = [&](const char* what, HostTensor& x, const HostTensor& grad) {
      for (int64_t i = 0; i < x.numel(); ++i) {
        const double x0 = x.get(i);
        x.set(i, x0 + eps);
        const double lp = loss();
        x.set(i, x0 - eps);
        const double lm = loss();
        x.set(i, x0);
        const double fd = (lp - lm) / (2 * eps);
        EXPECT_NEAR(grad.get(i), fd, 1e-7 * (1 + std::fabs(fd))) << what << "[" << i << "]";
      }
    };
    check_all("dg", d.g, gr.dg);
    if (gc.has_A_log) check_all("dA_log", d.A_log, gr.dA_log);
    if (gc.has_bias) check_all("ddt_bias", d.dt_bias, gr.ddt_bias);
  }
}

TEST(Gate, F32AndLowPrecisionStorage) {
  struct Dt {
    DType g, y, p;
    double tol;
  };
  const Dt dts[] = {{DType::kF32, DType::kF32, DType::kF32, 1e-6},
                    {DType::kBF16, DType::kF32, DType::kF32, 1e-6},
                    {DType::kF16, DType::kF16, DType::kF32, 1e-3},
                    {DType::kF32, DType::kBF16, DType::kF64, 8e-3},
                    {DType::kBF16, DType::kBF16, DType::kF32, 8e-3}};
  uint64_t seed = 90;
  for (const Dt& dt : dts) {
    for (GateCase gc : gate_cases()) {
      gc.g_dtype = dt.g;
      gc.y_dtype = dt.y;
      gc.param_dtype = dt.p;
      SCOPED_TRACE(gc.name());
      GateData d = make_gate_data(gc, seed++);
      const GateRef r = gate_formula(gc, d);  // from the rounded inputs
      HostTensor y = run_gate_fwd(gc, d);
      EXPECT_TRUE(Close("y", r.y, y.to_double(), dt.tol));
      Rng rng(seed);
      HostTensor dy = random_tensor(rng, dt.g, gc.shape);
      std::vector<double> dg, dA, db;
      expected_grads(gc, r, dy.to_double(), dg, dA, db);
      GateGrads gr = run_gate_bwd(gc, d, dy);
      const double tg = dt.g == DType::kF32 ? 1e-6 : 8e-3;  // dg is stored in g's dtype
      EXPECT_TRUE(Close("dg", dg, gr.dg.to_double(), tg));
      // Reductions: f32 accumulation at least; ddt_bias may be reduced from dg rounded to g's dtype
      // (FLA does so), hence the bf16/f16 tolerance.
      if (gc.has_A_log) {
        EXPECT_TRUE(Close("dA_log", dA, gr.dA_log.to_double(), 1e-4 + tg));
      }
      if (gc.has_bias) {
        EXPECT_TRUE(Close("ddt_bias", db, gr.ddt_bias.to_double(), 1e-4 + tg));
      }
    }
  }
}

TEST(Gate, ExtremeInputsAreFinite) {
  for (GateCase gc : gate_cases()) {
    for (DType dt : {DType::kF64, DType::kF32}) {
      gc.shape = {61, 2, 8};
      gc.g_dtype = gc.y_dtype = gc.param_dtype = dt;
      SCOPED_TRACE(gc.name());
      GateData d = make_gate_data(gc, 3);
      for (int64_t i = 0; i < d.g.numel(); ++i) d.g.set(i, -30.0 + (i % 61));  // -30 .. 30
      if (d.dt_bias.defined()) d.dt_bias.fill(0.0);
      const GateRef r = gate_formula(gc, d);
      HostTensor y = run_gate_fwd(gc, d);
      EXPECT_TRUE(AllFinite("y", y.to_double()));
      EXPECT_TRUE(Close("y", r.y, y.to_double(), dt == DType::kF64 ? 1e-13 : 1e-6));
      // Random dy: with dy = 1 the odd terms of dA_log cancel exactly over the symmetric x range.
      Rng rng(11);
      HostTensor dy(dt, gc.shape);
      for (int64_t i = 0; i < dy.numel(); ++i) dy.set(i, rng.uniform(0.5, 1.5));
      GateGrads gr = run_gate_bwd(gc, d, dy);
      EXPECT_TRUE(AllFinite("dg", gr.dg.to_double()));
      std::vector<double> dg, dA, db;
      expected_grads(gc, r, dy.to_double(), dg, dA, db);
      // Above the softplus threshold (x > 20) the derivative may be sigmoid(x) or exactly 1.
      EXPECT_TRUE(Close("dg", dg, gr.dg.to_double(), dt == DType::kF64 ? 1e-8 : 1e-6));
      if (gc.has_A_log) {
        EXPECT_TRUE(AllFinite("dA_log", gr.dA_log.to_double()));
        EXPECT_TRUE(Close("dA_log", dA, gr.dA_log.to_double(), dt == DType::kF64 ? 1e-8 : 1e-5));
      }
      if (gc.has_bias) {
        EXPECT_TRUE(AllFinite("ddt_bias", gr.ddt_bias.to_double()));
      }
    }
  }
}

TEST(Gate, DeterministicAcrossThreadCounts) {
  GateCase gc;
  gc.shape = {4, 64, 4, 32};
  gc.lower_bound = -5.0;
  GateData d = make_gate_data(gc, 77);
  Rng rng(78);
  HostTensor dy = random_tensor(rng, DType::kF64, gc.shape);
  GateGrads a = run_gate_bwd(gc, d, dy, 1);
  GateGrads b = run_gate_bwd(gc, d, dy, 2);
  GateGrads c = run_gate_bwd(gc, d, dy, 1);
  EXPECT_EQ(a.dg.raw(), b.dg.raw());
  EXPECT_EQ(a.dA_log.raw(), c.dA_log.raw()) << "two runs with the same thread count differ";
  EXPECT_TRUE(Close("dA_log 1 vs 2 threads", a.dA_log.to_double(), b.dA_log.to_double(), 1e-14));
  EXPECT_TRUE(
      Close("ddt_bias 1 vs 2 threads", a.ddt_bias.to_double(), b.ddt_bias.to_double(), 1e-14));
}

}  // namespace
}  // namespace kdatest
