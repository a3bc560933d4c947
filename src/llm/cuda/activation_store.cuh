// Device helpers of the runner's kernels: block-wide reductions, and writing a row of a linear
// layer's input in the form that layer reads (ActOutput in kernels.h).
//
// The int8 path reproduces nibble::quantize_activation (src/cuda/generic/act_quant.cu) bit for
// bit from the same f32 values: amax = max |x| (fmaxf from 0), s = amax / 127 with IEEE
// division (__fdiv_rn), q = clamp(rint(x / s), ±127), q = 0 when s = 0. A fused producer
// therefore gives the same bytes as "write f32, then quantize_activation" (tested per kernel in
// LlmCudaKernels.*, and end to end in LlmCudaBackend.FusedInt8QuantizationEqualsQuantizeActivation).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/common/token_quant.cuh"
#include "llm/cuda/kernels.h"

namespace nibble::llm::cuda {

constexpr unsigned kFullMask = 0xFFFFFFFFu;

/// Sum over the block (blockDim.x == kThreads, a multiple of 32) in a fixed order; every
/// thread gets the result. `scratch` holds kThreads/32 values; the call synchronizes the block.
template <int kThreads, class T>
__device__ __forceinline__ T block_sum(T v, T* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // scratch may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T total = scratch[0];
  for (int w = 1; w < kThreads / 32; ++w) total += scratch[w];
  return total;
}

/// Maximum over the block, as block_sum.
template <int kThreads>
__device__ __forceinline__ float block_max(float v, float* scratch) {
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(kFullMask, v, offset));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = scratch[0];
  for (int w = 1; w < kThreads / 32; ++w) m = fmaxf(m, scratch[w]);
  return m;
}

/// The int8 scale of a row whose largest magnitude is amax (quantize_activation's formula).
__device__ __forceinline__ float s8_scale(float amax) { return __fdiv_rn(amax, 127.0f); }

/// One int8 value, quantize_activation's rounding: rint (ties to even) of x / s, clamped. The
/// quotient is RN(x / s) from s's reciprocal (`div` = TokenDivider::make(s), once per row;
/// cuda/common/token_quant.cuh): the same bits as an IEEE division for |x| ≤ the row's amax,
/// without the division's slow-path subroutine call, which made ptxas spill around it once
/// several values were held across it.
__device__ __forceinline__ int8_t s8_quantize(float x, float s, const nibble::cuda::TokenDivider& div) {
  if (s == 0.0f) return 0;
  const float q = rintf(div.divide(x));
  return static_cast<int8_t>(fminf(fmaxf(q, -127.0f), 127.0f));
}

/// Stores element (row, i) of an f32 or bf16 output (round to nearest even for bf16).
__device__ __forceinline__ void store_float_act(const ActOutput& out, int64_t row, int64_t i,
                                                float v) {
  if (out.kind == ActKind::f32)
    static_cast<float*>(out.data)[row * out.ld + i] = v;
  else
    static_cast<__nv_bfloat16*>(out.data)[row * out.ld + i] = __float2bfloat16_rn(v);
}

/// Writes row `row` of `out` from a block whose threads can each (re)compute value(i) for the
/// indices i = threadIdx.x, threadIdx.x + kThreads, ... < width. For int8 output the values
/// are computed twice (once for amax, once to quantize) rather than held in registers, so any
/// width works; they are cheap recomputations from L1/L2-resident rows. Each pass takes
/// kBatch values a thread at a time, all computed (loaded) before any is used: a value read
/// from L2 costs a round trip, and one at a time made a 4096-wide row's two passes about 10 µs
/// (the decode attention's tail when it used this: runner_ops_bench, attention → s8 19 µs
/// against 9 µs → bf16, H100, 2026-11-23). The max and the quantization are exact,
/// so the grouping does not change the bytes.
template <int kThreads, class ValueFn>
__device__ __forceinline__ void store_act_row(const ActOutput& out, int64_t row, int64_t width,
                                              float* scratch, ValueFn value) {
  constexpr int kBatch = 8;
  // f(i, v) for this thread's indices, kBatch values computed before f sees any of them.
  const auto for_each_value = [&](auto&& f) {
    for (int64_t base = threadIdx.x; base < width; base += int64_t{kBatch} * kThreads) {
      float v[kBatch];
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t i = base + int64_t{j} * kThreads;
        v[j] = i < width ? value(i) : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < kBatch; ++j) {
        const int64_t i = base + int64_t{j} * kThreads;
        if (i < width) f(i, v[j]);
      }
    }
  };
  if (out.kind != ActKind::s8_per_token) {
    for_each_value([&](int64_t i, float v) { store_float_act(out, row, i, v); });
    return;
  }
  float amax = 0.0f;
  for_each_value([&](int64_t, float v) { amax = fmaxf(amax, fabsf(v)); });
  amax = block_max<kThreads>(amax, scratch);
  const float s = s8_scale(amax);
  if (threadIdx.x == 0) out.scales[row] = s;
  const nibble::cuda::TokenDivider div = nibble::cuda::TokenDivider::make(s);
  auto* q = static_cast<int8_t*>(out.data) + row * out.ld;
  for_each_value([&](int64_t i, float v) { q[i] = s8_quantize(v, s, div); });
}

/// store_act_row for a row whose values the threads already hold: thread t holds v[j] for
/// i = t + j·kThreads, j < kPer (entries with i ≥ width are ignored). One pass over registers:
/// no recomputation and no re-read of the producer's inputs, so the int8 path costs one block
/// reduction more than the float paths and no further memory round trip.
template <int kThreads, int kPer>
__device__ __forceinline__ void store_act_row_held(const ActOutput& out, int64_t row,
                                                   int64_t width, float* scratch,
                                                   const float (&v)[kPer]) {
  if (out.kind != ActKind::s8_per_token) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int64_t i = threadIdx.x + int64_t{j} * kThreads;
      if (i < width) store_float_act(out, row, i, v[j]);
    }
    return;
  }
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (threadIdx.x + int64_t{j} * kThreads < width) amax = fmaxf(amax, fabsf(v[j]));
  amax = block_max<kThreads>(amax, scratch);
  const float s = s8_scale(amax);
  if (threadIdx.x == 0) out.scales[row] = s;
  const nibble::cuda::TokenDivider div = nibble::cuda::TokenDivider::make(s);
  auto* q = static_cast<int8_t*>(out.data) + row * out.ld;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * kThreads;
    if (i < width) q[i] = s8_quantize(v[j], s, div);
  }
}

}  // namespace nibble::llm::cuda
