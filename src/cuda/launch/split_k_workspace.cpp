#include "cuda/launch/split_k_workspace.h"

#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>

#include "common/cuda_runtime_check.h"

namespace nibble::cuda {

namespace {
struct Buffers {
  void* partials = nullptr;
  size_t partial_bytes = 0;
  int* counters = nullptr;
  size_t counter_count = 0;
};
}  // namespace

SplitKWorkspace split_k_workspace(int device, Stream stream, size_t partial_bytes,
                                  size_t counters) {
  static std::mutex mu;
  static std::map<std::pair<int, Stream>, Buffers> all;
  std::lock_guard<std::mutex> lock(mu);
  Buffers& ws = all[{device, stream}];
  if (ws.partial_bytes < partial_bytes) {
    if (ws.partials != nullptr) NIBBLE_CUDA_CHECK(cudaFree(ws.partials));
    ws.partials = nullptr;
    NIBBLE_CUDA_CHECK(cudaMalloc(&ws.partials, partial_bytes));
    ws.partial_bytes = partial_bytes;
  }
  if (ws.counter_count < counters) {
    if (ws.counters != nullptr) NIBBLE_CUDA_CHECK(cudaFree(ws.counters));
    ws.counters = nullptr;
    NIBBLE_CUDA_CHECK(cudaMalloc(&ws.counters, counters * sizeof(int)));
    NIBBLE_CUDA_CHECK(cudaMemset(ws.counters, 0, counters * sizeof(int)));
    ws.counter_count = counters;
  }
  return {ws.partials, ws.counters};
}

void* activation_workspace(int device, Stream stream, size_t bytes) {
  static std::mutex mu;
  static std::map<std::pair<int, Stream>, std::pair<void*, size_t>> all;
  std::lock_guard<std::mutex> lock(mu);
  auto& [ptr, size] = all[{device, stream}];
  if (size < bytes) {
    if (ptr != nullptr) NIBBLE_CUDA_CHECK(cudaFree(ptr));
    ptr = nullptr;
    NIBBLE_CUDA_CHECK(cudaMalloc(&ptr, bytes));
    size = bytes;
  }
  return ptr;
}

}  // namespace nibble::cuda
