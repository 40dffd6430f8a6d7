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

size_t dtype_size(DType dtype);
const char* dtype_name(DType dtype);    // "bf16", "f32", ...
const char* device_name(DeviceType t);  // "cpu", "cuda"
std::string shape_str(const TensorRef& t);  // "[2, 64, 4, 128]"

}  // namespace openkda
