// Validation of every op's Args. Message format: "<op>: <argument>: <seen>; expected <expected>".
#include "core/validate.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "core/convert.h"

namespace openkda {
namespace {

// Message building without iostreams: the core can be linked into a host whose C++ runtime
// differs from the one it was compiled against (a statically linked libstdc++ next to torch's
// shared one), where iostream locale state is not safe to share.
std::string str(const std::string& s) {
  return s;
}
std::string str(const char* s) {
  return s;
}
// The shortest %g form that reads back as v (6 digits for round values, up to 17), so that a
// message never shows a rejected value rounded onto the bound it violates.
std::string str(double v) {
  char buf[32];
  for (int digits = 6; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v || v != v) break;
  }
  return buf;
}
template <class I, class = std::enable_if_t<std::is_integral_v<I>>>
std::string str(I v) {
  return std::to_string(v);
}

template <class... Ts>
std::string cat(const Ts&... parts) {
  std::string out;
  ((out += str(parts)), ...);
  return out;
}

std::string dev_str(const Device& d) {
  return cat(device_name(d.type), ":", d.index);
}

std::string dims_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// Checks shared by all tensors of one op: one device, contiguous, the expected rank and shape.
class Checker {
 public:
  // `ref` names the tensor whose device every other tensor must share.
  Checker(const char* op, Device device, const char* ref = "q")
      : op_(op), ref_(ref), device_(device) {}

  Status fail(const std::string& msg) const { return Status::InvalidArgument(cat(op_, ": ", msg)); }

  Status rank(const TensorRef& t, const char* name, int ndim, const char* layout) const {
    if (t.ndim != ndim)
      return fail(
          cat(name, ": rank ", t.ndim, " ", shape_str(t), "; expected rank ", ndim, " ", layout));
    return Status::Ok();
  }

  Status placed(const TensorRef& t, const char* name) const {
    if (t.device != device_)
      return fail(cat(name, ".device ", dev_str(t.device), "; expected ", ref_, ".device ",
                      dev_str(device_)));
    if (!t.is_contiguous())
      return fail(cat(name, ": non-contiguous strides; expected a contiguous row-major tensor"));
    if (t.numel() > 0 && t.data == nullptr) return fail(cat(name, ": null data pointer"));
    return Status::Ok();
  }

  Status float_dtype(const TensorRef& t, const char* name) const {
    if (!t.is_float())
      return fail(
          cat(name, ".dtype ", dtype_name(t.dtype), "; expected one of f16, bf16, f32, f64"));
    return Status::Ok();
  }

  Status dtype_in(const TensorRef& t, const char* name,
                  std::initializer_list<DType> allowed) const {
    for (DType d : allowed)
      if (t.dtype == d) return Status::Ok();
    std::string list;
    for (DType d : allowed) list += (list.empty() ? "" : ", ") + std::string(dtype_name(d));
    return fail(cat(name, ".dtype ", dtype_name(t.dtype), "; expected one of ", list));
  }

  Status shape(const TensorRef& t, const char* name, const std::vector<int64_t>& expected,
               const char* layout) const {
    bool same = t.ndim == static_cast<int>(expected.size());
    for (int d = 0; same && d < t.ndim; ++d) same = t.shape[d] == expected[d];
    if (!same)
      return fail(
          cat(name, ".shape ", shape_str(t), "; expected ", layout, " = ", dims_str(expected)));
    return Status::Ok();
  }

  // A float tensor of an exact shape on the op's device.
  Status tensor(const TensorRef& t, const char* name, const std::vector<int64_t>& expected,
                const char* layout) const {
    if (!t.defined())
      return fail(cat(name, " is undefined; expected ", layout, " = ", dims_str(expected)));
    OPENKDA_RETURN_IF_ERROR(shape(t, name, expected, layout));
    OPENKDA_RETURN_IF_ERROR(float_dtype(t, name));
    return placed(t, name);
  }

 private:
  const char* op_;
  const char* ref_;
  Device device_;
};

// q/k/v/g: ranks, shapes, dtypes, GVA divisibility.
Status check_qkvg(const Checker& c, const TensorRef& q, const TensorRef& k, const TensorRef& v,
                  const TensorRef& g) {
  if (!q.defined()) return c.fail("q is undefined; expected [B, T, H, K]");
  OPENKDA_RETURN_IF_ERROR(c.rank(q, "q", 4, "[B, T, H, K]"));
  OPENKDA_RETURN_IF_ERROR(c.float_dtype(q, "q"));
  OPENKDA_RETURN_IF_ERROR(c.placed(q, "q"));
  const int64_t B = q.shape[0], T = q.shape[1], H = q.shape[2], K = q.shape[3];
  if (H < 1 || K < 1) return c.fail(cat("q.shape ", shape_str(q), "; expected H >= 1 and K >= 1"));
  if (!k.defined()) return c.fail("k is undefined; expected [B, T, H, K]");
  OPENKDA_RETURN_IF_ERROR(c.shape(k, "k", {B, T, H, K}, "q.shape [B, T, H, K]"));
  if (k.dtype != q.dtype)
    return c.fail(cat("k.dtype ", dtype_name(k.dtype), "; expected q.dtype ", dtype_name(q.dtype)));
  OPENKDA_RETURN_IF_ERROR(c.placed(k, "k"));
  if (!v.defined()) return c.fail("v is undefined; expected [B, T, HV, V]");
  OPENKDA_RETURN_IF_ERROR(c.rank(v, "v", 4, "[B, T, HV, V]"));
  if (v.shape[0] != B || v.shape[1] != T)
    return c.fail(
        cat("v.shape ", shape_str(v), "; expected [B, T, HV, V] with B = ", B, ", T = ", T));
  const int64_t HV = v.shape[2];
  if (HV < 1 || HV % H != 0)
    return c.fail(cat("v.shape[2] (HV) = ", HV, "; expected a positive multiple of H = ", H));
  if (v.shape[3] < 1) return c.fail(cat("v.shape[3] (V) = ", v.shape[3], "; expected V >= 1"));
  OPENKDA_RETURN_IF_ERROR(c.float_dtype(v, "v"));
  OPENKDA_RETURN_IF_ERROR(c.placed(v, "v"));
  return c.tensor(g, "g", {B, T, HV, K}, "[B, T, HV, K]");
}

// cu_seqlens: [N + 1] i32 | i64; values checked when host-readable. Returns N through n_out.
Status check_cu_seqlens(const Checker& c, const TensorRef& cu, int64_t B, int64_t T,
                        int64_t* n_out) {
  *n_out = B;
  if (!cu.defined()) return Status::Ok();
  OPENKDA_RETURN_IF_ERROR(c.rank(cu, "cu_seqlens", 1, "[N + 1]"));
  OPENKDA_RETURN_IF_ERROR(c.dtype_in(cu, "cu_seqlens", {DType::kI32, DType::kI64}));
  OPENKDA_RETURN_IF_ERROR(c.placed(cu, "cu_seqlens"));
  if (cu.numel() < 1) return c.fail("cu_seqlens.shape [0]; expected [N + 1] with N >= 0");
  if (B != 1)
    return c.fail(cat("q.shape[0] (B) = ", B,
                      " with cu_seqlens; expected 1 (flatten variable-length "
                      "inputs into one row)"));
  *n_out = cu.numel() - 1;
  if (cu.device.type != DeviceType::kCPU) return Status::Ok();  // no host read of device memory
  const int64_t first = load_index(cu, 0);
  if (first != 0) return c.fail(cat("cu_seqlens[0] = ", first, "; expected 0"));
  for (int64_t i = 1; i < cu.numel(); ++i) {
    const int64_t a = load_index(cu, i - 1), b = load_index(cu, i);
    if (b < a)
      return c.fail(cat("cu_seqlens[", i, "] = ", b, " < cu_seqlens[", i - 1, "] = ", a,
                        "; expected non-decreasing values"));
  }
  const int64_t last = load_index(cu, cu.numel() - 1);
  if (last != T) return c.fail(cat("cu_seqlens[-1] = ", last, "; expected T = ", T));
  return Status::Ok();
}

std::vector<int64_t> state_shape(int64_t n, int64_t HV, int64_t K, int64_t V, bool v_first) {
  return v_first ? std::vector<int64_t>{n, HV, V, K} : std::vector<int64_t>{n, HV, K, V};
}

const char* state_layout(bool v_first) {
  return v_first ? "[N, HV, V, K]" : "[N, HV, K, V]";
}

// A state tensor: exact shape for its layout and a dtype from `allowed`.
Status check_state(const Checker& c, const TensorRef& s, const char* name,
                   const std::vector<int64_t>& expected, bool v_first,
                   std::initializer_list<DType> allowed) {
  if (!s.defined()) return Status::Ok();
  if (s.ndim != 4 || !(s.shape[0] == expected[0] && s.shape[1] == expected[1] &&
                       s.shape[2] == expected[2] && s.shape[3] == expected[3]))
    return c.fail(cat(name, ".shape ", shape_str(s), "; expected ", state_layout(v_first), " = ",
                      dims_str(expected), " (state_v_first = ", v_first ? "true" : "false", ")"));
  OPENKDA_RETURN_IF_ERROR(c.dtype_in(s, name, allowed));
  return c.placed(s, name);
}

// Gate parameters: A_log (HV elements) and dt_bias (HV * K elements).
Status check_gate_params(const Checker& c, const TensorRef& A_log, const TensorRef& dt_bias,
                         int64_t HV, int64_t K) {
  if (A_log.defined()) {
    if (A_log.numel() != HV)
      return c.fail(cat("A_log.shape ", shape_str(A_log), " (", A_log.numel(),
                        " elements); expected HV = ", HV, " elements"));
    OPENKDA_RETURN_IF_ERROR(c.float_dtype(A_log, "A_log"));
    OPENKDA_RETURN_IF_ERROR(c.placed(A_log, "A_log"));
  }
  if (dt_bias.defined()) {
    if (dt_bias.numel() != HV * K)
      return c.fail(cat("dt_bias.shape ", shape_str(dt_bias), " (", dt_bias.numel(),
                        " elements); expected [HV * K] = [", HV * K, "]"));
    OPENKDA_RETURN_IF_ERROR(c.float_dtype(dt_bias, "dt_bias"));
    OPENKDA_RETURN_IF_ERROR(c.placed(dt_bias, "dt_bias"));
  }
  return Status::Ok();
}

// Gate and beta options (FLA's ValueErrors).
Status check_options(const Checker& c, const KdaOptions& o, const TensorRef& A_log, bool safe_gate,
                     bool require_A_log) {
  if (o.use_gate_in_kernel && require_A_log && !A_log.defined() && !o.lower_bound)
    return c.fail(
        "A_log is undefined; expected HV elements when use_gate_in_kernel = true and "
        "lower_bound is not set");
  if (safe_gate && o.use_gate_in_kernel) {
    if (!o.lower_bound)
      return c.fail(
          "lower_bound is not set; expected a value in [-5, 0) when safe_gate = true and "
          "use_gate_in_kernel = true");
    if (!(*o.lower_bound >= -5.0 && *o.lower_bound < 0.0))
      return c.fail(
          cat("lower_bound = ", *o.lower_bound,
              "; expected a value in [-5, 0) when safe_gate = true and use_gate_in_kernel = true"));
  }
  if (o.lower_bound && !std::isfinite(*o.lower_bound))
    return c.fail(cat("lower_bound = ", *o.lower_bound, "; expected a finite value"));
  if (o.allow_neg_eigval && !o.use_beta_sigmoid_in_kernel)
    return c.fail("allow_neg_eigval = true; expected use_beta_sigmoid_in_kernel = true");
  if (o.scale && !std::isfinite(*o.scale))
    return c.fail(cat("scale = ", *o.scale, "; expected a finite value"));
  return Status::Ok();
}

Status check_chunk_problem(const Checker& c, const ChunkProblem& p, int64_t* n_out) {
  OPENKDA_RETURN_IF_ERROR(check_qkvg(c, p.q, p.k, p.v, p.g));
  const int64_t B = p.q.shape[0], T = p.q.shape[1], K = p.q.shape[3];
  const int64_t HV = p.v.shape[2], V = p.v.shape[3];
  OPENKDA_RETURN_IF_ERROR(c.tensor(p.beta, "beta", {B, T, HV}, "[B, T, HV]"));
  OPENKDA_RETURN_IF_ERROR(check_cu_seqlens(c, p.cu_seqlens, B, T, n_out));
  OPENKDA_RETURN_IF_ERROR(check_state(c, p.initial_state, "initial_state",
                                      state_shape(*n_out, HV, K, V, p.state_v_first),
                                      p.state_v_first, {DType::kF32, DType::kF64, DType::kBF16}));
  OPENKDA_RETURN_IF_ERROR(check_options(c, p, p.A_log, p.safe_gate, /*require_A_log=*/true));
  if (p.chunk_size != 32 && p.chunk_size != 64)
    return c.fail(cat("chunk_size = ", p.chunk_size, "; expected 32 or 64"));
  if (K > 256) return c.fail(cat("q.shape[3] (K) = ", K, "; expected K <= 256"));
  if (p.use_gate_in_kernel)
    OPENKDA_RETURN_IF_ERROR(check_gate_params(c, p.A_log, p.dt_bias, HV, K));
  return Status::Ok();
}

// Chunks per batch row of h: ceil(T / BT) dense, all chunks of all sequences with cu_seqlens.
int64_t chunks_per_row(const ChunkProblem& p) {
  const int64_t T = p.q.shape[1], BT = p.chunk_size;
  if (!p.cu_seqlens.defined()) return (T + BT - 1) / BT;
  int64_t nt = 0;
  for (int64_t i = 1; i < p.cu_seqlens.numel(); ++i)
    nt += (load_index(p.cu_seqlens, i) - load_index(p.cu_seqlens, i - 1) + BT - 1) / BT;
  return nt;
}

// An optional gradient output that must mirror its input's shape.
Status check_grad_like(const Checker& c, const TensorRef& grad, const char* name,
                       const TensorRef& input, const char* input_name) {
  if (!grad.defined()) return Status::Ok();
  if (!input.defined())
    return c.fail(cat(name, " is defined but ", input_name, " is undefined; expected undefined"));
  if (grad.numel() != input.numel())
    return c.fail(cat(name, ".shape ", shape_str(grad), "; expected ", input_name, ".shape ",
                      shape_str(input)));
  OPENKDA_RETURN_IF_ERROR(c.float_dtype(grad, name));
  return c.placed(grad, name);
}

// Host-readable state-pool indices: every slot read or written is in [0, num_slots).
Status check_state_indices(const Checker& c, const RecurrentFwdArgs& a, int64_t N) {
  const TensorRef& idx = a.ssm_state_indices;
  const int64_t cols = idx.ndim == 2 ? idx.shape[1] : 1;
  const int64_t slots = a.initial_state.defined() ? a.initial_state.shape[0] : -1;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t len = a.cu_seqlens.defined()
                            ? load_index(a.cu_seqlens, n + 1) - load_index(a.cu_seqlens, n)
                            : a.q.shape[1];
    if (len == 0) continue;
    if (len > cols)
      return c.fail(cat("ssm_state_indices.shape ", shape_str(idx), " has ", cols,
                        " slot(s) per sequence but sequence ", n, " has ", len,
                        " tokens; expected [N, max_tokens] with max_tokens >= ", len));
    int64_t first = 0;
    if (a.num_accepted_tokens.defined()) {
      const int64_t acc = load_index(a.num_accepted_tokens, n);
      if (acc < 1 || acc > cols)
        return c.fail(
            cat("num_accepted_tokens[", n, "] = ", acc, "; expected a value in [1, ", cols, "]"));
      first = acc - 1;
    }
    for (int64_t t = -1; t < len; ++t) {
      const int64_t col = t < 0 ? first : t;
      const int64_t slot = load_index(idx, n * cols + col);
      if (slots >= 0 && (slot < 0 || slot >= slots))
        return c.fail(cat("ssm_state_indices[", n, ", ", col, "] = ", slot,
                          "; expected a slot in [0, ", slots, ")"));
    }
  }
  return Status::Ok();
}

}  // namespace

Status validate(const ChunkFwdArgs& a) {
  Checker c("chunk_kda", a.q.device);
  int64_t N = 0;
  OPENKDA_RETURN_IF_ERROR(check_chunk_problem(c, a, &N));
  const int64_t B = a.q.shape[0], T = a.q.shape[1], K = a.q.shape[3];
  const int64_t HV = a.v.shape[2], V = a.v.shape[3];
  OPENKDA_RETURN_IF_ERROR(c.tensor(a.o, "o", {B, T, HV, V}, "[B, T, HV, V]"));
  OPENKDA_RETURN_IF_ERROR(check_state(c, a.final_state, "final_state",
                                      state_shape(N, HV, K, V, a.state_v_first), a.state_v_first,
                                      {DType::kF32, DType::kF64}));
  if (a.h.defined()) {
    // Device-resident cu_seqlens is never read from the host: the chunk count is then taken
    // from h itself and the kernels index within it.
    const bool host_cu = !a.cu_seqlens.defined() || a.cu_seqlens.device.type == DeviceType::kCPU;
    const int64_t nt = host_cu ? chunks_per_row(a) : (a.h.ndim == 5 ? a.h.shape[1] : -1);
    const auto expected = a.state_v_first ? std::vector<int64_t>{B, nt, HV, V, K}
                                          : std::vector<int64_t>{B, nt, HV, K, V};
    OPENKDA_RETURN_IF_ERROR(
        c.tensor(a.h, "h", expected, a.state_v_first ? "[B, NT, HV, V, K]" : "[B, NT, HV, K, V]"));
  }
  return Status::Ok();
}

Status validate(const ChunkBwdArgs& a) {
  Checker c("chunk_kda_bwd", a.q.device);
  int64_t N = 0;
  OPENKDA_RETURN_IF_ERROR(check_chunk_problem(c, a, &N));
  const int64_t B = a.q.shape[0], T = a.q.shape[1], H = a.q.shape[2], K = a.q.shape[3];
  const int64_t HV = a.v.shape[2], V = a.v.shape[3];
  OPENKDA_RETURN_IF_ERROR(c.tensor(a.d_o, "d_o", {B, T, HV, V}, "[B, T, HV, V]"));
  OPENKDA_RETURN_IF_ERROR(check_state(c, a.dht, "dht", state_shape(N, HV, K, V, a.state_v_first),
                                      a.state_v_first, {DType::kF32, DType::kF64}));
  OPENKDA_RETURN_IF_ERROR(c.tensor(a.dq, "dq", {B, T, H, K}, "[B, T, H, K]"));
  OPENKDA_RETURN_IF_ERROR(c.tensor(a.dk, "dk", {B, T, H, K}, "[B, T, H, K]"));
  OPENKDA_RETURN_IF_ERROR(c.tensor(a.dv, "dv", {B, T, HV, V}, "[B, T, HV, V]"));
  OPENKDA_RETURN_IF_ERROR(c.tensor(a.dg, "dg", {B, T, HV, K}, "[B, T, HV, K]"));
  OPENKDA_RETURN_IF_ERROR(c.tensor(a.dbeta, "dbeta", {B, T, HV}, "[B, T, HV]"));
  OPENKDA_RETURN_IF_ERROR(check_grad_like(c, a.dA_log, "dA_log", a.A_log, "A_log"));
  OPENKDA_RETURN_IF_ERROR(check_grad_like(c, a.ddt_bias, "ddt_bias", a.dt_bias, "dt_bias"));
  if (a.dh0.defined() && !a.initial_state.defined())
    return c.fail("dh0 is defined but initial_state is undefined; expected undefined");
  OPENKDA_RETURN_IF_ERROR(check_state(c, a.dh0, "dh0", state_shape(N, HV, K, V, a.state_v_first),
                                      a.state_v_first, {DType::kF32, DType::kF64}));
  return Status::Ok();
}

Status validate(const RecurrentFwdArgs& a) {
  Checker c("fused_recurrent_kda", a.q.device);
  OPENKDA_RETURN_IF_ERROR(check_qkvg(c, a.q, a.k, a.v, a.g));
  const int64_t B = a.q.shape[0], T = a.q.shape[1], K = a.q.shape[3];
  const int64_t HV = a.v.shape[2], V = a.v.shape[3];
  if (!a.beta.defined()) return c.fail("beta is undefined; expected [B, T, HV] or [B, T, HV, V]");
  if (a.beta.ndim == 4)
    OPENKDA_RETURN_IF_ERROR(c.tensor(a.beta, "beta", {B, T, HV, V}, "headwise [B, T, HV, V]"));
  else
    OPENKDA_RETURN_IF_ERROR(c.tensor(a.beta, "beta", {B, T, HV}, "[B, T, HV]"));
  int64_t N = 0;
  OPENKDA_RETURN_IF_ERROR(check_cu_seqlens(c, a.cu_seqlens, B, T, &N));
  OPENKDA_RETURN_IF_ERROR(check_options(c, a, a.A_log, false, /*require_A_log=*/false));
  if (a.use_gate_in_kernel)
    OPENKDA_RETURN_IF_ERROR(check_gate_params(c, a.A_log, a.dt_bias, HV, K));
  const bool pool = a.ssm_state_indices.defined();
  if (a.initial_state.defined()) {
    const int64_t n = pool ? a.initial_state.shape[0] : N;
    if (pool && (a.initial_state.ndim != 4 || n < 1))
      return c.fail(cat("initial_state.shape ", shape_str(a.initial_state),
                        "; expected a state pool [num_slots, HV, K, V] with num_slots >= 1"));
    OPENKDA_RETURN_IF_ERROR(check_state(c, a.initial_state, "initial_state",
                                        state_shape(n, HV, K, V, a.state_v_first), a.state_v_first,
                                        {DType::kF32, DType::kF64, DType::kBF16, DType::kF16}));
  }
  if (a.inplace_final_state && !a.initial_state.defined())
    return c.fail(
        "initial_state is undefined with inplace_final_state = true; expected the state "
        "tensor (or pool) to update in place");
  if (pool) {
    const TensorRef& idx = a.ssm_state_indices;
    if (idx.ndim != 1 && idx.ndim != 2)
      return c.fail(cat("ssm_state_indices: rank ", idx.ndim, " ", shape_str(idx),
                        "; expected rank 1 [N] or rank 2 [N, max_tokens]"));
    if (idx.shape[0] != N)
      return c.fail(cat("ssm_state_indices.shape[0] = ", idx.shape[0], "; expected N = ", N));
    OPENKDA_RETURN_IF_ERROR(c.dtype_in(idx, "ssm_state_indices", {DType::kI32, DType::kI64}));
    OPENKDA_RETURN_IF_ERROR(c.placed(idx, "ssm_state_indices"));
  }
  if (a.num_accepted_tokens.defined()) {
    if (!pool)
      return c.fail("num_accepted_tokens is defined without ssm_state_indices; expected both");
    OPENKDA_RETURN_IF_ERROR(c.shape(a.num_accepted_tokens, "num_accepted_tokens", {N}, "[N]"));
    OPENKDA_RETURN_IF_ERROR(
        c.dtype_in(a.num_accepted_tokens, "num_accepted_tokens", {DType::kI32, DType::kI64}));
    OPENKDA_RETURN_IF_ERROR(c.placed(a.num_accepted_tokens, "num_accepted_tokens"));
  }
  // After num_accepted_tokens' own checks: check_state_indices reads it on the host.
  if (pool && a.ssm_state_indices.device.type == DeviceType::kCPU) {
    OPENKDA_RETURN_IF_ERROR(check_state_indices(c, a, N));
  } else if (pool && !a.cu_seqlens.defined() && T > 0) {
    // Device indices are never read here, but without cu_seqlens every sequence has T tokens,
    // and token t uses column t: the shape alone must cover them.
    const int64_t cols = a.ssm_state_indices.ndim == 2 ? a.ssm_state_indices.shape[1] : 1;
    if (T > cols)
      return c.fail(cat("ssm_state_indices.shape ", shape_str(a.ssm_state_indices), " has ", cols,
                        " slot(s) per sequence but every sequence has T = ", T,
                        " tokens; expected [N, max_tokens] with max_tokens >= ", T));
  }
  OPENKDA_RETURN_IF_ERROR(c.tensor(a.o, "o", {B, T, HV, V}, "[B, T, HV, V]"));
  if (a.final_state.defined() && !a.inplace_final_state) {
    const int64_t n = pool ? B * T : N;
    OPENKDA_RETURN_IF_ERROR(check_state(c, a.final_state, "final_state",
                                        state_shape(n, HV, K, V, a.state_v_first), a.state_v_first,
                                        {DType::kF32, DType::kF64, DType::kBF16, DType::kF16}));
  }
  return Status::Ok();
}

namespace {

Status check_gate_common(const Checker& c, const TensorRef& g, const TensorRef& A_log,
                         const TensorRef& dt_bias, const std::optional<double>& lower_bound) {
  if (!g.defined()) return c.fail("g is undefined; expected [..., HV, K]");
  if (g.ndim < 2)
    return c.fail(cat("g: rank ", g.ndim, " ", shape_str(g), "; expected rank >= 2 [..., HV, K]"));
  if (g.size(-2) < 1 || g.size(-1) < 1)
    return c.fail(cat("g.shape ", shape_str(g), "; expected HV >= 1 and K >= 1 in [..., HV, K]"));
  OPENKDA_RETURN_IF_ERROR(c.float_dtype(g, "g"));
  OPENKDA_RETURN_IF_ERROR(c.placed(g, "g"));
  if (!A_log.defined() && !lower_bound)
    return c.fail("A_log is undefined; expected HV elements when lower_bound is not set");
  if (lower_bound && !std::isfinite(*lower_bound))
    return c.fail(cat("lower_bound = ", *lower_bound, "; expected a finite value"));
  return check_gate_params(c, A_log, dt_bias, g.size(-2), g.size(-1));
}

std::vector<int64_t> shape_of(const TensorRef& t) {
  return std::vector<int64_t>(t.shape, t.shape + t.ndim);
}

}  // namespace

Status validate(const GateFwdArgs& a) {
  Checker c("fused_kda_gate", a.g.device, "g");
  OPENKDA_RETURN_IF_ERROR(check_gate_common(c, a.g, a.A_log, a.dt_bias, a.lower_bound));
  return c.tensor(a.y, "y", shape_of(a.g), "g.shape [..., HV, K]");
}

Status validate(const GateBwdArgs& a) {
  Checker c("fused_kda_gate_bwd", a.g.device, "g");
  OPENKDA_RETURN_IF_ERROR(check_gate_common(c, a.g, a.A_log, a.dt_bias, a.lower_bound));
  OPENKDA_RETURN_IF_ERROR(c.tensor(a.dy, "dy", shape_of(a.g), "g.shape [..., HV, K]"));
  OPENKDA_RETURN_IF_ERROR(c.tensor(a.dg, "dg", shape_of(a.g), "g.shape [..., HV, K]"));
  if (a.dg.dtype != a.g.dtype)
    return c.fail(
        cat("dg.dtype ", dtype_name(a.dg.dtype), "; expected g.dtype ", dtype_name(a.g.dtype)));
  OPENKDA_RETURN_IF_ERROR(check_grad_like(c, a.dA_log, "dA_log", a.A_log, "A_log"));
  return check_grad_like(c, a.ddt_bias, "ddt_bias", a.dt_bias, "dt_bias");
}

}  // namespace openkda
