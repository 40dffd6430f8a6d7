// Arguments of every OpenKDA op. Shapes use one notation everywhere:
//   B batch rows, T tokens per row (varlen: all packed tokens, B == 1), N sequences
//   (B, or cu_seqlens.numel() - 1), H q/k heads, HV value heads (HV % H == 0, G = HV / H),
//   K q/k head dim (K <= 256), V value head dim, NT chunks (dense: B * ceil(T / chunk_size);
//   varlen: sum over sequences of ceil(len / chunk_size)).
// The state is [N, HV, K, V] fp32, or [N, HV, V, K] when state_v_first.
// "may be undefined" marks an optional tensor (FLA's None): leave the TensorRef
// default-constructed. Inputs must be contiguous row-major; outputs are written in place into
// caller-owned buffers.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>

#include "openkda/tensor_ref.h"

namespace openkda {

// Compute precision of the CPU backend (the CUDA backend always accumulates in fp32).
enum class Precision : int8_t { kF32 = 0, kF64 };

// Algorithm of the CPU backend for chunk_kda forward and backward.
//   kChunked:            the chunked stages the GPU runs (gate cumsum, A_kk/A_qk, inverse, w/u,
//                        state scan, output; backward per spec section 5), in `precision`.
//   kRecurrentReference: the per-token recurrence in double (forward and backpropagation through
//                        time): the ground truth the chunked path is tested against.
enum class Algorithm : int8_t { kChunked = 0, kRecurrentReference };

// Gate and beta options shared by every op of the family (FLA's flags, same defaults).
struct KdaOptions {
  std::optional<double> scale;              // default K^-0.5
  bool use_qk_l2norm_in_kernel = false;     // q, k <- x / sqrt(sum x^2 + 1e-6)
  bool use_gate_in_kernel = false;          // g is the raw gate; see lower_bound
  bool use_beta_sigmoid_in_kernel = false;  // beta <- sigmoid(beta) (x2 with allow_neg_eigval)
  bool allow_neg_eigval = false;            // requires use_beta_sigmoid_in_kernel
  // With use_gate_in_kernel: unset -> g = -exp(A_log) * softplus(g + dt_bias);
  // set to L -> g = L * sigmoid(exp(A_log) * (g + dt_bias)) (exp(A_log) -> 1 when A_log undefined).
  std::optional<double> lower_bound;
  bool state_v_first = false;                 // state layout [.., V, K] instead of [.., K, V]
  Precision precision = Precision::kF32;      // CPU backend only
  Algorithm algorithm = Algorithm::kChunked;  // CPU backend only (chunk_kda)
  int num_threads = 0;                        // CPU backend only; 0 = all hardware threads
};

// The factor q is scaled by: `scale`, or FLA's default K^-0.5 (K: the q/k head dim).
inline double effective_scale(const KdaOptions& o, int64_t K) {
  return o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(K));
}

// Inputs of chunk_kda, shared by its forward and backward.
struct ChunkProblem : KdaOptions {
  TensorRef q;        // [B, T, H, K]   f16 | bf16 | f32 | f64
  TensorRef k;        // [B, T, H, K]   dtype of q
  TensorRef v;        // [B, T, HV, V]  f16 | bf16 | f32 | f64
  TensorRef g;        // [B, T, HV, K]  any float: log-decay (natural log), or raw gate
  TensorRef beta;     // [B, T, HV]     any float: post-activation beta, or logits
  TensorRef A_log;    // HV elements, any float; may be undefined (read only with gate in kernel)
  TensorRef dt_bias;  // [HV * K] any float; may be undefined (read only with gate in kernel)
  TensorRef initial_state;  // [N, HV, K, V] (v-first [N, HV, V, K]) f32 | f64 | bf16;
                            // may be undefined (zeros)
  TensorRef cu_seqlens;     // [N + 1] i32 | i64 on the host or the device; may be undefined
  bool safe_gate = false;   // bounded-gate fast path; with the gate in kernel needs
                            // lower_bound in [-5, 0)
  int chunk_size = 64;      // 32 or 64: the chunk of h (and of the CPU backend); the CUDA
                            // kernels always work in 32-token chunks
};

struct ChunkFwdArgs : ChunkProblem {
  TensorRef o;  // [B, T, HV, V] any float (output; chunk_kda returns q's dtype)
  // [N, HV, K, V] (v-first [N, HV, V, K]) f32 | f64; may be undefined. On CUDA it may share
  // memory with initial_state only where the scan is not split in time (can_implement says).
  TensorRef final_state;
  TensorRef h;  // [B, NT_b, HV, K, V] (v-first [.., V, K]) any float: the state at the
                // start of every chunk (NT_b = chunks per batch row); may be undefined
};

struct ChunkBwdArgs : ChunkProblem {
  TensorRef d_o;  // [B, T, HV, V]  any float: dL/do
  TensorRef dht;  // [N, HV, K, V] (v-first [N, HV, V, K]) f32 | f64; may be undefined
  // Gradients (outputs) in any float dtype; the Python layer gives each its input's dtype.
  TensorRef dq;        // [B, T, H, K]
  TensorRef dk;        // [B, T, H, K]
  TensorRef dv;        // [B, T, HV, V]
  TensorRef dg;        // [B, T, HV, K]  w.r.t. the raw gate in kernel mode
  TensorRef dbeta;     // [B, T, HV]     w.r.t. the logits with the in-kernel sigmoid
  TensorRef dA_log;    // A_log's element count; may be defined only if A_log is
  TensorRef ddt_bias;  // [HV * K]; may be defined only if dt_bias is
  TensorRef dh0;       // shape of initial_state, f32 | f64 (output); may be undefined
};

// fused_recurrent_kda and the serving entry point (FLA's fused_recurrent_kda_fwd).
struct RecurrentFwdArgs : KdaOptions {
  TensorRef q;        // [B, T, H, K]   any float
  TensorRef k;        // [B, T, H, K]   dtype of q
  TensorRef v;        // [B, T, HV, V]  any float
  TensorRef g;        // [B, T, HV, K]  any float
  TensorRef beta;     // [B, T, HV] or headwise [B, T, HV, V], any float
  TensorRef A_log;    // HV elements; may be undefined (softplus gate then uses exp(A_log) = e,
                      // as FLA's fused_recurrent_kda does)
  TensorRef dt_bias;  // [HV * K]; may be undefined
  // Without ssm_state_indices: [N, HV, K, V] (v-first [N, HV, V, K]).
  // With ssm_state_indices: a state pool [num_slots, HV, K, V]. Any float; may be undefined.
  TensorRef initial_state;
  TensorRef cu_seqlens;  // [N + 1] i32 | i64; may be undefined
  // [N] or [N, max_tokens] i32 | i64; may be undefined. Host-side indices must lie in
  // [0, num_slots) (checked); on CUDA a slot outside that range (vLLM pads with -1) is neither
  // read (zero state) nor written.
  TensorRef ssm_state_indices;
  TensorRef num_accepted_tokens;     // [N] i32 | i64; may be undefined (needs ssm_state_indices)
  bool inplace_final_state = false;  // write states into initial_state (the pool)
  TensorRef o;                       // [B, T, HV, V] any float (output)
  // Not in place: [N, HV, K, V] f32 | f64 | bf16 | f16, or, with ssm_state_indices, the state
  // after every token [B * T, HV, K, V]. Ignored when inplace_final_state. May be undefined.
  TensorRef final_state;
};

// fused_kda_gate: y = -exp(A_log) * softplus(g + dt_bias) or L * sigmoid(exp(A_log) * (g +
// dt_bias)).
struct GateFwdArgs {
  TensorRef g;        // [..., HV, K] any float: raw gate
  TensorRef A_log;    // HV elements, any float; required unless lower_bound is set
  TensorRef dt_bias;  // [HV * K] any float; may be undefined
  std::optional<double> lower_bound;
  TensorRef y;  // [..., HV, K] any float (output)
  int num_threads = 0;
};

struct GateBwdArgs {
  TensorRef g;        // [..., HV, K]
  TensorRef A_log;    // as in GateFwdArgs
  TensorRef dt_bias;  // as in GateFwdArgs
  std::optional<double> lower_bound;
  TensorRef dy;        // [..., HV, K] any float
  TensorRef dg;        // [..., HV, K] dtype of g (output)
  TensorRef dA_log;    // A_log's element count, any float (output); defined only if A_log is
  TensorRef ddt_bias;  // [HV * K] any float (output); defined only if dt_bias is
  int num_threads = 0;
};

}  // namespace openkda
