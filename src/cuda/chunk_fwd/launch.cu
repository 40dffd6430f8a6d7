// Host launcher of chunk_kda forward: ChunkFwdArgs -> ChunkFwdParams in one function
// (make_params), the workspace table (workspace_layout, shared by sizing and carving; it holds the
// grid plans of plan.h), and the one place where run-time K and V become compiled kernels
// (cmake/OpenkdaCuda.cmake).
// No framework headers, no allocation, no host synchronisation.
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <string>

#include "cuda/chunk_fwd/chunk_index.cuh"
#include "cuda/chunk_fwd/launch_chunk_fwd.h"
#include "cuda/chunk_fwd/params.h"
#include "cuda/chunk_fwd/plan.h"
#include "cuda/chunk_fwd/traits.h"
#include "cuda/common/check.cuh"
#include "cuda/common/device.cuh"
#include "cuda/common/dispatch.cuh"
#include "cuda/common/tensor_map.h"

namespace openkda::cuda {
namespace chunk_forward {
// Defined in launchers.cuh; explicitly instantiated by cmake/OpenkdaCuda.cmake.
template <int kThreads>
cudaError_t launch_chunk_index(const ChunkFwdParams& p, cudaStream_t stream);
template <int kK, int kBT, PrepPath kPath>
cudaError_t launch_prep(const ChunkFwdParams& p, cudaStream_t stream);
template <int kK, int kBT>
cudaError_t launch_scan(const ChunkFwdParams& p, cudaStream_t stream);

static_assert(kKernelChunk < (1 << kChunkEntryShift),
              "chunk_table packs nv in kChunkEntryShift bits");
}  // namespace chunk_forward

namespace {

using chunk_forward::ChunkFwdParams;
using chunk_forward::GateMode;
using chunk_forward::plan_prep;
using chunk_forward::plan_scan;
using chunk_forward::PrepPlan;
using chunk_forward::ScanPlan;
using LaunchFn = cudaError_t (*)(const ChunkFwdParams&, cudaStream_t);

constexpr const char* kOp = "chunk_kda";
constexpr size_t kWsAlign = 128;
// Fast (anchored) diagonal blocks need every per-token log-decay in [-5, 0]: 15 rows of decay
// then stay below 2^109 (intra.cuh).
constexpr double kAnchoredDiagMinLowerBound = -5.0;

// The call's sizes: the plans' (plan.h: N, HV, K, V, T, BT, varlen) and the rest.
struct Dims : chunk_forward::PlanShape {
  int64_t B = 0, H = 0;
  int64_t h_BT = 64;           // the caller's chunk_size: h's chunk
  bool h = false;              // h snapshots requested
  bool v_map = false;          // the scan reads v by tensor-map boxes (params.h)
  bool inputs_by_tma = false;  // the prep reads q, k and g by tensor-map boxes (params.h)
  bool f16_keys = false;       // ke, qg, kg and A_qk are f16 tiles (params.h: f16_keys_apply)
};

GateMode gate_mode_of(const ChunkFwdArgs& a) {
  return !a.use_gate_in_kernel ? GateMode::kPre
         : a.lower_bound       ? GateMode::kLowerBound
                               : GateMode::kSoftplus;
}

float lower_bound_of(const ChunkFwdArgs& a) {  // 0 without the lower-bound gate
  return a.lower_bound ? static_cast<float>(*a.lower_bound) : 0.0f;
}

Dims dims_of(const ChunkFwdArgs& a) {
  Dims d;
  d.B = a.q.shape[0];
  d.T = a.q.shape[1];
  d.H = a.q.shape[2];
  d.K = a.q.shape[3];
  d.HV = a.v.shape[2];
  d.V = a.v.shape[3];
  d.h_BT = a.chunk_size;
  d.varlen = a.cu_seqlens.defined();
  d.h = a.h.defined();
  d.v_map = chunk_forward::v_by_tensor_map(a.v.dtype);
  d.inputs_by_tma = chunk_forward::inputs_by_tensor_map(a.q.dtype, a.g.dtype);
  d.f16_keys =
      chunk_forward::f16_keys_apply(a.use_qk_l2norm_in_kernel, gate_mode_of(a), lower_bound_of(a),
                                    static_cast<float>(effective_scale(a, d.K)));
  d.N = d.varlen ? a.cu_seqlens.shape[0] - 1 : d.B;  // rank 1 (validated)
  return d;
}

int device_sms() {
  int sms = 0;
  if (sm_count(&sms) != cudaSuccess || sms <= 0) {
    cudaGetLastError();  // clear the error a failed query leaves behind
    return 132;
  }
  return sms;
}

// The workspace table (params.h): byte offsets of every buffer, each 128-byte aligned.
struct WorkspaceLayout {
  int64_t slots = 0;  // chunk slots: exact for dense, an upper bound for varlen
  ScanPlan plan;
  PrepPlan prep;
  size_t handoff = 0, handoff_bytes = 0;  // claims (128 bytes), then ready; zeroed per call
  size_t chunk_offsets = 0, chunk_table = 0, seq_order = 0, h_offsets = 0, ke = 0, qg = 0, ka = 0,
         kgT = 0, aqk = 0, tinv = 0, v_img = 0;
  size_t gamma = 0;
  size_t seg_state = 0, seg_init = 0;
  size_t bytes = 0;
};

WorkspaceLayout workspace_layout(const Dims& d, int sms) {
  WorkspaceLayout L;
  // varlen: sum_n ceil(len_n / BT) <= floor((T + N (BT - 1)) / BT).
  L.slots = d.varlen ? (d.T + d.N * (d.BT - 1)) / d.BT : d.B * d.chunks();
  size_t at = 0;
  const auto take = [&](int64_t bytes) {
    const size_t offset = at;
    at += (static_cast<size_t>(bytes) + kWsAlign - 1) / kWsAlign * kWsAlign;
    return offset;
  };
  L.chunk_offsets = take(d.varlen ? (d.N + 1) * int64_t{sizeof(int32_t)} : 0);
  L.chunk_table = take(d.varlen ? L.slots * int64_t{sizeof(int64_t)} : 0);
  L.seq_order = take(d.varlen ? d.N * int64_t{sizeof(int32_t)} : 0);
  const bool own_h_offsets = d.varlen && d.h && d.h_BT != d.BT;
  L.h_offsets = take(own_h_offsets ? (d.N + 1) * int64_t{sizeof(int32_t)} : 0);
  const int64_t key_bytes = d.f16_keys ? 2 : int64_t{sizeof(float)};  // f16 or tf32 tiles
  L.ke = take(d.HV * L.slots * d.BT * d.K * key_bytes);
  L.qg = take(d.HV * L.slots * d.BT * d.K * key_bytes);
  L.ka = take(d.f16_keys ? d.HV * L.slots * d.BT * int64_t{sizeof(float)} : 0);
  L.kgT = take(d.HV * L.slots * d.K * d.BT * key_bytes);  // kg^T tf32, or kg f16
  L.aqk = take(d.HV * L.slots * d.BT * d.BT * int64_t{sizeof(float)});
  L.tinv = take(d.HV * L.slots * d.BT * d.BT * int64_t{sizeof(float)});
  L.v_img = take(!d.v_map ? d.HV * L.slots * d.BT * d.V * int64_t{sizeof(float)} : 0);
  L.gamma = take(d.HV * L.slots * d.K * int64_t{sizeof(float)});
  L.plan = plan_scan(d, sms);
  const int64_t segs = L.plan.nseg > 1 ? d.chains() * L.plan.nseg : 0;
  L.seg_state = take(segs * d.K * (d.V + d.K) * int64_t{sizeof(float)});
  L.seg_init = take(segs * d.K * d.V * int64_t{sizeof(float)});
  L.prep = plan_prep(d, L.plan, L.slots, sms);
  L.handoff_bytes = L.prep.handoff ? kWsAlign + d.HV * L.slots * sizeof(uint32_t) : 0;
  L.handoff = take(static_cast<int64_t>(L.handoff_bytes));
  L.bytes = at;
  return L;
}

bool aligned(const TensorRef& t, size_t bytes) {
  return reinterpret_cast<uintptr_t>(t.data) % bytes == 0;
}

// Whether the bytes of two tensors intersect (contiguous, as validated).
bool overlap(const TensorRef& x, const TensorRef& y) {
  const auto begin = [](const TensorRef& t) { return reinterpret_cast<uintptr_t>(t.data); };
  const auto end = [&](const TensorRef& t) {
    return begin(t) + static_cast<uintptr_t>(t.numel()) * dtype_size(t.dtype);
  };
  return begin(x) < end(y) && begin(y) < end(x);
}

Status not_supported(const std::string& what) {
  return Status::NotSupported(std::string(kOp) + ": " + what);
}

Status check_aligned(const TensorRef& t, const char* name) {
  const size_t need = t.dtype == DType::kF64 ? 32 : 16;
  if (aligned(t, need)) return Status::Ok();
  return not_supported(std::string(name) + ".data address % " + std::to_string(need) + " = " +
                       std::to_string(reinterpret_cast<uintptr_t>(t.data) % need) +
                       "; expected a " + std::to_string(need) + "-byte aligned tensor on CUDA");
}

ChunkFwdParams make_params(const ChunkFwdArgs& a, const Dims& d, const WorkspaceLayout& L,
                           Workspace ws) {
  ChunkFwdParams p;
  p.q = a.q.data;
  p.k = a.k.data;
  p.v = a.v.data;
  p.g = a.g.data;
  p.beta = a.beta.data;
  p.qk_dtype = a.q.dtype;
  p.v_dtype = a.v.dtype;
  p.g_dtype = a.g.dtype;
  p.beta_dtype = a.beta.dtype;
  if (a.use_gate_in_kernel) {
    if (a.A_log.defined()) {
      p.A_log = a.A_log.data;
      p.A_log_dtype = a.A_log.dtype;
    }
    if (a.dt_bias.defined()) {
      p.dt_bias = a.dt_bias.data;
      p.dt_bias_dtype = a.dt_bias.dtype;
    }
  }
  if (a.initial_state.defined()) {
    p.h0 = a.initial_state.data;
    p.h0_dtype = a.initial_state.dtype;
  }
  if (d.varlen) {
    p.cu_seqlens = a.cu_seqlens.data;
    p.cu_i64 = a.cu_seqlens.dtype == DType::kI64;
  }

  p.o = a.o.data;
  p.o_dtype = a.o.dtype;
  if (a.final_state.defined()) p.ht = static_cast<float*>(a.final_state.data);
  if (a.h.defined()) {
    p.h = a.h.data;
    p.h_dtype = a.h.dtype;
    p.h_chunks = a.h.shape[0] * a.h.shape[1];
  }
  p.h_every = static_cast<int32_t>(d.h_BT / d.BT);

  p.B = d.B;
  p.T = d.T;
  p.N = d.N;
  p.tokens = d.B * d.T;
  p.NT_b = d.chunks();
  p.NT_h = (d.T + d.h_BT - 1) / d.h_BT;
  p.slots = L.slots;
  p.H = static_cast<int32_t>(d.H);
  p.HV = static_cast<int32_t>(d.HV);
  p.group = static_cast<int32_t>(d.HV / d.H);
  p.K = static_cast<int32_t>(d.K);
  p.V = static_cast<int32_t>(d.V);
  p.BT = static_cast<int32_t>(d.BT);

  p.scale = static_cast<float>(effective_scale(a, d.K));
  p.gate_mode = gate_mode_of(a);
  p.lower_bound = lower_bound_of(a);
  p.l2norm = a.use_qk_l2norm_in_kernel;
  p.beta_sigmoid = a.use_beta_sigmoid_in_kernel;
  p.beta_scale = a.allow_neg_eigval ? 2.0f : 1.0f;
  p.v_first = a.state_v_first;
  p.exact_diag = !(p.gate_mode == GateMode::kLowerBound &&
                   *a.lower_bound >= kAnchoredDiagMinLowerBound && *a.lower_bound <= 0.0);
  p.f16_keys = d.f16_keys;

  p.vsplit = L.plan.vsplit;
  p.vs = static_cast<int32_t>(d.V / p.vsplit);
  p.nseg = L.plan.nseg;
  p.seg_chunks = L.plan.seg_chunks;

  char* base = static_cast<char*>(ws.data);
  if (d.varlen) {
    p.chunk_offsets = reinterpret_cast<int32_t*>(base + L.chunk_offsets);
    p.chunk_table = reinterpret_cast<int64_t*>(base + L.chunk_table);
    p.seq_order = reinterpret_cast<int32_t*>(base + L.seq_order);
    if (d.h) {
      p.h_offsets =
          p.h_every > 1 ? reinterpret_cast<int32_t*>(base + L.h_offsets) : p.chunk_offsets;
    }
  }
  p.ke = reinterpret_cast<float*>(base + L.ke);
  p.qg = reinterpret_cast<float*>(base + L.qg);
  p.ka = d.f16_keys ? reinterpret_cast<float*>(base + L.ka) : nullptr;
  p.kgT = reinterpret_cast<float*>(base + L.kgT);
  p.aqk = reinterpret_cast<float*>(base + L.aqk);
  p.tinv = reinterpret_cast<float*>(base + L.tinv);
  p.v_img = reinterpret_cast<float*>(base + L.v_img);
  p.gamma = reinterpret_cast<float*>(base + L.gamma);
  if (p.nseg > 1) {
    p.seg_state = reinterpret_cast<float*>(base + L.seg_state);
    p.seg_init = reinterpret_cast<float*>(base + L.seg_init);
  }
  p.prep_ctas = static_cast<int32_t>(L.prep.ctas);
  if (L.prep.handoff) {
    p.keeper_sms = L.prep.keeper_sms;
    p.exit_item = L.prep.exit_item;
    p.claims = reinterpret_cast<uint32_t*>(base + L.handoff);
    p.ready = reinterpret_cast<uint32_t*>(base + L.handoff + kWsAlign);
  }
  return p;
}

// The compiled variants: K in {64, 128} (the prep does not depend on V; the scan's V is a run-time
// value), at the kernels' chunk length; the prep in three paths (traits.h: PrepPath).
template <int kK>
LaunchFn prep_launcher_k(chunk_forward::PrepPath path) {
  using chunk_forward::launch_prep;
  using chunk_forward::PrepPath;
  constexpr int kBT = chunk_forward::kKernelChunk;
  switch (path) {
    case PrepPath::kSafeBF16: return launch_prep<kK, kBT, PrepPath::kSafeBF16>;
    case PrepPath::kSafeF16: return launch_prep<kK, kBT, PrepPath::kSafeF16>;
    default: return launch_prep<kK, kBT, PrepPath::kGeneric>;
  }
}

LaunchFn prep_launcher(int64_t K, chunk_forward::PrepPath path) {
  return K == 64 ? prep_launcher_k<64>(path) : prep_launcher_k<128>(path);
}

LaunchFn scan_launcher(int64_t K) {
  using chunk_forward::launch_scan;
  constexpr int kBT = chunk_forward::kKernelChunk;
  return K == 64 ? launch_scan<64, kBT> : launch_scan<128, kBT>;
}

}  // namespace

Status chunk_fwd_can_implement(const ChunkFwdArgs& a) {
  const Dims d = dims_of(a);
  if (d.K != 64 && d.K != 128) {
    return not_supported("q.shape[3] (K) = " + std::to_string(d.K) +
                         "; expected K in {64, 128} on CUDA");
  }
  if (d.V != 64 && d.V != 128) {
    return not_supported("v.shape[3] (V) = " + std::to_string(d.V) +
                         "; expected V in {64, 128} on CUDA");
  }
  if (d.h_BT != 32 && d.h_BT != 64) {
    return not_supported("chunk_size = " + std::to_string(d.h_BT) + "; expected 32 or 64");
  }
  if (a.final_state.defined() && a.final_state.dtype != DType::kF32) {
    return not_supported(std::string("final_state.dtype ") + dtype_label(a.final_state.dtype) +
                         "; expected f32 on CUDA");
  }
  OPENKDA_RETURN_IF_ERROR(check_aligned(a.q, "q"));
  OPENKDA_RETURN_IF_ERROR(check_aligned(a.k, "k"));
  OPENKDA_RETURN_IF_ERROR(check_aligned(a.v, "v"));
  OPENKDA_RETURN_IF_ERROR(check_aligned(a.g, "g"));
  OPENKDA_RETURN_IF_ERROR(check_aligned(a.o, "o"));  // the scan's packed o stores are 8 bytes
  const WorkspaceLayout L = workspace_layout(d, device_sms());
  constexpr int64_t kMaxGrid = std::numeric_limits<int32_t>::max();
  // The largest grids: the prep's chunk slots HV, the scan's N HV vsplit (vsplit <= 2; a time
  // split only when N HV is below the multiprocessor count).
  const int64_t prep_ctas = L.slots * d.HV, scan_ctas = d.chains() * 2;
  if (prep_ctas > kMaxGrid || scan_ctas > kMaxGrid) {
    return not_supported("T = " + std::to_string(d.T) + ", N = " + std::to_string(d.N) +
                         ", HV = " + std::to_string(d.HV) + ": " + std::to_string(prep_ctas) +
                         " prep CTAs (chunk slots HV) and up to " + std::to_string(scan_ctas) +
                         " scan CTAs; expected at most 2^31 - 1 of each");
  }
  // The prep's q, k and g (unless one of them is f64) and a 16-bit v are read by tensor-map
  // boxes, whose row coordinates are int32.
  if ((d.inputs_by_tma || d.v_map) && d.B * d.T > kMaxGrid) {
    const std::string by = d.inputs_by_tma
                               ? std::string("q, k and g in ") + dtype_label(a.q.dtype) + " / " +
                                     dtype_label(a.g.dtype)
                               : std::string("a ") + dtype_label(a.v.dtype) + " v";
    return not_supported("B T = " + std::to_string(d.B * d.T) + " tokens with " + by +
                         " (read by tensor-map boxes, int32 rows); expected at most 2^31 - 1");
  }
  // Under the time split the last segment's CTAs write the final state while the first segment's
  // may still be reading the initial state (the serial scan reads each column before it writes
  // it), so the two must not share memory there.
  if (L.plan.nseg > 1 && a.initial_state.defined() && a.final_state.defined() &&
      overlap(a.initial_state, a.final_state)) {
    return not_supported(
        "final_state shares memory with initial_state; expected separate buffers "
        "when the scan is split in time (" +
        std::to_string(L.plan.nseg) +
        " segments per sequence for N HV = " + std::to_string(d.chains()) + " state chains)");
  }
  return Status::Ok();
}

size_t chunk_fwd_workspace_bytes(const ChunkFwdArgs& a) {
  return workspace_layout(dims_of(a), device_sms()).bytes;
}

Status chunk_fwd(const ChunkFwdArgs& a, Workspace ws, Stream stream) {
  const Dims d = dims_of(a);
  const WorkspaceLayout L = workspace_layout(d, device_sms());
  if (ws.bytes < L.bytes || (L.bytes > 0 && ws.data == nullptr)) {
    return Status::InvalidArgument(std::string(kOp) + ": workspace: " + std::to_string(ws.bytes) +
                                   " bytes" + (ws.data ? "" : " at null") + "; expected at least " +
                                   std::to_string(L.bytes) + " bytes");
  }
  const auto s = static_cast<cudaStream_t>(stream);
  if (d.N == 0) {  // no sequence: with varlen every row of o is padding, written as 0
    if (d.varlen && a.o.numel() > 0) {
      OPENKDA_RETURN_IF_ERROR(cuda_status(
          cudaMemsetAsync(a.o.data, 0, static_cast<size_t>(a.o.numel()) * dtype_size(a.o.dtype), s),
          kOp, "o = 0 (N = 0)"));
    }
    return Status::Ok();
  }
  ChunkFwdParams p = make_params(a, d, L, ws);
  // The stream work before the prep that reads no tensor map goes first, before the host encodes
  // the prep's maps (varlen: the chunk index; the hand-off, dense only: its marks' memset): with
  // the GPU idle at the call, the host time before the first kernel is exposed latency, and the
  // GPU runs this work meanwhile.
  if (d.varlen) {
    OPENKDA_RETURN_IF_ERROR(
        cuda_status(chunk_forward::launch_chunk_index<chunk_forward::kIndexThreads>(p, s), kOp,
                    "launch of openkda_fwd_chunk_index_kernel"));
  }
  if (L.prep.handoff) {  // the hand-off's claims and ready marks start at 0 on every call
    OPENKDA_RETURN_IF_ERROR(
        cuda_status(cudaMemsetAsync(static_cast<char*>(ws.data) + L.handoff, 0, L.handoff_bytes, s),
                    kOp, "hand-off marks = 0"));
  }
  if (d.inputs_by_tma && p.tokens > 0) {  // the prep's boxes of q, k ([tokens, H K]), g
    // x viewed as [tokens, heads K] rows of its dtype, boxes of BT rows x K columns.
    const auto encode_input = [&](CUtensorMap* map, const TensorRef& x, int64_t heads,
                                  const char* what) {
      const auto bytes = static_cast<uint32_t>(dtype_size(x.dtype));
      const auto cols = static_cast<uint64_t>(heads * d.K);
      return cuda_status(encode_dense_rows_map(map, x.data, bytes, static_cast<uint64_t>(p.tokens),
                                               cols, cols * bytes, static_cast<uint32_t>(d.BT),
                                               static_cast<uint32_t>(d.K)),
                         kOp, what);
    };
    OPENKDA_RETURN_IF_ERROR(encode_input(&p.q_map, a.q, d.H, "tensor map of q"));
    OPENKDA_RETURN_IF_ERROR(encode_input(&p.k_map, a.k, d.H, "tensor map of k"));
    OPENKDA_RETURN_IF_ERROR(encode_input(&p.g_map, a.g, d.HV, "tensor map of g"));
  }

  if (p.slots > 0 && p.tokens > 0) {
    OPENKDA_RETURN_IF_ERROR(cuda_status(prep_launcher(d.K, chunk_forward::prep_path_of(p))(p, s),
                                        kOp, "launch of openkda_fwd_prep_kernel"));
  }
  // Encoded after the prep's launch, which does not read v by it: with the GPU idle at the call,
  // the host time before the first kernel is the call's exposed latency.
  if (d.v_map && p.tokens > 0) {  // the scan's boxes of v: BT x 64
    OPENKDA_RETURN_IF_ERROR(cuda_status(
        encode_b16_rows_map(&p.v_map, a.v.data, static_cast<uint64_t>(p.tokens),
                            static_cast<uint64_t>(d.HV * d.V),
                            static_cast<uint64_t>(2 * d.HV * d.V), static_cast<uint32_t>(d.BT)),
        kOp, "tensor map of v"));
  }
  OPENKDA_RETURN_IF_ERROR(
      cuda_status(scan_launcher(d.K)(p, s), kOp, "launch of openkda_fwd_scan_kernel"));
  return Status::Ok();
}

}  // namespace openkda::cuda
