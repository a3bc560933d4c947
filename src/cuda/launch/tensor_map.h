// TMA tensor maps for the sm_90 kernels, built on the host per call from the operands' pointers
// and strides (they travel by value as __grid_constant__ kernel parameters, so CUDA-graph
// capture records them).
#pragma once

#include <cuda.h>

#include <cstring>
#include <string>

#include "common/check.h"

namespace nibble::cuda {

/// The driver's cuTensorMapEncodeTiled, fetched through the runtime so that nothing links
/// libcuda directly (the runtime already loads it).
using EncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*,
                                   const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
                                   const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
EncodeTiledFn encode_tiled();

/// A tensor map of rank R: dims[0] is the contiguous one; strides (bytes) of dims 1..R-1;
/// elements outside the tensor read as zeros. Errors name the kernel and the operand.
template <int R>
CUtensorMap make_tensor_map(const char* kernel, CUtensorMapDataType type, const void* base,
                            const cuuint64_t (&dims)[R], const cuuint64_t (&strides)[R - 1],
                            const cuuint32_t (&box)[R], CUtensorMapSwizzle swizzle,
                            const char* what) {
  CUtensorMap map;
  std::memset(&map, 0, sizeof(map));
  cuuint32_t element_strides[R];
  for (int i = 0; i < R; ++i) element_strides[i] = 1;
  const CUresult r =
      encode_tiled()(&map, type, R, const_cast<void*>(base), dims, strides, box,
                     element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    nibble::detail::fail(ErrorCode::cuda_error, std::string(kernel) + ": cannot describe " +
                                                    what + " for TMA (CUresult " +
                                                    std::to_string(static_cast<int>(r)) + ")");
  return map;
}

}  // namespace nibble::cuda
