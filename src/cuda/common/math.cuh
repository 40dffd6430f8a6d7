// Explicit-precision device math shared by every kernel family.
//
// NOTE: the library is built without --use_fast_math. Every special function below names the
// precision it uses, so a kernel's numerics never depend on global compiler flags:
//   exp_f32, log1p_f32   CUDA's accurate single-precision expf / log1pf (max 2 ulp), not the
//                        __expf / __logf approximations.
//   reciprocal           IEEE round-to-nearest 1/x (__frcp_rn): bitwise equal to 1.0f / x.
//   exp2_operand         ex2.approx.ftz.f32 (max relative error 2^-22, results below 2^-126
//                        flushed to 0): only for factors that are rounded to a tensor-core
//                        operand type (tf32: 2^-11) right after, where it changes nothing
//                        measurable and costs one MUFU instead of exp2f's range handling.
//   inv_one_plus_exp2_fast  1 / (1 + 2^z) by ex2.approx.ftz and rcp.approx.ftz (relative
//                        error below 2^-21, as FLA's Triton sigmoid): sigmoid(x) at
//                        z = -x log2(e), only for the chunk prep's per-element lower-bound gate,
//                        whose log-decays then enter tf32 products (2^-11).
// Storage types are f16 (__half), bf16 (__nv_bfloat16), f32 and f64; arithmetic is f32, as in
// FLA's Triton kernels, and every store rounds to nearest even.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "openkda/tensor_ref.h"

namespace openkda::cuda {

// ---- storage <-> f32 --------------------------------------------------------------------------
__device__ __forceinline__ float to_f32(float x) {
  return x;
}
__device__ __forceinline__ float to_f32(double x) {
  return __double2float_rn(x);
}
__device__ __forceinline__ float to_f32(__half x) {
  return __half2float(x);
}
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) {
  return __bfloat162float(x);
}

template <typename T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ double from_f32<double>(float x) {
  return static_cast<double>(x);
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float x) {
  return __float2half_rn(x);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Element i of a tensor whose dtype (f16, bf16, f32, f64) is a run-time value, as f32, and the
// store of an f32 value into one (rounded to nearest even). The switch is uniform over a launch.
__device__ __forceinline__ float load_f32(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kBF16: return to_f32(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::kF16: return to_f32(static_cast<const __half*>(p)[i]);
    case DType::kF64: return to_f32(static_cast<const double*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

// load_f32 for kPer consecutive elements from offset `i`: scalar loads (no alignment needed beyond
// the element's), one dtype switch for the whole run instead of one per element.
template <int kPer>
__device__ __forceinline__ void load_scalars(const void* base, DType dtype, int64_t i,
                                             float (&out)[kPer]) {
  const auto run = [&](const auto* ptr) {
#pragma unroll
    for (int e = 0; e < kPer; ++e) out[e] = to_f32(ptr[i + e]);
  };
  switch (dtype) {
    case DType::kBF16: run(static_cast<const __nv_bfloat16*>(base)); break;
    case DType::kF16: run(static_cast<const __half*>(base)); break;
    case DType::kF64: run(static_cast<const double*>(base)); break;
    default: run(static_cast<const float*>(base)); break;
  }
}

__device__ __forceinline__ void store_f32(void* p, DType dtype, int64_t i, float x) {
  switch (dtype) {
    case DType::kF16: static_cast<__half*>(p)[i] = from_f32<__half>(x); break;
    case DType::kBF16: static_cast<__nv_bfloat16*>(p)[i] = from_f32<__nv_bfloat16>(x); break;
    case DType::kF64: static_cast<double*>(p)[i] = static_cast<double>(x); break;
    default: static_cast<float*>(p)[i] = x; break;
  }
}

// ---- activations (f32) ------------------------------------------------------------------------
constexpr float kLog2e = 1.4426950408889634f;  // log2(e) = 1 / ln 2, rounded to f32
constexpr float kL2NormEps = 1e-6f;            // inside the square root, as FLA's l2norm

__device__ __forceinline__ float exp_f32(float x) {
  return expf(x);
}
__device__ __forceinline__ float log1p_f32(float x) {
  return log1pf(x);
}

__device__ __forceinline__ float exp2_operand(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// sigmoid(x) = 1 / (1 + exp(-x)); exp(-x) -> inf for x < -88 gives exactly 0, never NaN.
__device__ __forceinline__ float sigmoid_f32(float x) {
  return __frcp_rn(1.0f + exp_f32(-x));
}

// 1 / (1 + 2^z), sigmoid(-z ln 2): the caller folds the multiply by -log2(e) into its own
// arithmetic. z -> +inf gives rcp(inf) = 0 (never NaN); NaN stays NaN.
__device__ __forceinline__ float inv_one_plus_exp2_fast(float z) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.0f + exp2_operand(z)));
  return r;
}

// softplus(x) = log(1 + exp(x)), and x itself above the threshold 20 (FLA's and torch's
// F.softplus threshold): there log1p(exp(x)) - x < 2.1e-9, below f32 resolution of x.
__device__ __forceinline__ float softplus_f32(float x) {
  constexpr float kSoftplusThreshold = 20.0f;
  return x > kSoftplusThreshold ? x : log1p_f32(exp_f32(x));
}

// beta (post-activation): s sigmoid(b) with the sigmoid in the kernel (s = 2 with
// allow_neg_eigval), else b as given.
__device__ __forceinline__ float beta_activation(float b, bool in_kernel_sigmoid, float s) {
  return in_kernel_sigmoid ? s * sigmoid_f32(b) : b;
}

}  // namespace openkda::cuda
