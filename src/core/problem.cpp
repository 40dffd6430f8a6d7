#include "core/problem.h"

#include "core/convert.h"

namespace openkda {

ProblemDims resolve_dims(const TensorRef& q, const TensorRef& v, const TensorRef& cu_seqlens,
                         int64_t chunk_size) {
  ProblemDims d;
  d.B = q.shape[0];
  d.T = q.shape[1];
  d.H = q.shape[2];
  d.K = q.shape[3];
  d.HV = v.shape[2];
  d.V = v.shape[3];
  d.G = d.H > 0 ? d.HV / d.H : 1;
  d.BT = chunk_size;
  if (cu_seqlens.defined()) {
    d.N = cu_seqlens.numel() - 1;
    for (int64_t n = 0; n < d.N; ++n) {
      SequenceInfo s;
      s.bos = load_index(cu_seqlens, n);
      s.len = load_index(cu_seqlens, n + 1) - s.bos;
      d.seqs.push_back(s);
    }
  } else {
    d.N = d.B;
    for (int64_t b = 0; b < d.B; ++b) d.seqs.push_back(SequenceInfo{b * d.T, d.T, 0});
  }
  int64_t c = 0;
  for (auto& s : d.seqs) {
    s.chunk_offset = c;
    c += d.num_chunks(s.len);
  }
  d.NT_total = c;
  return d;
}

}  // namespace openkda
