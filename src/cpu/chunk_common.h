// CPU backend of chunk_kda: the buffers every stage reads and writes, and the token-parallel
// preparation (before the chunk stages) and finishing (after the backward stages) passes.
//
// Buffers mirror FLA's global tensors between kernels (spec 4.9), in the compute type T:
//   tok = B * T packed tokens, BT = chunk size, NT = chunks over all sequences.
// All states are kept in the [K, V] layout internally; state_v_first only changes load/store.
#pragma once

#include <cstdint>

#include "core/problem.h"
#include "core/workspace.h"
#include "cpu/activations.h"
#include "openkda/args.h"

namespace openkda::cpu {

template <class T>
struct ChunkBuffers {
  // ---- forward (and recomputed in backward) ----
  T* q = nullptr;        // [tok, H, K]   q (l2-normalised when use_qk_l2norm_in_kernel)
  T* k = nullptr;        // [tok, H, K]
  T* rstd_q = nullptr;   // [tok, H]      1 / sqrt(sum q^2 + eps) (l2norm only)
  T* rstd_k = nullptr;   // [tok, H]
  T* v = nullptr;        // [tok, HV, V]
  T* beta = nullptr;     // [tok, HV]     post-activation beta
  double* G = nullptr;   // [tok, HV, K]  per-token log-decay g (natural log) after prepare;
                         //               chunk-local inclusive cumsum * RCP_LN2 after stage 1.
                         //               Double in every precision: with strong decay the cumsum
                         //               reaches ~1e5 and fp32 would lose the small differences
                         //               G_i - G_j that the exponentials need (FLA keeps it fp32)
  T* A_qk = nullptr;     // [tok, HV, BT] scale * q_i . k_j * exp2(G_i - G_j), j <= i; 0 above
  T* A_kk = nullptr;     // [tok, HV, BT] beta_i * k_i . k_j * exp2(G_i - G_j), j < i; then
                         //               replaced by Tinv = (I + A_kk)^-1 (unit lower)
  T* w = nullptr;        // [tok, HV, K]  Tinv . (beta * k * exp2(G))
  T* u = nullptr;        // [tok, HV, V]  Tinv . (beta * v)
  T* kg = nullptr;       // [tok, HV, K]  k * exp2(G_last - G)
  T* qg = nullptr;       // [tok, HV, K]  q * exp2(G)
  T* h = nullptr;        // [NT, HV, K, V] state at the start of each chunk
  T* v_new = nullptr;    // [tok, HV, V]  u - w . h
  T* h0 = nullptr;       // [N, HV, K, V] initial state (zeros when undefined)
  T* ht = nullptr;       // [N, HV, K, V] final state
  T* o = nullptr;        // [tok, HV, V]
  T* A_log = nullptr;    // [HV]
  T* dt_bias = nullptr;  // [HV * K]
  // ---- backward only ----
  T* g_raw = nullptr;     // [tok, HV, K] g as passed (raw gate in kernel mode)
  T* beta_raw = nullptr;  // [tok, HV]    beta as passed
  T* d_o = nullptr;       // [tok, HV, V] dL/do
  T* dht = nullptr;       // [N, HV, K, V] dL/d final state (zeros when undefined)
  T* dA_qk = nullptr;     // [tok, HV, BT] dL/dA_qk (lower incl. diagonal)
  T* dA_kk = nullptr;     // [tok, HV, BT] dL/dA_kk (strictly lower)
  T* dv_new = nullptr;    // [tok, HV, V] dL/dv_new (output part, then total)
  T* dh = nullptr;        // [NT, HV, K, V] dL/d(state at the end of each chunk)
  T* dq = nullptr;        // [tok, HV, K] per value head, w.r.t. the normalised q
  T* dk = nullptr;        // [tok, HV, K]
  T* dG = nullptr;        // [tok, HV, K] dL/dG (natural-log cumsum); then dL/dg per token
  T* dv = nullptr;        // [tok, HV, V]
  T* dbeta = nullptr;     // [tok, HV]    w.r.t. the post-activation beta
  T* dh0 = nullptr;       // [N, HV, K, V]

  // Row addressing (token t, value head hv).
  int64_t H = 0, HV = 0, G_ = 1, K = 0, V = 0, BT = 64;
  T* q_row(T* base, int64_t t, int64_t hv) const { return base + (t * H + hv / G_) * K; }
  int64_t hk(int64_t t, int64_t hv) const { return (t * HV + hv) * K; }
  int64_t hvv(int64_t t, int64_t hv) const { return (t * HV + hv) * V; }
  int64_t ha(int64_t t, int64_t hv) const { return (t * HV + hv) * BT; }
  int64_t state(int64_t n, int64_t hv) const { return (n * HV + hv) * K * V; }
};

// Lays out the buffers in `plan` (sizing only when the plan has no base).
template <class T>
ChunkBuffers<T> plan_chunk_buffers(const ProblemDims& d, bool backward, WorkspacePlan& plan);

// Token-parallel preparation: q/k (l2norm), v, beta activation, gate activation into G, A_log,
// dt_bias, initial state; in backward also g_raw, beta_raw, d_o and dht.
template <class T>
void prepare_inputs(const ChunkProblem& p, const ProblemDims& d, ChunkBuffers<T>& b,
                    const TensorRef* d_o, const TensorRef* dht, int threads);

// GateParams for the chunk problem over the loaded A_log / dt_bias.
template <class T>
GateParams<T> gate_params(const ChunkProblem& p, const ChunkBuffers<T>& b);

// One [K, V] state tile at element `offset` of a state tensor, in its layout ([V, K] if v_first).
template <class T>
void load_state_tile(const TensorRef& src, int64_t offset, int64_t K, int64_t V, bool v_first,
                     T* dst);
template <class T>
void store_state_tile(const T* src, int64_t K, int64_t V, bool v_first, const TensorRef& dst,
                      int64_t offset);

// Writes a [n, HV, K, V] state (internal layout) into dst, transposing for state_v_first.
template <class T>
void store_states(const T* src, int64_t n, const ProblemDims& d, bool v_first,
                  const TensorRef& dst);
template <class T>
void load_states(const TensorRef& src, int64_t n, const ProblemDims& d, bool v_first, T* dst);

// Backward epilogue: GVA sum + l2norm backward for dq/dk, beta-sigmoid backward, gate backward
// (dg, dA_log, ddt_bias reduced in a fixed order), dv and dh0 stores.
// Expects b.dG to hold dL/dg per token (natural log), after the reverse chunk cumsum.
template <class T>
void finish_backward(const ChunkBwdArgs& a, const ProblemDims& d, ChunkBuffers<T>& b, int threads);

}  // namespace openkda::cpu
