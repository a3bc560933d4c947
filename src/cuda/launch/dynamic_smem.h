// Kernels that use more than 48 KB of dynamic shared memory must opt in to it first.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <mutex>

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

/// Raises `Kernel`'s limit to at least `bytes` when a launch needs more than any before it: for
/// kernels whose shared memory depends on the plan, up to what the device allows (the planner
/// checks that), so a smaller device never sees a request above its own limit.
template <auto Kernel>
void raise_dynamic_smem(int bytes) {
  // Set on the first launch whatever its size: the default limit is 48 KiB less the kernel's
  // static shared memory. Only ever raised after that.
  static std::atomic<int> configured{-1};
  static std::mutex raising;
  if (bytes <= configured.load(std::memory_order_acquire)) return;
  const std::lock_guard<std::mutex> lock(raising);
  if (bytes <= configured.load(std::memory_order_relaxed)) return;
  NIBBLE_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  configured.store(bytes, std::memory_order_release);
}

}  // namespace nibble::cuda
