// Host launcher of fused_recurrent_kda (decode / speculative verify): RecurrentFwdArgs ->
// RecurrentParams in one function, then the one place where run-time K, V, state layout and
// state dtype width become a compiled kernel (each instantiated by cmake/OpenkdaCuda.cmake). No
// framework headers, no allocation, no host synchronisation.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "cuda/common/check.cuh"
#include "cuda/common/device.cuh"
#include "cuda/common/dispatch.cuh"
#include "cuda/recurrent/launch_recurrent.h"
#include "cuda/recurrent/params.h"
#include "cuda/recurrent/traits.h"

namespace openkda::cuda {
namespace recurrent {
// Defined in kernel.cuh; explicitly instantiated by cmake/OpenkdaCuda.cmake.
template <class Tr>
cudaError_t launch_recurrent(const RecurrentParams& p, cudaStream_t stream);
// Defined in stream.cuh; explicitly instantiated by cmake/OpenkdaCuda.cmake.
template <class Tr>
cudaError_t launch_recurrent_stream(const RecurrentParams& p, cudaStream_t stream);
}  // namespace recurrent

namespace {

using recurrent::RecurrentParams;
using recurrent::RecurrentTraits;
using recurrent::StreamTraits;
using LaunchFn = cudaError_t (*)(const RecurrentParams&, cudaStream_t);

constexpr const char* kOp = "fused_recurrent_kda";
constexpr int kCtaColumns = 64;  // RecurrentTraits::kBlockV of every compiled kernel

const TensorRef& state_destination(const RecurrentFwdArgs& a) {
  return a.inplace_final_state ? a.initial_state : a.final_state;
}

// The dtype whose 16-byte runs set the thread tile: the state read (the pool), else the state
// written; 2-byte dtypes move 8 elements per run, 4- and 8-byte ones 4.
int run_elems(const RecurrentFwdArgs& a) {
  const TensorRef& s = a.initial_state.defined() ? a.initial_state : state_destination(a);
  return s.defined() && (s.dtype == DType::kBF16 || s.dtype == DType::kF16) ? 8 : 4;
}

bool aligned_16(const TensorRef& t) {
  return !t.defined() || reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
}

int64_t num_sequences(const RecurrentFwdArgs& a) {
  return a.cu_seqlens.defined() ? a.cu_seqlens.numel() - 1 : a.q.shape[0];
}

RecurrentParams make_params(const RecurrentFwdArgs& a) {
  RecurrentParams p;
  const int64_t K = a.q.shape[3];
  p.q = a.q.data;
  p.k = a.k.data;
  p.v = a.v.data;
  p.g = a.g.data;
  p.beta = a.beta.data;
  p.o = a.o.data;
  p.qk_dtype = a.q.dtype;
  p.v_dtype = a.v.dtype;
  p.g_dtype = a.g.dtype;
  p.beta_dtype = a.beta.dtype;
  p.o_dtype = a.o.dtype;
  p.headwise_beta = a.beta.ndim == 4;

  p.T = a.q.shape[1];
  p.N = static_cast<int>(num_sequences(a));
  p.H = static_cast<int>(a.q.shape[2]);
  p.HV = static_cast<int>(a.v.shape[2]);
  p.group = p.HV / p.H;
  if (a.cu_seqlens.defined()) {
    p.cu_seqlens = a.cu_seqlens.data;
    p.cu_dtype = a.cu_seqlens.dtype;
  }

  p.scale = static_cast<float>(effective_scale(a, K));
  p.l2norm = a.use_qk_l2norm_in_kernel;
  p.gate_in_kernel = a.use_gate_in_kernel;
  p.has_lower_bound = a.lower_bound.has_value();
  p.lower_bound = p.has_lower_bound ? static_cast<float>(*a.lower_bound) : 0.0f;
  // FLA's fused_recurrent_kda: A_log undefined -> exp(A) = e for softplus, 1 for the lower bound.
  p.a_default = p.has_lower_bound ? 1.0f : static_cast<float>(std::exp(1.0));
  if (a.use_gate_in_kernel && a.A_log.defined()) {
    p.A_log = a.A_log.data;
    p.A_log_dtype = a.A_log.dtype;
  }
  if (a.use_gate_in_kernel && a.dt_bias.defined()) {
    p.dt_bias = a.dt_bias.data;
    p.dt_bias_dtype = a.dt_bias.dtype;
  }
  p.beta_sigmoid = a.use_beta_sigmoid_in_kernel;
  p.beta_scale = a.allow_neg_eigval ? 2.0f : 1.0f;

  p.pool = a.ssm_state_indices.defined();
  if (p.pool) {
    p.state_indices = a.ssm_state_indices.data;
    p.idx_dtype = a.ssm_state_indices.dtype;
    p.idx_cols = a.ssm_state_indices.ndim == 2 ? a.ssm_state_indices.shape[1] : 1;
    p.num_slots = a.initial_state.defined() ? a.initial_state.shape[0] : 0;
  }
  if (a.num_accepted_tokens.defined()) {
    p.num_accepted = a.num_accepted_tokens.data;
    p.acc_dtype = a.num_accepted_tokens.dtype;
  }
  if (a.initial_state.defined()) {
    p.h0 = a.initial_state.data;
    p.h0_dtype = a.initial_state.dtype;
  }
  const TensorRef& ht = state_destination(a);
  if (ht.defined()) {
    p.ht = ht.data;
    p.ht_dtype = ht.dtype;
  }
  p.inplace = p.pool && a.inplace_final_state && ht.defined();
  p.store_each_token = p.pool && ht.defined();
  p.store_final = !p.pool && ht.defined();
  return p;
}

template <bool kVFirst, int kVec>
LaunchFn pick_dims(int64_t K, int64_t V) {
  using recurrent::launch_recurrent;
  if (K == 64) {
    return V == 64 ? &launch_recurrent<RecurrentTraits<64, 64, kVFirst, kVec>>
                   : &launch_recurrent<RecurrentTraits<64, 128, kVFirst, kVec>>;
  }
  return V == 64 ? &launch_recurrent<RecurrentTraits<128, 64, kVFirst, kVec>>
                 : &launch_recurrent<RecurrentTraits<128, 128, kVFirst, kVec>>;
}

// Run-time choices -> the compiled kernel (K and V already checked to be 64 or 128).
LaunchFn pick_kernel(int64_t K, int64_t V, bool v_first, int vec) {
  if (v_first) return vec == 8 ? pick_dims<true, 8>(K, V) : pick_dims<true, 4>(K, V);
  return vec == 8 ? pick_dims<false, 8>(K, V) : pick_dims<false, 4>(K, V);
}

// The streaming kernel (stream.cuh) of an f32 state.
template <bool kVFirst>
LaunchFn pick_stream_dims(int64_t K, int64_t V) {
  using recurrent::launch_recurrent_stream;
  if (K == 64) {
    return V == 64 ? &launch_recurrent_stream<StreamTraits<64, 64, kVFirst>>
                   : &launch_recurrent_stream<StreamTraits<64, 128, kVFirst>>;
  }
  return V == 64 ? &launch_recurrent_stream<StreamTraits<128, 64, kVFirst>>
                 : &launch_recurrent_stream<StreamTraits<128, 128, kVFirst>>;
}

// Whether the state is f32 wherever it is read or written (and is read or written at all).
bool f32_state(const RecurrentFwdArgs& a) {
  const TensorRef& src = a.initial_state;
  const TensorRef& dst = state_destination(a);
  if (!src.defined() && !dst.defined()) return false;
  return (!src.defined() || src.dtype == DType::kF32) &&
         (!dst.defined() || dst.dtype == DType::kF32);
}

}  // namespace

Status recurrent_fwd_supported(const RecurrentFwdArgs& a) {
  const int64_t K = a.q.shape[3], V = a.v.shape[3];
  const auto compiled = [](int64_t d) { return d == 64 || d == 128; };
  if (!compiled(K))
    return Status::NotSupported(std::string(kOp) + ": q.shape[3] (K) = " + std::to_string(K) +
                                "; expected K in {64, 128} on CUDA (the compiled head dims)");
  if (!compiled(V))
    return Status::NotSupported(std::string(kOp) + ": v.shape[3] (V) = " + std::to_string(V) +
                                "; expected V in {64, 128} on CUDA (the compiled head dims)");
  for (const TensorRef* s : {&a.initial_state, &state_destination(a)}) {
    const char* name = s == &a.initial_state ? "initial_state" : "final_state";
    if (s->defined() && s->dtype != DType::kF32 && s->dtype != DType::kBF16 &&
        s->dtype != DType::kF16 && s->dtype != DType::kF64)
      return Status::NotSupported(std::string(kOp) + ": " + name + ".dtype " +
                                  dtype_label(s->dtype) +
                                  "; expected f32, bf16, f16 or f64 on CUDA");
    if (!aligned_16(*s))
      return Status::NotSupported(
          std::string(kOp) + ": " + name +
          ".data address % 16 = " + std::to_string(reinterpret_cast<uintptr_t>(s->data) % 16) +
          "; expected a 16-byte aligned state buffer on CUDA (the kernel moves the state in "
          "16-byte runs)");
  }
  const int64_t ctas = num_sequences(a) * a.v.shape[2] * (V / kCtaColumns);
  if (ctas > std::numeric_limits<int32_t>::max())
    return Status::NotSupported(std::string(kOp) + ": N * HV * V / 64 = " + std::to_string(ctas) +
                                " CTAs; expected fewer than 2^31 (one CTA per 64 value columns)");
  return Status::Ok();
}

Status recurrent_fwd(const RecurrentFwdArgs& args, Stream stream) {
  OPENKDA_RETURN_IF_ERROR(recurrent_fwd_supported(args));
  const RecurrentParams p = make_params(args);
  const cudaStream_t st = static_cast<cudaStream_t>(stream);
  // NOTE: the one dispatch between the two kernels. An f32 state (the serving pool) with more
  // (sequence, value head) pairs than SMs streams through shared memory with bulk copies
  // (stream.cuh: bandwidth-bound, three heads per SM). Fewer heads (small-batch decode, where the
  // latency of one item is the run time), bf16 / f16 / f64 states (which the bulk copy cannot
  // convert) and calls without a state run the register-tile kernel (kernel.cuh), whose CTAs of
  // 64 columns load their state with more threads at once.
  // Measured on the H200 (2026-11-29, fp32 pool, K = V = 128, H = 32, CUDA-graph replay, us,
  // register / stream): B = 1 4.6 / 6.1, B = 4 6.7 / 7.5 (128 heads), B = 8 10.9 / 11.1,
  // B = 16 18.6 / 18.2, B = 64 81.0 / 73.1; 4 tokens: B = 4 15.6 / 16.4, B = 8 33.0 / 25.6.
  if (f32_state(args)) {
    int sms = 0;
    OPENKDA_CUDA_RETURN_IF_ERROR(kOp, sm_count(&sms));
    if (static_cast<int64_t>(p.N) * p.HV > sms) {
      const LaunchFn launch = args.state_v_first
                                  ? pick_stream_dims<true>(args.q.shape[3], args.v.shape[3])
                                  : pick_stream_dims<false>(args.q.shape[3], args.v.shape[3]);
      return cuda_status(launch(p, st), kOp, "launch of openkda_fwd_recurrent_stream_kernel");
    }
  }
  const LaunchFn launch =
      pick_kernel(args.q.shape[3], args.v.shape[3], args.state_v_first, run_elems(args));
  return cuda_status(launch(p, st), kOp, "launch of openkda_fwd_recurrent_kernel");
}

}  // namespace openkda::cuda
