// Status: the error channel of the framework-free core.
//
// No exception crosses the core API. Every failing check returns a Status whose message names the
// argument, the value seen and the value expected, e.g.
//   "chunk_kda: q.shape[3] (K) = 300; expected K <= 256".
#pragma once

#include <string>
#include <utility>

namespace openkda {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // bad shape, dtype, device, range or option combination
  kNotSupported,     // valid input that this build or device cannot run (e.g. no CUDA kernel yet)
  kInternal,         // a bug or a failed device call
};

class Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string msg) {
    return Status(StatusCode::kInvalidArgument, std::move(msg));
  }
  static Status NotSupported(std::string msg) {
    return Status(StatusCode::kNotSupported, std::move(msg));
  }
  static Status Internal(std::string msg) { return Status(StatusCode::kInternal, std::move(msg)); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  Status(StatusCode code, std::string msg) : code_(code), message_(std::move(msg)) {}
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// Returns from the enclosing function when `expr` yields a non-ok Status.
#define OPENKDA_RETURN_IF_ERROR(expr)        \
  do {                                       \
    ::openkda::Status _openkda_s = (expr);   \
    if (!_openkda_s.ok()) return _openkda_s; \
  } while (0)

}  // namespace openkda
