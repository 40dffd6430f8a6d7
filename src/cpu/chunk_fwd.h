// CPU twin of the chunked forward (spec section 4), one function per GPU stage:
//   1  gate_cumsum  G = RCP_LN2 * chunk-local inclusive cumsum of g            [tok, HV, K]
//   2a intra        A_qk (j <= i) and A_kk (j < i), exponents G_i - G_j <= 0   [tok, HV, BT]
//   2b inverse      Tinv = (I + A_kk)^-1 by forward substitution (in place)    [tok, HV, BT]
//   3  wy           w = Tinv (beta k E), u = Tinv (beta v), kg, qg             [tok, HV, K|V]
//   4  state        h[c] = S; v_new = u - w S; S = diag(E_last) S + kg^T v_new (sequential)
//   5  output       o = scale * qg h[c] + A_qk v_new
// Each function handles one chunk of one (sequence, value head); chunk_forward_sequence runs them
// in order for a whole sequence, which is the unit of CPU parallelism.
#pragma once

#include "cpu/chunk_common.h"

namespace openkda::cpu {

struct ChunkSpan {
  int64_t t0 = 0;   // first packed token of the chunk
  int64_t n = 0;    // valid rows (the last chunk of a sequence may be partial)
  int64_t idx = 0;  // flattened chunk index into h / dh
};

template <class T>
void fwd_gate_cumsum(ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv);
template <class T>
void fwd_intra(ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv, T scale);
template <class T>
void fwd_inverse(ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv);
template <class T>
void fwd_wy(ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv);
template <class T>
void fwd_state(ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv, T* S);
template <class T>
void fwd_output(ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv, T scale);

// All stages for sequence n and value head hv; final state into b.ht, o into b.o when `output`.
template <class T>
void chunk_forward_sequence(ChunkBuffers<T>& b, const ProblemDims& d, int64_t n, int64_t hv,
                            T scale, bool output);

}  // namespace openkda::cpu
