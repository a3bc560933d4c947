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
// Operands: x, delta (m, d) f32 row stride d; g (d) f32; out (m, ld) with ld ≥ d.
// Work split: one block of 512 threads per row (d = 4096: 8 elements per thread; the decode
// step has one row, so one SM does it in about a microsecond).
// Limitations: 1. One block per row: at m = 1 the other SMs idle (the op is ~16 KB of traffic).
// 2. The row is read twice for int8 output (amax, then quantize); it is in L1/L2 by then.
// Verify: build/<preset>/tests/cpp/nibble_tests --gtest_filter='LlmCudaKernels.AddRmsNorm*'
#include <cuda_runtime.h>

#include "common/check.h"
#include "common/cuda_runtime_check.h"
#include "llm/cuda/activation_store.cuh"
#include "llm/cuda/kernels.h"

namespace nibble::llm::cuda {

namespace {

constexpr int kThreads = 512;

__global__ void __launch_bounds__(kThreads)
    add_rmsnorm_kernel(float* x, const float* delta, int64_t d, const float* g, double eps,
                       ActOutput out) {
  __shared__ double sum_scratch[kThreads / 32];
  __shared__ float max_scratch[kThreads / 32];
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
  add_rmsnorm_kernel<<<static_cast<unsigned>(m), kThreads, 0, stream>>>(x, delta, d, g, eps, out);
  NIBBLE_CUDA_CHECK_LAUNCH();
}

}  // namespace nibble::llm::cuda
