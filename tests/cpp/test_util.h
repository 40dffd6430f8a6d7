// Test utilities of the GoogleTest suite: host tensors in any storage dtype (f64, f32, bf16, f16,
// i32, i64), random fills, error metrics (rel-RMS, max-abs) and a gtest assertion that prints them.
//
// Values are read and written as double; a write into bf16/f16/f32 storage rounds to nearest even,
// so a reference built from `to_double()` sees exactly what the core sees.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "openkda/openkda.h"

namespace kdatest {

using openkda::DType;
using openkda::TensorRef;

// ---- bf16 / f16 <-> f32, round to nearest even; NaN stays NaN ---------------------------------

inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  return bits_float(static_cast<uint32_t>(h) << 16);
}

inline uint16_t f32_to_f16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {                        // below 2^-14: subnormal or zero
    // value = abs_float; subnormal unit 2^-24. Round value / 2^-24 to nearest even.
    const float a = bits_float(abs);
    const double scaled = static_cast<double>(a) * 16777216.0;  // exact in double
    double r = std::nearbyint(scaled);                          // default mode: nearest even
    return sign | static_cast<uint16_t>(r);
  }
  // Normal: rebias exponent 127 -> 15, keep 10 mantissa bits, round to nearest even.
  uint32_t v = abs - 0x38000000u;  // (127 - 15) << 23
  v += 0x0fffu + ((v >> 13) & 1u);
  return sign | static_cast<uint16_t>(v >> 13);
}
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    const float mag = static_cast<float>(man) * (1.0f / 16777216.0f);  // man * 2^-24
    return bits_float(float_bits(mag) | sign);
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (man << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// ---- host tensor
// ---------------------------------------------------------------------------------

// A contiguous host tensor that owns its storage. Default-constructed = undefined (FLA's None).
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
    numel_ = 1;
    for (int64_t s : shape_) numel_ *= s;
    const size_t bytes = static_cast<size_t>(numel_) * openkda::dtype_size(dtype_);
    storage_.assign((bytes + sizeof(Block) - 1) / sizeof(Block) + 1, Block{});
  }
  static HostTensor filled(DType dtype, std::vector<int64_t> shape, double value) {
    HostTensor t(dtype, std::move(shape));
    t.fill(value);
    return t;
  }
  static HostTensor from_values(DType dtype, std::vector<int64_t> shape,
                                const std::vector<double>& values) {
    HostTensor t(dtype, std::move(shape));
    t.assign(values);
    return t;
  }

  bool defined() const { return dtype_ != DType::kUndefined; }
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  void* data() { return storage_.empty() ? nullptr : static_cast<void*>(storage_.data()); }
  const void* data() const { return storage_.empty() ? nullptr : storage_.data(); }
  size_t bytes() const { return static_cast<size_t>(numel_) * openkda::dtype_size(dtype_); }

  double get(int64_t i) const {
    const unsigned char* p = static_cast<const unsigned char*>(data());
    switch (dtype_) {
      case DType::kF64: {
        double x;
        std::memcpy(&x, p + 8 * i, 8);
        return x;
      }
      case DType::kF32: {
        float x;
        std::memcpy(&x, p + 4 * i, 4);
        return x;
      }
      case DType::kBF16: {
        uint16_t x;
        std::memcpy(&x, p + 2 * i, 2);
        return bf16_to_f32(x);
      }
      case DType::kF16: {
        uint16_t x;
        std::memcpy(&x, p + 2 * i, 2);
        return f16_to_f32(x);
      }
      case DType::kI32: {
        int32_t x;
        std::memcpy(&x, p + 4 * i, 4);
        return x;
      }
      case DType::kI64: {
        int64_t x;
        std::memcpy(&x, p + 8 * i, 8);
        return static_cast<double>(x);
      }
      case DType::kU8: return p[i];
      default: return std::numeric_limits<double>::quiet_NaN();
    }
  }
  void set(int64_t i, double v) {
    unsigned char* p = static_cast<unsigned char*>(data());
    switch (dtype_) {
      case DType::kF64: std::memcpy(p + 8 * i, &v, 8); break;
      case DType::kF32: {
        const float x = static_cast<float>(v);
        std::memcpy(p + 4 * i, &x, 4);
        break;
      }
      case DType::kBF16: {
        const uint16_t x = f32_to_bf16(static_cast<float>(v));
        std::memcpy(p + 2 * i, &x, 2);
        break;
      }
      case DType::kF16: {
        const uint16_t x = f32_to_f16(static_cast<float>(v));
        std::memcpy(p + 2 * i, &x, 2);
        break;
      }
      case DType::kI32: {
        const int32_t x = static_cast<int32_t>(v);
        std::memcpy(p + 4 * i, &x, 4);
        break;
      }
      case DType::kI64: {
        const int64_t x = static_cast<int64_t>(v);
        std::memcpy(p + 8 * i, &x, 8);
        break;
      }
      case DType::kU8: p[i] = static_cast<unsigned char>(v); break;
      default: break;
    }
  }
  void fill(double v) {
    for (int64_t i = 0; i < numel_; ++i) set(i, v);
  }
  void fill_nan() { fill(std::numeric_limits<double>::quiet_NaN()); }
  void assign(const std::vector<double>& values) {
    for (int64_t i = 0; i < numel_; ++i) set(i, values[static_cast<size_t>(i)]);
  }
  std::vector<double> to_double() const {
    std::vector<double> out(static_cast<size_t>(numel_));
    for (int64_t i = 0; i < numel_; ++i) out[static_cast<size_t>(i)] = get(i);
    return out;
  }
  // Raw bytes, for bit-identity checks.
  std::vector<unsigned char> raw() const {
    const unsigned char* p = static_cast<const unsigned char*>(data());
    return std::vector<unsigned char>(p, p + bytes());
  }

  // A contiguous TensorRef over this storage; undefined TensorRef when this tensor is.
  TensorRef ref() {
    if (!defined()) return TensorRef{};
    return openkda::make_tensor(data(), dtype_, static_cast<int>(shape_.size()), shape_.data());
  }

 private:
  struct alignas(64) Block {
    unsigned char b[64];
  };
  DType dtype_ = DType::kUndefined;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  std::vector<Block> storage_;
};

// Caller-owned workspace, 64-byte aligned.
class HostWorkspace {
 public:
  explicit HostWorkspace(size_t bytes) : bytes_(bytes), blocks_((bytes + 63) / 64 + 1) {}
  openkda::Workspace get() { return openkda::Workspace{bytes_ ? blocks_.data() : nullptr, bytes_}; }
  openkda::Workspace get(size_t bytes) { return openkda::Workspace{blocks_.data(), bytes}; }

 private:
  struct alignas(64) Block {
    unsigned char b[64];
  };
  size_t bytes_;
  std::vector<Block> blocks_;
};

// The caller-owns-memory protocol on the host: can_implement, then workspace_bytes (reported
// through *workspace when given), then run with a workspace of exactly that size.
template <class Args>
openkda::Status run_on_host(const Args& args, size_t* workspace = nullptr) {
  openkda::Status s = openkda::can_implement(args);
  if (!s.ok()) return s;
  const size_t bytes = openkda::workspace_bytes(args);
  if (workspace != nullptr) *workspace = bytes;
  HostWorkspace ws(bytes);
  return openkda::run(args, ws.get());
}

// ---- random numbers
// ------------------------------------------------------------------------------

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  double uniform(double lo = 0.0, double hi = 1.0) {
    return lo + (hi - lo) * (static_cast<double>(gen_() >> 11) * (1.0 / 9007199254740992.0));
  }
  double normal() {  // Box-Muller: identical on every platform
    double u1 = uniform();
    while (u1 <= 1e-300) u1 = uniform();
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  int64_t integer(int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(gen_() % static_cast<uint64_t>(hi - lo + 1));
  }
  std::vector<double> normals(int64_t n, double sigma = 1.0, double mean = 0.0) {
    std::vector<double> v(static_cast<size_t>(n));
    for (auto& x : v) x = mean + sigma * normal();
    return v;
  }
  uint64_t next() { return gen_(); }

 private:
  std::mt19937_64 gen_;
};

inline HostTensor random_tensor(Rng& rng, DType dtype, std::vector<int64_t> shape,
                                double sigma = 1.0, double mean = 0.0) {
  HostTensor t(dtype, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, mean + sigma * rng.normal());
  return t;
}

// ---- scalar functions used by test-side formulas
// -------------------------------------------------

inline double sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}
inline double softplus(double x) {
  return x > 20.0 ? x : std::log1p(std::exp(x));
}
inline double log_sigmoid(double x) {
  return -softplus(-x);
}

// ---- error metrics
// ---------------------------------------------------------------------------------

inline double rms(const std::vector<double>& a) {
  if (a.empty()) return 0.0;
  long double s = 0;
  for (double x : a) s += static_cast<long double>(x) * x;
  return static_cast<double>(std::sqrt(s / a.size()));
}

// RMS(ref - got) / RMS(ref); 0 when both are exactly zero, inf on a size mismatch or a NaN.
inline double rel_rms(const std::vector<double>& ref, const std::vector<double>& got) {
  if (ref.size() != got.size()) return std::numeric_limits<double>::infinity();
  long double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (std::isnan(ref[i]) != std::isnan(got[i])) return std::numeric_limits<double>::infinity();
    const long double d = static_cast<long double>(ref[i]) - got[i];
    num += d * d;
    den += static_cast<long double>(ref[i]) * ref[i];
  }
  if (std::isnan(static_cast<double>(num))) return std::numeric_limits<double>::infinity();
  if (num == 0) return 0.0;
  if (den == 0) return std::numeric_limits<double>::infinity();
  return static_cast<double>(std::sqrt(num / den));
}

inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(a[i] - b[i]);
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    m = std::max(m, d);
  }
  return m;
}

inline double max_abs(const std::vector<double>& a) {
  double m = 0;
  for (double x : a) m = std::max(m, std::fabs(x));
  return m;
}

inline bool all_finite(const std::vector<double>& a) {
  for (double x : a)
    if (!std::isfinite(x)) return false;
  return true;
}

inline int64_t first_mismatch(const std::vector<double>& ref, const std::vector<double>& got,
                              double tol_abs) {
  for (size_t i = 0; i < std::min(ref.size(), got.size()); ++i) {
    const double d = std::fabs(ref[i] - got[i]);
    if (!(d <= tol_abs)) return static_cast<int64_t>(i);
  }
  return -1;
}

// Passes when rel_rms(ref, got) <= tol, or when every |ref - got| <= abs_floor (tiny tensors of
// near-zero values). The failure message carries rel-RMS, max-abs, RMS(ref) and the worst index.
inline ::testing::AssertionResult Close(const std::string& what, const std::vector<double>& ref,
                                        const std::vector<double>& got, double tol,
                                        double abs_floor = 0.0) {
  if (ref.size() != got.size()) {
    return ::testing::AssertionFailure()
           << what << ": size " << got.size() << " vs reference " << ref.size();
  }
  const double r = rel_rms(ref, got);
  const double m = max_abs_diff(ref, got);
  if (r <= tol || m <= abs_floor) return ::testing::AssertionSuccess();
  size_t worst = 0;
  double wd = -1;
  for (size_t i = 0; i < ref.size(); ++i) {
    double d = std::fabs(ref[i] - got[i]);
    if (std::isnan(d)) d = std::numeric_limits<double>::infinity();
    if (d > wd) {
      wd = d;
      worst = i;
    }
  }
  return ::testing::AssertionFailure()
         << what << ": rel-RMS " << r << " > " << tol << " (max-abs " << m << ", RMS(ref) "
         << rms(ref) << ", worst index " << worst << ": ref " << ref[worst] << " got " << got[worst]
         << ", n = " << ref.size() << ")";
}

inline ::testing::AssertionResult AllFinite(const std::string& what, const std::vector<double>& a) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) {
      return ::testing::AssertionFailure()
             << what << ": element " << i << " is " << a[i] << " (n = " << a.size() << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

// Substring assertion for Status messages.
inline ::testing::AssertionResult HasSubstr(const std::string& haystack,
                                            const std::string& needle) {
  if (haystack.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "message \"" << haystack << "\" lacks \"" << needle << "\"";
}

inline const char* code_name(openkda::StatusCode c) {
  switch (c) {
    case openkda::StatusCode::kOk: return "kOk";
    case openkda::StatusCode::kInvalidArgument: return "kInvalidArgument";
    case openkda::StatusCode::kNotSupported: return "kNotSupported";
    case openkda::StatusCode::kInternal: return "kInternal";
  }
  return "?";
}

inline ::testing::AssertionResult IsOk(const openkda::Status& s) {
  if (s.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << code_name(s.code()) << ": " << s.message();
}

}  // namespace kdatest
