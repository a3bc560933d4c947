// gpu_wait — a kernel that only waits, for profiling the decode step op by op.
//
//   one thread spins until `nanoseconds` of %globaltimer have passed since it started.
//
// Why: events between eagerly launched kernels time the host's launch rate as much as the GPU
// when the kernels are short (a decode step's norms take a few microseconds, about a launch's
// host cost). Launched first, this kernel holds the stream while the host enqueues the whole
// step, so the ops then run back to back as in a CUDA-graph replay.
// Limitations: 1. The wait must outlast the host's enqueueing (the caller sizes it); if it does
// not, the first ops' times include host gaps again. 2. %globaltimer ticks in microseconds on
// some GPUs; the wait is approximate.
// Verify: nibble bench-model --random-weights --arch llama3-8b --profile-decode (GPU)
#include <cuda_runtime.h>

#include "common/cuda_runtime_check.h"
#include "llm/cuda/kernels.h"

namespace nibble::llm::cuda {

namespace {

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void gpu_wait_kernel(int64_t nanoseconds) {
  const uint64_t start = global_ns();
  while (global_ns() - start < static_cast<uint64_t>(nanoseconds)) __nanosleep(1000);
}

}  // namespace

void launch_gpu_wait(int64_t nanoseconds, Stream stream) {
  gpu_wait_kernel<<<1, 1, 0, stream>>>(nanoseconds);
  NIBBLE_CUDA_CHECK_LAUNCH();
}

}  // namespace nibble::llm::cuda
