// random_fill — device-side contents for --random-weights runs (an 8B model's 7B parameters are
// never generated, quantized or packed on the host).
//
//   element i of a tensor with seed s:  r = splitmix64(s + (i + 1) · 0x9E3779B97F4A7C15)
//   uniform bf16:   (2·u − 1)·a, u = top 24 bits of r / 2^24 ∈ [0, 1)   (then rounded to bf16)
//   random bytes:   the 8 bytes of r for bytes 8i .. 8i + 7
//   two-level parameters (w4_mma_k128): pair i = (g_s, 128 − 8·g_s), g_s = 9 + (r mod 8)
//
// A counter-based hash, so every element is independent of the launch shape and the contents
// are reproducible from the seed; not the host RandomSource's values (those are made on the CPU).
// Work split: grid-stride loops, 256 threads, enough blocks to fill the GPU.
// Limitations: 1. Not a statistical-quality RNG, only well mixed (splitmix64's finalizer).
// Verify: build/<preset>/tests/cpp/nibble_tests --gtest_filter='LlmCudaKernels.RandomFill*'
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/check.h"
#include "common/cuda_runtime_check.h"
#include "llm/cuda/kernels.h"

namespace nibble::llm::cuda {

namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;

__device__ __forceinline__ uint64_t hash(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void fill_uniform_bf16_kernel(__nv_bfloat16* dst, int64_t count, float a,
                                         uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * kThreads) {
    const float u = static_cast<float>(hash(seed, static_cast<uint64_t>(i)) >> 40) * 0x1p-24f;
    dst[i] = __float2bfloat16_rn((2.0f * u - 1.0f) * a);
  }
}

__global__ void fill_random_bytes_kernel(uint8_t* dst, int64_t bytes, uint64_t seed) {
  const int64_t words = bytes / 8;
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < words;
       i += int64_t{gridDim.x} * kThreads)
    reinterpret_cast<uint64_t*>(dst)[i] = hash(seed, static_cast<uint64_t>(i));
  if (blockIdx.x == 0 && threadIdx.x == 0)
    for (int64_t b = words * 8; b < bytes; ++b)
      dst[b] = static_cast<uint8_t>(hash(seed, static_cast<uint64_t>(words)) >> (8 * (b % 8)));
}

__global__ void fill_f32_kernel(float* dst, int64_t count, float value) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * kThreads)
    dst[i] = value;
}

__global__ void fill_two_level_params_kernel(uint8_t* dst, int64_t pairs, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < pairs;
       i += int64_t{gridDim.x} * kThreads) {
    const int gs = 9 + static_cast<int>(hash(seed, static_cast<uint64_t>(i)) % 8);
    dst[2 * i] = static_cast<uint8_t>(gs);
    dst[2 * i + 1] = static_cast<uint8_t>(128 - 8 * gs);  // g_z = 8: w8 = g_s·(q − 8)
  }
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

}  // namespace

void launch_fill_uniform_bf16(uint16_t* dst, int64_t count, float a, uint64_t seed,
                              Stream stream) {
  if (count <= 0) return;
  fill_uniform_bf16_kernel<<<blocks_for(count), kThreads, 0, stream>>>(
      reinterpret_cast<__nv_bfloat16*>(dst), count, a, seed);
  NIBBLE_CUDA_CHECK_LAUNCH();
}

void launch_fill_random_bytes(uint8_t* dst, int64_t bytes, uint64_t seed, Stream stream) {
  if (bytes <= 0) return;
  if (reinterpret_cast<uintptr_t>(dst) % 8 != 0)
    nibble::detail::fail(ErrorCode::internal, "launch_fill_random_bytes: dst not 8-byte aligned");
  fill_random_bytes_kernel<<<blocks_for(bytes / 8), kThreads, 0, stream>>>(dst, bytes, seed);
  NIBBLE_CUDA_CHECK_LAUNCH();
}

void launch_fill_f32(float* dst, int64_t count, float value, Stream stream) {
  if (count <= 0) return;
  fill_f32_kernel<<<blocks_for(count), kThreads, 0, stream>>>(dst, count, value);
  NIBBLE_CUDA_CHECK_LAUNCH();
}

void launch_fill_two_level_params(uint8_t* dst, int64_t pairs, uint64_t seed, Stream stream) {
  if (pairs <= 0) return;
  fill_two_level_params_kernel<<<blocks_for(pairs), kThreads, 0, stream>>>(dst, pairs, seed);
  NIBBLE_CUDA_CHECK_LAUNCH();
}

}  // namespace nibble::llm::cuda
