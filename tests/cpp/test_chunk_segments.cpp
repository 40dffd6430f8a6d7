// CPU twins of the CUDA scan's own algebra, against the serial CPU stages. Stage-level tests: they
// drive the CPU stages (src/cpu/chunk_fwd.h) directly, in float64.
//   * The time split (src/cuda/chunk_fwd/segments.cuh): chaining every segment's zero-start state
//     Z_s and transition M_s from the initial state reproduces the serial scan's state at each
//     segment boundary, and after the last segment its final state.
//   * The factored v_new (src/cuda/chunk_fwd/state.cuh): Tinv' (v - ke S) equals the WY form's
//     u - w S of every chunk.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "core/problem.h"
#include "core/workspace.h"
#include "cpu/chunk_common.h"
#include "cpu/chunk_fwd.h"
#include "kda_case.h"
#include "test_util.h"

namespace {

using namespace kdatest;  // NOLINT: test helpers
using openkda::Algorithm;
using openkda::Precision;
using openkda::cpu::ChunkSpan;

double rel_max(const double* ref, const double* got, int64_t n) {
  double err = 0.0, mag = 1e-300;
  for (int64_t i = 0; i < n; ++i) {
    err = std::max(err, std::abs(got[i] - ref[i]));
    mag = std::max(mag, std::abs(ref[i]));
  }
  return err / mag;
}

// The CPU backend's f64 buffers of case c after the serial stages 1-4 of every chunk: b.h holds
// the state entering each chunk, b.ht the final state.
struct SerialRun {
  explicit SerialRun(const Config& c) : in(make_inputs(c)) {
    out.o = HostTensor(DType::kF64, {c.B, c.T, c.HV, c.V});
    openkda::ChunkFwdArgs a = make_fwd_args(c, in, out, Precision::kF64, Algorithm::kChunked, 1);
    EXPECT_TRUE(openkda::can_implement(a).ok());
    d = openkda::resolve_dims(a.q, a.v, a.cu_seqlens, a.chunk_size);
    openkda::WorkspacePlan sizing;
    openkda::cpu::plan_chunk_buffers<double>(d, false, sizing);
    ws.resize(sizing.bytes());
    openkda::WorkspacePlan plan(ws.data());
    b = openkda::cpu::plan_chunk_buffers<double>(d, false, plan);
    openkda::cpu::prepare_inputs(a, d, b, nullptr, nullptr, 1);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d.K));
    for (int64_t n = 0; n < d.N; ++n)
      for (int64_t hv = 0; hv < d.HV; ++hv)
        openkda::cpu::chunk_forward_sequence(b, d, n, hv, scale, false);
  }
  Inputs in;
  FwdOut out;
  openkda::ProblemDims d;
  std::vector<unsigned char> ws;
  openkda::cpu::ChunkBuffers<double> b;
};

// Segments of `seg` chunks per (sequence, value head); returns the worst relative error of the
// chained states against the serial ones, and counts the boundaries checked.
double chained_state_error(const Config& c, int64_t seg, int64_t* checked) {
  const SerialRun run(c);
  const openkda::ProblemDims& d = run.d;
  const openkda::cpu::ChunkBuffers<double>& b = run.b;
  const int64_t K = d.K, V = d.V;
  double worst = 0.0;
  std::vector<double> X(K * (V + K)), S(K * V), S_next(K * V);
  for (int64_t n = 0; n < d.N; ++n) {
    const openkda::SequenceInfo& s = d.seqs[n];
    std::vector<ChunkSpan> spans;
    for (int64_t ch = 0; ch < d.num_chunks(s.len); ++ch)
      spans.push_back({s.bos + ch * d.BT, std::min(d.BT, s.len - ch * d.BT), s.chunk_offset + ch});
    for (int64_t hv = 0; hv < d.HV; ++hv) {
      std::copy(b.h0 + b.state(n, hv), b.h0 + b.state(n, hv) + K * V, S.begin());
      for (size_t c0 = 0; c0 < spans.size(); c0 += seg) {
        const int64_t count = std::min<int64_t>(seg, static_cast<int64_t>(spans.size() - c0));
        openkda::cpu::fwd_segment_transition(b, spans.data() + c0, count, hv, X.data());
        openkda::cpu::fwd_segment_combine(X.data(), S.data(), S_next.data(), K, V);
        const size_t c1 = c0 + count;
        const double* serial =
            c1 < spans.size() ? b.h + (spans[c1].idx * d.HV + hv) * K * V : b.ht + b.state(n, hv);
        worst = std::max(worst, rel_max(serial, S_next.data(), K * V));
        ++*checked;
        S = S_next;
      }
    }
  }
  return worst;
}

// A small dense case (B = 2, HV = 2 over one q/k head, K = 16, V = 8, 32-token chunks, the softplus
// gate with its bias, l2norm, an initial state) of T tokens, and its varlen twin: one row cut at
// `cut` into three sequences (the middle one empty), K = 8, V = 16, the gate as passed.
std::pair<Config, Config> small_cases(int64_t T, int64_t cut, Beta beta) {
  Config dense;
  dense.B = 2;
  dense.T = T;
  dense.H = 1;
  dense.HV = 2;
  dense.K = 16;
  dense.V = 8;
  dense.chunk = 32;
  dense.gate = Gate::kSoftplusBias;
  dense.beta = beta;
  dense.l2norm = true;
  dense.h0 = true;
  Config varlen = dense;
  varlen.B = 1;
  varlen.cu = {0, cut, cut, T};
  varlen.K = 8;
  varlen.V = 16;
  varlen.gate = Gate::kPre;
  return {dense, varlen};
}

TEST(ChunkSegments, ChainedSegmentsReproduceTheSerialStates) {
  // 7 chunks of 32, the last of 8 tokens; the varlen twin with 64-token h chunks.
  auto [dense, varlen] = small_cases(200, 70, Beta::kLogits);
  varlen.chunk = 64;
  for (const Config& c : {dense, varlen}) {
    for (int64_t seg : {1, 2, 3}) {
      int64_t checked = 0;
      const double err = chained_state_error(c, seg, &checked);
      EXPECT_GT(checked, 0);
      EXPECT_LT(err, 1e-11) << "segments of " << seg << " chunks";
    }
  }
}

// The test can fail: a transition without its M part (the zero-start state alone) misses the
// initial state's contribution.
TEST(ChunkSegments, ZeroStartStatesAloneDoNotChain) {
  Config c;
  c.B = 1;
  c.T = 4;  // one short chunk: the initial state still matters at its end
  c.H = c.HV = 1;
  c.K = c.V = 8;
  c.h0 = true;
  const SerialRun run(c);
  const openkda::cpu::ChunkBuffers<double>& b = run.b;
  std::vector<ChunkSpan> spans = {{0, 4, 0}};
  std::vector<double> X(c.K * (c.V + c.K));
  openkda::cpu::fwd_segment_transition(b, spans.data(), 1, 0, X.data());
  std::vector<double> Z(c.K * c.V);
  for (int64_t x = 0; x < c.K; ++x)
    for (int64_t e = 0; e < c.V; ++e) Z[x * c.V + e] = X[x * (c.V + c.K) + e];
  EXPECT_GT(rel_max(b.ht, Z.data(), c.K * c.V), 1e-3) << rel_max(b.ht, Z.data(), c.K * c.V);
}

// The scan's v_new = Tinv' (v - ke S) (Tinv' = Tinv diag(beta), ke = k exp2(G)) against fwd_state's
// u - w S, chunk by chunk from the state entering it (b.h), on dense and varlen cases with tail
// chunks, beta in (0, 2) (allow_neg_eigval) and an initial state.
TEST(ChunkFactoredVNew, EqualsTheWYForm) {
  // 3 chunks of 32, the last of 11 tokens; the varlen twin with beta as passed.
  auto [dense, varlen] = small_cases(75, 40, Beta::kLogitsNeg);
  varlen.beta = Beta::kPost;
  for (const Config& c : {dense, varlen}) {
    const SerialRun run(c);
    const openkda::ProblemDims& d = run.d;
    const openkda::cpu::ChunkBuffers<double>& b = run.b;
    int64_t checked = 0;
    double worst = 0.0;
    for (int64_t n = 0; n < d.N; ++n) {
      const openkda::SequenceInfo& s = d.seqs[n];
      for (int64_t ch = 0; ch < d.num_chunks(s.len); ++ch) {
        const ChunkSpan span{s.bos + ch * d.BT, std::min(d.BT, s.len - ch * d.BT),
                             s.chunk_offset + ch};
        for (int64_t hv = 0; hv < d.HV; ++hv) {
          std::vector<double> v_new(span.n * d.V);
          openkda::cpu::fwd_v_new_factored(b, span, hv, b.h + (span.idx * d.HV + hv) * d.K * d.V,
                                           v_new.data());
          for (int64_t i = 0; i < span.n; ++i) {
            worst = std::max(
                worst, rel_max(b.v_new + b.hvv(span.t0 + i, hv), v_new.data() + i * d.V, d.V));
            ++checked;
          }
        }
      }
    }
    EXPECT_GT(checked, 0);
    EXPECT_LT(worst, 1e-11);
  }
}

}  // namespace
