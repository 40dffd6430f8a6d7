// Workspace plan: named sub-buffers carved out of one caller-owned block, each 128-byte aligned.
// The same plan object both sizes the workspace (base == nullptr) and hands out typed pointers, so
// workspace_bytes() and run() can never disagree.
#pragma once

#include <cstddef>
#include <cstdint>

namespace openkda {

class WorkspacePlan {
 public:
  static constexpr size_t kAlign = 128;

  explicit WorkspacePlan(void* base = nullptr) : base_(static_cast<char*>(base)) {}

  // Reserves `count` elements of T; returns their address (nullptr while only sizing).
  template <class T>
  T* take(int64_t count) {
    const size_t offset = bytes_;
    bytes_ += align(static_cast<size_t>(count > 0 ? count : 0) * sizeof(T));
    return base_ ? reinterpret_cast<T*>(base_ + offset) : nullptr;
  }

  size_t bytes() const { return bytes_; }

 private:
  static size_t align(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
  char* base_;
  size_t bytes_ = 0;
};

}  // namespace openkda
