#include "cpu/recurrent.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/convert.h"
#include "cpu/parallel.h"

namespace openkda::cpu {

template <class T>
void recurrent_step(T* S, const T* q, const T* k, const T* v, const T* g, const T* beta,
                    int64_t beta_stride, int64_t K, int64_t V, T* o) {
  std::vector<T> r(v, v + V);
  for (int64_t x = 0; x < K; ++x) {
    const T a = std::exp(g[x]);
    T* Sx = S + x * V;
    for (int64_t e = 0; e < V; ++e) {
      Sx[e] *= a;
      r[e] -= Sx[e] * k[x];
    }
  }
  for (int64_t e = 0; e < V; ++e) r[e] *= beta[e * beta_stride];
  std::fill(o, o + V, T(0));
  for (int64_t x = 0; x < K; ++x) {
    T* Sx = S + x * V;
    for (int64_t e = 0; e < V; ++e) {
      Sx[e] += k[x] * r[e];
      o[e] += Sx[e] * q[x];
    }
  }
}

void reference_forward_sequence(ChunkBuffers<double>& b, const ProblemDims& d, int64_t n,
                                int64_t hv, double scale) {
  const SequenceInfo& s = d.seqs[n];
  const int64_t K = d.K, V = d.V;
  double* S = b.ht + b.state(n, hv);
  std::memcpy(S, b.h0 + b.state(n, hv), sizeof(double) * K * V);
  std::vector<double> qs(static_cast<size_t>(K));
  for (int64_t i = 0; i < s.len; ++i) {
    if (i % d.BT == 0)
      std::memcpy(b.h + ((s.chunk_offset + i / d.BT) * d.HV + hv) * K * V, S,
                  sizeof(double) * K * V);
    const int64_t t = s.bos + i;
    const double* q = b.q_row(b.q, t, hv);
    for (int64_t x = 0; x < K; ++x) qs[x] = scale * q[x];
    recurrent_step(S, qs.data(), b.q_row(b.k, t, hv), b.v + b.hvv(t, hv), b.G + b.hk(t, hv),
                   b.beta + t * d.HV + hv, 0, K, V, b.o + b.hvv(t, hv));
  }
}

void reference_backward_sequence(ChunkBuffers<double>& b, const ProblemDims& d, int64_t n,
                                 int64_t hv, double scale) {
  reference_forward_sequence(b, d, n, hv, scale);  // fills the chunk-start checkpoints b.h
  const SequenceInfo& s = d.seqs[n];
  const int64_t K = d.K, V = d.V, KV = K * V;
  double* dS = b.dh0 + b.state(n, hv);  // running dL/dS, ends as dh0
  std::memcpy(dS, b.dht + b.state(n, hv), sizeof(double) * KV);
  std::vector<double> states, Sp(static_cast<size_t>(KV)), r(static_cast<size_t>(V)),
      dr(static_cast<size_t>(V)), o(static_cast<size_t>(V)), qs(static_cast<size_t>(K));
  for (int64_t c = d.num_chunks(s.len) - 1; c >= 0; --c) {
    const int64_t i0 = c * d.BT, n_rows = std::min(d.BT, s.len - i0);
    // Replay the chunk from its checkpoint: states[i] = S after token i0 + i - 1.
    states.assign(static_cast<size_t>((n_rows + 1) * KV), 0.0);
    std::memcpy(states.data(), b.h + ((s.chunk_offset + c) * d.HV + hv) * KV, sizeof(double) * KV);
    for (int64_t i = 0; i < n_rows; ++i) {
      const int64_t t = s.bos + i0 + i;
      std::memcpy(&states[(i + 1) * KV], &states[i * KV], sizeof(double) * KV);
      recurrent_step(&states[(i + 1) * KV], qs.data(), b.q_row(b.k, t, hv), b.v + b.hvv(t, hv),
                     b.G + b.hk(t, hv), b.beta + t * d.HV + hv, 0, K, V, o.data());
    }
    for (int64_t i = n_rows - 1; i >= 0; --i) {
      const int64_t t = s.bos + i0 + i;
      const double* Sprev = &states[i * KV];
      const double* Snew = &states[(i + 1) * KV];
      const double* q = b.q_row(b.q, t, hv);
      const double* k = b.q_row(b.k, t, hv);
      const double* v = b.v + b.hvv(t, hv);
      const double* g = b.G + b.hk(t, hv);
      const double* doo = b.d_o + b.hvv(t, hv);
      const double beta = b.beta[t * d.HV + hv];
      double* dq = b.dq + b.hk(t, hv);
      double* dk = b.dk + b.hk(t, hv);
      double* dv = b.dv + b.hvv(t, hv);
      double* dg = b.dG + b.hk(t, hv);
      // o = scale * S^T q
      for (int64_t x = 0; x < K; ++x) {
        double acc = 0;
        for (int64_t e = 0; e < V; ++e) {
          acc += Snew[x * V + e] * doo[e];
          dS[x * V + e] += scale * q[x] * doo[e];
        }
        dq[x] = scale * acc;
      }
      // S' = diag(exp(g)) Sprev, r = v - S'^T k
      for (int64_t x = 0; x < K; ++x)
        for (int64_t e = 0; e < V; ++e) Sp[x * V + e] = std::exp(g[x]) * Sprev[x * V + e];
      for (int64_t e = 0; e < V; ++e) {
        double acc = v[e];
        for (int64_t x = 0; x < K; ++x) acc -= Sp[x * V + e] * k[x];
        r[e] = acc;
      }
      // S = S' + beta k r^T
      double dbeta = 0;
      for (int64_t e = 0; e < V; ++e) {
        double acc = 0;
        for (int64_t x = 0; x < K; ++x) acc += dS[x * V + e] * k[x];
        dbeta += acc * r[e];
        dr[e] = beta * acc;
        dv[e] = dr[e];
      }
      b.dbeta[t * d.HV + hv] = dbeta;
      for (int64_t x = 0; x < K; ++x) {
        double acc_r = 0, acc_s = 0, acc_g = 0;
        for (int64_t e = 0; e < V; ++e) {
          acc_r += dS[x * V + e] * r[e];
          acc_s += Sp[x * V + e] * dr[e];
          // dS' = dS - k dr^T, then through the decay.
          const double dSp = dS[x * V + e] - k[x] * dr[e];
          acc_g += dSp * Sp[x * V + e];
          dS[x * V + e] = std::exp(g[x]) * dSp;
        }
        dk[x] = beta * acc_r - acc_s;
        dg[x] = acc_g;  // d/dg of exp(g) Sprev = S'
      }
    }
  }
}

template <class T>
void recurrent_fwd_cpu(const RecurrentFwdArgs& a) {
  const int64_t H = a.q.shape[2], K = a.q.shape[3];
  const int64_t HV = a.v.shape[2], V = a.v.shape[3], G = HV / H, KV = K * V;
  const ProblemDims d = resolve_dims(a.q, a.v, a.cu_seqlens, 64);
  const bool pool = a.ssm_state_indices.defined();
  const int64_t idx_cols = pool && a.ssm_state_indices.ndim == 2 ? a.ssm_state_indices.shape[1] : 1;
  const bool headwise = a.beta.ndim == 4;
  const T scale = T(effective_scale(a, K));
  std::vector<T> A_log(static_cast<size_t>(HV)), dt_bias(static_cast<size_t>(HV * K));
  GateParams<T> gp;
  gp.in_kernel = a.use_gate_in_kernel;
  gp.lower_bound = a.lower_bound;
  gp.softplus_without_A = true;  // FLA's fused_recurrent_kda: A_log undefined -> exp(A) = e
  if (a.use_gate_in_kernel && a.A_log.defined())
    load_array(a.A_log, 0, HV, A_log.data()), gp.A_log = A_log.data();
  if (a.use_gate_in_kernel && a.dt_bias.defined())
    load_array(a.dt_bias, 0, HV * K, dt_bias.data()), gp.dt_bias = dt_bias.data();
  const T beta_scale = a.allow_neg_eigval ? T(2) : T(1);
  const TensorRef& ht = a.inplace_final_state ? a.initial_state : a.final_state;

  parallel_for(d.N * HV, a.num_threads, [&](int64_t task) {
    const int64_t n = task / HV, hv = task % HV, h = hv / G;
    const SequenceInfo& s = d.seqs[n];
    if (pool && s.len == 0)
      return;  // continuous batching: an empty slot is neither read nor written
    std::vector<T> S(static_cast<size_t>(KV), T(0)), q(K), k(K), v(V), g(K), beta(V), o(V);
    auto slot = [&](int64_t col) { return load_index(a.ssm_state_indices, n * idx_cols + col); };
    if (a.initial_state.defined()) {
      const int64_t src =
          pool
              ? slot(a.num_accepted_tokens.defined() ? load_index(a.num_accepted_tokens, n) - 1 : 0)
              : n;
      load_state_tile(a.initial_state, (src * HV + hv) * KV, K, V, a.state_v_first, S.data());
    }
    for (int64_t i = 0; i < s.len; ++i) {
      const int64_t t = s.bos + i;
      load_array(a.q, (t * H + h) * K, K, q.data());
      load_array(a.k, (t * H + h) * K, K, k.data());
      load_array(a.v, (t * HV + hv) * V, V, v.data());
      load_array(a.g, (t * HV + hv) * K, K, g.data());
      load_array(a.beta, headwise ? (t * HV + hv) * V : t * HV + hv, headwise ? V : 1, beta.data());
      if (a.use_qk_l2norm_in_kernel) {
        const T rq = l2norm_rstd(q.data(), K), rk = l2norm_rstd(k.data(), K);
        for (int64_t x = 0; x < K; ++x) q[x] *= rq, k[x] *= rk;
      }
      for (int64_t x = 0; x < K; ++x) {
        q[x] *= scale;
        g[x] = gp.forward(g[x], hv, K, x);
      }
      if (a.use_beta_sigmoid_in_kernel)
        for (int64_t e = 0; e < (headwise ? V : 1); ++e) beta[e] = beta_scale * sigmoid(beta[e]);
      recurrent_step(S.data(), q.data(), k.data(), v.data(), g.data(), beta.data(),
                     headwise ? 1 : 0, K, V, o.data());
      store_array(o.data(), V, a.o, (t * HV + hv) * V);
      if (pool && ht.defined()) {  // the state after every token
        const int64_t dst = a.inplace_final_state ? slot(i) : t;
        store_state_tile(S.data(), K, V, a.state_v_first, ht, (dst * HV + hv) * KV);
      }
    }
    if (!pool && ht.defined())
      store_state_tile(S.data(), K, V, a.state_v_first, ht, (n * HV + hv) * KV);
  });
}

template void recurrent_step<float>(float*, const float*, const float*, const float*, const float*,
                                    const float*, int64_t, int64_t, int64_t, float*);
template void recurrent_step<double>(double*, const double*, const double*, const double*,
                                     const double*, const double*, int64_t, int64_t, int64_t,
                                     double*);
template void recurrent_fwd_cpu<float>(const RecurrentFwdArgs&);
template void recurrent_fwd_cpu<double>(const RecurrentFwdArgs&);

}  // namespace openkda::cpu
