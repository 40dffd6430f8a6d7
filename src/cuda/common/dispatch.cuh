// Runtime dtype -> compile-time storage type for the gate launchers (the chunk and recurrent
// kernels take their dtypes as run-time values, except recurrent's state width, which
// recurrent/launch.cu's pick_kernel maps to a compiled run length).
//
//   dispatch_float(dtype, [&](auto tag) { using T = typename decltype(tag)::type; ... });
//
// The functor returns Status; a dtype without a compiled variant returns kNotSupported listing
// the compiled ones (the core's can_implement normally rejects it first).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>
#include <utility>

#include "openkda/status.h"
#include "openkda/tensor_ref.h"

namespace openkda::cuda {

// The dtype's name in messages ("bf16", "f32", ...).
inline const char* dtype_label(DType dtype) {
  return dtype_name(dtype);
}

template <typename T>
struct TypeTag {
  using type = T;
};

// Storage types of float tensors: f16, bf16, f32, f64.
template <typename Fn>
Status dispatch_float(DType dtype, const char* op, const char* argument, Fn&& fn) {
  switch (dtype) {
    case DType::kF16: return std::forward<Fn>(fn)(TypeTag<__half>{});
    case DType::kBF16: return std::forward<Fn>(fn)(TypeTag<__nv_bfloat16>{});
    case DType::kF32: return std::forward<Fn>(fn)(TypeTag<float>{});
    case DType::kF64: return std::forward<Fn>(fn)(TypeTag<double>{});
    default:
      return Status::NotSupported(std::string(op) + ": " + argument + ": dtype " +
                                  dtype_label(dtype) + "; expected f16, bf16, f32 or f64 on CUDA");
  }
}

}  // namespace openkda::cuda
