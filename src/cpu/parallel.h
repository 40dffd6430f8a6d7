// parallel_for: static partition of [0, n) over std::threads. Each index is processed by exactly
// one thread and every reduction in the CPU backend is done in a fixed order afterwards, so
// results do not depend on the thread count.
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace openkda::cpu {

inline int resolve_threads(int requested) {
  if (requested > 0) return requested;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

template <class F>
void parallel_for(int64_t n, int num_threads, F&& body) {
  const int64_t workers = std::min<int64_t>(resolve_threads(num_threads), n);
  if (workers <= 1) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(workers));
  for (int64_t w = 0; w < workers; ++w) {
    pool.emplace_back([&, w] {
      // Interleaved assignment balances uneven work (varlen sequences of different lengths).
      for (int64_t i = w; i < n; i += workers) body(i);
    });
  }
  for (auto& t : pool) t.join();
}

}  // namespace openkda::cpu
