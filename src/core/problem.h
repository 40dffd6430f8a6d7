// Problem geometry resolved from validated Args: sizes, the sequence table and the chunk table.
//
// Sequence n covers packed tokens [bos, bos + len); its chunks are chunk_offset .. chunk_offset +
// ceil(len / BT) - 1 in the flattened chunk index that h / dh use ([B, NT_b] flattened for dense
// batches, the varlen chunk order of FLA's prepare_chunk_offsets otherwise).
#pragma once

#include <cstdint>
#include <vector>

#include "openkda/args.h"
#include "openkda/status.h"

namespace openkda {

struct SequenceInfo {
  int64_t bos = 0;           // first packed token (index into B*T)
  int64_t len = 0;           // tokens
  int64_t chunk_offset = 0;  // first flattened chunk index
};

struct ProblemDims {
  int64_t B = 0, T = 0, H = 0, HV = 0, K = 0, V = 0, N = 0;
  int64_t G = 1;         // HV / H
  int64_t BT = 64;       // chunk size
  int64_t NT_total = 0;  // chunks over all sequences
  std::vector<SequenceInfo> seqs;

  int64_t tokens() const { return B * T; }
  int64_t num_chunks(int64_t len) const { return (len + BT - 1) / BT; }
};

// Fills dims from q [B, T, H, K], v [B, T, HV, V] and cu_seqlens (host-readable, validated).
ProblemDims resolve_dims(const TensorRef& q, const TensorRef& v, const TensorRef& cu_seqlens,
                         int64_t chunk_size);

}  // namespace openkda
