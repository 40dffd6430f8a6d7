// TensorRef: a non-owning, DLPack-like view of a tensor (data, dtype, device, shape, strides).
//
// The core never allocates tensors: the caller owns every input, output and workspace buffer and
// describes it with a TensorRef. A default-constructed TensorRef is "undefined" and stands for an
// optional argument that was not given (FLA's `None`).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

// Marks the few header functions that CUDA kernels call too (empty for a host compiler).
#if defined(__CUDACC__)
#define OPENKDA_HOST_DEVICE __host__ __device__
#else
#define OPENKDA_HOST_DEVICE
#endif

namespace openkda {

enum class DType : int8_t { kUndefined = 0, kF16, kBF16, kF32, kF64, kI32, kI64, kU8 };
enum class DeviceType : int8_t { kCPU = 0, kCUDA };

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = 0;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

constexpr int kMaxDims = 6;

struct TensorRef {
  void* data = nullptr;
  DType dtype = DType::kUndefined;
  Device device;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};  // in elements, not bytes

  bool defined() const { return dtype != DType::kUndefined; }
  int64_t numel() const;
  // Size of dimension d; negative d counts from the end (as in torch).
  int64_t size(int d) const { return shape[d < 0 ? d + ndim : d]; }
  bool is_contiguous() const;  // row-major dense (size-1 dims may have any stride)
  bool is_float() const {
    return dtype == DType::kF16 || dtype == DType::kBF16 || dtype == DType::kF32 ||
           dtype == DType::kF64;
  }
};

// A contiguous row-major TensorRef over `data`.
TensorRef make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
                      Device device = Device{});
TensorRef make_tensor(void* data, DType dtype, int ndim, const int64_t* shape,
                      Device device = Device{});

// Inline (and callable from device code under nvcc) so that every layer, the CUDA kernels
// included, shares one definition.
OPENKDA_HOST_DEVICE inline size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF16:
    case DType::kBF16: return 2;
    case DType::kF32:
    case DType::kI32: return 4;
    case DType::kF64:
    case DType::kI64: return 8;
    case DType::kU8: return 1;
    case DType::kUndefined: break;
  }
  return 0;
}

inline const char* dtype_name(DType dtype) {  // "bf16", "f32", ...
  switch (dtype) {
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
    case DType::kUndefined: break;
  }
  return "undefined";
}

inline const char* device_name(DeviceType t) {
  return t == DeviceType::kCUDA ? "cuda" : "cpu";
}

std::string shape_str(const TensorRef& t);  // "[2, 64, 4, 128]"

}  // namespace openkda
