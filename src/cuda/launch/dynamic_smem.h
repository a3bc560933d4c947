// Kernels that use more than 48 KB of dynamic shared memory must opt in to it first.
#pragma once

#include <cuda_runtime.h>

#include "common/cuda_runtime_check.h"

namespace nibble::cuda {

/// Raises `Kernel`'s dynamic shared-memory limit to `bytes`, once per kernel instance.
template <auto Kernel>
void allow_dynamic_smem(int bytes) {
  static const bool configured = [bytes] {
    NIBBLE_CUDA_CHECK(
        cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    return true;
  }();
  (void)configured;
}

}  // namespace nibble::cuda
