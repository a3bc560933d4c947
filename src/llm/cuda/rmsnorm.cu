// add_rmsnorm — the residual add and RMSNorm between the linear layers of a Llama block.
//
//   per row r:  x[r] += delta[r]                       (when delta is given; f32, one rounding)
//               inv   = 1 / sqrt(Σ_i x[r,i]² / d + eps)  (sum of exact f32 squares in double)
//               out[r, i] = (x[r,i] · inv) · g[i]        (f32, two roundings, no FMA)
//   out in the form the next linear reads: bf16, f32 or int8 per token (activation_store.cuh).
//
// This mirrors the CPU backend's rmsnorm() and `x[i] += o[i]` operation by operation (explicit
// __fadd_rn/__fmul_rn so nvcc cannot contract them into FMAs), so the GPU's norm outputs equal
// the CPU's up to the order of the double sum.
//
// Operands: x, delta (m, d) f32 row stride d, not overlapping; g (d) f32; out (m, ld), ld ≥ d.
// Work split: one block of 512 threads per row; thread t owns elements t, t + 512, ... For
// d ≤ 8192 (Llama-3-8B: 4096, 70B: 8192) the thread loads all of its x, delta and g values at
// once and keeps them in registers, so a row costs one memory round trip, whatever the output
// form (a decode step is latency-bound: one row, a few microseconds). Wider rows recompute the
// values from memory for the int8 pass. The double sum's order is the same in both paths.
// On sm_90+ the kernel is launched to overlap the linear before it (programmatic dependent
// launch): g loads first, x and delta after ptx::griddep_wait.
// Limitations: 1. One block per row: at m = 1 the other SMs idle (the op is ~16 KB of traffic).
// 2. d > 8192 reads the row a second and third time for int8 output (from L1/L2).
// Verify: build/<preset>/tests/cpp/nibble_tests --gtest_filter='LlmCudaKernels.AddRmsNorm*'
#include <cuda_runtime.h>

#include "common/check.h"
#include "common/cuda_runtime_check.h"
#include "cuda/common/ptx.cuh"
#include "cuda/launch/pdl_launch.h"
#include "llm/cuda/activation_store.cuh"
#include "llm/cuda/kernels.h"

namespace nibble::llm::cuda {

namespace {

constexpr int kThreads = 512;

// Rows of up to kPer · kThreads elements, held in registers (see the header).
template <int kPer>
__global__ void __launch_bounds__(kThreads)
    add_rmsnorm_held_kernel(float* __restrict__ x, const float* __restrict__ delta, int64_t d,
                            const float* __restrict__ g, double eps, ActOutput out) {
  __shared__ double sum_scratch[kThreads / 32];
  __shared__ float max_scratch[kThreads / 32];
  // The linear this feeds is launched to overlap it (cuda/launch/pdl_launch.h): let it start
  // now and prefetch its weights; it still waits for this kernel to finish before reading.
  nibble::cuda::ptx::griddep_launch_dependents();
  const int64_t r = blockIdx.x;
  float* xr = x + r * d;
  float v[kPer], gv[kPer];
  // The norm weights are no kernel's output: they load while the kernel before this one (the
  // linear producing delta) may still run; x and delta only after it has finished.
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * kThreads;
    gv[j] = i < d ? g[i] : 0.0f;
  }
  nibble::cuda::ptx::griddep_wait();
  // Every load first (x, delta), then the arithmetic: the loads overlap.
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * kThreads;
    v[j] = i < d ? xr[i] : 0.0f;
  }
  if (delta != nullptr) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int64_t i = threadIdx.x + int64_t{j} * kThreads;
      if (i < d) {
        v[j] = __fadd_rn(v[j], delta[r * d + i]);
        xr[i] = v[j];
      }
    }
  }
  double ss = 0.0;
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (threadIdx.x + int64_t{j} * kThreads < d)
      ss += static_cast<double>(v[j]) * static_cast<double>(v[j]);
  ss = block_sum<kThreads>(ss, sum_scratch);
  const auto inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(d) + eps));
#pragma unroll
  for (int j = 0; j < kPer; ++j) v[j] = __fmul_rn(__fmul_rn(v[j], inv), gv[j]);
  store_act_row_held<kThreads, kPer>(out, r, d, max_scratch, v);
}

// Any d: the values are recomputed from memory for each pass of the int8 output.
__global__ void __launch_bounds__(kThreads)
    add_rmsnorm_kernel(float* x, const float* delta, int64_t d, const float* g, double eps,
                       ActOutput out) {
  __shared__ double sum_scratch[kThreads / 32];
  __shared__ float max_scratch[kThreads / 32];
  // The linear this feeds is launched to overlap it (cuda/launch/pdl_launch.h): let it start
  // now and prefetch its weights; it still waits for this kernel to finish before reading.
  nibble::cuda::ptx::griddep_launch_dependents();
  nibble::cuda::ptx::griddep_wait();  // for the kernel before this one (see launch_add_rmsnorm)
  const int64_t r = blockIdx.x;
  float* xr = x + r * d;
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < d; i += kThreads) {
    float v = xr[i];
    if (delta != nullptr) {
      v = __fadd_rn(v, delta[r * d + i]);
      xr[i] = v;  // the same thread rereads it below
    }
    ss += static_cast<double>(v) * static_cast<double>(v);
  }
  ss = block_sum<kThreads>(ss, sum_scratch);
  const auto inv = static_cast<float>(1.0 / sqrt(ss / static_cast<double>(d) + eps));
  store_act_row<kThreads>(out, r, d, max_scratch,
                          [&](int64_t i) { return __fmul_rn(__fmul_rn(xr[i], inv), g[i]); });
}

}  // namespace

const char* to_string(ActKind k) {
  switch (k) {
    case ActKind::f32: return "f32";
    case ActKind::bf16: return "bf16";
    case ActKind::s8_per_token: return "s8 per token";
  }
  return "?";
}

void launch_add_rmsnorm(float* x, const float* delta, int64_t m, int64_t d, const float* g,
                        double eps, const ActOutput& out, Stream stream) {
  if (m <= 0 || d <= 0 || out.ld < d || out.data == nullptr)
    nibble::detail::fail(ErrorCode::internal, "launch_add_rmsnorm: bad shape or output");
  // Launched to overlap the kernel before it (sm_90+, cuda/launch/pdl_launch.h): the kernels
  // wait for it before touching x or delta.
  const auto grid = static_cast<unsigned>(m);
  const bool overlap = nibble::cuda::overlapping_launch_allowed_here();
  auto run = [&](auto kernel) {
    nibble::cuda::launch_overlapping(kernel, dim3(grid), dim3(kThreads), 0, stream, overlap, 1,
                                     x, delta, d, g, eps, out);
  };
  if (d <= 4 * kThreads)
    run(add_rmsnorm_held_kernel<4>);
  else if (d <= 8 * kThreads)
    run(add_rmsnorm_held_kernel<8>);
  else if (d <= 16 * kThreads)
    run(add_rmsnorm_held_kernel<16>);
  else
    run(add_rmsnorm_kernel);
}

}  // namespace nibble::llm::cuda
