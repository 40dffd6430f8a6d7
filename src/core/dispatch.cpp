// The host protocol of every op, and the one place where run-time values become compile-time
// choices: device (CPU backend or CUDA launchers) and CPU compute precision (float or double).
#include <string>
#include <type_traits>

#include "core/convert.h"
#include "core/problem.h"
#include "core/validate.h"
#include "cpu/chunk_bwd.h"
#include "cpu/chunk_common.h"
#include "cpu/gate.h"
#include "cpu/parallel.h"
#include "cpu/recurrent.h"
#include "openkda/api.h"
#ifdef OPENKDA_WITH_CUDA
#include "cuda/chunk_fwd/launch_chunk_fwd.h"
#include "cuda/launch.h"
#include "cuda/recurrent/launch_recurrent.h"
#endif

namespace openkda {
namespace {

bool on_cuda(const TensorRef& t) {
  return t.device.type == DeviceType::kCUDA;
}

// A CUDA tensor in a build without the CUDA backend (OPENKDA_ENABLE_CUDA=OFF).
[[maybe_unused]] Status no_cuda_backend(const char* op, const char* tensor) {
  return Status::NotSupported(std::string(op) + ": " + tensor +
                              ".device cuda; expected cpu (this build has no CUDA backend: "
                              "configure with OPENKDA_ENABLE_CUDA=ON)");
}

#ifdef OPENKDA_WITH_CUDA
// The launchers enqueue on the current device (the caller's cudaSetDevice, as every CUDA library
// does); tensors on another device would be addressed through the wrong context. Checked last,
// after the arguments themselves are known to be valid.
Status check_current_device(const char* op, const char* name, const TensorRef& t) {
  const int current = cuda::current_device();
  if (current == t.device.index) return Status::Ok();
  const std::string seen = std::string(name) + ".device cuda:" + std::to_string(t.device.index);
  if (current < 0)
    return Status::NotSupported(std::string(op) + ": " + seen +
                                "; expected a current CUDA device (cudaGetDevice failed: no "
                                "device or driver)");
  return Status::InvalidArgument(std::string(op) + ": " + seen +
                                 "; expected the current CUDA device cuda:" +
                                 std::to_string(current) + " (cudaSetDevice before the call)");
}
#endif

Status check_workspace(const char* op, Workspace ws, size_t needed) {
  if (ws.bytes < needed)
    return Status::InvalidArgument(std::string(op) + ": workspace: " + std::to_string(ws.bytes) +
                                   " bytes; expected at least " + std::to_string(needed));
  if (needed > 0 && ws.data == nullptr)
    return Status::InvalidArgument(std::string(op) + ": workspace.data = null; expected a " +
                                   std::to_string(needed) + "-byte buffer");
  if (needed > 0 && reinterpret_cast<uintptr_t>(ws.data) % 16 != 0)
    return Status::InvalidArgument(std::string(op) + ": workspace.data address % 16 = " +
                                   std::to_string(reinterpret_cast<uintptr_t>(ws.data) % 16) +
                                   "; expected a 16-byte aligned buffer");
  return Status::Ok();
}

// Runs `f.template operator()<T>()` with T = double or float.
template <class F>
auto with_precision(bool use_double, F&& f) {
  return use_double ? f(double{}) : f(float{});
}

bool chunk_uses_double(const ChunkProblem& p) {
  return p.algorithm == Algorithm::kRecurrentReference || p.precision == Precision::kF64;
}

template <class T>
size_t chunk_plan_bytes(const ChunkProblem& p, bool backward) {
  const ProblemDims d = resolve_dims(p.q, p.v, p.cu_seqlens, p.chunk_size);
  WorkspacePlan plan;
  cpu::plan_chunk_buffers<T>(d, backward, plan);
  return plan.bytes();
}

template <class T>
void chunk_fwd_cpu(const ChunkFwdArgs& a, Workspace ws) {
  const ProblemDims d = resolve_dims(a.q, a.v, a.cu_seqlens, a.chunk_size);
  WorkspacePlan plan(ws.data);
  cpu::ChunkBuffers<T> b = cpu::plan_chunk_buffers<T>(d, false, plan);
  const int threads = cpu::resolve_threads(a.num_threads);
  cpu::prepare_inputs(a, d, b, nullptr, nullptr, threads);
  const T scale = T(effective_scale(a, d.K));
  cpu::parallel_for(d.N * d.HV, threads, [&](int64_t task) {
    if constexpr (std::is_same_v<T, double>) {
      if (a.algorithm == Algorithm::kRecurrentReference) {
        cpu::reference_forward_sequence(b, d, task / d.HV, task % d.HV, scale);
        return;
      }
    }
    cpu::chunk_forward_sequence(b, d, task / d.HV, task % d.HV, scale, /*output=*/true);
  });
  store_array(b.o, d.tokens() * d.HV * d.V, a.o, 0);
  cpu::store_states(b.ht, d.N, d, a.state_v_first, a.final_state);
  cpu::store_states(b.h, d.NT_total, d, a.state_v_first, a.h);
}

template <class T>
void chunk_bwd_cpu(const ChunkBwdArgs& a, Workspace ws) {
  const ProblemDims d = resolve_dims(a.q, a.v, a.cu_seqlens, a.chunk_size);
  WorkspacePlan plan(ws.data);
  cpu::ChunkBuffers<T> b = cpu::plan_chunk_buffers<T>(d, true, plan);
  const int threads = cpu::resolve_threads(a.num_threads);
  cpu::prepare_inputs(a, d, b, &a.d_o, &a.dht, threads);
  const T scale = T(effective_scale(a, d.K));
  cpu::parallel_for(d.N * d.HV, threads, [&](int64_t task) {
    if constexpr (std::is_same_v<T, double>) {
      if (a.algorithm == Algorithm::kRecurrentReference) {
        cpu::reference_backward_sequence(b, d, task / d.HV, task % d.HV, scale);
        return;
      }
    }
    cpu::chunk_backward_sequence(b, d, task / d.HV, task % d.HV, scale);
  });
  cpu::finish_backward(a, d, b, threads);
}

}  // namespace

// ---- chunk_kda forward -------------------------------------------------------------------------
Status can_implement(const ChunkFwdArgs& a) {
  OPENKDA_RETURN_IF_ERROR(validate(a));
  if (on_cuda(a.q)) {
#ifdef OPENKDA_WITH_CUDA
    OPENKDA_RETURN_IF_ERROR(cuda::chunk_fwd_can_implement(a));
    return check_current_device("chunk_kda", "q", a.q);
#else
    return no_cuda_backend("chunk_kda", "q");
#endif
  }
  return Status::Ok();
}

// Scratch of validated args (run() and workspace_bytes() validate once, then call this).
static size_t chunk_fwd_bytes(const ChunkFwdArgs& a) {
#ifdef OPENKDA_WITH_CUDA
  if (on_cuda(a.q)) return cuda::chunk_fwd_workspace_bytes(a);  // never reads device memory
#endif
  return with_precision(chunk_uses_double(a),
                        [&](auto t) { return chunk_plan_bytes<decltype(t)>(a, false); });
}

size_t workspace_bytes(const ChunkFwdArgs& a) {
  return can_implement(a).ok() ? chunk_fwd_bytes(a) : 0;
}

Status run(const ChunkFwdArgs& a, Workspace ws, Stream stream) {
  OPENKDA_RETURN_IF_ERROR(can_implement(a));
  OPENKDA_RETURN_IF_ERROR(check_workspace("chunk_kda", ws, chunk_fwd_bytes(a)));
#ifdef OPENKDA_WITH_CUDA
  if (on_cuda(a.q)) return cuda::chunk_fwd(a, ws, stream);
#endif
  with_precision(chunk_uses_double(a), [&](auto t) { chunk_fwd_cpu<decltype(t)>(a, ws); });
  return Status::Ok();
}

// ---- chunk_kda backward ------------------------------------------------------------------------
Status can_implement(const ChunkBwdArgs& a) {
  OPENKDA_RETURN_IF_ERROR(validate(a));
  if (on_cuda(a.q))
    return Status::NotSupported(
        "chunk_kda_bwd: q.device cuda; expected cpu (the chunk_kda backward has no CUDA kernel "
        "yet)");
  return Status::Ok();
}

static size_t chunk_bwd_bytes(const ChunkBwdArgs& a) {
  return with_precision(chunk_uses_double(a),
                        [&](auto t) { return chunk_plan_bytes<decltype(t)>(a, true); });
}

size_t workspace_bytes(const ChunkBwdArgs& a) {
  return can_implement(a).ok() ? chunk_bwd_bytes(a) : 0;
}

Status run(const ChunkBwdArgs& a, Workspace ws, Stream) {
  OPENKDA_RETURN_IF_ERROR(can_implement(a));
  OPENKDA_RETURN_IF_ERROR(check_workspace("chunk_kda_bwd", ws, chunk_bwd_bytes(a)));
  with_precision(chunk_uses_double(a), [&](auto t) { chunk_bwd_cpu<decltype(t)>(a, ws); });
  return Status::Ok();
}

// ---- fused_recurrent_kda -----------------------------------------------------------------------
Status can_implement(const RecurrentFwdArgs& a) {
  OPENKDA_RETURN_IF_ERROR(validate(a));
  if (on_cuda(a.q)) {
#ifdef OPENKDA_WITH_CUDA
    OPENKDA_RETURN_IF_ERROR(cuda::recurrent_fwd_supported(a));
    return check_current_device("fused_recurrent_kda", "q", a.q);
#else
    return no_cuda_backend("fused_recurrent_kda", "q");
#endif
  }
  return Status::Ok();
}

size_t workspace_bytes(const RecurrentFwdArgs&) {
  return 0;
}

Status run(const RecurrentFwdArgs& a, Workspace, Stream stream) {
  OPENKDA_RETURN_IF_ERROR(can_implement(a));
#ifdef OPENKDA_WITH_CUDA
  if (on_cuda(a.q)) return cuda::recurrent_fwd(a, stream);
#endif
  with_precision(a.precision == Precision::kF64,
                 [&](auto t) { cpu::recurrent_fwd_cpu<decltype(t)>(a); });
  return Status::Ok();
}

// ---- fused_kda_gate ----------------------------------------------------------------------------
Status can_implement(const GateFwdArgs& a) {
  OPENKDA_RETURN_IF_ERROR(validate(a));
#ifdef OPENKDA_WITH_CUDA
  if (on_cuda(a.g)) return check_current_device("fused_kda_gate", "g", a.g);
#endif
  return Status::Ok();
}

size_t workspace_bytes(const GateFwdArgs&) {
  return 0;
}

Status run(const GateFwdArgs& a, Workspace, Stream stream) {
  OPENKDA_RETURN_IF_ERROR(can_implement(a));
  if (on_cuda(a.g)) {
#ifdef OPENKDA_WITH_CUDA
    return cuda::gate_fwd(a, stream);
#else
    return no_cuda_backend("fused_kda_gate", "g");
#endif
  }
  cpu::gate_fwd_cpu(a);
  return Status::Ok();
}

Status can_implement(const GateBwdArgs& a) {
  OPENKDA_RETURN_IF_ERROR(validate(a));
#ifdef OPENKDA_WITH_CUDA
  if (on_cuda(a.g)) return check_current_device("fused_kda_gate_bwd", "g", a.g);
#endif
  return Status::Ok();
}

size_t workspace_bytes(const GateBwdArgs& a) {
#ifdef OPENKDA_WITH_CUDA
  if (on_cuda(a.g) && validate(a).ok()) return cuda::gate_bwd_workspace_bytes(a);
#endif
  return 0;
}

Status run(const GateBwdArgs& a, Workspace ws, Stream stream) {
  OPENKDA_RETURN_IF_ERROR(can_implement(a));
  if (on_cuda(a.g)) {
#ifdef OPENKDA_WITH_CUDA
    OPENKDA_RETURN_IF_ERROR(
        check_workspace("fused_kda_gate_bwd", ws, cuda::gate_bwd_workspace_bytes(a)));
    return cuda::gate_bwd(a, ws, stream);
#else
    return no_cuda_backend("fused_kda_gate_bwd", "g");
#endif
  }
  cpu::gate_bwd_cpu(a);
  return Status::Ok();
}

BuildConfig build_config() {
  BuildConfig c;
#ifdef OPENKDA_WITH_CUDA
  c.cuda = true;
  c.cuda_archs = OPENKDA_CUDA_ARCHS_STR;
#endif
  c.version = OPENKDA_VERSION;
  return c;
}

}  // namespace openkda
