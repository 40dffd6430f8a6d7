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

std::string shape_str(const TensorRef& t) {  // no iostreams: see core/validate.cpp
  std::string out = "[";
  for (int d = 0; d < t.ndim; ++d) out += (d ? ", " : "") + std::to_string(t.shape[d]);
  return out + "]";
}

}  // namespace openkda
