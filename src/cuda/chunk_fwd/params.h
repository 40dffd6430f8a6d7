// Kernel view of chunk_kda forward (ChunkFwdArgs): raw pointers, run-time dtypes and flags,
// filled from the Args in one function (launch.cu: make_params).
//
// Shapes (contiguous row-major; "tok" = packed token row b * T + t, or bos + t with cu_seqlens;
// tokens = B * T):
//   q, k          [B, T, H, K]     qk_dtype            (q/k head h = hv / group)
//   v             [B, T, HV, V]    v_dtype
//   g             [B, T, HV, K]    g_dtype             raw gate (gate_mode != kPre) or log-decay
//   beta          [B, T, HV]       beta_dtype          post-activation or logits
//   A_log         [HV]             may be null         (read only with the gate in kernel)
//   dt_bias       [HV * K]         may be null         (read only with the gate in kernel)
//   h0            [N, HV, K, V] ([N, HV, V, K] when v_first) h0_dtype; may be null (zeros)
//   cu_seqlens    [N + 1] i32 | i64 on the device; may be null (dense: sequence n = row n)
// Outputs:
//   o             [B, T, HV, V]    o_dtype
//   ht            [N, HV, K, V] (v_first: [N, HV, V, K]) f32; may be null
//   h             [h_chunks, HV, K, V] (v_first: [.., V, K]) h_dtype, the state entering every
//                 snapshot chunk (the caller's chunk_size = h_every kernel chunks), flattened
//                 over [B, NT_h] (dense) or [1, NT] (varlen); may be null
// Workspace (launch.cu: WorkspaceLayout; f32 unless noted). The prep's outputs are per (value head,
// chunk slot) tiles (tile = HV-major index hv * slots + slot), each stored as the scan's
// shared-memory image of it (tile_image.h: one bulk copy per tile; rows past the chunk come from
// the zero rows of q, k and beta there):
//   chunk_offsets [N + 1] i32      first chunk of every sequence (varlen only)
//   chunk_table   [slots] i64      every chunk slot's first token and valid rows, packed
//                                  (chunk_index.cuh: kChunkEntryShift; varlen only)
//   seq_order     [N] i32          the sequences in the scan's CTA order, longest first
//                                  (chunk_index.cuh; varlen only)
//   h_offsets     [N + 1] i32      first snapshot of every sequence (varlen with h and
//                                  h_every > 1; with h_every = 1 it aliases chunk_offsets;
//                                  null without h or cu_seqlens)
//   ke, qg        [HV, slots, BT, K]   ke = k E; qg = scale q E (E = exp2(G); swizzled, pair
//                                      order); with f16 keys E = exp2(G - A) per row (A: ka)
//   ka            [HV, slots, BT]      f16 keys only: exp2(A_j), A_j = floor(max over d of G_jd),
//                                      the row anchors of ke and qg (rows in pair order; wy.cuh)
//   kgT           [HV, slots, K, BT]   kg^T, kg = k exp2(G_last - G) (swizzled, pair order); with
//                                      f16 keys kg itself [HV, slots, BT, K] f16 in ke's image
//   aqk           [HV, slots, BT, BT]  scale q_i.k_j exp2(G_i - G_j) (j <= i), 0 elsewhere
//                                      (swizzled, pair order; with f16 keys f16 in half of each
//                                      128-byte row, half_pair_image_offset)
//   tinv          [HV, slots, BT, BT]  Tinv' = (I + A_kk)^-1 diag(beta) (swizzled, pair order);
//                                      the scan's v_new = Tinv' (v - ke S) is the WY form's
//                                      u - w S (u = Tinv' v, w = Tinv' ke), whose products the
//                                      prep no longer computes
//   v_img         f32 / f64 v only (!v_by_tensor_map): the chunk's v rows in f32, [HV, slots,
//                 V / 64, BT, 64] (XOR-swizzled columns; tile_image.h: v_image_index). A bf16 /
//                 f16 v needs no copy: the scan loads its rows from v itself (v_map)
//   gamma         [HV, slots, K]   exp2(G_last) of every chunk (slot = global chunk index)
//   seg_state     [N, HV, nseg, K, V + K]  time split only: segment s's zero-start final state
//                 Z_s (columns < V) and transition M_s (columns V + m), segments.cuh
//   seg_init      [N, HV, nseg, K, V]      time split only: the state entering segment s >= 1
//   claims, ready [2] u32, [HV, slots] u32  prep / scan hand-off only (handoff.cuh): the next item
//                                           and the keepers; every tile's ready mark
#pragma once

#include <cuda.h>  // CUtensorMap (a plain struct: no driver call here)

#include <cstdint>

#include "cuda/chunk_fwd/traits.h"
#include "openkda/tensor_ref.h"

namespace openkda::cuda::chunk_forward {

// Per-token log-decay g_t (natural log) computed from the g tensor (spec 3.1).
enum class GateMode : int32_t {
  kPre = 0,       // g as passed
  kSoftplus = 1,  // -exp(A_log[hv]) * softplus(g + dt_bias)
  kLowerBound =
      2,  // lower_bound * sigmoid(exp(A_log[hv]) * (g + dt_bias)); exp(A_log) -> 1 if null
};

// Where the scan gets the chunk's v rows: a bf16 / f16 v (true) from v itself, by tensor-map (TMA)
// boxes of 32 rows x 64 columns (v_map; read with tile_image.h's v_box_offset), an f32 / f64 v
// (false) from the prep's f32 copy in the workspace (v_img).
OPENKDA_HOST_DEVICE constexpr bool v_by_tensor_map(DType v_dtype) {
  return v_dtype == DType::kBF16 || v_dtype == DType::kF16;
}

// Whether ke, qg, kg and A_qk are f16 tiles and the scan's X^T / O^T products, its O^T update and
// its state update f16 wgmma, with S^T held row-scaled (f16_operands.cuh: update_f16_row_factors).
// It needs the in-kernel l2norm (|k|, |q| <= 1, so |ke| <= 1, |qg| <= |scale| and |A_qk| <=
// |scale|; the range guard's bound takes |kg| <= 1), an in-kernel gate that is never positive
// (softplus, or the lower-bound sigmoid with lower_bound <= 0: every decay factor at most 1), and
// |scale| well inside f16's range; otherwise the tiles are tf32 and the products tf32 wgmma.
OPENKDA_HOST_DEVICE constexpr bool f16_keys_apply(bool l2norm, GateMode gate_mode,
                                                  float lower_bound, float scale) {
  const bool gate_at_most_0 = gate_mode == GateMode::kSoftplus ||
                              (gate_mode == GateMode::kLowerBound && lower_bound <= 0.0f);
  return l2norm && gate_at_most_0 && scale <= 16384.0f && scale >= -16384.0f;
}

// Whether the prep reads q, k (qk_dtype) and g by tensor-map boxes (q_map, k_map, g_map): 2- and
// 4-byte dtypes; an f64 input is read by per-thread loads instead (its box would not fit the f32
// tile it lands in).
OPENKDA_HOST_DEVICE constexpr bool inputs_by_tensor_map(DType qk_dtype, DType g_dtype) {
  return qk_dtype != DType::kF64 && g_dtype != DType::kF64;
}

// Aligned as its tensor maps (CUtensorMap: 128 bytes). The prep and scan kernels take it as a
// __grid_constant__ parameter, whose address the TMA loads use.
struct ChunkFwdParams {
  // ---- inputs ----
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* g = nullptr;
  const void* beta = nullptr;
  const void* A_log = nullptr;
  const void* dt_bias = nullptr;
  const void* h0 = nullptr;
  const void* cu_seqlens = nullptr;
  DType qk_dtype = DType::kUndefined;
  DType v_dtype = DType::kUndefined;
  // v viewed as [tokens, HV * V] 16-bit elements, boxes of BT rows x 64 columns
  // (v_by_tensor_map(v_dtype); launch.cu encodes it per call).
  CUtensorMap v_map{};
  // inputs_by_tensor_map(qk_dtype, g_dtype): the prep loads its chunk's rows of q and k (viewed as
  // [tokens, H * K]) and of g ([tokens, HV * K]) as dense boxes of BT rows x K columns into shared
  // memory (launch.cu encodes the maps per call).
  CUtensorMap q_map{};
  CUtensorMap k_map{};
  CUtensorMap g_map{};
  DType g_dtype = DType::kUndefined;
  DType beta_dtype = DType::kUndefined;
  DType A_log_dtype = DType::kUndefined;
  DType dt_bias_dtype = DType::kUndefined;
  DType h0_dtype = DType::kUndefined;
  bool cu_i64 = false;

  // ---- outputs ----
  void* o = nullptr;
  float* ht = nullptr;
  void* h = nullptr;
  DType o_dtype = DType::kUndefined;
  DType h_dtype = DType::kUndefined;
  int64_t h_chunks = 0;  // rows of h: h.shape[0] * h.shape[1] (writes past it are dropped)
  // Kernel chunks per snapshot of h: the caller's chunk_size / BT (launch.cu: the kernels always
  // work in kKernelChunk-token chunks; chunk_size only sets where h is taken).
  int32_t h_every = 1;

  // ---- geometry ----
  int64_t B = 0, T = 0, N = 0;
  int64_t tokens = 0;  // B * T
  int64_t NT_b = 0;    // dense: chunks per batch row, ceil(T / BT)
  int64_t NT_h = 0;    // dense: snapshots per batch row, ceil(T / (BT h_every))
  int64_t slots = 0;   // chunk slots of gamma / the prep grid (>= chunks over all sequences)
  int32_t H = 0, HV = 0, group = 1, K = 0, V = 0, BT = 64;

  // ---- options ----
  float scale = 1.0f;
  GateMode gate_mode = GateMode::kPre;
  float lower_bound = 0.0f;
  bool l2norm = false;        // q, k <- x / sqrt(sum x^2 + 1e-6)
  bool beta_sigmoid = false;  // beta <- beta_scale * sigmoid(beta)
  float beta_scale = 1.0f;    // 2 with allow_neg_eigval
  bool v_first = false;       // state tensors in [.., V, K]
  // Diagonal 16x16 blocks of A_qk / A_kk by exact per-pair exponents (any gate) instead of the
  // first-row-anchored product, which needs |g| <= 5 per token (in-kernel lower-bound gate).
  bool exact_diag = true;
  bool f16_keys = false;  // f16_keys_apply(l2norm, gate_mode, lower_bound, scale)

  // ---- scan split: each scan CTA owns `vs` = V / vsplit value columns of one state ----
  int32_t vsplit = 1;
  int32_t vs = 0;
  // ---- time split (segments.cuh; few state chains of a dense batch or of one varlen sequence):
  // every sequence's chunks in nseg segments of seg_chunks (the last may be shorter; with varlen
  // the segments cover ceil(T / BT) chunks, so those past the sequence's end are empty).
  // nseg = 1: one segment of all chunks.
  int32_t nseg = 1;
  int64_t seg_chunks = 0;

  // ---- the prep / scan hand-off (handoff.cuh; plan.h: plan_prep; set only with it) ----
  int32_t prep_ctas = 0;       // the persistent prep grid
  int32_t keeper_sms = 0;      // hand-off: CTAs on multiprocessors %smid < keeper_sms keep going
  int32_t exit_item = 0;       // hand-off: the others stop after their first item >= exit_item
  uint32_t* claims = nullptr;  // hand-off: [2] u32 (next item, keepers registered)
  uint32_t* ready = nullptr;   // hand-off: [HV, slots] u32 (tile order), 1 once a tile is stored

  // ---- workspace ----
  int32_t* chunk_offsets = nullptr;  // varlen only
  int64_t* chunk_table = nullptr;    // varlen only
  int32_t* seq_order = nullptr;      // varlen only
  int32_t* h_offsets = nullptr;      // varlen with h only (== chunk_offsets when h_every = 1)
  float* ke = nullptr;
  float* qg = nullptr;
  float* ka = nullptr;  // f16 keys only (null otherwise)
  float* kgT = nullptr;
  float* aqk = nullptr;
  float* tinv = nullptr;
  float* v_img = nullptr;  // !v_by_tensor_map(v_dtype) only
  float* gamma = nullptr;
  float* seg_state = nullptr;  // nseg > 1: [N, HV, nseg, K, V + K] (Z_s | M_s) of every segment
  float* seg_init = nullptr;   // nseg > 1: [N, HV, nseg, K, V] the state entering segment s >= 1
};

// The prep's path for these parameters (traits.h: PrepPath), chosen once per call by the launcher:
// a safe path exactly when the call is the configuration it fixes, else kGeneric.
inline PrepPath prep_path_of(const ChunkFwdParams& p) {
  const bool safe = p.gate_mode == GateMode::kLowerBound && p.f16_keys && !p.exact_diag &&
                    p.l2norm && v_by_tensor_map(p.v_dtype) && p.g_dtype == p.qk_dtype;
  if (!safe) return PrepPath::kGeneric;
  if (p.qk_dtype == DType::kBF16) return PrepPath::kSafeBF16;
  return p.qk_dtype == DType::kF16 ? PrepPath::kSafeF16 : PrepPath::kGeneric;
}

// The run-time options of the prep, as its stages read them: constants on a safe path (Tr:
// PrepTraits; prep_path_of guarantees these values), p's fields on kGeneric.
template <class Tr>
OPENKDA_HOST_DEVICE inline bool prep_f16_keys(const ChunkFwdParams& p) {
  return Tr::kSafePath || p.f16_keys;
}
template <class Tr>
OPENKDA_HOST_DEVICE inline bool prep_exact_diag(const ChunkFwdParams& p) {
  return !Tr::kSafePath && p.exact_diag;
}
template <class Tr>
OPENKDA_HOST_DEVICE inline bool prep_l2norm(const ChunkFwdParams& p) {
  return Tr::kSafePath || p.l2norm;
}
template <class Tr>
OPENKDA_HOST_DEVICE inline GateMode prep_gate_mode(const ChunkFwdParams& p) {
  return Tr::kSafePath ? GateMode::kLowerBound : p.gate_mode;
}
template <class Tr>
OPENKDA_HOST_DEVICE inline bool prep_inputs_by_tensor_map(const ChunkFwdParams& p) {
  return Tr::kSafePath || inputs_by_tensor_map(p.qk_dtype, p.g_dtype);
}
template <class Tr>
OPENKDA_HOST_DEVICE inline bool prep_v_by_tensor_map(const ChunkFwdParams& p) {
  return Tr::kSafePath || v_by_tensor_map(p.v_dtype);
}

// The scan's input / output formats for these parameters (traits.h: ScanIo), chosen once per call
// by the launcher: fixed exactly when the call has f16 keys, no h snapshots, and v and o of one
// 16-bit dtype, else kGeneric.
inline ScanIo scan_io_of(const ChunkFwdParams& p) {
  if (!p.f16_keys || p.h != nullptr || p.o_dtype != p.v_dtype) return ScanIo::kGeneric;
  if (p.v_dtype == DType::kBF16) return ScanIo::kBF16;
  return p.v_dtype == DType::kF16 ? ScanIo::kF16 : ScanIo::kGeneric;
}

// The run-time formats of the scan, as its stages read them: constants with a fixed ScanIo (Tr:
// ScanTraits; scan_io_of guarantees these values), p's fields with kGeneric.
template <class Tr>
OPENKDA_HOST_DEVICE inline DType scan_v_dtype(const ChunkFwdParams& p) {
  return Tr::kIo == ScanIo::kBF16 ? DType::kBF16
                                  : (Tr::kIo == ScanIo::kF16 ? DType::kF16 : p.v_dtype);
}
template <class Tr>
OPENKDA_HOST_DEVICE inline DType scan_o_dtype(const ChunkFwdParams& p) {
  return Tr::kIo == ScanIo::kBF16 ? DType::kBF16
                                  : (Tr::kIo == ScanIo::kF16 ? DType::kF16 : p.o_dtype);
}
template <class Tr>
OPENKDA_HOST_DEVICE inline bool scan_h_snapshots(const ChunkFwdParams& p) {
  return Tr::kIo == ScanIo::kGeneric && p.h != nullptr;
}

}  // namespace openkda::cuda::chunk_forward
