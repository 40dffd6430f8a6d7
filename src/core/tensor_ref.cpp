// TensorRef helpers: element counts, contiguity, names used in error messages.
#include "openkda/tensor_ref.h"


namespace openkda {

int64_t TensorRef::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

bool TensorRef::is_contiguous() const {
  if (numel() == 0) return true;  // no element is addressed: any strides describe it
  int64_t expected = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && stride[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

TensorRef make_tensor(void* data, DType dtype, int ndim, const int64_t* shape, Device device) {
  TensorRef t;
  t.data = data;
  t.dtype = dtype;
  t.device = device;
  t.ndim = ndim;
  int64_t s = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    t.shape[d] = shape[d];
    t.stride[d] = s;
    s *= shape[d];
  }
  return t;
}

TensorRef make_tensor(void* data, DType dtype, std::initializer_list<int64_t> shape,
                      Device device) {
  return make_tensor(data, dtype, static_cast<int>(shape.size()), shape.begin(), device);
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kU8:
      return 1;
    case DType::kUndefined:
      break;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
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

const char* device_name(DeviceType t) { return t == DeviceType::kCUDA ? "cuda" : "cpu"; }

std::string shape_str(const TensorRef& t) {  // no iostreams: see core/validate.cpp
  std::string out = "[";
  for (int d = 0; d < t.ndim; ++d) out += (d ? ", " : "") + std::to_string(t.shape[d]);
  return out + "]";
}

}  // namespace openkda
