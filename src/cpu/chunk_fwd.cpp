#include "cpu/chunk_fwd.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace openkda::cpu {

template <class T>
void fwd_gate_cumsum(ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv) {
  const int64_t K = b.K;
  for (int64_t i = 1; i < c.n; ++i) {
    double* row = b.G + b.hk(c.t0 + i, hv);
    const double* prev = b.G + b.hk(c.t0 + i - 1, hv);
    for (int64_t x = 0; x < K; ++x) row[x] += prev[x];
  }
  for (int64_t i = 0; i < c.n; ++i) {
    double* row = b.G + b.hk(c.t0 + i, hv);
    for (int64_t x = 0; x < K; ++x) row[x] *= kRcpLn2;
  }
}

template <class T>
void fwd_intra(ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv, T scale) {
  const int64_t K = b.K, BT = b.BT;
  for (int64_t i = 0; i < c.n; ++i) {
    const int64_t ti = c.t0 + i;
    const T* qi = b.q_row(b.q, ti, hv);
    const T* ki = b.q_row(b.k, ti, hv);
    const double* Gi = b.G + b.hk(ti, hv);
    T* aqk = b.A_qk + b.ha(ti, hv);
    T* akk = b.A_kk + b.ha(ti, hv);
    std::fill(aqk, aqk + BT, T(0));
    std::fill(akk, akk + BT, T(0));
    for (int64_t j = 0; j <= i; ++j) {
      const int64_t tj = c.t0 + j;
      const T* kj = b.q_row(b.k, tj, hv);
      const double* Gj = b.G + b.hk(tj, hv);
      T s_qk = 0, s_kk = 0;
      for (int64_t x = 0; x < K; ++x) {
        const T e = T(std::exp2(Gi[x] - Gj[x]));  // <= 1 whenever every g <= 0
        s_qk += qi[x] * kj[x] * e;
        s_kk += ki[x] * kj[x] * e;
      }
      aqk[j] = scale * s_qk;
      if (j < i) akk[j] = b.beta[ti * b.HV + hv] * s_kk;
    }
  }
}

template <class T>
void fwd_inverse(ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv) {
  // Row i of X = (I + A)^-1: X[i][j] = -(A[i][j] + sum_{j<m<i} A[i][m] X[m][j]). Going left to
  // right, entry j is overwritten only after the entries m > j it reads, so it runs in place.
  for (int64_t i = 0; i < c.n; ++i) {
    T* xi = b.A_kk + b.ha(c.t0 + i, hv);
    for (int64_t j = 0; j < i; ++j) {
      T acc = xi[j];
      for (int64_t m = j + 1; m < i; ++m) acc += xi[m] * b.A_kk[b.ha(c.t0 + m, hv) + j];
      xi[j] = -acc;
    }
    xi[i] = T(1);
  }
}

template <class T>
void fwd_wy(ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv) {
  const int64_t K = b.K, V = b.V;
  const double* G_last = b.G + b.hk(c.t0 + c.n - 1, hv);
  // qg = q * exp2(G) and kg = k * exp2(G_last - G): both exponents <= 0 for g <= 0.
  for (int64_t i = 0; i < c.n; ++i) {
    const int64_t ti = c.t0 + i;
    const T* ki = b.q_row(b.k, ti, hv);
    const T* qi = b.q_row(b.q, ti, hv);
    const double* Gi = b.G + b.hk(ti, hv);
    T* kg = b.kg + b.hk(ti, hv);
    T* qg = b.qg + b.hk(ti, hv);
    for (int64_t x = 0; x < K; ++x) {
      kg[x] = ki[x] * std::exp2(G_last[x] - Gi[x]);
      qg[x] = qi[x] * std::exp2(Gi[x]);
    }
  }
  // w = Tinv (beta k exp2(G)), u = Tinv (beta v); row i only uses rows j <= i.
  std::vector<T> kbE(static_cast<size_t>(c.n * K));
  for (int64_t j = 0; j < c.n; ++j) {
    const int64_t tj = c.t0 + j;
    const T* kj = b.q_row(b.k, tj, hv);
    const double* Gj = b.G + b.hk(tj, hv);
    const T bj = b.beta[tj * b.HV + hv];
    for (int64_t x = 0; x < K; ++x) kbE[j * K + x] = bj * kj[x] * std::exp2(Gj[x]);
  }
  for (int64_t i = 0; i < c.n; ++i) {
    const int64_t ti = c.t0 + i;
    const T* Tinv = b.A_kk + b.ha(ti, hv);
    T* w = b.w + b.hk(ti, hv);
    T* u = b.u + b.hvv(ti, hv);
    std::fill(w, w + K, T(0));
    std::fill(u, u + V, T(0));
    for (int64_t j = 0; j <= i; ++j) {
      const int64_t tj = c.t0 + j;
      const T* vj = b.v + b.hvv(tj, hv);
      const T coef_u = Tinv[j] * b.beta[tj * b.HV + hv];
      for (int64_t x = 0; x < K; ++x) w[x] += Tinv[j] * kbE[j * K + x];
      for (int64_t e = 0; e < V; ++e) u[e] += coef_u * vj[e];
    }
  }
}

namespace {

// One chunk of the state recurrence on X [K, W] (W = V: the state; W = V + K: the time split's
// [Z | M], whose columns past V see u = 0): row i of R = [u_i | 0] - w_i X goes to r_row(i), then
// X = diag(exp2(G_last)) X + kg^T R.
template <class T, class RowOf>
void chunk_state_update(const ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv, T* X, int64_t W,
                        RowOf r_row) {
  const int64_t K = b.K, V = b.V;
  for (int64_t i = 0; i < c.n; ++i) {
    const int64_t ti = c.t0 + i;
    const T* w = b.w + b.hk(ti, hv);
    const T* u = b.u + b.hvv(ti, hv);
    T* r = r_row(i);
    for (int64_t e = 0; e < W; ++e) r[e] = e < V ? u[e] : T(0);
    for (int64_t x = 0; x < K; ++x) {
      const T* Xx = X + x * W;
      for (int64_t e = 0; e < W; ++e) r[e] -= w[x] * Xx[e];
    }
  }
  const double* G_last = b.G + b.hk(c.t0 + c.n - 1, hv);
  for (int64_t x = 0; x < K; ++x) {
    T* Xx = X + x * W;
    const T decay = T(std::exp2(G_last[x]));
    for (int64_t e = 0; e < W; ++e) Xx[e] *= decay;
    for (int64_t i = 0; i < c.n; ++i) {
      const T kgx = b.kg[b.hk(c.t0 + i, hv) + x];
      const T* r = r_row(i);
      for (int64_t e = 0; e < W; ++e) Xx[e] += kgx * r[e];
    }
  }
}

}  // namespace

template <class T>
void fwd_state(ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv, T* S) {
  std::memcpy(b.h + (c.idx * b.HV + hv) * b.K * b.V, S, sizeof(T) * b.K * b.V);
  chunk_state_update(b, c, hv, S, b.V, [&](int64_t i) { return b.v_new + b.hvv(c.t0 + i, hv); });
}

template <class T>
void fwd_output(ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv, T scale) {
  const int64_t K = b.K, V = b.V;
  const T* h = b.h + (c.idx * b.HV + hv) * K * V;
  for (int64_t i = 0; i < c.n; ++i) {
    const int64_t ti = c.t0 + i;
    T* o = b.o + b.hvv(ti, hv);
    std::fill(o, o + V, T(0));
    const T* qg = b.qg + b.hk(ti, hv);
    for (int64_t x = 0; x < K; ++x) {
      const T coef = scale * qg[x];
      for (int64_t e = 0; e < V; ++e) o[e] += coef * h[x * V + e];
    }
    const T* aqk = b.A_qk + b.ha(ti, hv);
    for (int64_t j = 0; j <= i; ++j) {
      const T* vn = b.v_new + b.hvv(c.t0 + j, hv);
      for (int64_t e = 0; e < V; ++e) o[e] += aqk[j] * vn[e];
    }
  }
}

template <class T>
void fwd_v_new_factored(const ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv, const T* S,
                        T* v_new) {
  const int64_t K = b.K, V = b.V;
  // R = v - ke S, row j only from row j (ke_j = k_j exp2(G_j)).
  std::vector<T> r(static_cast<size_t>(c.n * V));
  for (int64_t j = 0; j < c.n; ++j) {
    const int64_t tj = c.t0 + j;
    const T* kj = b.q_row(b.k, tj, hv);
    const double* Gj = b.G + b.hk(tj, hv);
    const T* vj = b.v + b.hvv(tj, hv);
    T* rj = r.data() + j * V;
    for (int64_t e = 0; e < V; ++e) rj[e] = vj[e];
    for (int64_t x = 0; x < K; ++x) {
      const T ke = kj[x] * T(std::exp2(Gj[x]));
      const T* Sx = S + x * V;
      for (int64_t e = 0; e < V; ++e) rj[e] -= ke * Sx[e];
    }
  }
  // v_new = Tinv' R, Tinv'[i][j] = Tinv[i][j] beta_j; row i only uses rows j <= i.
  for (int64_t i = 0; i < c.n; ++i) {
    const T* Tinv = b.A_kk + b.ha(c.t0 + i, hv);
    T* out = v_new + i * V;
    std::fill(out, out + V, T(0));
    for (int64_t j = 0; j <= i; ++j) {
      const T coef = Tinv[j] * b.beta[(c.t0 + j) * b.HV + hv];
      const T* rj = r.data() + j * V;
      for (int64_t e = 0; e < V; ++e) out[e] += coef * rj[e];
    }
  }
}

template <class T>
void chunk_forward_sequence(ChunkBuffers<T>& b, const ProblemDims& d, int64_t n, int64_t hv,
                            T scale, bool output) {
  const SequenceInfo& s = d.seqs[n];
  const int64_t KV = d.K * d.V;
  T* S = b.ht + b.state(n, hv);  // the running state lives in the final-state buffer
  std::memcpy(S, b.h0 + b.state(n, hv), sizeof(T) * KV);
  for (int64_t c = 0; c < d.num_chunks(s.len); ++c) {
    ChunkSpan span{s.bos + c * d.BT, std::min(d.BT, s.len - c * d.BT), s.chunk_offset + c};
    fwd_gate_cumsum(b, span, hv);
    fwd_intra(b, span, hv, scale);
    fwd_inverse(b, span, hv);
    fwd_wy(b, span, hv);
    fwd_state(b, span, hv, S);
    if (output) fwd_output(b, span, hv, scale);
  }
}

template <class T>
void fwd_segment_transition(const ChunkBuffers<T>& b, const ChunkSpan* chunks, int64_t count,
                            int64_t hv, T* X) {
  const int64_t K = b.K, W = b.V + b.K;
  std::fill(X, X + K * W, T(0));
  for (int64_t x = 0; x < K; ++x) X[x * W + b.V + x] = T(1);
  std::vector<T> r;
  for (int64_t ci = 0; ci < count; ++ci) {
    r.assign(static_cast<size_t>(chunks[ci].n * W), T(0));
    chunk_state_update(b, chunks[ci], hv, X, W, [&](int64_t i) { return r.data() + i * W; });
  }
}

template <class T>
void fwd_segment_combine(const T* X, const T* S, T* S_next, int64_t K, int64_t V) {
  const int64_t W = V + K;
  for (int64_t x = 0; x < K; ++x) {
    T* out = S_next + x * V;
    for (int64_t e = 0; e < V; ++e) out[e] = X[x * W + e];
    for (int64_t m = 0; m < K; ++m) {
      const T mxm = X[x * W + V + m];
      for (int64_t e = 0; e < V; ++e) out[e] += mxm * S[m * V + e];
    }
  }
}

#define OPENKDA_INSTANTIATE(T)                                                                     \
  template void fwd_gate_cumsum<T>(ChunkBuffers<T>&, const ChunkSpan&, int64_t);                   \
  template void fwd_intra<T>(ChunkBuffers<T>&, const ChunkSpan&, int64_t, T);                      \
  template void fwd_inverse<T>(ChunkBuffers<T>&, const ChunkSpan&, int64_t);                       \
  template void fwd_wy<T>(ChunkBuffers<T>&, const ChunkSpan&, int64_t);                            \
  template void fwd_state<T>(ChunkBuffers<T>&, const ChunkSpan&, int64_t, T*);                     \
  template void fwd_output<T>(ChunkBuffers<T>&, const ChunkSpan&, int64_t, T);                     \
  template void fwd_v_new_factored<T>(const ChunkBuffers<T>&, const ChunkSpan&, int64_t, const T*, \
                                      T*);                                                         \
  template void chunk_forward_sequence<T>(ChunkBuffers<T>&, const ProblemDims&, int64_t, int64_t,  \
                                          T, bool);                                                \
  template void fwd_segment_transition<T>(const ChunkBuffers<T>&, const ChunkSpan*, int64_t,       \
                                          int64_t, T*);                                            \
  template void fwd_segment_combine<T>(const T*, const T*, T*, int64_t, int64_t);
OPENKDA_INSTANTIATE(float)
OPENKDA_INSTANTIATE(double)
#undef OPENKDA_INSTANTIATE

}  // namespace openkda::cpu
