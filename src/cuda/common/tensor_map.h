// Host side of the Tensor Memory Accelerator (TMA): tensor maps for cp.async.bulk.tensor loads
// (bulk_copy.cuh: tma_load_2d). cuTensorMapEncodeTiled is a driver function; it is reached through
// the runtime's driver entry point, so the library does not link libcuda. Encoding is pure host
// work (no device call, no allocation): a map is built per call and passed to the kernel by value,
// in its __grid_constant__ parameters, which CUDA-graph capture records with the rest of them.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace openkda::cuda {

// A 2-D map of a row-major matrix of 16-bit elements [rows, cols] whose rows are `row_bytes`
// apart (a multiple of 16; `base` 16-byte aligned), read in boxes of box_rows x 64 columns (128
// bytes per box row) that land in shared memory with the 128-byte swizzle: box row r, 16-byte
// chunk c at r * 128 + ((c ^ r % 8) * 16), from a 1024-byte aligned destination. Elements past
// `rows` or `cols` read as zero. cudaErrorNotSupported when the driver does not export the encoder
// (a driver older than CUDA 12, which could not run this library's sm_90a kernels anyway).
cudaError_t encode_b16_rows_map(CUtensorMap* map, const void* base, uint64_t rows, uint64_t cols,
                                uint64_t row_bytes, uint32_t box_rows);

// The same for elements of `elem_bytes` (2 or 4) bytes, read in dense boxes of box_rows x
// box_cols (box_cols * elem_bytes a multiple of 16, box_cols <= 256): box row r lands at byte
// r * box_cols * elem_bytes of a 128-byte aligned destination, unswizzled.
cudaError_t encode_dense_rows_map(CUtensorMap* map, const void* base, uint32_t elem_bytes,
                                  uint64_t rows, uint64_t cols, uint64_t row_bytes,
                                  uint32_t box_rows, uint32_t box_cols);

}  // namespace openkda::cuda
