// The configuration grid shared by the forward and backward comparisons against the reference.
//
// Every (T, gate mode, beta mode) triple is one case; the other axes (l2norm, GVA, K != V, chunk
// size, initial state, state layout, varlen with i32/i64 cu_seqlens, explicit scale) are assigned
// by independent counters with coprime periods, so every value of every axis appears many times and
// in varied combinations, while the grid stays small enough for a CPU CI run.
#pragma once

#include <string>
#include <vector>

#include "kda_case.h"

namespace kdatest {

// splitmix64: a well-mixed hash of the case counter, one stream per axis.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
inline int pick(uint64_t i, uint64_t axis, int count) {
  return static_cast<int>(mix64(i * 0x100 + axis) % static_cast<uint64_t>(count));
}

// `replicas` cases per (T, gate mode, beta mode); the remaining axes are hashed from the case
// counter (GridCoverage checks that every value of every axis meets every gate and beta mode).
inline std::vector<Config> reference_grid(DType dtype, const std::vector<int64_t>& Ts,
                                          int replicas = 2) {
  struct KV {
    int64_t K, V;
  };
  const KV kvs[] = {{16, 16}, {8, 32}, {32, 8}, {16, 24}, {8, 8}};
  const int64_t groups[] = {1, 2, 4};
  std::vector<Config> grid;
  uint64_t i = 0;
  for (int64_t T : Ts) {
    for (Gate gate : kAllGates) {
      for (Beta beta : kAllBetas) {
        for (int r = 0; r < replicas; ++r, ++i) {
          Config c;
          c.T = T;
          c.gate = gate;
          c.beta = beta;
          c.l2norm = pick(i, 1, 2) == 1;
          const int varlen = pick(i, 2, 3);  // 0 dense, 1 i32, 2 i64
          const KV kv = kvs[pick(i, 3, 5)];
          c.K = kv.K;
          c.V = kv.V;
          c.H = pick(i, 4, 2) ? 2 : 1;
          c.HV = c.H * groups[pick(i, 5, 3)];
          c.chunk = pick(i, 6, 2) ? 32 : 64;
          c.h0 = pick(i, 7, 2) == 1;
          c.v_first = pick(i, 8, 2) == 1;
          if (pick(i, 9, 4) == 0) c.scale = 0.37;
          if (gate == Gate::kSafeInKernel)
            c.lower_bound = pick(i, 10, 2) ? -5.0 : -0.75;
          else if (gate_has_lower_bound(gate))
            c.lower_bound = pick(i, 10, 2) ? -3.0 : -7.5;
          c.seed = 1000 + i;
          if (varlen != 0) {
            Rng rng(c.seed);
            c.B = 1;
            c.cu = make_cu_seqlens(rng, T);
            c.cu_dtype = varlen == 1 ? DType::kI32 : DType::kI64;
          } else {
            c.B = 2;
          }
          c.set_all_dtypes(dtype);
          grid.push_back(c);
        }
      }
    }
  }
  return grid;
}

// A few larger head dimensions (K, V in {64, 128}).
inline std::vector<Config> large_dim_grid(DType dtype) {
  std::vector<Config> grid;
  struct Shape {
    int64_t T, H, HV, K, V;
    Gate gate;
    Beta beta;
    int chunk;
    bool varlen;
  };
  const Shape shapes[] = {
      {130, 1, 2, 64, 64, Gate::kSoftplusBias, Beta::kLogits, 64, false},
      {97, 1, 1, 128, 64, Gate::kSafeInKernel, Beta::kLogitsNeg, 32, true},
      {70, 1, 1, 64, 128, Gate::kPre, Beta::kPost, 64, false},
      {64, 1, 1, 128, 128, Gate::kLowerBound, Beta::kLogits, 64, true},
  };
  uint64_t i = 0;
  for (const Shape& s : shapes) {
    Config c;
    c.B = s.varlen ? 1 : 2;
    c.T = s.T;
    c.H = s.H;
    c.HV = s.HV;
    c.K = s.K;
    c.V = s.V;
    c.gate = s.gate;
    c.beta = s.beta;
    c.chunk = s.chunk;
    c.l2norm = true;
    c.h0 = true;
    c.v_first = (i % 2) == 1;
    c.lower_bound = -5.0;
    c.seed = 5000 + i;
    if (s.varlen) {
      Rng rng(c.seed);
      c.cu = make_cu_seqlens(rng, s.T);
    }
    c.set_all_dtypes(dtype);
    grid.push_back(c);
    ++i;
  }
  return grid;
}

inline std::string sanitize(std::string s) {
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

// GoogleTest name of a grid case: its index and its Config name, as an identifier.
inline std::string case_name(const ::testing::TestParamInfo<Config>& i) {
  return sanitize(std::to_string(i.index) + "_" + i.param.name());
}

}  // namespace kdatest
