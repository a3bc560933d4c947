// Shared `nibble bench` pieces (bench_util.h).
#include "bench/bench_util.h"

#include <cuda_bf16.h>

#include <cstdio>
#include <ctime>
#include <random>
#include <vector>

#include "nibble/numeric.h"

namespace nibble::bench {

namespace {
// xorshift64: cheap enough for the gigabytes of weights a run fills.
uint64_t xorshift_seed(uint64_t seed) { return seed * 0x9E3779B97F4A7C15ull + 1; }
uint64_t xorshift_next(uint64_t& x) {
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return x;
}
// Uniform in [-1, 1) from the top 24 bits.
float xorshift_unit(uint64_t& x) { return static_cast<float>(xorshift_next(x) >> 40) * 0x1p-23f - 1.0f; }
}  // namespace

void fill_random(void* dst, size_t bytes, uint64_t seed) {
  std::vector<uint64_t> host((bytes + 7) / 8);
  uint64_t x = xorshift_seed(seed);
  for (auto& v : host) v = xorshift_next(x);
  BENCH_CUDA(cudaMemcpy(dst, host.data(), bytes, cudaMemcpyHostToDevice));
}

void fill_bf16(void* dst, size_t count, uint64_t seed) {
  std::vector<uint16_t> host(count);
  uint64_t x = xorshift_seed(seed);
  for (auto& v : host) v = f32_to_bf16_bits(xorshift_unit(x));
  BENCH_CUDA(cudaMemcpy(dst, host.data(), count * 2, cudaMemcpyHostToDevice));
}

void fill_e4m3(void* dst, size_t count, uint64_t seed) {
  std::vector<uint8_t> host(count);
  uint64_t x = xorshift_seed(seed);
  for (auto& v : host) v = f32_to_e4m3_bits(448.0f * xorshift_unit(x));
  BENCH_CUDA(cudaMemcpy(dst, host.data(), count, cudaMemcpyHostToDevice));
}

void fill_f32(void* dst, size_t count, float lo, float hi, uint64_t seed) {
  std::vector<float> host(count);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (auto& v : host) v = u(rng);
  BENCH_CUDA(cudaMemcpy(dst, host.data(), count * 4, cudaMemcpyHostToDevice));
}

double time_graph(cudaStream_t stream, int iters, int reps, const std::function<void(int)>& op) {
  for (int i = 0; i < 3; ++i) op(i);  // warm-up outside capture (allocations, autotuning)
  BENCH_CUDA(cudaStreamSynchronize(stream));
  cudaGraph_t graph;
  BENCH_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < iters; ++i) op(i);
  BENCH_CUDA(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  BENCH_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  BENCH_CUDA(cudaGraphLaunch(exec, stream));
  BENCH_CUDA(cudaStreamSynchronize(stream));
  cudaEvent_t e0, e1;
  BENCH_CUDA(cudaEventCreate(&e0));
  BENCH_CUDA(cudaEventCreate(&e1));
  std::vector<double> us;
  for (int r = 0; r < reps; ++r) {
    BENCH_CUDA(cudaEventRecord(e0, stream));
    BENCH_CUDA(cudaGraphLaunch(exec, stream));
    BENCH_CUDA(cudaEventRecord(e1, stream));
    BENCH_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    BENCH_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    us.push_back(1000.0 * ms / iters);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

namespace {
// The plain streaming kernels below (what the ceilings are measured with, not tuned ones): each
// thread has four 16-byte accesses in flight, blocks of 256 threads.
constexpr int kStreamPerThread = 4;
constexpr unsigned kStreamThreads = 256;
unsigned stream_blocks(size_t n) {
  return static_cast<unsigned>((n + kStreamThreads * kStreamPerThread - 1) /
                               (kStreamThreads * kStreamPerThread));
}
// This thread's chunks of src (n of 16 bytes): chunk j is at stream_index(j) when that is < n.
__device__ __forceinline__ size_t stream_index(int j) {
  return size_t(blockIdx.x) * blockDim.x * kStreamPerThread + threadIdx.x + size_t(j) * blockDim.x;
}
__device__ __forceinline__ void load_stream_chunks(const int4* __restrict__ src, size_t n,
                                                   int4 (&v)[kStreamPerThread]) {
#pragma unroll
  for (int j = 0; j < kStreamPerThread; ++j) {
    const size_t i = stream_index(j);
    v[j] = i < n ? src[i] : make_int4(0, 0, 0, 0);
  }
}

__global__ void copy_16b(const int4* __restrict__ src, int4* __restrict__ dst, size_t n) {
  int4 v[kStreamPerThread];
  load_stream_chunks(src, n, v);
#pragma unroll
  for (int j = 0; j < kStreamPerThread; ++j) {
    const size_t i = stream_index(j);
    if (i < n) dst[i] = v[j];
  }
}

// copy_16b's loads without its stores. The XOR of everything read is stored only if it equals a
// value random data essentially never gives, so the loads are kept but nothing is written.
__global__ void read_16b(const int4* __restrict__ src, size_t n, int4* __restrict__ sink) {
  int4 v[kStreamPerThread];
  load_stream_chunks(src, n, v);
  int4 acc = make_int4(0, 0, 0, 0);
#pragma unroll
  for (int j = 0; j < kStreamPerThread; ++j) {
    acc.x ^= v[j].x;
    acc.y ^= v[j].y;
    acc.z ^= v[j].z;
    acc.w ^= v[j].w;
  }
  if (acc.x == 0x5EED1234 && acc.y == 0x0BADF00D && acc.z == acc.w) *sink = acc;
}
}  // namespace

void stream_read(const void* src, size_t bytes, cudaStream_t stream) {
  static DeviceBuffer sink(16);
  const size_t n = bytes / 16;
  read_16b<<<stream_blocks(n), kStreamThreads, 0, stream>>>(static_cast<const int4*>(src), n,
                                                             static_cast<int4*>(sink.p));
  BENCH_CUDA(cudaGetLastError());
}

CopyCeiling copy_ceiling(cudaStream_t stream) {
  const size_t bytes = size_t(1) << 30;
  DeviceBuffer src(bytes), dst(bytes);
  fill_random(src.p, 1 << 20, 7);
  CopyCeiling c;
  const double memcpy_us = time_graph(stream, 5, 5, [&](int) {
    BENCH_CUDA(cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyDeviceToDevice, stream));
  });
  const size_t n = bytes / 16;
  const double kernel_us = time_graph(stream, 5, 5, [&](int) {
    copy_16b<<<stream_blocks(n), kStreamThreads, 0, stream>>>(static_cast<const int4*>(src.p),
                                                             static_cast<int4*>(dst.p), n);
    BENCH_CUDA(cudaGetLastError());
  });
  c.memcpy_gbps = 2.0 * bytes / (memcpy_us * 1e3);
  c.kernel_gbps = 2.0 * bytes / (kernel_us * 1e3);
  return c;
}

std::string CopyCeiling::json_fields() const {
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "\"copy_GBps\": %.2f, \"copy_memcpy_GBps\": %.2f, \"copy_kernel_GBps\": %.2f", gbps(),
                memcpy_gbps, kernel_gbps);
  return buf;
}

int copies_for(size_t bytes, int64_t l2_bytes, int cap) {
  return static_cast<int>(
      std::clamp<int64_t>(3 * l2_bytes / std::max<int64_t>(int64_t(bytes), 1) + 1, 2, cap));
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", std::gmtime(&t));
  return buf;
}

void abandon_capture(cudaStream_t stream) {
  cudaGetLastError();
  cudaStreamCaptureStatus st;
  if (cudaStreamIsCapturing(stream, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone) {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream, &g);
    if (g) cudaGraphDestroy(g);
  }
}

}  // namespace nibble::bench
