// CUDA runtime errors -> openkda::Status.
//
// Launchers return Status; they never throw and never synchronise. A failed runtime call becomes
// StatusCode::kInternal with the message "<op>: <what>: <cudaErrorName> (<description>); expected
// cudaSuccess", following the library's "<op>: <argument>: <seen>; expected <expected>" format.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "openkda/status.h"

namespace openkda::cuda {

inline Status cuda_status(cudaError_t err, const char* op, const char* what) {
  if (err == cudaSuccess) return Status::Ok();
  return Status::Internal(std::string(op) + ": " + what + ": " + cudaGetErrorName(err) + " (" +
                          cudaGetErrorString(err) + "); expected cudaSuccess");
}

}  // namespace openkda::cuda

// Returns a kInternal Status from the enclosing function when the runtime call `expr` fails.
#define OPENKDA_CUDA_RETURN_IF_ERROR(op, expr)                        \
  do {                                                                \
    const cudaError_t _openkda_err = (expr);                          \
    if (_openkda_err != cudaSuccess)                                  \
      return ::openkda::cuda::cuda_status(_openkda_err, (op), #expr); \
  } while (0)

// Checks the launch of `kernel_name` just issued (configuration errors, missing image for the
// device's architecture). Asynchronous faults surface at the caller's next synchronisation.
#define OPENKDA_CUDA_CHECK_LAUNCH(op, kernel_name)                                       \
  do {                                                                                   \
    const cudaError_t _openkda_err = cudaGetLastError();                                 \
    if (_openkda_err != cudaSuccess)                                                     \
      return ::openkda::cuda::cuda_status(_openkda_err, (op), "launch of " kernel_name); \
  } while (0)
