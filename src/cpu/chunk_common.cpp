// Buffer plan, preparation and backward epilogue of the CPU chunk_kda backend.
#include "cpu/chunk_common.h"

#include <cstring>
#include <vector>

#include "core/convert.h"
#include "cpu/parallel.h"

namespace openkda::cpu {

template <class T>
ChunkBuffers<T> plan_chunk_buffers(const ProblemDims& d, bool backward, WorkspacePlan& plan) {
  ChunkBuffers<T> b;
  b.H = d.H, b.HV = d.HV, b.G_ = d.G, b.K = d.K, b.V = d.V, b.BT = d.BT;
  const int64_t tok = d.tokens();
  const int64_t state = d.HV * d.K * d.V;
  b.q = plan.take<T>(tok * d.H * d.K);
  b.k = plan.take<T>(tok * d.H * d.K);
  b.rstd_q = plan.take<T>(tok * d.H);
  b.rstd_k = plan.take<T>(tok * d.H);
  b.v = plan.take<T>(tok * d.HV * d.V);
  b.beta = plan.take<T>(tok * d.HV);
  b.G = plan.take<double>(tok * d.HV * d.K);
  b.A_qk = plan.take<T>(tok * d.HV * d.BT);
  b.A_kk = plan.take<T>(tok * d.HV * d.BT);
  b.w = plan.take<T>(tok * d.HV * d.K);
  b.u = plan.take<T>(tok * d.HV * d.V);
  b.kg = plan.take<T>(tok * d.HV * d.K);
  b.qg = plan.take<T>(tok * d.HV * d.K);
  b.h = plan.take<T>(d.NT_total * state);
  b.v_new = plan.take<T>(tok * d.HV * d.V);
  b.h0 = plan.take<T>(d.N * state);
  b.ht = plan.take<T>(d.N * state);
  b.o = plan.take<T>(tok * d.HV * d.V);
  b.A_log = plan.take<T>(d.HV);
  b.dt_bias = plan.take<T>(d.HV * d.K);
  if (backward) {
    b.g_raw = plan.take<T>(tok * d.HV * d.K);
    b.beta_raw = plan.take<T>(tok * d.HV);
    b.d_o = plan.take<T>(tok * d.HV * d.V);
    b.dht = plan.take<T>(d.N * state);
    b.dA_qk = plan.take<T>(tok * d.HV * d.BT);
    b.dA_kk = plan.take<T>(tok * d.HV * d.BT);
    b.dv_new = plan.take<T>(tok * d.HV * d.V);
    b.dh = plan.take<T>(d.NT_total * state);
    b.dq = plan.take<T>(tok * d.HV * d.K);
    b.dk = plan.take<T>(tok * d.HV * d.K);
    b.dG = plan.take<T>(tok * d.HV * d.K);
    b.dv = plan.take<T>(tok * d.HV * d.V);
    b.dbeta = plan.take<T>(tok * d.HV);
    b.dh0 = plan.take<T>(d.N * state);
  }
  return b;
}

template <class T>
void load_state_tile(const TensorRef& src, int64_t offset, int64_t K, int64_t V, bool v_first,
                     T* dst) {
  if (!v_first) {
    load_array(src, offset, K * V, dst);
    return;
  }
  std::vector<T> tile(static_cast<size_t>(K * V));
  load_array(src, offset, K * V, tile.data());  // [V, K]
  for (int64_t e = 0; e < V; ++e)
    for (int64_t c = 0; c < K; ++c) dst[c * V + e] = tile[e * K + c];
}

template <class T>
void store_state_tile(const T* src, int64_t K, int64_t V, bool v_first, const TensorRef& dst,
                      int64_t offset) {
  if (!v_first) {
    store_array(src, K * V, dst, offset);
    return;
  }
  std::vector<T> tile(static_cast<size_t>(K * V));
  for (int64_t e = 0; e < V; ++e)
    for (int64_t c = 0; c < K; ++c) tile[e * K + c] = src[c * V + e];
  store_array(tile.data(), K * V, dst, offset);
}

template <class T>
void load_states(const TensorRef& src, int64_t n, const ProblemDims& d, bool v_first, T* dst) {
  const int64_t KV = d.K * d.V;
  if (!src.defined()) {
    std::fill(dst, dst + n * d.HV * KV, T(0));
    return;
  }
  for (int64_t s = 0; s < n * d.HV; ++s)
    load_state_tile(src, s * KV, d.K, d.V, v_first, dst + s * KV);
}

template <class T>
void store_states(const T* src, int64_t n, const ProblemDims& d, bool v_first,
                  const TensorRef& dst) {
  if (!dst.defined()) return;
  const int64_t KV = d.K * d.V;
  for (int64_t s = 0; s < n * d.HV; ++s)
    store_state_tile(src + s * KV, d.K, d.V, v_first, dst, s * KV);
}

template <class T>
GateParams<T> gate_params(const ChunkProblem& p, const ChunkBuffers<T>& b) {
  GateParams<T> gp;
  gp.in_kernel = p.use_gate_in_kernel;
  gp.lower_bound = p.lower_bound;
  if (p.use_gate_in_kernel && p.A_log.defined()) gp.A_log = b.A_log;
  if (p.use_gate_in_kernel && p.dt_bias.defined()) gp.dt_bias = b.dt_bias;
  return gp;
}

template <class T>
void prepare_inputs(const ChunkProblem& p, const ProblemDims& d, ChunkBuffers<T>& b,
                    const TensorRef* d_o, const TensorRef* dht, int threads) {
  const int64_t H = d.H, HV = d.HV, K = d.K, V = d.V;
  if (p.use_gate_in_kernel && p.A_log.defined()) load_array(p.A_log, 0, HV, b.A_log);
  if (p.use_gate_in_kernel && p.dt_bias.defined()) load_array(p.dt_bias, 0, HV * K, b.dt_bias);
  const GateParams<T> gp = gate_params<T>(p, b);
  const T beta_scale = p.allow_neg_eigval ? T(2) : T(1);
  parallel_for(d.tokens(), threads, [&](int64_t t) {
    for (int64_t h = 0; h < H; ++h) {
      T* qr = b.q + (t * H + h) * K;
      T* kr = b.k + (t * H + h) * K;
      load_array(p.q, (t * H + h) * K, K, qr);
      load_array(p.k, (t * H + h) * K, K, kr);
      if (p.use_qk_l2norm_in_kernel) {
        const T rq = l2norm_rstd(qr, K), rk = l2norm_rstd(kr, K);
        for (int64_t c = 0; c < K; ++c) qr[c] *= rq, kr[c] *= rk;
        b.rstd_q[t * H + h] = rq;
        b.rstd_k[t * H + h] = rk;
      }
    }
    load_array(p.v, t * HV * V, HV * V, b.v + t * HV * V);
    load_array(p.beta, t * HV, HV, b.beta + t * HV);
    if (b.beta_raw) std::memcpy(b.beta_raw + t * HV, b.beta + t * HV, sizeof(T) * HV);
    if (p.use_beta_sigmoid_in_kernel)
      for (int64_t hv = 0; hv < HV; ++hv)
        b.beta[t * HV + hv] = beta_scale * sigmoid(b.beta[t * HV + hv]);
    double* gr = b.G + t * HV * K;
    load_array(p.g, t * HV * K, HV * K, gr);
    if (b.g_raw) load_array(p.g, t * HV * K, HV * K, b.g_raw + t * HV * K);
    for (int64_t hv = 0; hv < HV; ++hv)
      for (int64_t c = 0; c < K; ++c) gr[hv * K + c] = gp.forward(T(gr[hv * K + c]), hv, K, c);
    if (d_o) load_array(*d_o, t * HV * V, HV * V, b.d_o + t * HV * V);
  });
  load_states(p.initial_state, d.N, d, p.state_v_first, b.h0);
  if (dht) load_states(*dht, d.N, d, p.state_v_first, b.dht);
}

template <class T>
void finish_backward(const ChunkBwdArgs& a, const ProblemDims& d, ChunkBuffers<T>& b, int threads) {
  const int64_t H = d.H, HV = d.HV, G = d.G, K = d.K, V = d.V;
  const GateParams<T> gp = gate_params<T>(a, b);
  const T beta_scale = a.allow_neg_eigval ? T(2) : T(1);
  // dy/dA_log per element, reduced per head below in token order.
  std::vector<T> dA_part(static_cast<size_t>(d.tokens() * HV), T(0));
  parallel_for(d.tokens(), threads, [&](int64_t t) {
    std::vector<T> row(static_cast<size_t>(K));
    for (int64_t h = 0; h < H; ++h) {  // dq, dk: sum the G value heads that share q/k head h
      for (const bool is_q : {true, false}) {
        const T* src = is_q ? b.dq : b.dk;
        std::fill(row.begin(), row.end(), T(0));
        for (int64_t j = 0; j < G; ++j)
          for (int64_t c = 0; c < K; ++c) row[c] += src[b.hk(t, h * G + j) + c];
        if (a.use_qk_l2norm_in_kernel)
          l2norm_backward((is_q ? b.q : b.k) + (t * H + h) * K,
                          (is_q ? b.rstd_q : b.rstd_k)[t * H + h], K, row.data());
        store_array(row.data(), K, is_q ? a.dq : a.dk, (t * H + h) * K);
      }
    }
    store_array(b.dv + t * HV * V, HV * V, a.dv, t * HV * V);
    for (int64_t hv = 0; hv < HV; ++hv) {
      T db = b.dbeta[t * HV + hv];
      if (a.use_beta_sigmoid_in_kernel) {
        const T s = sigmoid(b.beta_raw[t * HV + hv]);
        db *= beta_scale * s * (T(1) - s);
      }
      row[0] = db;
      store_array(row.data(), 1, a.dbeta, t * HV + hv);
    }
    T* dg = b.dG + t * HV * K;  // becomes dL/dg_raw in place
    if (a.use_gate_in_kernel) {
      for (int64_t hv = 0; hv < HV; ++hv) {
        T acc = 0;
        for (int64_t c = 0; c < K; ++c) {
          T dy_dx, dy_dA;
          gp.derivatives(b.g_raw[b.hk(t, hv) + c], hv, K, c, &dy_dx, &dy_dA);
          acc += dg[hv * K + c] * dy_dA;
          dg[hv * K + c] *= dy_dx;
        }
        dA_part[t * HV + hv] = acc;
      }
    }
    store_array(dg, HV * K, a.dg, t * HV * K);
  });
  // Parameter gradients: fixed-order sums over tokens, one head per task.
  std::vector<T> dA(static_cast<size_t>(HV), T(0)), dbias(static_cast<size_t>(HV * K), T(0));
  if (a.use_gate_in_kernel) {
    parallel_for(HV, threads, [&](int64_t hv) {
      for (int64_t t = 0; t < d.tokens(); ++t) {
        dA[hv] += dA_part[t * HV + hv];
        for (int64_t c = 0; c < K; ++c) dbias[hv * K + c] += b.dG[b.hk(t, hv) + c];
      }
    });
  }
  if (a.dA_log.defined()) store_array(dA.data(), HV, a.dA_log, 0);
  if (a.ddt_bias.defined()) store_array(dbias.data(), HV * K, a.ddt_bias, 0);
  if (a.dh0.defined()) store_states(b.dh0, d.N, d, a.state_v_first, a.dh0);
}

#define OPENKDA_INSTANTIATE(T)                                                                    \
  template ChunkBuffers<T> plan_chunk_buffers<T>(const ProblemDims&, bool, WorkspacePlan&);       \
  template void prepare_inputs<T>(const ChunkProblem&, const ProblemDims&, ChunkBuffers<T>&,      \
                                  const TensorRef*, const TensorRef*, int);                       \
  template GateParams<T> gate_params<T>(const ChunkProblem&, const ChunkBuffers<T>&);             \
  template void store_states<T>(const T*, int64_t, const ProblemDims&, bool, const TensorRef&);   \
  template void load_states<T>(const TensorRef&, int64_t, const ProblemDims&, bool, T*);          \
  template void load_state_tile<T>(const TensorRef&, int64_t, int64_t, int64_t, bool, T*);        \
  template void store_state_tile<T>(const T*, int64_t, int64_t, bool, const TensorRef&, int64_t); \
  template void finish_backward<T>(const ChunkBwdArgs&, const ProblemDims&, ChunkBuffers<T>&, int);
OPENKDA_INSTANTIATE(float)
OPENKDA_INSTANTIATE(double)
#undef OPENKDA_INSTANTIATE

}  // namespace openkda::cpu
