// Tensor-map encoding through the runtime's driver entry point (tensor_map.h).
#include "cuda/common/tensor_map.h"

namespace openkda::cuda {
namespace {

using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// Looked up once per process (the function-local static's initialisation is thread-safe).
EncodeTiledFn encode_tiled() {
  static const EncodeTiledFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    // 12000: the ABI of cuTensorMapEncodeTiled since CUDA 12.0.
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // clear the error a failed lookup leaves behind
      return static_cast<EncodeTiledFn>(nullptr);
    }
    return reinterpret_cast<EncodeTiledFn>(f);
  }();
  return fn;
}

// A 2-D map [rows, cols] (innermost first to the driver) with boxes of box_rows x box_cols.
cudaError_t encode_rows_map(CUtensorMap* map, const void* base, CUtensorMapDataType type,
                            uint64_t rows, uint64_t cols, uint64_t row_bytes, uint32_t box_rows,
                            uint32_t box_cols, CUtensorMapSwizzle swizzle) {
  const EncodeTiledFn encode = encode_tiled();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {row_bytes};  // of dimension 1 (dimension 0 is contiguous)
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(map, type, 2, const_cast<void*>(base), dims, strides, box,
                            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace

cudaError_t encode_b16_rows_map(CUtensorMap* map, const void* base, uint64_t rows, uint64_t cols,
                                uint64_t row_bytes, uint32_t box_rows) {
  // 64 16-bit columns: one 128-byte swizzle row.
  return encode_rows_map(map, base, CU_TENSOR_MAP_DATA_TYPE_UINT16, rows, cols, row_bytes, box_rows,
                         64, CU_TENSOR_MAP_SWIZZLE_128B);
}

cudaError_t encode_dense_rows_map(CUtensorMap* map, const void* base, uint32_t elem_bytes,
                                  uint64_t rows, uint64_t cols, uint64_t row_bytes,
                                  uint32_t box_rows, uint32_t box_cols) {
  if (elem_bytes != 2 && elem_bytes != 4) return cudaErrorInvalidValue;
  return encode_rows_map(
      map, base, elem_bytes == 2 ? CU_TENSOR_MAP_DATA_TYPE_UINT16 : CU_TENSOR_MAP_DATA_TYPE_UINT32,
      rows, cols, row_bytes, box_rows, box_cols, CU_TENSOR_MAP_SWIZZLE_NONE);
}

}  // namespace openkda::cuda
