#include "cpu/chunk_bwd.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace openkda::cpu {

template <class T>
void bwd_dAv(ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv) {
  const int64_t V = b.V, BT = b.BT;
  for (int64_t i = 0; i < c.n; ++i) {
    const T* doi = b.d_o + b.hvv(c.t0 + i, hv);
    T* dA = b.dA_qk + b.ha(c.t0 + i, hv);
    std::fill(dA, dA + BT, T(0));
    for (int64_t j = 0; j <= i; ++j) {
      const T* vn = b.v_new + b.hvv(c.t0 + j, hv);
      T s = 0;
      for (int64_t e = 0; e < V; ++e) s += doi[e] * vn[e];
      dA[j] = s;
    }
  }
  for (int64_t j = 0; j < c.n; ++j) {
    T* dvn = b.dv_new + b.hvv(c.t0 + j, hv);
    std::fill(dvn, dvn + V, T(0));
    for (int64_t i = j; i < c.n; ++i) {
      const T a = b.A_qk[b.ha(c.t0 + i, hv) + j];
      const T* doi = b.d_o + b.hvv(c.t0 + i, hv);
      for (int64_t e = 0; e < V; ++e) dvn[e] += a * doi[e];
    }
  }
}

template <class T>
void bwd_state(ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv, T scale, T* dS) {
  const int64_t K = b.K, V = b.V;
  std::memcpy(b.dh + (c.idx * b.HV + hv) * K * V, dS, sizeof(T) * K * V);
  for (int64_t i = 0; i < c.n; ++i) {  // v_new feeds the next state through kg^T v_new
    const T* kg = b.kg + b.hk(c.t0 + i, hv);
    T* dvn = b.dv_new + b.hvv(c.t0 + i, hv);
    for (int64_t x = 0; x < K; ++x)
      for (int64_t e = 0; e < V; ++e) dvn[e] += kg[x] * dS[x * V + e];
  }
  const double* G_last = b.G + b.hk(c.t0 + c.n - 1, hv);
  for (int64_t x = 0; x < K; ++x) {
    T* dSx = dS + x * V;
    const T decay = T(std::exp2(G_last[x]));
    for (int64_t e = 0; e < V; ++e) dSx[e] *= decay;
    for (int64_t i = 0; i < c.n; ++i) {
      const T qg = scale * b.qg[b.hk(c.t0 + i, hv) + x];
      const T w = b.w[b.hk(c.t0 + i, hv) + x];
      const T* doi = b.d_o + b.hvv(c.t0 + i, hv);
      const T* dvn = b.dv_new + b.hvv(c.t0 + i, hv);
      for (int64_t e = 0; e < V; ++e) dSx[e] += qg * doi[e] - w * dvn[e];
    }
  }
}

template <class T>
void bwd_wy(ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv, T scale) {
  const int64_t K = b.K, V = b.V, n = c.n, HV = b.HV;
  const T* h = b.h + (c.idx * HV + hv) * K * V;    // state entering the chunk
  const T* dS = b.dh + (c.idx * HV + hv) * K * V;  // dL/d(state leaving the chunk)
  const double* G_last = b.G + b.hk(c.t0 + n - 1, hv);
  std::vector<T> dW(static_cast<size_t>(n * K)), E(static_cast<size_t>(n * K));
  std::vector<T> dTinv(static_cast<size_t>(n * n), T(0));
  std::vector<T> dgL(static_cast<size_t>(K), T(0));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t ti = c.t0 + i;
    const T* doi = b.d_o + b.hvv(ti, hv);
    const T* vn = b.v_new + b.hvv(ti, hv);
    const T* dvn = b.dv_new + b.hvv(ti, hv);
    const double* Gi = b.G + b.hk(ti, hv);
    const T* qi = b.q_row(b.q, ti, hv);
    const T* ki = b.q_row(b.k, ti, hv);
    T* dq = b.dq + b.hk(ti, hv);
    T* dk = b.dk + b.hk(ti, hv);
    T* dG = b.dG + b.hk(ti, hv);
    for (int64_t x = 0; x < K; ++x) {
      const T* hx = h + x * V;
      const T* dSx = dS + x * V;
      T s_q = 0, s_kg = 0, s_w = 0;
      for (int64_t e = 0; e < V; ++e) {
        s_q += doi[e] * hx[e];
        s_kg += vn[e] * dSx[e];
        s_w += dvn[e] * hx[e];
      }
      E[i * K + x] = std::exp2(Gi[x]);
      dq[x] = scale * s_q * E[i * K + x];                 // o = scale * (q E) h
      const T dkI = s_kg * std::exp2(G_last[x] - Gi[x]);  // S_next += kg^T v_new
      dk[x] = dkI;
      dG[x] = qi[x] * dq[x] - ki[x] * dkI;
      dgL[x] += ki[x] * dkI;
      dW[i * K + x] = -s_w;  // v_new = u - w h
    }
  }
  // dTinv (strictly lower part suffices: Tinv is unit lower) from w = Tinv (beta k E), u = Tinv
  // (beta v).
  for (int64_t i = 0; i < n; ++i) {
    const T* dvn = b.dv_new + b.hvv(c.t0 + i, hv);
    for (int64_t j = 0; j < i; ++j) {
      const int64_t tj = c.t0 + j;
      const T bj = b.beta[tj * HV + hv];
      const T* kj = b.q_row(b.k, tj, hv);
      const T* vj = b.v + b.hvv(tj, hv);
      T s = 0;
      for (int64_t x = 0; x < K; ++x) s += dW[i * K + x] * bj * kj[x] * E[j * K + x];
      for (int64_t e = 0; e < V; ++e) s += dvn[e] * bj * vj[e];
      dTinv[i * n + j] = s;
    }
  }
  // Through (beta k E) and (beta v): dWb = Tinv^T dW, dUb = Tinv^T dv_new.
  std::vector<T> dUb(static_cast<size_t>(V));
  for (int64_t j = 0; j < n; ++j) {
    const int64_t tj = c.t0 + j;
    const T bj = b.beta[tj * HV + hv];
    const T* kj = b.q_row(b.k, tj, hv);
    const T* vj = b.v + b.hvv(tj, hv);
    T dbeta = 0;
    for (int64_t x = 0; x < K; ++x) {
      T dWb = 0;
      for (int64_t i = j; i < n; ++i) dWb += b.A_kk[b.ha(c.t0 + i, hv) + j] * dW[i * K + x];
      const T kE = kj[x] * E[j * K + x];
      dbeta += dWb * kE;
      b.dk[b.hk(tj, hv) + x] += dWb * bj * E[j * K + x];
      b.dG[b.hk(tj, hv) + x] += dWb * bj * kE;
    }
    std::fill(dUb.begin(), dUb.end(), T(0));
    for (int64_t i = j; i < n; ++i) {
      const T t = b.A_kk[b.ha(c.t0 + i, hv) + j];
      const T* dvn = b.dv_new + b.hvv(c.t0 + i, hv);
      for (int64_t e = 0; e < V; ++e) dUb[e] += t * dvn[e];
    }
    T* dv = b.dv + b.hvv(tj, hv);
    for (int64_t e = 0; e < V; ++e) {
      dv[e] = bj * dUb[e];
      dbeta += dUb[e] * vj[e];
    }
    b.dbeta[tj * HV + hv] = dbeta;
  }
  // G_last also scales the carried state: S_next = diag(exp2(G_last)) h + ...
  T* dG_last = b.dG + b.hk(c.t0 + n - 1, hv);
  for (int64_t x = 0; x < K; ++x) {
    T s = 0;
    for (int64_t e = 0; e < V; ++e) s += h[x * V + e] * dS[x * V + e];
    dG_last[x] += std::exp2(G_last[x]) * s + dgL[x];
  }
  // dA_kk = -strict_lower(Tinv^T dTinv Tinv^T), since dTinv = -Tinv dA_kk Tinv.
  std::vector<T> P(static_cast<size_t>(n * n), T(0));
  auto Tinv = [&](int64_t r, int64_t col) { return b.A_kk[b.ha(c.t0 + r, hv) + col]; };
  for (int64_t a = 0; a < n; ++a)
    for (int64_t col = 0; col < n; ++col) {
      T s = 0;
      for (int64_t i = std::max(a, col + 1); i < n; ++i) s += Tinv(i, a) * dTinv[i * n + col];
      P[a * n + col] = s;
    }
  for (int64_t a = 0; a < n; ++a) {
    T* dA = b.dA_kk + b.ha(c.t0 + a, hv);
    std::fill(dA, dA + b.BT, T(0));
    for (int64_t col = 0; col < a; ++col) {
      T s = 0;
      for (int64_t j = 0; j <= col; ++j) s += P[a * n + j] * Tinv(col, j);
      dA[col] = -s;
    }
  }
}

template <class T>
void bwd_intra(ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv, T scale) {
  const int64_t K = b.K, HV = b.HV;
  for (int64_t i = 0; i < c.n; ++i) {
    const int64_t ti = c.t0 + i;
    const T* qi = b.q_row(b.q, ti, hv);
    const T* ki = b.q_row(b.k, ti, hv);
    const double* Gi = b.G + b.hk(ti, hv);
    const T bi = b.beta[ti * HV + hv];
    T* dqi = b.dq + b.hk(ti, hv);
    T* dki = b.dk + b.hk(ti, hv);
    T* dGi = b.dG + b.hk(ti, hv);
    T dbeta_i = 0;
    for (int64_t j = 0; j <= i; ++j) {
      const int64_t tj = c.t0 + j;
      const T* kj = b.q_row(b.k, tj, hv);
      const double* Gj = b.G + b.hk(tj, hv);
      T* dkj = b.dk + b.hk(tj, hv);
      T* dGj = b.dG + b.hk(tj, hv);
      const T a_qk = scale * b.dA_qk[b.ha(ti, hv) + j];         // A_qk = scale q_i k_j e
      const T a_kk = j < i ? b.dA_kk[b.ha(ti, hv) + j] : T(0);  // A_kk = beta_i k_i k_j e
      for (int64_t x = 0; x < K; ++x) {
        const T e = T(std::exp2(Gi[x] - Gj[x]));
        const T p_qk = a_qk * qi[x] * kj[x] * e;
        const T p_kk = a_kk * ki[x] * kj[x] * e;
        dqi[x] += a_qk * kj[x] * e;
        dkj[x] += a_qk * qi[x] * e + a_kk * bi * ki[x] * e;
        dki[x] += a_kk * bi * kj[x] * e;
        dbeta_i += p_kk;
        const T p = p_qk + bi * p_kk;  // d e / dG_i = e, d e / dG_j = -e
        dGi[x] += p;
        dGj[x] -= p;
      }
    }
    b.dbeta[ti * HV + hv] += dbeta_i;
  }
}

template <class T>
void bwd_gate_cumsum(ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv) {
  for (int64_t i = c.n - 2; i >= 0; --i) {
    T* row = b.dG + b.hk(c.t0 + i, hv);
    const T* next = b.dG + b.hk(c.t0 + i + 1, hv);
    for (int64_t x = 0; x < b.K; ++x) row[x] += next[x];
  }
}

template <class T>
void chunk_backward_sequence(ChunkBuffers<T>& b, const ProblemDims& d, int64_t n, int64_t hv,
                             T scale) {
  chunk_forward_sequence(b, d, n, hv, scale, /*output=*/false);
  const SequenceInfo& s = d.seqs[n];
  const int64_t nc = d.num_chunks(s.len);
  auto span = [&](int64_t c) {
    return ChunkSpan{s.bos + c * d.BT, std::min(d.BT, s.len - c * d.BT), s.chunk_offset + c};
  };
  for (int64_t c = 0; c < nc; ++c) bwd_dAv(b, span(c), hv);
  T* dS = b.dh0 + b.state(n, hv);  // the running state gradient ends as dh0
  std::memcpy(dS, b.dht + b.state(n, hv), sizeof(T) * d.K * d.V);
  for (int64_t c = nc - 1; c >= 0; --c) bwd_state(b, span(c), hv, scale, dS);
  for (int64_t c = 0; c < nc; ++c) {
    bwd_wy(b, span(c), hv, scale);
    bwd_intra(b, span(c), hv, scale);
    bwd_gate_cumsum(b, span(c), hv);
  }
}

#define OPENKDA_INSTANTIATE(T)                                                                     \
  template void bwd_dAv<T>(ChunkBuffers<T>&, const ChunkSpan&, int64_t);                           \
  template void bwd_state<T>(ChunkBuffers<T>&, const ChunkSpan&, int64_t, T, T*);                  \
  template void bwd_wy<T>(ChunkBuffers<T>&, const ChunkSpan&, int64_t, T);                         \
  template void bwd_intra<T>(ChunkBuffers<T>&, const ChunkSpan&, int64_t, T);                      \
  template void bwd_gate_cumsum<T>(ChunkBuffers<T>&, const ChunkSpan&, int64_t);                   \
  template void chunk_backward_sequence<T>(ChunkBuffers<T>&, const ProblemDims&, int64_t, int64_t, \
                                           T);
OPENKDA_INSTANTIATE(float)
OPENKDA_INSTANTIATE(double)
#undef OPENKDA_INSTANTIATE

}  // namespace openkda::cpu
