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

bool capturing(Stream stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  NIBBLE_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// cudaMalloc, also while `stream` is capturing a CUDA graph: the first call on a stream may come
// during a capture (PyTorch warms up on a side stream and captures on another), and cudaMalloc is
// refused there in the default (global) capture mode. It is not a stream operation, so this
// thread may make it in relaxed mode for the duration of the call.
void* allocate(size_t bytes, Stream stream) {
  const bool capture = capturing(stream);
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  if (capture) NIBBLE_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (capture) NIBBLE_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
  NIBBLE_CUDA_CHECK(err);
  return p;
}

}  // namespace

SplitKWorkspace split_k_workspace(int device, Stream stream, size_t partial_bytes,
                                  size_t counters) {
  static std::mutex mu;
  static std::map<std::pair<int, Stream>, Buffers> all;
  std::lock_guard<std::mutex> lock(mu);
  Buffers& ws = all[{device, stream}];
  // An outgrown buffer is not freed: a CUDA graph captured while it was current still reads and
  // writes it at every replay. (Workspaces are small: splits·M·N·4 bytes at decode sizes.)
  if (ws.partial_bytes < partial_bytes) {
    ws.partials = allocate(partial_bytes, stream);
    ws.partial_bytes = partial_bytes;
  }
  if (ws.counter_count < counters) {
    ws.counters = static_cast<int*>(allocate(counters * sizeof(int), stream));
    // Zeroed in stream order (a memset node when captured: the kernels leave the counters at
    // zero, so repeating it at every replay changes nothing).
    NIBBLE_CUDA_CHECK(cudaMemsetAsync(ws.counters, 0, counters * sizeof(int), stream));
    ws.counter_count = counters;
  }
  return {ws.partials, ws.counters};
}

void* activation_workspace(int device, Stream stream, size_t bytes) {
  static std::mutex mu;
  static std::map<std::pair<int, Stream>, std::pair<void*, size_t>> all;
  std::lock_guard<std::mutex> lock(mu);
  auto& [ptr, size] = all[{device, stream}];
  if (size < bytes) {  // the outgrown buffer is kept, as in split_k_workspace
    ptr = allocate(bytes, stream);
    size = bytes;
  }
  return ptr;
}

}  // namespace nibble::cuda
