// swiglu — the gated activation between the fused gate_up linear and the down projection.
//
//   out[r, i] = (g / (1 + exp(−g))) · u,   g = gu[r, i], u = gu[r, f + i],   i < f
//   (f32; IEEE division and explicitly rounded products, as the CPU backend's loop computes it;
//   expf is CUDA's, within 2 ulp of the host's)
//   out in the form the down projection reads: bf16, f32 or int8 per token.
//
// Operands: gu (m, 2f) f32, row stride 2f (the gate_up linear's output: gate columns, then up
// columns, because its weight is [W_gate; W_up]); out (m, ld) with ld ≥ f.
// Work split: one block of 1024 threads per row; thread t owns elements t, t + 1024, ... For
// f ≤ 16384 (Llama-3-8B: 14336) it loads all of its gate and up values at once and keeps the
// results in registers, so the int8 output needs no second pass over memory (a decode step's
// row is latency-bound). Wider rows (Llama-3-70B: 28672; 32 values a thread would spill at 1024
// threads) recompute each value for the quantize pass.
// On sm_90+ the kernel is launched to overlap the linear before it (programmatic dependent
// launch) and waits for it (ptx::griddep_wait) before reading gu.
// Limitations: 1. One block per row (the decode step's row is 112 KB of f32 input, read from
// L2); 2. f > 16384 with int8 output recomputes each value once (amax pass, then quantize).
// Verify: build/<preset>/tests/cpp/nibble_tests --gtest_filter='LlmCudaKernels.SwiGlu*'
#include <cuda_runtime.h>

#include "common/check.h"
#include "common/cuda_runtime_check.h"
#include "cuda/common/ptx.cuh"
#include "cuda/launch/pdl_launch.h"
#include "llm/cuda/activation_store.cuh"
#include "llm/cuda/kernels.h"

namespace nibble::llm::cuda {

namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ float swiglu_value(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

// Rows of up to kPer · kThreads values, held in registers (see the header).
template <int kPer>
__global__ void __launch_bounds__(kThreads)
    swiglu_held_kernel(const float* __restrict__ gu, int64_t f, ActOutput out) {
  __shared__ float max_scratch[kThreads / 32];
  const int64_t r = blockIdx.x;
  // The linear this feeds is launched to overlap it (cuda/launch/pdl_launch.h): let it start
  // now and prefetch its weights; it still waits for this kernel to finish before reading.
  nibble::cuda::ptx::griddep_launch_dependents();
  nibble::cuda::ptx::griddep_wait();  // for the linear producing gu (see launch_swiglu)
  const float* row = gu + r * 2 * f;
  float g[kPer], u[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {  // every load first: they overlap
    const int64_t i = threadIdx.x + int64_t{j} * kThreads;
    g[j] = i < f ? row[i] : 0.0f;
    u[j] = i < f ? row[f + i] : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) g[j] = swiglu_value(g[j], u[j]);
  store_act_row_held<kThreads, kPer>(out, r, f, max_scratch, g);
}

// Any f: the values are recomputed from memory for the quantize pass of int8 output.
__global__ void __launch_bounds__(kThreads)
    swiglu_kernel(const float* gu, int64_t f, ActOutput out) {
  __shared__ float max_scratch[kThreads / 32];
  const int64_t r = blockIdx.x;
  // The linear this feeds is launched to overlap it (cuda/launch/pdl_launch.h): let it start
  // now and prefetch its weights; it still waits for this kernel to finish before reading.
  nibble::cuda::ptx::griddep_launch_dependents();
  nibble::cuda::ptx::griddep_wait();  // for the linear producing gu (see launch_swiglu)
  const float* row = gu + r * 2 * f;
  store_act_row<kThreads>(out, r, f, max_scratch, [&](int64_t i) {
    return swiglu_value(row[i], row[f + i]);
  });
}

}  // namespace

void launch_swiglu(const float* gu, int64_t m, int64_t f, const ActOutput& out, Stream stream) {
  if (m <= 0 || f <= 0 || out.ld < f || out.data == nullptr)
    nibble::detail::fail(ErrorCode::internal, "launch_swiglu: bad shape or output");
  // Launched to overlap the kernel before it (sm_90+, cuda/launch/pdl_launch.h): the kernels
  // wait for it before reading gu.
  const auto grid = static_cast<unsigned>(m);
  const bool overlap = nibble::cuda::overlapping_launch_allowed_here();
  auto run = [&](auto kernel) {
    nibble::cuda::launch_overlapping(kernel, dim3(grid), dim3(kThreads), 0, stream, overlap, 1,
                                     gu, f, out);
  };
  if (f <= 4 * kThreads)
    run(swiglu_held_kernel<4>);
  else if (f <= 16 * kThreads)
    run(swiglu_held_kernel<16>);
  else
    run(swiglu_kernel);
}

}  // namespace nibble::llm::cuda
