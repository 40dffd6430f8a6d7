// openkda._C: the nanobind/DLPack binding of the framework-free C++ core (include/openkda).
//
// Every op is exposed as three functions that take the tensors and the options as dicts:
//   <op>_workspace_bytes(tensors, options) -> int    validates (can_implement), then sizes scratch
//   <op>(tensors, options, workspace, stream) -> None  runs; the GIL is released meanwhile
//   <op>_run(tensors, options, allocate, stream) -> None  both in one call: validates, sizes the
//       scratch, calls allocate(nbytes) (a Python callable returning a DLPack tensor of at least
//       nbytes bytes, e.g. a torch.empty; not called when nbytes = 0) and runs. The caller still
//       owns the memory; each tensor is imported through DLPack once instead of twice (the two
//       calls above cost ~20 DLPack exports per op call, the largest share of the host time
//       before a chunk_kda launch).
// with <op> in {chunk_fwd, chunk_bwd, recurrent_fwd, gate_fwd, gate_bwd}. `tensors` maps the
// field names of the core's Args struct (q, k, v, ..., o, final_state) to any DLPack producer
// (torch, numpy, ...) or None (an undefined TensorRef, FLA's None); `options` maps option names
// (scale, lower_bound, chunk_size, precision "f32" | "f64", algorithm "chunked" | "reference", ...)
// to Python scalars. Unknown names raise ValueError, so a typo never goes unnoticed.
//
// The CUDA stream travels explicitly as an integer (DLPack carries none): the Python layer passes
// torch.cuda.current_stream().cuda_stream, or 0 for CPU tensors. Status codes map to Python
// exceptions: kInvalidArgument -> ValueError, kNotSupported -> NotImplementedError,
// kInternal -> RuntimeError, each with the Status message.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "openkda/openkda.h"

namespace nb = nanobind;
using namespace openkda;

namespace {

[[noreturn]] void raise_status(const Status& s) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument: throw nb::value_error(s.message().c_str());
    case StatusCode::kNotSupported:
      PyErr_SetString(PyExc_NotImplementedError, s.message().c_str());
      throw nb::python_error();
    default: throw std::runtime_error(s.message());
  }
}

void check(const Status& s) {
  if (!s.ok()) raise_status(s);
}

[[noreturn]] void bad(const std::string& op, const std::string& what) {
  throw nb::value_error((op + ": " + what).c_str());
}

// A dict key as a view of its UTF-8 bytes, which the str object caches (no copy per call: the
// names are parsed on every op call).
std::string_view key_name(nb::handle key, const std::string& op) {
  Py_ssize_t size = 0;
  const char* s = PyUnicode_Check(key.ptr()) ? PyUnicode_AsUTF8AndSize(key.ptr(), &size) : nullptr;
  if (s == nullptr) {
    PyErr_Clear();
    bad(op, "a " + std::string(nb::inst_name(key).c_str()) + " key; expected a str (a name)");
  }
  return {s, static_cast<size_t>(size)};
}

// DLPack dtype (code, bits) -> DType. bf16 is kDLBfloat (code 4).
DType to_dtype(nb::dlpack::dtype d, const std::string& op, std::string_view name) {
  using C = nb::dlpack::dtype_code;
  const auto code = static_cast<C>(d.code);
  if (d.lanes == 1) {
    if (code == C::Float && d.bits == 16) return DType::kF16;
    if (code == C::Float && d.bits == 32) return DType::kF32;
    if (code == C::Float && d.bits == 64) return DType::kF64;
    if (code == C::Bfloat && d.bits == 16) return DType::kBF16;
    if (code == C::Int && d.bits == 32) return DType::kI32;
    if (code == C::Int && d.bits == 64) return DType::kI64;
    if (code == C::UInt && d.bits == 8) return DType::kU8;
  }
  bad(op, std::string(name) + ": DLPack dtype (code " + std::to_string(d.code) + ", bits " +
              std::to_string(d.bits) + ", lanes " + std::to_string(d.lanes) +
              "); expected f16, bf16, f32, f64, i32, i64 or u8");
}

// "cpu" or "cuda:N" of an imported tensor.
std::string device_name(const nb::ndarray<>& a) {
  return a.device_type() == nb::device::cuda::value ? "cuda:" + std::to_string(a.device_id())
                                                    : std::string("cpu");
}

// Imports one DLPack tensor and describes it as a TensorRef. `keep` owns the import until the op
// has returned.
TensorRef to_ref(nb::handle obj, const std::string& op, std::string_view name,
                 std::vector<nb::ndarray<>>& keep) {
  nb::ndarray<> a;
  if (!nb::try_cast(obj, a, /*convert=*/false))
    bad(op, std::string(name) + ": a " + std::string(nb::inst_name(obj).c_str()) +
                "; expected a DLPack tensor or None");
  TensorRef t;
  t.data = a.data();
  t.dtype = to_dtype(a.dtype(), op, name);
  if (a.device_type() == nb::device::cpu::value) {
    t.device = Device{DeviceType::kCPU, 0};
  } else if (a.device_type() == nb::device::cuda::value) {
    t.device = Device{DeviceType::kCUDA, a.device_id()};
  } else {
    bad(op, std::string(name) + ": DLPack device type " + std::to_string(a.device_type()) +
                "; expected cpu or cuda");
  }
  if (a.ndim() > static_cast<size_t>(kMaxDims))
    bad(op, std::string(name) + ": rank " + std::to_string(a.ndim()) +
                "; expected rank <= " + std::to_string(kMaxDims));
  t.ndim = static_cast<int>(a.ndim());
  for (int d = 0; d < t.ndim; ++d) {
    t.shape[d] = static_cast<int64_t>(a.shape(d));
    t.stride[d] = a.stride(d);  // elements, as in TensorRef
  }
  // NOTE: strides of an empty tensor address nothing and producers disagree on them (torch keeps
  // the strides of its nominal shape); describe empty tensors as row-major.
  if (a.size() == 0) {
    int64_t s = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      t.stride[d] = s;
      s *= t.shape[d];
    }
  }
  keep.push_back(std::move(a));
  return t;
}

template <class Args>
using TensorFields = std::vector<std::pair<const char*, TensorRef Args::*>>;

// Fills the TensorRef fields of `args` named in `tensors`.
template <class Args>
void set_tensors(Args& args, const TensorFields<Args>& fields, nb::dict tensors,
                 const std::string& op, std::vector<nb::ndarray<>>& keep) {
  for (auto [key, value] : tensors) {
    const std::string_view name = key_name(key, op);
    bool found = false;
    for (const auto& [field, member] : fields) {
      if (name != field) continue;
      if (!value.is_none()) args.*member = to_ref(value, op, name, keep);
      found = true;
      break;
    }
    if (!found) bad(op, "unknown tensor argument '" + std::string(name) + "'");
  }
}

std::optional<double> opt_double(nb::handle v) {
  if (v.is_none()) return std::nullopt;
  return nb::cast<double>(v);
}

// Options shared by every chunk/recurrent op; false if `name` is not one of them.
bool set_kda_option(KdaOptions& o, std::string_view name, nb::handle v, const std::string& op) {
  if (name == "scale")
    o.scale = opt_double(v);
  else if (name == "use_qk_l2norm_in_kernel")
    o.use_qk_l2norm_in_kernel = nb::cast<bool>(v);
  else if (name == "use_gate_in_kernel")
    o.use_gate_in_kernel = nb::cast<bool>(v);
  else if (name == "use_beta_sigmoid_in_kernel")
    o.use_beta_sigmoid_in_kernel = nb::cast<bool>(v);
  else if (name == "allow_neg_eigval")
    o.allow_neg_eigval = nb::cast<bool>(v);
  else if (name == "lower_bound")
    o.lower_bound = opt_double(v);
  else if (name == "state_v_first")
    o.state_v_first = nb::cast<bool>(v);
  else if (name == "num_threads")
    o.num_threads = nb::cast<int>(v);
  else if (name == "precision") {
    const auto s = nb::cast<std::string>(v);
    if (s != "f32" && s != "f64") bad(op, "precision = '" + s + "'; expected 'f32' or 'f64'");
    o.precision = s == "f64" ? Precision::kF64 : Precision::kF32;
  } else if (name == "algorithm") {
    const auto s = nb::cast<std::string>(v);
    if (s != "chunked" && s != "reference")
      bad(op, "algorithm = '" + s + "'; expected 'chunked' or 'reference'");
    o.algorithm = s == "reference" ? Algorithm::kRecurrentReference : Algorithm::kChunked;
  } else
    return false;
  return true;
}

bool set_option(ChunkProblem& a, std::string_view n, nb::handle v, const std::string& op) {
  if (n == "safe_gate")
    a.safe_gate = nb::cast<bool>(v);
  else if (n == "chunk_size")
    a.chunk_size = nb::cast<int>(v);
  else
    return set_kda_option(a, n, v, op);
  return true;
}
bool set_option(RecurrentFwdArgs& a, std::string_view n, nb::handle v, const std::string& op) {
  if (n == "inplace_final_state")
    a.inplace_final_state = nb::cast<bool>(v);
  else
    return set_kda_option(a, n, v, op);
  return true;
}
template <class GateArgs>
bool set_gate_option(GateArgs& a, std::string_view n, nb::handle v) {
  if (n == "lower_bound")
    a.lower_bound = opt_double(v);
  else if (n == "num_threads")
    a.num_threads = nb::cast<int>(v);
  else
    return false;
  return true;
}
bool set_option(GateFwdArgs& a, std::string_view n, nb::handle v, const std::string&) {
  return set_gate_option(a, n, v);
}
bool set_option(GateBwdArgs& a, std::string_view n, nb::handle v, const std::string&) {
  return set_gate_option(a, n, v);
}

template <class Args>
void set_options(Args& args, nb::dict options, const std::string& op) {
  for (auto [key, value] : options) {
    const std::string_view name = key_name(key, op);
    bool ok = false;
    try {
      ok = set_option(args, name, value, op);
    } catch (const nb::cast_error&) {
      bad(op, std::string(name) + ": a " + std::string(nb::inst_name(value).c_str()) +
                  "; expected a " +
                  (name == "precision" || name == "algorithm" ? "str" : "number"));
    }
    if (!ok) bad(op, "unknown option '" + std::string(name) + "'");
  }
}

// run(args) with `workspace` (a DLPack tensor, or None for no scratch) on `stream`, the GIL
// released meanwhile; a non-Ok Status raises.
// The workspace must be contiguous (its bytes are numel x itemsize) and on the device of the
// tensors imported before it (keep.front(): the op's first tensor field).
template <class Args>
void run_with(const Args& args, nb::handle workspace, const char* op, uintptr_t stream,
              std::vector<nb::ndarray<>>& keep) {
  Workspace ws;
  if (!workspace.is_none()) {
    const std::string where = keep.empty() ? std::string() : device_name(keep.front());
    const TensorRef w = to_ref(workspace, op, "workspace", keep);
    if (!w.is_contiguous()) bad(op, "workspace: a strided view; expected a contiguous tensor");
    if (!where.empty() && device_name(keep.back()) != where) {
      bad(op,
          "workspace: on " + device_name(keep.back()) + "; expected the inputs' device " + where);
    }
    ws.data = w.data;
    ws.bytes = static_cast<size_t>(w.numel()) * dtype_size(w.dtype);
  }
  Status s;
  {
    nb::gil_scoped_release release;
    s = run(args, ws, reinterpret_cast<Stream>(stream));
  }
  check(s);
}

// One op: its name in messages, its tensor fields, and the three Python entry points.
template <class Args>
void def_op(nb::module_& m, const char* py_name, const char* op, TensorFields<Args> fields,
            const char* doc) {
  auto build = [op, fields](nb::dict tensors, nb::dict options, std::vector<nb::ndarray<>>& keep) {
    keep.reserve(fields.size() + 1);  // every tensor field and the workspace: no regrowth
    Args args;
    set_tensors(args, fields, tensors, op, keep);
    set_options(args, options, op);
    return args;
  };
  m.def((std::string(py_name) + "_workspace_bytes").c_str(),
        [build](nb::dict tensors, nb::dict options) {
          std::vector<nb::ndarray<>> keep;
          const Args args = build(tensors, options, keep);
          check(can_implement(args));
          return workspace_bytes(args);
        },
        nb::arg("tensors"), nb::arg("options"),
        "Validates the arguments (can_implement) and returns the workspace size in bytes.");
  m.def(
      py_name,
      [build, op](nb::dict tensors, nb::dict options, nb::handle workspace, uintptr_t stream) {
        std::vector<nb::ndarray<>> keep;
        const Args args = build(tensors, options, keep);
        run_with(args, workspace, op, stream, keep);
      },
      nb::arg("tensors"), nb::arg("options"), nb::arg("workspace").none(), nb::arg("stream"), doc);
  m.def((std::string(py_name) + "_run").c_str(),
        [build, op](nb::dict tensors, nb::dict options, nb::callable allocate, uintptr_t stream) {
          std::vector<nb::ndarray<>> keep;
          const Args args = build(tensors, options, keep);
          // 0 for invalid arguments: nothing is allocated and run() reports them.
          const size_t nbytes = workspace_bytes(args);
          nb::object buffer = nb::none();
          if (nbytes > 0) {
            buffer = allocate(nbytes);
            if (buffer.is_none()) {
              bad(op, "allocate(" + std::to_string(nbytes) +
                          ") returned None; expected a DLPack tensor of at least " +
                          std::to_string(nbytes) + " bytes");
            }
          }
          run_with(args, buffer, op, stream, keep);
        },
        nb::arg("tensors"), nb::arg("options"), nb::arg("allocate"), nb::arg("stream"),
        "Validates, sizes the workspace, calls allocate(nbytes) for it (not when 0) and runs.");
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "OpenKDA C++ core (DLPack binding). Use the openkda package, not this module.";

  def_op<ChunkFwdArgs>(m, "chunk_fwd", "chunk_kda",
                       {{"q", &ChunkFwdArgs::q},
                        {"k", &ChunkFwdArgs::k},
                        {"v", &ChunkFwdArgs::v},
                        {"g", &ChunkFwdArgs::g},
                        {"beta", &ChunkFwdArgs::beta},
                        {"A_log", &ChunkFwdArgs::A_log},
                        {"dt_bias", &ChunkFwdArgs::dt_bias},
                        {"initial_state", &ChunkFwdArgs::initial_state},
                        {"cu_seqlens", &ChunkFwdArgs::cu_seqlens},
                        {"o", &ChunkFwdArgs::o},
                        {"final_state", &ChunkFwdArgs::final_state},
                        {"h", &ChunkFwdArgs::h}},
                       "chunk_kda forward: writes o, final_state and h (when given).");
  def_op<ChunkBwdArgs>(m, "chunk_bwd", "chunk_kda_bwd",
                       {{"q", &ChunkBwdArgs::q},
                        {"k", &ChunkBwdArgs::k},
                        {"v", &ChunkBwdArgs::v},
                        {"g", &ChunkBwdArgs::g},
                        {"beta", &ChunkBwdArgs::beta},
                        {"A_log", &ChunkBwdArgs::A_log},
                        {"dt_bias", &ChunkBwdArgs::dt_bias},
                        {"initial_state", &ChunkBwdArgs::initial_state},
                        {"cu_seqlens", &ChunkBwdArgs::cu_seqlens},
                        {"d_o", &ChunkBwdArgs::d_o},
                        {"dht", &ChunkBwdArgs::dht},
                        {"dq", &ChunkBwdArgs::dq},
                        {"dk", &ChunkBwdArgs::dk},
                        {"dv", &ChunkBwdArgs::dv},
                        {"dg", &ChunkBwdArgs::dg},
                        {"dbeta", &ChunkBwdArgs::dbeta},
                        {"dA_log", &ChunkBwdArgs::dA_log},
                        {"ddt_bias", &ChunkBwdArgs::ddt_bias},
                        {"dh0", &ChunkBwdArgs::dh0}},
                       "chunk_kda backward: writes the gradients of every defined input.");
  def_op<RecurrentFwdArgs>(
      m, "recurrent_fwd", "fused_recurrent_kda",
      {{"q", &RecurrentFwdArgs::q},
       {"k", &RecurrentFwdArgs::k},
       {"v", &RecurrentFwdArgs::v},
       {"g", &RecurrentFwdArgs::g},
       {"beta", &RecurrentFwdArgs::beta},
       {"A_log", &RecurrentFwdArgs::A_log},
       {"dt_bias", &RecurrentFwdArgs::dt_bias},
       {"initial_state", &RecurrentFwdArgs::initial_state},
       {"cu_seqlens", &RecurrentFwdArgs::cu_seqlens},
       {"ssm_state_indices", &RecurrentFwdArgs::ssm_state_indices},
       {"num_accepted_tokens", &RecurrentFwdArgs::num_accepted_tokens},
       {"o", &RecurrentFwdArgs::o},
       {"final_state", &RecurrentFwdArgs::final_state}},
      "fused_recurrent_kda forward: writes o and the final (or per-token, or in-place) states.");
  def_op<GateFwdArgs>(m, "gate_fwd", "fused_kda_gate",
                      {{"g", &GateFwdArgs::g},
                       {"A_log", &GateFwdArgs::A_log},
                       {"dt_bias", &GateFwdArgs::dt_bias},
                       {"y", &GateFwdArgs::y}},
                      "fused_kda_gate forward: writes y.");
  def_op<GateBwdArgs>(m, "gate_bwd", "fused_kda_gate_bwd",
                      {{"g", &GateBwdArgs::g},
                       {"A_log", &GateBwdArgs::A_log},
                       {"dt_bias", &GateBwdArgs::dt_bias},
                       {"dy", &GateBwdArgs::dy},
                       {"dg", &GateBwdArgs::dg},
                       {"dA_log", &GateBwdArgs::dA_log},
                       {"ddt_bias", &GateBwdArgs::ddt_bias}},
                      "fused_kda_gate backward: writes dg, dA_log and ddt_bias (when given).");

  m.def(
      "build_config",
      [] {
        const BuildConfig c = build_config();
        nb::dict d;
        d["cuda"] = c.cuda;
        d["cuda_archs"] = std::string(c.cuda_archs ? c.cuda_archs : "");
        d["version"] = std::string(c.version ? c.version : "");
        return d;
      },
      "Optional parts compiled into this build: {'cuda': bool, 'cuda_archs': str, 'version': "
      "str}.");
}
