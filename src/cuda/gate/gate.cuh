// Device stage of fused_kda_gate: the KDA gate activation and its derivative, per element.
//
// What it computes (FLA 0.6.0 fused_kda_gate; spec sections 3.2 and 5.2 B7), in f32 for every
// storage dtype, with x = g + dt_bias[c] (dt_bias undefined: x = g):
//   softplus gate     y = -exp(A_log[h]) * softplus(x)              (A_log undefined: -e * ...)
//                     dx = -exp(A_log[h]) * (dy * sigmoid(x)),       dA_log[h] += dy * y
//   lower-bound gate  y = L * sigmoid(a * x),  a = exp(A_log[h])     (A_log undefined: a = 1)
//                     dx = dy * (L * s * (1 - s)) * a, s = sigmoid(a * x),  dA_log[h] += dx * x
// and dg = dx, ddt_bias[c] = sum over rows of dx (the f32 dx, before dg is rounded).
//
// Grid mapping (see traits.h): g is [M, C], C = HV * K; thread (x, y) of block (bx, by) owns
// columns [(bx * block_x + x) * kVec, + kVec) and rows by * block_y + y + i * gridDim.y * block_y.
// The kVec columns of a thread share one head (the vector path requires K % kVec == 0).
//
// Inputs:  g [M, C] f16|bf16|f32|f64, dy [M, C] (bwd) f16|bf16|f32|f64, A_log [HV] and
//          dt_bias [C] f16|bf16|f32|f64 (each may be null).
// Outputs: y [M, C] any float (fwd); dg [M, C] dtype of g, dA_log [HV] dtype of A_log,
//          ddt_bias [C] dtype of dt_bias (bwd).
// Shared memory: forward none; backward 2 x kThreads x kVec f32 = 16 KB (vector path) for the
// per-column row-tree reduction; the second pass 1 KB.
#pragma once

#include <cstdint>

#include "cuda/common/math.cuh"
#include "openkda/tensor_ref.h"

namespace openkda::cuda {

// Kernel view of GateFwdArgs / GateBwdArgs, filled by one function per op in launch.cu.
struct GateParams {
  const void* g = nullptr;        // [M, C] raw gate
  void* y = nullptr;              // [M, C] output (fwd)
  const void* dy = nullptr;       // [M, C] dL/dy (bwd)
  void* dg = nullptr;             // [M, C] dL/dg, dtype of g (bwd)
  const void* A_log = nullptr;    // [HV]; may be null
  const void* dt_bias = nullptr;  // [C]; may be null
  void* dA_log = nullptr;         // [HV] dtype of A_log (bwd); null iff A_log is
  void* ddt_bias = nullptr;       // [C] dtype of dt_bias (bwd); null iff dt_bias is
  float* ws_dA_log = nullptr;     // [grid_y, C] f32 per-column partials of dA_log (bwd)
  float* ws_ddt_bias = nullptr;   // [grid_y, C] f32 per-column partials of ddt_bias (bwd)
  DType A_log_dtype = DType::kUndefined;
  DType dt_bias_dtype = DType::kUndefined;
  DType dA_log_dtype = DType::kUndefined;
  DType ddt_bias_dtype = DType::kUndefined;
  int64_t rows = 0;               // M
  int64_t cols = 0;               // C = HV * K
  int64_t head_dim = 0;           // K
  int64_t heads = 0;              // HV
  int64_t partial_rows = 0;       // grid_y of the backward kernel (bwd)
  bool lower_bound_gate = false;  // lower-bound (sigmoid) gate instead of softplus
  float lower_bound = 0.0f;       // L
};

// Per-head factor of the activation: softplus gate -exp(A_log[h]) (A_log null: -exp(1), as FLA's
// kernel loads 1.0 for a missing A_log); lower-bound gate exp(A_log[h]) (A_log null: 1).
__device__ __forceinline__ float gate_head_factor(const GateParams& p, int64_t head) {
  if (p.lower_bound_gate) {
    return p.A_log ? exp_f32(load_f32(p.A_log, p.A_log_dtype, head)) : 1.0f;
  }
  const float a_log = p.A_log ? load_f32(p.A_log, p.A_log_dtype, head) : 1.0f;
  return -exp_f32(a_log);
}

// Forward activation of one element; x already includes dt_bias.
__device__ __forceinline__ float gate_fwd(const GateParams& p, float x, float head_factor) {
  if (p.lower_bound_gate) return p.lower_bound * sigmoid_f32(head_factor * x);
  return head_factor * softplus_f32(x);
}

// Backward of one element: returns dx (= dg = this element's ddt_bias term) and sets dA_term,
// this element's contribution to dA_log[h].
__device__ __forceinline__ float gate_bwd(const GateParams& p, float x, float dy, float head_factor,
                                          float& dA_term) {
  if (p.lower_bound_gate) {
    const float s = sigmoid_f32(head_factor * x);
    const float dx = dy * (p.lower_bound * (s * (1.0f - s))) * head_factor;
    dA_term = dx * x;
    return dx;
  }
  const float y = head_factor * softplus_f32(x);
  dA_term = dy * y;
  return head_factor * (dy * sigmoid_f32(x));
}

}  // namespace openkda::cuda
