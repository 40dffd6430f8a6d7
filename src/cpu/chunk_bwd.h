// CPU twin of the chunked backward (spec section 5), one function per GPU stage, per chunk of one
// (sequence, value head). The forward intermediates are recomputed first (FLA's default,
// disable_recompute only changes what the GPU keeps):
//   B1 dAv     dA_qk = tril(do v_new^T); dv_new = A_qk^T do                      (output part)
//   B2 state   reverse over chunks: dh[c] = dS; dv_new += kg dS;
//              dS = diag(E_last) dS + scale qg^T do - w^T dv_new;  dh0 = dS at the start
//   B3 wy      dq, dk, dG from h, kg, w/u through Tinv; dv, dbeta; dA_kk = -Tinv^T dTinv Tinv^T
//   B4 intra   dq, dk, dG, dbeta through A_qk and A_kk (exponents G_i - G_j <= 0)
//   B6 cumsum  dg = reverse chunk-local cumsum of dG
// Derivatives are taken w.r.t. the natural-log cumsum, so no ln 2 appears (spec 5.3).
#pragma once

#include "cpu/chunk_fwd.h"

namespace openkda::cpu {

template <class T>
void bwd_dAv(ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv);
template <class T>
void bwd_state(ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv, T scale, T* dS);
template <class T>
void bwd_wy(ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv, T scale);
template <class T>
void bwd_intra(ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv, T scale);
template <class T>
void bwd_gate_cumsum(ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv);

// Recompute + B1..B4 + B6 for sequence n, value head hv. Leaves per-value-head dq/dk, dG (= dL/dg
// per token), dv, dbeta in b, and dh0 in b.dh0.
template <class T>
void chunk_backward_sequence(ChunkBuffers<T>& b, const ProblemDims& d, int64_t n, int64_t hv,
                             T scale);

}  // namespace openkda::cpu
