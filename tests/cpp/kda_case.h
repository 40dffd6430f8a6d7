// A KDA test case: configuration, random inputs, runners of the public API (chunk forward and
// backward) and an independent per-token reference written from the spec (section 1.1), in double.
//
// Gate modes (spec 3.1) and beta modes (spec 3.4) are enumerated so that a test grid can walk them.
#pragma once

#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace kdatest {

using openkda::Algorithm;
using openkda::Precision;

enum class Gate {
  kPre,            // pre-gated log-decay g (natural log, <= 0)
  kSoftplus,       // in kernel: -exp(A_log) * softplus(g)
  kSoftplusBias,   // in kernel: -exp(A_log) * softplus(g + dt_bias)
  kLowerBound,     // in kernel: L * sigmoid(exp(A_log) * (g + dt_bias))
  kLowerBoundNoA,  // in kernel: L * sigmoid(g + dt_bias)
  kSafeInKernel,   // safe_gate + in kernel lower bound L in [-5, 0) (A_log + dt_bias)
  kSafePre,        // safe_gate + pre-gated g clamped to [-5, 0]
};
constexpr Gate kAllGates[] = {Gate::kPre,        Gate::kSoftplus,      Gate::kSoftplusBias,
                              Gate::kLowerBound, Gate::kLowerBoundNoA, Gate::kSafeInKernel,
                              Gate::kSafePre};

enum class Beta {
  kPost,       // beta as passed, in (0, 1)
  kLogits,     // sigmoid(beta) in kernel
  kLogitsNeg,  // 2 * sigmoid(beta) in kernel (allow_neg_eigval)
};
constexpr Beta kAllBetas[] = {Beta::kPost, Beta::kLogits, Beta::kLogitsNeg};

inline const char* gate_name(Gate g) {
  switch (g) {
    case Gate::kPre: return "pre";
    case Gate::kSoftplus: return "softplus";
    case Gate::kSoftplusBias: return "softplusBias";
    case Gate::kLowerBound: return "lowerBound";
    case Gate::kLowerBoundNoA: return "lowerBoundNoA";
    case Gate::kSafeInKernel: return "safeInKernel";
    case Gate::kSafePre: return "safePre";
  }
  return "?";
}
inline const char* beta_name(Beta b) {
  switch (b) {
    case Beta::kPost: return "betaPost";
    case Beta::kLogits: return "betaLogits";
    case Beta::kLogitsNeg: return "betaNegEig";
  }
  return "?";
}

inline bool gate_in_kernel(Gate g) {
  return g != Gate::kPre && g != Gate::kSafePre;
}
inline bool gate_has_A_log(Gate g) {
  return g == Gate::kSoftplus || g == Gate::kSoftplusBias || g == Gate::kLowerBound ||
         g == Gate::kSafeInKernel;
}
inline bool gate_has_dt_bias(Gate g) {
  return g == Gate::kSoftplusBias || g == Gate::kLowerBound || g == Gate::kLowerBoundNoA ||
         g == Gate::kSafeInKernel;
}
inline bool gate_has_lower_bound(Gate g) {
  return g == Gate::kLowerBound || g == Gate::kLowerBoundNoA || g == Gate::kSafeInKernel;
}
inline bool gate_safe(Gate g) {
  return g == Gate::kSafeInKernel || g == Gate::kSafePre;
}

struct Config {
  int64_t B = 2, T = 64, H = 2, HV = 2, K = 16, V = 16;
  Gate gate = Gate::kPre;
  Beta beta = Beta::kPost;
  bool l2norm = false;
  std::optional<double> scale;
  int chunk = 64;
  bool h0 = false;
  bool v_first = false;
  std::vector<int64_t> cu;  // empty: dense
  DType cu_dtype = DType::kI64;
  double lower_bound = -3.0;  // used by the lower-bound gates (the safe gate overrides below)
  DType qk_dtype = DType::kF64, v_dtype = DType::kF64, g_dtype = DType::kF64,
        beta_dtype = DType::kF64, param_dtype = DType::kF64, h0_dtype = DType::kF64,
        state_dtype = DType::kF64;  // final_state, h, dh0
  // Every float tensor of the case (inputs, parameters, states) in `dtype`.
  void set_all_dtypes(DType dtype) {
    qk_dtype = v_dtype = g_dtype = beta_dtype = param_dtype = h0_dtype = state_dtype = dtype;
  }
  bool headwise_beta = false;         // recurrent op only: beta [B, T, HV, V]
  bool a_log_4d = false;              // A_log shaped [1, 1, HV, 1] instead of [HV]
  bool params_when_pregated = false;  // pass A_log and dt_bias although the gate is pre-gated
  double extreme_gate_prob = 0.0;     // pre-gated only: fraction of g set to extreme_gate_value
  double extreme_gate_value = -1000.0;
  uint64_t seed = 1;

  bool varlen() const { return !cu.empty(); }
  int64_t N() const { return varlen() ? static_cast<int64_t>(cu.size()) - 1 : B; }
  int64_t chunks(int64_t len) const { return (len + chunk - 1) / chunk; }
  int64_t NT_b() const {  // chunks per batch row (h's second dimension)
    if (!varlen()) return chunks(T);
    int64_t c = 0;
    for (size_t n = 0; n + 1 < cu.size(); ++n) c += chunks(cu[n + 1] - cu[n]);
    return c;
  }
  bool has_A_log() const { return gate_has_A_log(gate) || params_when_pregated; }
  bool has_dt_bias() const { return gate_has_dt_bias(gate) || params_when_pregated; }
  std::vector<int64_t> state_shape(int64_t n) const {
    return v_first ? std::vector<int64_t>{n, HV, V, K} : std::vector<int64_t>{n, HV, K, V};
  }
  std::vector<int64_t> h_shape() const {
    return v_first ? std::vector<int64_t>{B, NT_b(), HV, V, K}
                   : std::vector<int64_t>{B, NT_b(), HV, K, V};
  }
  // Element (d, e) of the state matrix [K, V] inside a state block, honouring the layout.
  int64_t sidx(int64_t d, int64_t e) const { return v_first ? e * K + d : d * V + e; }
  double scale_value() const { return scale ? *scale : 1.0 / std::sqrt(static_cast<double>(K)); }

  std::string name() const {
    std::ostringstream s;
    s << "B" << B << "_T" << T << "_H" << H << "_HV" << HV << "_K" << K << "_V" << V << "_"
      << gate_name(gate) << "_" << beta_name(beta) << (l2norm ? "_l2" : "") << "_c" << chunk
      << (h0 ? "_h0" : "") << (v_first ? "_vfirst" : "");
    if (scale) s << "_scale";
    if (varlen()) s << "_cu" << (cu_dtype == DType::kI32 ? "32" : "64") << "N" << N();
    if (headwise_beta) s << "_headwise";
    return s.str();
  }
};

// gtest prints parameters through this (instead of a byte dump).
inline void PrintTo(const Config& c, std::ostream* os) {
  *os << c.name();
}

// Sequence lengths summing to `total` that contain an empty and a 1-token sequence when possible.
inline std::vector<int64_t> make_cu_seqlens(Rng& rng, int64_t total) {
  std::vector<int64_t> lens;
  if (total == 0) {
    lens = {0};
  } else if (total == 1) {
    lens = {0, 1, 0};
  } else {
    lens = {1, 0};
    int64_t rest = total - 1;
    const int64_t pieces = std::min<int64_t>(rest, rng.integer(1, 3));
    for (int64_t p = 0; p < pieces - 1; ++p) {
      const int64_t l = rng.integer(1, rest - (pieces - 1 - p));
      lens.push_back(l);
      rest -= l;
    }
    lens.push_back(rest);
    // Shuffle so that the empty / single sequences are not always first.
    for (size_t i = lens.size() - 1; i > 0; --i) {
      const size_t j = static_cast<size_t>(rng.integer(0, static_cast<int64_t>(i)));
      std::swap(lens[i], lens[j]);
    }
  }
  std::vector<int64_t> cu{0};
  for (int64_t l : lens) cu.push_back(cu.back() + l);
  return cu;
}

struct Inputs {
  HostTensor q, k, v, g, beta, A_log, dt_bias, h0, cu;
};

inline Inputs make_inputs(const Config& c) {
  Rng rng(c.seed * 7919 + 17);
  Inputs in;
  const int64_t B = c.B, T = c.T, H = c.H, HV = c.HV, K = c.K, V = c.V;
  in.q = random_tensor(rng, c.qk_dtype, {B, T, H, K});
  in.k = HostTensor(c.qk_dtype, {B, T, H, K});
  for (int64_t row = 0; row < B * T * H; ++row) {
    // Without in-kernel l2norm the keys are unit-norm rows times U(0.5, 1): the delta rule stays
    // contractive (|1 - beta |k|^2| <= 1 for beta <= 2), as with normalised keys in practice.
    std::vector<double> x = rng.normals(K);
    double nrm = 0;
    for (double v : x) nrm += v * v;
    nrm = std::sqrt(nrm);
    const double s = c.l2norm ? rng.uniform(0.5, 2.0) : rng.uniform(0.5, 1.0) / nrm;
    for (int64_t d = 0; d < K; ++d) in.k.set(row * K + d, x[static_cast<size_t>(d)] * s);
  }
  in.v = random_tensor(rng, c.v_dtype, {B, T, HV, V});
  in.g = HostTensor(c.g_dtype, {B, T, HV, K});
  for (int64_t i = 0; i < in.g.numel(); ++i) {
    double x = rng.normal();
    if (!gate_in_kernel(c.gate)) {
      x = log_sigmoid(x + 1.0);  // in (-inf, 0), mostly [-2, 0]
      if (c.gate == Gate::kSafePre) x = std::max(-5.0, std::min(0.0, 2.0 * x));
      if (c.extreme_gate_prob > 0 && rng.uniform() < c.extreme_gate_prob) x = c.extreme_gate_value;
    } else {
      x *= 2.0;  // raw gate logits
    }
    in.g.set(i, x);
  }
  const bool headwise = c.headwise_beta;
  in.beta = HostTensor(
      c.beta_dtype, headwise ? std::vector<int64_t>{B, T, HV, V} : std::vector<int64_t>{B, T, HV});
  for (int64_t i = 0; i < in.beta.numel(); ++i) {
    const double x = rng.normal() * 1.5;
    in.beta.set(i, c.beta == Beta::kPost ? sigmoid(x) : x);
  }
  if (c.has_A_log()) {
    in.A_log =
        c.a_log_4d ? HostTensor(c.param_dtype, {1, 1, HV, 1}) : HostTensor(c.param_dtype, {HV});
    for (int64_t i = 0; i < HV; ++i) in.A_log.set(i, 0.7 * rng.normal());
  }
  if (c.has_dt_bias()) in.dt_bias = random_tensor(rng, c.param_dtype, {HV * K});
  if (c.h0) in.h0 = random_tensor(rng, c.h0_dtype, c.state_shape(c.N()), 0.5);
  if (c.varlen()) {
    in.cu = HostTensor(c.cu_dtype, {static_cast<int64_t>(c.cu.size())});
    for (size_t i = 0; i < c.cu.size(); ++i) in.cu.set(static_cast<int64_t>(i), c.cu[i]);
  }
  return in;
}

inline void apply_options(const Config& c, Precision p, Algorithm a, int threads,
                          openkda::KdaOptions& o) {
  o.scale = c.scale;
  o.use_qk_l2norm_in_kernel = c.l2norm;
  o.use_gate_in_kernel = gate_in_kernel(c.gate);
  o.use_beta_sigmoid_in_kernel = c.beta != Beta::kPost;
  o.allow_neg_eigval = c.beta == Beta::kLogitsNeg;
  if (gate_has_lower_bound(c.gate)) o.lower_bound = c.lower_bound;
  o.state_v_first = c.v_first;
  o.precision = p;
  o.algorithm = a;
  o.num_threads = threads;
}

// The inputs that every KDA op reads (ChunkProblem, RecurrentFwdArgs), from one Inputs set.
template <class Args>
void fill_inputs(Inputs& in, Args& a) {
  a.q = in.q.ref();
  a.k = in.k.ref();
  a.v = in.v.ref();
  a.g = in.g.ref();
  a.beta = in.beta.ref();
  a.A_log = in.A_log.ref();
  a.dt_bias = in.dt_bias.ref();
  a.initial_state = in.h0.ref();
  a.cu_seqlens = in.cu.ref();
}

inline void fill_problem(const Config& c, Inputs& in, openkda::ChunkProblem& p) {
  fill_inputs(in, p);
  p.safe_gate = gate_safe(c.gate);
  p.chunk_size = c.chunk;
}

// ---- chunk forward through the public API
// --------------------------------------------------------

struct FwdOut {
  HostTensor o, final_state, h;
  openkda::Status status;
  size_t workspace = 0;
};

inline openkda::ChunkFwdArgs make_fwd_args(const Config& c, Inputs& in, FwdOut& out, Precision p,
                                           Algorithm a, int threads) {
  openkda::ChunkFwdArgs args;
  apply_options(c, p, a, threads, args);
  fill_problem(c, in, args);
  args.o = out.o.ref();
  args.final_state = out.final_state.ref();
  args.h = out.h.ref();
  return args;
}

// Runs chunk_kda forward; outputs are NaN-poisoned first so that unwritten elements show up.
inline FwdOut run_chunk_fwd(const Config& c, Inputs& in, Precision p, Algorithm a, int threads = 0,
                            bool want_final = true, bool want_h = true) {
  FwdOut out;
  out.o = HostTensor(c.qk_dtype, {c.B, c.T, c.HV, c.V});
  out.o.fill_nan();
  if (want_final) {
    out.final_state = HostTensor(c.state_dtype, c.state_shape(c.N()));
    out.final_state.fill_nan();
  }
  if (want_h) {
    out.h = HostTensor(c.state_dtype, c.h_shape());
    out.h.fill_nan();
  }
  openkda::ChunkFwdArgs args = make_fwd_args(c, in, out, p, a, threads);
  out.status = run_on_host(args, &out.workspace);
  return out;
}

// ---- chunk backward through the public API
// -------------------------------------------------------

struct BwdOut {
  HostTensor dq, dk, dv, dg, dbeta, dA_log, ddt_bias, dh0;
  openkda::Status status;
  size_t workspace = 0;
};

inline BwdOut run_chunk_bwd(const Config& c, Inputs& in, HostTensor& d_o, HostTensor& dht,
                            Precision p, Algorithm a, int threads = 0) {
  BwdOut out;
  auto alloc = [](HostTensor& t, const HostTensor& like, DType dt) {
    if (!like.defined()) return;
    t = HostTensor(dt, like.shape());
    t.fill_nan();
  };
  alloc(out.dq, in.q, in.q.dtype());
  alloc(out.dk, in.k, in.k.dtype());
  alloc(out.dv, in.v, in.v.dtype());
  alloc(out.dg, in.g, in.g.dtype());
  alloc(out.dbeta, in.beta, in.beta.dtype());
  alloc(out.dA_log, in.A_log, in.A_log.dtype());
  alloc(out.ddt_bias, in.dt_bias, in.dt_bias.dtype());
  alloc(out.dh0, in.h0, c.state_dtype);
  openkda::ChunkBwdArgs args;
  apply_options(c, p, a, threads, args);
  fill_problem(c, in, args);
  args.d_o = d_o.ref();
  args.dht = dht.ref();
  args.dq = out.dq.ref();
  args.dk = out.dk.ref();
  args.dv = out.dv.ref();
  args.dg = out.dg.ref();
  args.dbeta = out.dbeta.ref();
  args.dA_log = out.dA_log.ref();
  args.ddt_bias = out.ddt_bias.ref();
  args.dh0 = out.dh0.ref();
  out.status = run_on_host(args, &out.workspace);
  return out;
}

// ---- independent per-token reference (spec 1.1, 3.2, 3.4, 3.5, 6.1) -----------------------------

struct SeqSpan {
  int64_t b, bos, len, chunk_offset;  // bos: packed token row (b * T + t for dense)
};

inline std::vector<SeqSpan> sequences(const Config& c) {
  std::vector<SeqSpan> s;
  if (c.varlen()) {
    int64_t off = 0;
    for (size_t n = 0; n + 1 < c.cu.size(); ++n) {
      const int64_t len = c.cu[n + 1] - c.cu[n];
      s.push_back({0, c.cu[n], len, off});
      off += c.chunks(len);
    }
  } else {
    for (int64_t b = 0; b < c.B; ++b) s.push_back({b, b * c.T, c.T, 0});
  }
  return s;
}

// Per-token log-decay of one channel from the raw (or pre-gated) value, spec 3.1.
// `A_log` may be null (lower bound: factor 1; softplus: the recurrent op's exp(1) quirk).
inline double gate_value(const Config& c, double graw, const double* A_log, double bias) {
  if (!gate_in_kernel(c.gate)) return graw;
  const double x = graw + bias;
  if (gate_has_lower_bound(c.gate)) {
    const double a = A_log ? std::exp(*A_log) : 1.0;
    return c.lower_bound * sigmoid(a * x);
  }
  const double a = A_log ? std::exp(*A_log) : std::exp(1.0);
  return -a * softplus(x);
}

inline double beta_value(const Config& c, double b) {
  switch (c.beta) {
    case Beta::kPost: return b;
    case Beta::kLogits: return sigmoid(b);
    case Beta::kLogitsNeg: return 2.0 * sigmoid(b);
  }
  return b;
}

struct NaiveOut {
  std::vector<double> o;       // [B, T, HV, V]
  std::vector<double> final;   // [N, HV, state]
  std::vector<double> h;       // [B, NT_b, HV, state]
  std::vector<double> states;  // [B * T, HV, state]: the state after every token
};

// `initial` overrides in.h0 when non-null ([N, HV, state] in the config's layout).
inline NaiveOut naive_forward(const Config& c, const Inputs& in,
                              const std::vector<double>* initial = nullptr) {
  const int64_t H = c.H, HV = c.HV, K = c.K, V = c.V, G = c.HV / c.H, KV = K * V;
  const auto q = in.q.to_double(), k = in.k.to_double(), v = in.v.to_double(), g = in.g.to_double(),
             beta = in.beta.to_double();
  const std::vector<double> A = in.A_log.defined() ? in.A_log.to_double() : std::vector<double>{};
  const std::vector<double> bias =
      in.dt_bias.defined() ? in.dt_bias.to_double() : std::vector<double>{};
  std::vector<double> h0;
  if (initial)
    h0 = *initial;
  else if (in.h0.defined())
    h0 = in.h0.to_double();
  const double scale = c.scale_value();
  NaiveOut r;
  r.o.assign(static_cast<size_t>(c.B * c.T * HV * V), 0.0);
  r.final.assign(static_cast<size_t>(c.N() * HV * KV), 0.0);
  r.h.assign(static_cast<size_t>(c.B * c.NT_b() * HV * KV), 0.0);
  r.states.assign(static_cast<size_t>(c.B * c.T * HV * KV), 0.0);
  const auto seqs = sequences(c);
  std::vector<double> S(static_cast<size_t>(KV)), qt(static_cast<size_t>(K)),
      kt(static_cast<size_t>(K)), rt(static_cast<size_t>(V));
  for (size_t n = 0; n < seqs.size(); ++n) {
    const SeqSpan sp = seqs[n];
    for (int64_t hv = 0; hv < HV; ++hv) {
      const int64_t h = hv / G;
      // S is kept as [K][V] here; layouts are applied on load/store.
      for (int64_t d = 0; d < K; ++d)
        for (int64_t e = 0; e < V; ++e)
          S[static_cast<size_t>(d * V + e)] =
              h0.empty() ? 0.0 : h0[static_cast<size_t>((n * HV + hv) * KV + c.sidx(d, e))];
      for (int64_t t = 0; t < sp.len; ++t) {
        if (t % c.chunk == 0) {
          const int64_t ci = sp.chunk_offset + t / c.chunk;
          const int64_t base = ((sp.b * c.NT_b() + ci) * HV + hv) * KV;
          for (int64_t d = 0; d < K; ++d)
            for (int64_t e = 0; e < V; ++e)
              r.h[static_cast<size_t>(base + c.sidx(d, e))] = S[static_cast<size_t>(d * V + e)];
        }
        const int64_t row = sp.bos + t;
        double nq = 0, nk = 0;
        for (int64_t d = 0; d < K; ++d) {
          qt[d] = q[static_cast<size_t>((row * H + h) * K + d)];
          kt[d] = k[static_cast<size_t>((row * H + h) * K + d)];
          nq += qt[d] * qt[d];
          nk += kt[d] * kt[d];
        }
        if (c.l2norm) {
          const double rq = 1.0 / std::sqrt(nq + 1e-6), rk = 1.0 / std::sqrt(nk + 1e-6);
          for (int64_t d = 0; d < K; ++d) {
            qt[d] *= rq;
            kt[d] *= rk;
          }
        }
        for (int64_t d = 0; d < K; ++d) {
          const double graw = g[static_cast<size_t>((row * HV + hv) * K + d)];
          const double* a = A.empty() ? nullptr : &A[static_cast<size_t>(hv)];
          const double b = bias.empty() ? 0.0 : bias[static_cast<size_t>(hv * K + d)];
          const double alpha = std::exp(gate_value(c, graw, a, b));
          for (int64_t e = 0; e < V; ++e) S[static_cast<size_t>(d * V + e)] *= alpha;
        }
        for (int64_t e = 0; e < V; ++e) {
          double s = 0;
          for (int64_t d = 0; d < K; ++d) s += S[static_cast<size_t>(d * V + e)] * kt[d];
          const double bt = c.headwise_beta ? beta[static_cast<size_t>((row * HV + hv) * V + e)]
                                            : beta[static_cast<size_t>(row * HV + hv)];
          rt[e] = beta_value(c, bt) * (v[static_cast<size_t>((row * HV + hv) * V + e)] - s);
        }
        for (int64_t d = 0; d < K; ++d)
          for (int64_t e = 0; e < V; ++e) S[static_cast<size_t>(d * V + e)] += kt[d] * rt[e];
        for (int64_t e = 0; e < V; ++e) {
          double s = 0;
          for (int64_t d = 0; d < K; ++d) s += S[static_cast<size_t>(d * V + e)] * qt[d];
          r.o[static_cast<size_t>((row * HV + hv) * V + e)] = scale * s;
        }
        for (int64_t d = 0; d < K; ++d)
          for (int64_t e = 0; e < V; ++e)
            r.states[static_cast<size_t>((row * HV + hv) * KV + c.sidx(d, e))] =
                S[static_cast<size_t>(d * V + e)];
      }
      for (int64_t d = 0; d < K; ++d)
        for (int64_t e = 0; e < V; ++e)
          r.final[static_cast<size_t>((n * HV + hv) * KV + c.sidx(d, e))] =
              S[static_cast<size_t>(d * V + e)];
    }
  }
  return r;
}

// Scalar loss of the finite-difference checks: sum(o * d_o) + sum(final_state * dht).
inline double loss_of(const std::vector<double>& o, const std::vector<double>& d_o,
                      const std::vector<double>& fs, const std::vector<double>& dht) {
  long double L = 0;
  for (size_t i = 0; i < o.size(); ++i) L += static_cast<long double>(o[i]) * d_o[i];
  for (size_t i = 0; i < dht.size() && i < fs.size(); ++i)
    L += static_cast<long double>(fs[i]) * dht[i];
  return static_cast<double>(L);
}

}  // namespace kdatest
