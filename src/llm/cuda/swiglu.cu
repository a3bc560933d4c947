// swiglu — the gated activation between the fused gate_up linear and the down projection.
//
//   out[r, i] = (g / (1 + exp(−g))) · u,   g = gu[r, i], u = gu[r, f + i],   i < f
//   (f32; IEEE division and explicitly rounded products, as the CPU backend's loop computes it;
//   expf is CUDA's, within 2 ulp of the host's)
//   out in the form the down projection reads: bf16, f32 or int8 per token.
//
// Operands: gu (m, 2f) f32, row stride 2f (the gate_up linear's output: gate columns, then up
// columns, because its weight is [W_gate; W_up]); out (m, ld) with ld ≥ f.
// Work split: one block of 1024 threads per row (f = 14336: 14 elements per thread).
// Limitations: 1. One block per row (the decode step's row is 112 KB of f32 input, read from
// L2); 2. int8 output recomputes each value once (amax pass, then quantize pass).
// Verify: build/<preset>/tests/cpp/nibble_tests --gtest_filter='LlmCudaKernels.SwiGlu*'
#include <cuda_runtime.h>

#include "common/check.h"
#include "common/cuda_runtime_check.h"
#include "llm/cuda/activation_store.cuh"
#include "llm/cuda/kernels.h"

namespace nibble::llm::cuda {

namespace {

constexpr int kThreads = 1024;

__global__ void __launch_bounds__(kThreads)
    swiglu_kernel(const float* gu, int64_t f, ActOutput out) {
  __shared__ float max_scratch[kThreads / 32];
  const int64_t r = blockIdx.x;
  const float* row = gu + r * 2 * f;
  store_act_row<kThreads>(out, r, f, max_scratch, [&](int64_t i) {
    const float g = row[i];
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), row[f + i]);
  });
}

}  // namespace

void launch_swiglu(const float* gu, int64_t m, int64_t f, const ActOutput& out, Stream stream) {
  if (m <= 0 || f <= 0 || out.ld < f || out.data == nullptr)
    nibble::detail::fail(ErrorCode::internal, "launch_swiglu: bad shape or output");
  swiglu_kernel<<<static_cast<unsigned>(m), kThreads, 0, stream>>>(gu, f, out);
  NIBBLE_CUDA_CHECK_LAUNCH();
}

}  // namespace nibble::llm::cuda
