// Pieces shared by the `nibble bench` harnesses (bench/*.cu; CUDA builds only): device buffers,
// random fills, CUDA-graph timing, the copy ceiling and L2 rotation counts.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "nibble/status.h"

namespace nibble::bench {

#define BENCH_CUDA(call)                                                                   \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess)                                                                 \
      throw Error(ErrorCode::cuda_error, std::string(#call) + ": " + cudaGetErrorString(e_)); \
  } while (0)

struct DeviceBuffer {
  void* p = nullptr;
  explicit DeviceBuffer(size_t bytes) { BENCH_CUDA(cudaMalloc(&p, std::max<size_t>(bytes, 16))); }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

/// Random bytes on the device (xorshift on the host, copied up): never zeros.
void fill_random(void* dst, size_t bytes, uint64_t seed);
/// bf16 uniform in [-1, 1): cheap enough for the gigabytes a run needs.
void fill_bf16(void* dst, size_t count, uint64_t seed);
/// e4m3 codes of values uniform in [-448, 448) (finite: no NaN codes), like per-token fp8
/// activations.
void fill_e4m3(void* dst, size_t count, uint64_t seed);
/// f32 uniform in [lo, hi).
void fill_f32(void* dst, size_t count, float lo, float hi, uint64_t seed);

/// Median per-call microseconds of `op(i)` captured `iters` times into one CUDA graph, replayed
/// `reps` times (three warm-up calls outside the capture first).
double time_graph(cudaStream_t stream, int iters, int reps, const std::function<void(int)>& op);

/// The device-to-device copy ceiling in GB/s (bytes read + written) of 1 GiB, two ways in the
/// same CUDA-graph timing: a cudaMemcpyAsync (captured, it becomes a memcpy node, which the
/// H200 ran at 2765 GB/s, 2026-11-28) and a copy kernel (4246 GB/s there, as torch's eager
/// copy). The ceiling is the faster: a stream that only reads can beat the memcpy node's rate.
struct CopyCeiling {
  double memcpy_gbps = 0, kernel_gbps = 0;
  double gbps() const { return memcpy_gbps > kernel_gbps ? memcpy_gbps : kernel_gbps; }
  /// `"copy_GBps": ..., "copy_memcpy_GBps": ..., "copy_kernel_GBps": ...` for a JSON header.
  std::string json_fields() const;
};
CopyCeiling copy_ceiling(cudaStream_t stream);

/// Reads `bytes` (a multiple of 16) at `src` with a plain read-only kernel (16-byte loads, four
/// per thread in flight, the copy kernel's loads without its stores): what a weight stream of
/// exactly that size can reach, launch and memory latency included, for the decode cells where
/// the 1 GiB ceiling above is not reachable (`nibble bench gemm`: read_int4_bytes /
/// read_int8_bytes).
void stream_read(const void* src, size_t bytes, cudaStream_t stream);

/// How many copies of a `bytes` working set make at least 3× L2 (at least 2, at most `cap`).
int copies_for(size_t bytes, int64_t l2_bytes, int cap = 64);

/// Today's date, UTC, as YYYY-MM-DD.
std::string today();

/// Ends a capture left open by an operation that threw, and clears the CUDA error.
void abandon_capture(cudaStream_t stream);

}  // namespace nibble::bench
