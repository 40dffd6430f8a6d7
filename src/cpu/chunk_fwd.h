// CPU twin of the chunked forward (spec section 4), one function per GPU stage:
//   1  gate_cumsum  G = RCP_LN2 * chunk-local inclusive cumsum of g            [tok, HV, K]
//   2a intra        A_qk (j <= i) and A_kk (j < i), exponents G_i - G_j <= 0   [tok, HV, BT]
//   2b inverse      Tinv = (I + A_kk)^-1 by forward substitution (in place)    [tok, HV, BT]
//   3  wy           w = Tinv (beta k E), u = Tinv (beta v), kg, qg             [tok, HV, K|V]
//   4  state        h[c] = S; v_new = u - w S; S = diag(E_last) S + kg^T v_new (sequential)
//      (the CUDA scan forms v_new = Tinv' (v - ke S), Tinv' = Tinv diag(beta), ke = k E, without
//      w and u: fwd_v_new_factored is its twin)
//   5  output       o = scale * qg h[c] + A_qk v_new
//   time split      segment_transition, segment_combine (cuda/chunk_fwd/segments.cuh)
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

// The CUDA scan's v_new (cuda/chunk_fwd/state.cuh): rows i < c.n of v_new [c.n, V] for the state S
// [K, V] entering the chunk, as Tinv' (v - ke S) from stages 1-2b (G, Tinv in A_kk) and the
// inputs; equal to fwd_state's u - w S up to rounding.
template <class T>
void fwd_v_new_factored(const ChunkBuffers<T>& b, const ChunkSpan& c, int64_t hv, const T* S,
                        T* v_new);

// Time split (cuda/chunk_fwd/segments.cuh), for one (sequence, value head) whose stages 1-3 ran:
//   segment_transition  X = [Z | M] [K, V + K] over `count` consecutive chunks, from [0 | I]: each
//                       chunk X <- diag(exp2(G_last)) X + kg^T ([u | 0] - w X), so that Z is the
//                       segment's final state from S = 0 and M the product of its transitions
//   segment_combine     S_next = M S + Z                                      [K, V]
template <class T>
void fwd_segment_transition(const ChunkBuffers<T>& b, const ChunkSpan* chunks, int64_t count,
                            int64_t hv, T* X);
template <class T>
void fwd_segment_combine(const T* X, const T* S, T* S_next, int64_t K, int64_t V);

// All stages for sequence n and value head hv; final state into b.ht, o into b.o when `output`.
template <class T>
void chunk_forward_sequence(ChunkBuffers<T>& b, const ProblemDims& d, int64_t n, int64_t hv,
                            T scale, bool output);

}  // namespace openkda::cpu
