// argmax — the greedy next token, picked on the device from the output layer's logits.
//
//   token = llm::argmax(logits[0 .. n)): the lowest index of the largest value, where NaNs never
//           win except a NaN at index 0 (the host loop starts from index 0 and only moves on a
//           strictly greater value), and −0 equals +0.
//   with advance_position (`token` then points to the decode graph's {token, position} in
//   device memory): also token[1] += 1, so that the next replay of the decode graph feeds this
//   token at the next position without a round trip through the host.
//
// Why on the device: a greedy decode step on the host copies the whole logits row (513 KB for
// Llama-3's 128256 ids) to pinned memory, waits for it and scans it, and the GPU idles until the
// host launches the next step. Here the GPU writes 4 bytes, and the runner queues the next
// steps before it has read this one (cuda_backend.cpp, decode_greedy).
//
// Work split: ceil(n / 4096) CTAs of 256 threads, 16 values a thread with all loads in flight.
// Each value becomes a 64-bit key, (orderable bits of the value) << 32 | (~index), so that the
// unsigned maximum of the keys is the largest value at the lowest index; NaN gives key 0 (never
// the maximum of a row with a non-NaN value). The CTA's maximum goes to one atomicMax in the
// workspace; the last CTA to arrive (an arrival counter, as the split-K GEMMs decide it) reads
// the result, applies the index-0 NaN rule, writes the token and resets the workspace. The
// maximum of a set does not depend on the order it is taken in, so the result is deterministic.
//
// Limitations: 1. n < 2^31. 2. One row (batch 1 decode).
// Verify: build/<preset>/tests/cpp/nibble_tests --gtest_filter='LlmCudaKernels.Argmax*'
#include <cuda_runtime.h>

#include <cstdint>

#include "common/check.h"
#include "common/cuda_runtime_check.h"
#include "llm/cuda/kernels.h"

namespace nibble::llm::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kPerThread = 16;
constexpr int kPerCta = kThreads * kPerThread;

// Unsigned bits that order as the floats do (for non-NaN values; −0 is mapped to +0 first).
__device__ __forceinline__ unsigned long long key_of(float v, int64_t i) {
  if (v != v) return 0ull;  // NaN
  unsigned bits = __float_as_uint(v == 0.0f ? 0.0f : v);
  bits = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
  return (static_cast<unsigned long long>(bits) << 32) |
         static_cast<unsigned long long>(0xFFFFFFFFu - static_cast<unsigned>(i));
}

struct ArgmaxWorkspace {
  unsigned long long* key;  // the running maximum key
  unsigned* arrived;        // CTAs done
};

__global__ void __launch_bounds__(kThreads)
    argmax_kernel(const float* logits, int64_t n, int32_t* token, bool advance_position,
                  ArgmaxWorkspace ws) {
  __shared__ unsigned long long warp_max[kThreads / 32];
  __shared__ bool last;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * kPerCta + threadIdx.x;
  float v[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const int64_t i = base + int64_t{j} * kThreads;
    v[j] = i < n ? __ldcg(logits + i) : __int_as_float(0x7fffffff);  // NaN: key 0
  }
  unsigned long long best = 0ull;
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    const unsigned long long k = key_of(v[j], base + int64_t{j} * kThreads);
    best = k > best ? k : best;
  }
  for (int off = 16; off > 0; off >>= 1) {
    const unsigned long long o = __shfl_xor_sync(0xffffffffu, best, off);
    best = o > best ? o : best;
  }
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) best = warp_max[w] > best ? warp_max[w] : best;
    if (best != 0ull) atomicMax(ws.key, best);
    __threadfence();
    last = atomicAdd(ws.arrived, 1u) == gridDim.x - 1;
    if (last) {
      __threadfence();
      const unsigned long long k = atomicExch(ws.key, 0ull);  // read and reset for the next launch
      *ws.arrived = 0u;
      const float first = __ldcg(logits);
      const int32_t t =
          (first != first || k == 0ull) ? 0 : static_cast<int32_t>(0xFFFFFFFFu - static_cast<unsigned>(k));
      token[0] = t;
      if (advance_position) token[1] += 1;
    }
  }
}

}  // namespace

void launch_argmax(const float* logits, int64_t n, int32_t* token, bool advance_position,
                   int* workspace, Stream stream) {
  if (n <= 0 || n >= (int64_t{1} << 31) || logits == nullptr || token == nullptr ||
      workspace == nullptr || reinterpret_cast<uintptr_t>(workspace) % 8 != 0)
    nibble::detail::fail(ErrorCode::internal,
                         "launch_argmax: 0 < n < 2^31 and an 8-byte aligned workspace expected");
  ArgmaxWorkspace ws;
  ws.key = reinterpret_cast<unsigned long long*>(workspace);
  ws.arrived = reinterpret_cast<unsigned*>(workspace + 2);
  const auto grid = static_cast<unsigned>((n + kPerCta - 1) / kPerCta);
  argmax_kernel<<<grid, kThreads, 0, stream>>>(logits, n, token, advance_position, ws);
  NIBBLE_CUDA_CHECK_LAUNCH();
}

}  // namespace nibble::llm::cuda
