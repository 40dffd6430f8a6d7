// Elementwise activations of the KDA family and their derivatives (spec section 3), shared by the
// recurrent reference, the chunked stages, fused_recurrent and fused_kda_gate on the CPU.
//   softplus gate:     y = -exp(A) * softplus(x),          x = g_raw + dt_bias
//   lower-bound gate:  y = L * sigmoid(a * x),             a = exp(A) (1 without A_log)
//   beta:              b = s * sigmoid(beta_raw),          s = 2 with allow_neg_eigval, else 1
//   l2norm:            y = x * rstd, rstd = 1 / sqrt(sum x^2 + 1e-6)   (eps inside the sqrt)
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>

namespace openkda::cpu {

// 1 / ln 2 in full precision: exp2(G) with G = RCP_LN2 * cumsum(g) equals exp(cumsum(g)). FLA's
// float constant 1.4426950216 is this value rounded to float.
constexpr double kRcpLn2 = 1.4426950408889634;
constexpr double kL2NormEps = 1e-6;

template <class T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

// FLA's softplus: x above the threshold 20, log(1 + exp(x)) below.
template <class T>
T softplus(T x) {
  return x > T(20) ? x : std::log1p(std::exp(x));
}

// Gate activation for one (value head hv): everything the forward and backward need.
template <class T>
struct GateParams {
  bool in_kernel = false;  // false: g is already the log-decay
  std::optional<double> lower_bound;
  const T* A_log = nullptr;         // [HV] or nullptr
  const T* dt_bias = nullptr;       // [HV * K] or nullptr
  bool softplus_without_A = false;  // fused_recurrent: A_log undefined -> exp(A) = e

  T a_coef(int64_t hv) const {  // exp(A_log[hv]), or the mode's default
    if (A_log) return std::exp(A_log[hv]);
    return lower_bound ? T(1) : (softplus_without_A ? T(std::exp(1.0)) : T(1));
  }
  T x(T g_raw, int64_t hv, int64_t K, int64_t d) const {
    return dt_bias ? g_raw + dt_bias[hv * K + d] : g_raw;
  }
  // Log-decay y for raw input g_raw.
  T forward(T g_raw, int64_t hv, int64_t K, int64_t d) const {
    if (!in_kernel) return g_raw;
    const T xv = x(g_raw, hv, K, d);
    const T a = a_coef(hv);
    if (lower_bound) return T(*lower_bound) * sigmoid(a * xv);
    return -a * softplus(xv);
  }
  // dy/dx (= dy/dg_raw = dy/ddt_bias) and dy/dA_log for raw input g_raw.
  void derivatives(T g_raw, int64_t hv, int64_t K, int64_t d, T* dy_dx, T* dy_dA) const {
    const T xv = x(g_raw, hv, K, d);
    const T a = a_coef(hv);
    if (lower_bound) {
      const T s = sigmoid(a * xv);
      *dy_dx = T(*lower_bound) * s * (T(1) - s) * a;
      *dy_dA = A_log ? *dy_dx * xv : T(0);
    } else {
      *dy_dx = -a * sigmoid(xv);
      *dy_dA = A_log ? -a * softplus(xv) : T(0);
    }
  }
};

// rstd of one row of length K (the caller multiplies).
template <class T>
T l2norm_rstd(const T* x, int64_t K) {
  T ss = 0;
  for (int64_t d = 0; d < K; ++d) ss += x[d] * x[d];
  return T(1) / std::sqrt(ss + T(kL2NormEps));
}

// dx = rstd * (dy - (dy . y) y), y = x * rstd (in place on dy).
template <class T>
void l2norm_backward(const T* y, T rstd, int64_t K, T* dy) {
  T dot = 0;
  for (int64_t d = 0; d < K; ++d) dot += dy[d] * y[d];
  for (int64_t d = 0; d < K; ++d) dy[d] = rstd * (dy[d] - dot * y[d]);
}

}  // namespace openkda::cpu
