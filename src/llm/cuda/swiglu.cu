// swiglu — the gated activation between the fused gate_up linear and the down projection.
//
//   out[r, i] = (g / (1 + exp(−g))) · u,   g = gu[r, i], u = gu[r, f + i],   i < f
//   (f32; IEEE division and explicitly rounded products, as the CPU backend's loop computes it;
//   expf is CUDA's, within 2 ulp of the host's)
//   out in the form the down projection reads: bf16, f32 or int8 per token.
//
// Operands: gu (m, 2f) f32, row stride 2f (the gate_up linear's output: gate columns, then up
// columns, because its weight is [W_gate; W_up]); out (m, ld) with ld ≥ f.
// Work split, sm_90+ (swiglu_cluster_kernel): a cluster of 8 blocks of 256 threads per row,
// block z owning the z-th eighth of the row, every value computed once and held in registers
// (up to 16 a thread: f ≤ 32768, Llama-3-70B's 28672 included). For int8 output each block
// reduces its max |x|, and the cluster combines the eight maxima through distributed shared
// memory. Why: a row's exp and IEEE division are ~40 instructions a value, and one block of
// 1024 threads (the sm_80 path) spent ~6-8 µs of a decode step on them on one SM (ncu, H100,
// 2026-11-24); eight SMs share them now.
// sm_80 (swiglu_held_kernel, swiglu_kernel): one block of 1024 threads per row; thread t owns
// elements t, t + 1024, ... For f ≤ 16384 (Llama-3-8B: 14336) it holds its values in
// registers, so the int8 output needs no second pass over memory; wider rows recompute each
// value for the quantize pass.
// On sm_90+ the kernel is launched to overlap the linear before it (programmatic dependent
// launch) and waits for it (ptx::griddep_wait) before reading gu.
// Limitations: 1. sm_80: one block per row (the decode step's row is 112 KB of f32 input, read
// from L2), and f > 16384 with int8 output recomputes each value once. 2. sm_90: f ≤ 32768;
// wider rows take the sm_80 kernels.
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
constexpr int kClusterThreads = 256;
constexpr int kClusterBlocks = 8;  // the portable cluster size

__device__ __forceinline__ float swiglu_value(float g, float u) {
  return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

// The values i = i0 + threadIdx.x + j·kStride (j < kPer) of row r that lie below i1, into v
// (0 past i1), after letting the next kernel start and waiting for the linear producing gu.
template <int kPer, int kStride>
__device__ __forceinline__ void swiglu_row_values(const float* __restrict__ gu, int64_t f,
                                                  int64_t r, int64_t i0, int64_t i1,
                                                  float (&v)[kPer]) {
  // The linear this feeds is launched to overlap it (cuda/launch/pdl_launch.h): let it start
  // now and prefetch its weights; it still waits for this kernel to finish before reading.
  nibble::cuda::ptx::griddep_launch_dependents();
  nibble::cuda::ptx::griddep_wait();  // for the linear producing gu (see launch_swiglu)
  const float* row = gu + r * 2 * f;
  float u[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {  // every load first: they overlap
    const int64_t i = i0 + threadIdx.x + int64_t{j} * kStride;
    v[j] = i < i1 ? row[i] : 0.0f;
    u[j] = i < i1 ? row[f + i] : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < kPer; ++j) v[j] = swiglu_value(v[j], u[j]);
}

// Rows of up to kPer · kThreads values, held in registers (see the header).
template <int kPer>
__global__ void __launch_bounds__(kThreads)
    swiglu_held_kernel(const float* __restrict__ gu, int64_t f, ActOutput out) {
  __shared__ float max_scratch[kThreads / 32];
  const int64_t r = blockIdx.x;
  float v[kPer];
  swiglu_row_values<kPer, kThreads>(gu, f, r, 0, f, v);
  store_act_row_held<kThreads, kPer>(out, r, f, max_scratch, v);
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

// A cluster of kClusterBlocks blocks per row (grid (m, 1, kClusterBlocks), cluster (1, 1, 8)):
// block z computes the values [z·slice, (z + 1)·slice) of row blockIdx.x, thread t the ones at
// t + j·kClusterThreads of that slice (see the header).
template <int kPer>
__global__ void __launch_bounds__(kClusterThreads)
    swiglu_cluster_kernel(const float* __restrict__ gu, int64_t f, int64_t slice, ActOutput out) {
  __shared__ float max_scratch[kClusterThreads / 32];
  __shared__ uint32_t block_amax_bits;  // read by the other blocks of the cluster
  const int64_t r = blockIdx.x;
  const int64_t i0 = int64_t{blockIdx.z} * slice, i1 = min(f, i0 + slice);
  float g[kPer];
  swiglu_row_values<kPer, kClusterThreads>(gu, f, r, i0, i1, g);
  if (out.kind != ActKind::s8_per_token) {
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int64_t i = i0 + threadIdx.x + int64_t{j} * kClusterThreads;
      if (i < i1) store_float_act(out, r, i, g[j]);
    }
    return;
  }
  // The row's max |x|: this block's, then the cluster's (exact, so the order does not matter
  // and the codes equal quantize_activation's of the f32 row).
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (i0 + threadIdx.x + int64_t{j} * kClusterThreads < i1) amax = fmaxf(amax, fabsf(g[j]));
  amax = block_max<kClusterThreads>(amax, max_scratch);
  if (threadIdx.x == 0) block_amax_bits = __float_as_uint(amax);
  nibble::cuda::ptx::cluster_sync();  // every block's maximum is written
  const auto local = static_cast<uint32_t>(__cvta_generic_to_shared(&block_amax_bits));
  uint32_t bits = 0;
#pragma unroll
  for (int b = 0; b < kClusterBlocks; ++b)
    bits = max(bits, nibble::cuda::ptx::ld_shared_cluster_u32(local, static_cast<uint32_t>(b)));
  nibble::cuda::ptx::cluster_sync();  // no block exits while another may still read its maximum
  const float s = s8_scale(__uint_as_float(bits));  // non-negative floats order as their bits
  if (blockIdx.z == 0 && threadIdx.x == 0) out.scales[r] = s;
  const nibble::cuda::TokenDivider div = nibble::cuda::TokenDivider::make(s);
  auto* q = static_cast<int8_t*>(out.data) + r * out.ld;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int64_t i = i0 + threadIdx.x + int64_t{j} * kClusterThreads;
    if (i < i1) q[i] = s8_quantize(g[j], s, div);
  }
}

}  // namespace

void launch_swiglu(const float* gu, int64_t m, int64_t f, const ActOutput& out, Stream stream) {
  if (m <= 0 || f <= 0 || out.ld < f || out.data == nullptr)
    nibble::detail::fail(ErrorCode::internal, "launch_swiglu: bad shape or output");
  // Launched to overlap the kernel before it (sm_90+, cuda/launch/pdl_launch.h): the kernels
  // wait for it before reading gu.
  const auto grid = static_cast<unsigned>(m);
  int device = 0;
  NIBBLE_CUDA_CHECK(cudaGetDevice(&device));
  const int cc_major = nibble::cuda_device_info(device).cc_major;
  const bool overlap = nibble::cuda::overlapping_launch_allowed(cc_major);
  const int64_t slice = (f + kClusterBlocks - 1) / kClusterBlocks;
  if (cc_major >= 9 && slice <= 16 * kClusterThreads) {
    auto run_cluster = [&](auto kernel) {
      nibble::cuda::launch_overlapping(kernel, dim3(grid, 1, kClusterBlocks),
                                       dim3(kClusterThreads), 0, stream, overlap,
                                       kClusterBlocks, gu, f, slice, out);
    };
    if (slice <= 4 * kClusterThreads)
      run_cluster(swiglu_cluster_kernel<4>);
    else if (slice <= 8 * kClusterThreads)
      run_cluster(swiglu_cluster_kernel<8>);
    else
      run_cluster(swiglu_cluster_kernel<16>);
    return;
  }
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
