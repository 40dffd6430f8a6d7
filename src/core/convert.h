// Element conversion between storage dtypes (f16, bf16, f32, f64, i32, i64) and the CPU backend's
// compute type. bf16/f16 rounding is round-to-nearest-even, NaN and Inf preserved, as on the GPU.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "openkda/tensor_ref.h"

namespace openkda {

inline float bf16_bits_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float f16_bits_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal half -> normal float
    float f = std::ldexp(static_cast<float>(man), -24);
    return sign ? -f : f;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_f16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: Inf
  if (abs < 0x38800000u) {                        // below the smallest normal half: subnormal
    const float a = std::fabs(f) * 16777216.0f;   // in units of 2^-24, exact for this range
    const float r = std::nearbyint(a);            // round half to even (default rounding mode)
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t mant_round = abs + 0xfffu + ((abs >> 13) & 1u);
  return sign | static_cast<uint16_t>(((mant_round - 0x38000000u) >> 13) & 0x7fffu);
}

// Reads element i (linear index of a contiguous tensor) as double.
inline double load_scalar(const void* data, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF16: return f16_bits_to_float(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16: return bf16_bits_to_float(static_cast<const uint16_t*>(data)[i]);
    case DType::kF32: return static_cast<const float*>(data)[i];
    case DType::kF64: return static_cast<const double*>(data)[i];
    case DType::kI32: return static_cast<const int32_t*>(data)[i];
    case DType::kI64: return static_cast<double>(static_cast<const int64_t*>(data)[i]);
    default: return 0.0;
  }
}

inline int64_t load_index(const TensorRef& t, int64_t i) {
  return t.dtype == DType::kI32 ? static_cast<const int32_t*>(t.data)[i]
                                : static_cast<const int64_t*>(t.data)[i];
}

// Converts n contiguous elements starting at element `offset` of `src` into dst.
template <class T>
void load_array(const TensorRef& src, int64_t offset, int64_t n, T* dst) {
  const char* base = static_cast<const char*>(src.data) + offset * dtype_size(src.dtype);
  switch (src.dtype) {
    case DType::kF16: {
      auto p = reinterpret_cast<const uint16_t*>(base);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(f16_bits_to_float(p[i]));
      break;
    }
    case DType::kBF16: {
      auto p = reinterpret_cast<const uint16_t*>(base);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(bf16_bits_to_float(p[i]));
      break;
    }
    case DType::kF32: {
      auto p = reinterpret_cast<const float*>(base);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(p[i]);
      break;
    }
    case DType::kF64: {
      auto p = reinterpret_cast<const double*>(base);
      for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(p[i]);
      break;
    }
    default:
      for (int64_t i = 0; i < n; ++i)
        dst[i] = static_cast<T>(load_scalar(src.data, src.dtype, offset + i));
  }
}

// Writes n elements of src into dst starting at element `offset`, rounding to dst's dtype.
template <class T>
void store_array(const T* src, int64_t n, const TensorRef& dst, int64_t offset) {
  char* base = static_cast<char*>(dst.data) + offset * dtype_size(dst.dtype);
  switch (dst.dtype) {
    case DType::kF16: {
      auto p = reinterpret_cast<uint16_t*>(base);
      for (int64_t i = 0; i < n; ++i) p[i] = float_to_f16_bits(static_cast<float>(src[i]));
      break;
    }
    case DType::kBF16: {
      auto p = reinterpret_cast<uint16_t*>(base);
      for (int64_t i = 0; i < n; ++i) p[i] = float_to_bf16_bits(static_cast<float>(src[i]));
      break;
    }
    case DType::kF32: {
      auto p = reinterpret_cast<float*>(base);
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<float>(src[i]);
      break;
    }
    case DType::kF64: {
      auto p = reinterpret_cast<double*>(base);
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<double>(src[i]);
      break;
    }
    default: break;
  }
}

}  // namespace openkda
