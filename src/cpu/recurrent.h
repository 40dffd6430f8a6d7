// Per-token recurrence (spec 1.1), the ground truth of the family, and fused_recurrent_kda on the
// CPU.
//   S' = diag(exp(g_t)) S;  r = v_t - S'^T k_t;  S = S' + beta_t k_t r^T;  o_t = scale * S^T q_t
#pragma once

#include "cpu/chunk_common.h"

namespace openkda::cpu {

// One token: decays S [K, V] by exp(g) per row, writes the delta rule update and o = S^T q.
// `q` is already scaled; beta has V entries with stride beta_stride (0: one scalar for all).
template <class T>
void recurrent_step(T* S, const T* q, const T* k, const T* v, const T* g, const T* beta,
                    int64_t beta_stride, int64_t K, int64_t V, T* o);

// chunk_kda's reference in double: the inputs prepared by prepare_inputs (G = per-token
// log-decay), o into b.o, final state into b.ht, the state at every chunk start into b.h.
void reference_forward_sequence(ChunkBuffers<double>& b, const ProblemDims& d, int64_t n,
                                int64_t hv, double scale);

// Backpropagation through time for sequence n, value head hv: dq/dk per value head, dv, dbeta,
// dG (= dL/dg per token) and dh0, the same outputs chunk_backward_sequence leaves.
void reference_backward_sequence(ChunkBuffers<double>& b, const ProblemDims& d, int64_t n,
                                 int64_t hv, double scale);

// fused_recurrent_kda on the CPU, in precision T (validated args).
template <class T>
void recurrent_fwd_cpu(const RecurrentFwdArgs& a);

}  // namespace openkda::cpu
