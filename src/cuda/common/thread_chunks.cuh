// A CTA's threads sharing a tile's copy chunks: thread t takes chunks t, t + kThreads, ...
//
// Both loops run a compile-time count and unroll completely. Written as `for (i = tid;
// i < count; i += kThreads)` the same copies compiled to a 4-way unrolled loop with remainder
// branches, whose address arithmetic was about half of the W4A16 decode tile's main loop
// (sm80_weight_only_gemm, sm_90a SASS: 936 → 498 instructions a K block, 2026-11-28).
// sm80_w4a8_gemm's thin tiles run the same count in a plain loop (thread_chunk_passes): its
// 128×128 two-CTA tiles, at 128 registers, spilled 56–92 bytes with their copies in lambdas,
// unrolled or not, so that kernel keeps one loop whose bound is the pass count on the thin
// tiles and the loop from tid on the large ones.
#pragma once

namespace nibble::cuda {

/// Passes over a tile's kCount copy chunks when kThreads threads share them: the trip count of
/// `for (j = 0; j < passes; ++j) { i = tid + j·kThreads; if (i >= kCount) break; ... }`, the
/// form for kernels where a lambda per copy costs registers (sm80_w4a8_gemm's 128×128 tiles).
constexpr int thread_chunk_passes(int count, int threads) { return (count + threads - 1) / threads; }

/// f(i) for this thread's chunks i = tid + j·kThreads < kCount (tid < kThreads).
template <int kCount, int kThreads, class F>
__device__ __forceinline__ void for_each_thread_chunk(int tid, F&& f) {
#pragma unroll
  for (int j = 0; j < (kCount + kThreads - 1) / kThreads; ++j) {
    const int i = tid + j * kThreads;
    if (kCount % kThreads == 0 || i < kCount) f(i);
  }
}

/// The same for a runtime count ≤ kMaxCount (a tile's rows past M left out).
template <int kMaxCount, int kThreads, class F>
__device__ __forceinline__ void for_each_thread_chunk_below(int tid, int count, F&& f) {
#pragma unroll
  for (int j = 0; j < (kMaxCount + kThreads - 1) / kThreads; ++j) {
    const int i = tid + j * kThreads;
    if (i < count) f(i);
  }
}

}  // namespace nibble::cuda
