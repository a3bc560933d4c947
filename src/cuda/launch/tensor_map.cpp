#include "cuda/launch/tensor_map.h"

#include <cuda_runtime.h>

#include "common/cuda_runtime_check.h"

namespace nibble::cuda {

EncodeTiledFn encode_tiled() {
  static const EncodeTiledFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult status{};
    NIBBLE_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                       cudaEnableDefault, &status));
    if (status != cudaDriverEntryPointSuccess || p == nullptr)
      nibble::detail::fail(ErrorCode::cuda_error,
                           "nibble: the CUDA driver has no cuTensorMapEncodeTiled (TMA)");
    return reinterpret_cast<EncodeTiledFn>(p);
  }();
  return fn;
}

}  // namespace nibble::cuda
