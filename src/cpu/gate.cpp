#include "cpu/gate.h"

#include <vector>

#include "core/convert.h"
#include "cpu/activations.h"
#include "cpu/parallel.h"

namespace openkda::cpu {
namespace {

struct GateSetup {
  int64_t rows = 0, HV = 0, K = 0;
  std::vector<double> A_log, dt_bias;
  GateParams<double> gp;
};

GateSetup setup(const TensorRef& g, const TensorRef& A_log, const TensorRef& dt_bias,
                const std::optional<double>& lower_bound) {
  GateSetup s;
  s.HV = g.size(-2);
  s.K = g.size(-1);
  s.rows = g.numel() / (s.HV * s.K);
  s.gp.in_kernel = true;
  s.gp.lower_bound = lower_bound;
  if (A_log.defined()) {
    s.A_log.resize(static_cast<size_t>(s.HV));
    load_array(A_log, 0, s.HV, s.A_log.data());
    s.gp.A_log = s.A_log.data();
  }
  if (dt_bias.defined()) {
    s.dt_bias.resize(static_cast<size_t>(s.HV * s.K));
    load_array(dt_bias, 0, s.HV * s.K, s.dt_bias.data());
    s.gp.dt_bias = s.dt_bias.data();
  }
  return s;
}

}  // namespace

void gate_fwd_cpu(const GateFwdArgs& a) {
  const GateSetup s = setup(a.g, a.A_log, a.dt_bias, a.lower_bound);
  const int64_t row = s.HV * s.K;
  parallel_for(s.rows, a.num_threads, [&](int64_t r) {
    std::vector<double> x(static_cast<size_t>(row));
    load_array(a.g, r * row, row, x.data());
    for (int64_t hv = 0; hv < s.HV; ++hv)
      for (int64_t c = 0; c < s.K; ++c) x[hv * s.K + c] = s.gp.forward(x[hv * s.K + c], hv, s.K, c);
    store_array(x.data(), row, a.y, r * row);
  });
}

void gate_bwd_cpu(const GateBwdArgs& a) {
  const GateSetup s = setup(a.g, a.A_log, a.dt_bias, a.lower_bound);
  const int64_t row = s.HV * s.K;
  std::vector<double> dx_all(static_cast<size_t>(s.rows * row)),
      dA_all(static_cast<size_t>(s.rows * s.HV));
  parallel_for(s.rows, a.num_threads, [&](int64_t r) {
    std::vector<double> g(static_cast<size_t>(row)), dy(static_cast<size_t>(row));
    load_array(a.g, r * row, row, g.data());
    load_array(a.dy, r * row, row, dy.data());
    double* dx = &dx_all[r * row];
    for (int64_t hv = 0; hv < s.HV; ++hv) {
      double acc = 0;
      for (int64_t c = 0; c < s.K; ++c) {
        double dy_dx, dy_dA;
        s.gp.derivatives(g[hv * s.K + c], hv, s.K, c, &dy_dx, &dy_dA);
        dx[hv * s.K + c] = dy[hv * s.K + c] * dy_dx;
        acc += dy[hv * s.K + c] * dy_dA;
      }
      dA_all[r * s.HV + hv] = acc;
    }
    store_array(dx, row, a.dg, r * row);
  });
  std::vector<double> dA(static_cast<size_t>(s.HV), 0.0), dbias(static_cast<size_t>(row), 0.0);
  for (int64_t r = 0; r < s.rows; ++r) {
    for (int64_t hv = 0; hv < s.HV; ++hv) dA[hv] += dA_all[r * s.HV + hv];
    for (int64_t i = 0; i < row; ++i) dbias[i] += dx_all[r * row + i];
  }
  if (a.dA_log.defined()) store_array(dA.data(), s.HV, a.dA_log, 0);
  if (a.ddt_bias.defined()) store_array(dbias.data(), row, a.ddt_bias, 0);
}

}  // namespace openkda::cpu
