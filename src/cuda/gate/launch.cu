// Host launchers of fused_kda_gate (forward, backward): GateFwdArgs / GateBwdArgs -> GateParams,
// launch plan, dtype dispatch, kernel launches. No framework headers, no allocation, no host sync.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/common/check.cuh"
#include "cuda/common/dispatch.cuh"
#include "cuda/gate/kernels.cuh"
#include "cuda/gate/traits.h"
#include "cuda/launch.h"

namespace openkda::cuda {
namespace {

constexpr const char* kFwdOp = "fused_kda_gate";
constexpr const char* kBwdOp = "fused_kda_gate_bwd";
constexpr int kVec = GateTraits::kVec;

// g [..., HV, K] viewed as [M, C]: M = product of the leading dims, C = HV * K.
struct GateShape {
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
};

GateShape gate_shape(const TensorRef& g) {
  GateShape s;
  s.heads = g.shape[g.ndim - 2];
  s.head_dim = g.shape[g.ndim - 1];
  s.cols = s.heads * s.head_dim;
  s.rows = 1;
  for (int d = 0; d < g.ndim - 2; ++d) s.rows *= g.shape[d];
  return s;
}

Status check_rank(const TensorRef& g, const char* op) {
  if (g.ndim >= 2) return Status::Ok();
  return Status::InvalidArgument(std::string(op) + ": g: rank " + std::to_string(g.ndim) +
                                 "; expected rank >= 2 [..., HV, K]");
}

bool is_aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

size_t float_bytes(DType dtype) {
  return dtype == DType::kF64 ? 8 : dtype == DType::kF32 ? 4 : 2;
}

// Workspace of the backward pass: [grid_y, C] f32 partials of ddt_bias, then of dA_log, each
// present only when its gradient is requested, at offsets that are multiples of 128 bytes.
struct BwdWorkspaceLayout {
  bool has_ddt_bias = false;
  bool has_dA_log = false;
  size_t ddt_bias_offset = 0;
  size_t dA_log_offset = 0;
  size_t bytes = 0;
};

BwdWorkspaceLayout bwd_workspace_layout(const GateBwdArgs& args, const GateShape& shape,
                                        const GatePlan& plan) {
  constexpr size_t kAlign = GateTraits::kWorkspaceAlign;
  const size_t partial_bytes = static_cast<size_t>(plan.grid_y * shape.cols) * sizeof(float);
  const size_t stride = (partial_bytes + kAlign - 1) / kAlign * kAlign;
  BwdWorkspaceLayout layout;
  layout.has_ddt_bias = args.dt_bias.defined() && args.ddt_bias.defined();
  layout.has_dA_log = args.A_log.defined() && args.dA_log.defined();
  if (layout.has_ddt_bias) {
    layout.ddt_bias_offset = layout.bytes;
    layout.bytes += stride;
  }
  if (layout.has_dA_log) {
    layout.dA_log_offset = layout.bytes;
    layout.bytes += stride;
  }
  return layout;
}

// Fields shared by both directions: shape, parameters, gate mode.
GateParams make_common_params(const TensorRef& g, const TensorRef& A_log, const TensorRef& dt_bias,
                              const std::optional<double>& lower_bound) {
  const GateShape shape = gate_shape(g);
  GateParams p;
  p.g = g.data;
  if (A_log.defined()) {
    p.A_log = A_log.data;
    p.A_log_dtype = A_log.dtype;
  }
  if (dt_bias.defined()) {
    p.dt_bias = dt_bias.data;
    p.dt_bias_dtype = dt_bias.dtype;
  }
  p.rows = shape.rows;
  p.cols = shape.cols;
  p.heads = shape.heads;
  p.head_dim = shape.head_dim;
  p.lower_bound_gate = lower_bound.has_value();
  p.lower_bound = lower_bound ? static_cast<float>(*lower_bound) : 0.0f;
  return p;
}

GateParams make_fwd_params(const GateFwdArgs& args) {
  GateParams p = make_common_params(args.g, args.A_log, args.dt_bias, args.lower_bound);
  p.y = args.y.data;
  return p;
}

GateParams make_bwd_params(const GateBwdArgs& args, const BwdWorkspaceLayout& layout,
                           const GatePlan& plan, Workspace workspace) {
  GateParams p = make_common_params(args.g, args.A_log, args.dt_bias, args.lower_bound);
  p.dy = args.dy.data;
  p.dg = args.dg.data;
  p.partial_rows = plan.grid_y;
  char* ws = static_cast<char*>(workspace.data);
  if (layout.has_ddt_bias) {
    p.ddt_bias = args.ddt_bias.data;
    p.ddt_bias_dtype = args.ddt_bias.dtype;
    p.ws_ddt_bias = reinterpret_cast<float*>(ws + layout.ddt_bias_offset);
  }
  if (layout.has_dA_log) {
    p.dA_log = args.dA_log.data;
    p.dA_log_dtype = args.dA_log.dtype;
    p.ws_dA_log = reinterpret_cast<float*>(ws + layout.dA_log_offset);
  }
  return p;
}

// Grid of the fwd/bwd kernels: column blocks of block_x groups of kCols columns, plan.grid_y rows.
template <int kCols>
dim3 gate_grid(const GateParams& p, const GatePlan& plan) {
  const int64_t groups = ceil_div(p.cols, kCols);
  return dim3(static_cast<unsigned>(ceil_div(groups, plan.block_x)),
              static_cast<unsigned>(plan.grid_y));
}

template <typename TIn, typename TOut, int kCols>
Status launch_fwd(const GateParams& p, const GatePlan& plan, cudaStream_t stream) {
  const dim3 block(plan.block_x, plan.block_y);
  openkda_fwd_gate_kernel<TIn, TOut, kCols><<<gate_grid<kCols>(p, plan), block, 0, stream>>>(p);
  OPENKDA_CUDA_CHECK_LAUNCH(kFwdOp, "openkda_fwd_gate_kernel");
  return Status::Ok();
}

template <typename TG, typename TDy, int kCols>
Status launch_bwd(const GateParams& p, const GatePlan& plan, cudaStream_t stream) {
  const dim3 block(plan.block_x, plan.block_y);
  openkda_bwd_gate_kernel<TG, TDy, kCols><<<gate_grid<kCols>(p, plan), block, 0, stream>>>(p);
  OPENKDA_CUDA_CHECK_LAUNCH(kBwdOp, "openkda_bwd_gate_kernel");
  return Status::Ok();
}

Status launch_bwd_reduce(const GateParams& p, cudaStream_t stream) {
  const int64_t blocks =
      (p.ws_ddt_bias ? ceil_div(p.cols, GateTraits::kReduceCols) : 0) + (p.ws_dA_log ? p.heads : 0);
  if (blocks == 0) return Status::Ok();
  openkda_bwd_gate_reduce_kernel<<<static_cast<unsigned>(blocks), GateTraits::kReduceThreads, 0,
                                   stream>>>(p);
  OPENKDA_CUDA_CHECK_LAUNCH(kBwdOp, "openkda_bwd_gate_reduce_kernel");
  return Status::Ok();
}

}  // namespace

Status gate_fwd(const GateFwdArgs& args, Stream stream) {
  OPENKDA_RETURN_IF_ERROR(check_rank(args.g, kFwdOp));
  const GateParams p = make_fwd_params(args);
  if (p.rows == 0 || p.cols == 0) return Status::Ok();
  const GatePlan plan = make_gate_plan(p.rows, p.cols, /*backward=*/false);
  const auto s = static_cast<cudaStream_t>(stream);
  return dispatch_float(args.g.dtype, kFwdOp, "g", [&](auto g_tag) {
    using TIn = typename decltype(g_tag)::type;
    return dispatch_float(args.y.dtype, kFwdOp, "y", [&](auto y_tag) {
      using TOut = typename decltype(y_tag)::type;
      // Vector path: 16-byte-class packs need whole packs inside one head and aligned bases.
      const bool vec = p.head_dim % kVec == 0 && is_aligned(p.g, kVec * sizeof(TIn)) &&
                       is_aligned(p.y, kVec * sizeof(TOut));
      return vec ? launch_fwd<TIn, TOut, kVec>(p, plan, s) : launch_fwd<TIn, TOut, 1>(p, plan, s);
    });
  });
}

size_t gate_bwd_workspace_bytes(const GateBwdArgs& args) {
  if (args.g.ndim < 2) return 0;
  const GateShape shape = gate_shape(args.g);
  const GatePlan plan = make_gate_plan(shape.rows, shape.cols, /*backward=*/true);
  return bwd_workspace_layout(args, shape, plan).bytes;
}

Status gate_bwd(const GateBwdArgs& args, Workspace workspace, Stream stream) {
  OPENKDA_RETURN_IF_ERROR(check_rank(args.g, kBwdOp));
  const GateShape shape = gate_shape(args.g);
  const GatePlan plan = make_gate_plan(shape.rows, shape.cols, /*backward=*/true);
  const BwdWorkspaceLayout layout = bwd_workspace_layout(args, shape, plan);
  if (workspace.bytes < layout.bytes || (layout.bytes > 0 && workspace.data == nullptr)) {
    return Status::InvalidArgument(std::string(kBwdOp) +
                                   ": workspace: " + std::to_string(workspace.bytes) + " bytes" +
                                   (workspace.data ? "" : " at null") + "; expected at least " +
                                   std::to_string(layout.bytes) + " bytes");
  }
  if (args.dg.dtype != args.g.dtype) {  // the kernels write dg in g's storage type
    return Status::NotSupported(std::string(kBwdOp) + ": dg: dtype " + dtype_label(args.dg.dtype) +
                                "; expected g's dtype " + dtype_label(args.g.dtype));
  }
  const GateParams p = make_bwd_params(args, layout, plan, workspace);
  const auto s = static_cast<cudaStream_t>(stream);

  if (p.cols == 0) {  // K == 0 or HV == 0: nothing to read; dA_log is all zeros
    if (p.dA_log && p.heads > 0) {
      OPENKDA_CUDA_RETURN_IF_ERROR(
          kBwdOp, cudaMemsetAsync(p.dA_log, 0, p.heads * float_bytes(args.dA_log.dtype), s));
    }
    return Status::Ok();
  }

  // Pass 1 also runs for M == 0: it then writes zero partials, so the sums come out as zeros.
  OPENKDA_RETURN_IF_ERROR(dispatch_float(args.g.dtype, kBwdOp, "g", [&](auto g_tag) {
    using TG = typename decltype(g_tag)::type;
    return dispatch_float(args.dy.dtype, kBwdOp, "dy", [&](auto dy_tag) {
      using TDy = typename decltype(dy_tag)::type;
      const bool vec = p.head_dim % kVec == 0 && is_aligned(p.g, kVec * sizeof(TG)) &&
                       is_aligned(p.dy, kVec * sizeof(TDy)) && is_aligned(p.dg, kVec * sizeof(TG));
      return vec ? launch_bwd<TG, TDy, kVec>(p, plan, s) : launch_bwd<TG, TDy, 1>(p, plan, s);
    });
  }));
  return launch_bwd_reduce(p, s);
}

}  // namespace openkda::cuda
