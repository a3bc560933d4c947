// Kernels that use more than 48 KB of dynamic shared memory must opt in to it first.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <atomic>
#include <mutex>

#include "common/cuda_runtime_check.h"

namespace nibble::cuda {

namespace launch_attributes {
/// Devices past this count set a kernel attribute on every call instead of once.
constexpr int kDevices = 64;
/// The current device's entry of a per-device table of what was set; nullptr past kDevices.
template <class Entry>
Entry* current_device_entry(std::array<Entry, kDevices>& table) {
  int device = 0;
  NIBBLE_CUDA_CHECK(cudaGetDevice(&device));
  return device < kDevices ? &table[size_t(device)] : nullptr;
}
}  // namespace launch_attributes

/// Raises `Kernel`'s dynamic shared-memory limit on the current device to at least `bytes`. The
/// first launch on a device always sets it (the default limit is 48 KiB less the kernel's
/// static shared memory); later ones only when they need more than any before them, so a kernel
/// whose shared memory follows its plan never asks for more than a plan (checked against the
/// device by its planner) needs. Kept per device, as the attribute is.
template <auto Kernel>
void allow_dynamic_smem(int bytes) {
  // 1 + the limit set on each device; 0 while none is (zero-initialized atomics).
  static std::array<std::atomic<int>, launch_attributes::kDevices> configured{};
  static std::mutex raising;
  std::atomic<int>* set = launch_attributes::current_device_entry(configured);
  if (set != nullptr && bytes < set->load(std::memory_order_acquire)) return;
  const std::lock_guard<std::mutex> lock(raising);
  if (set != nullptr && bytes < set->load(std::memory_order_relaxed)) return;
  NIBBLE_CUDA_CHECK(cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  if (set != nullptr) set->store(bytes + 1, std::memory_order_release);
}

/// Lets `Kernel` run in thread-block clusters of more than 8 CTAs (the portable size) on the
/// current device: the H100 runs 16. Set before launching such clusters and before asking the
/// occupancy calculator about them; kept per device, as the attribute is.
template <auto Kernel>
void allow_nonportable_clusters() {
  static std::array<std::atomic<bool>, launch_attributes::kDevices> configured{};
  std::atomic<bool>* set = launch_attributes::current_device_entry(configured);
  if (set != nullptr && set->load(std::memory_order_acquire)) return;
  NIBBLE_CUDA_CHECK(
      cudaFuncSetAttribute(Kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  if (set != nullptr) set->store(true, std::memory_order_release);
}

}  // namespace nibble::cuda
