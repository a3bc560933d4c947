// embedding — the token embedding lookup that starts every forward pass.
//
//   x[t, i] = float(table[tokens[t], i])      t < m, i < d   (bf16 → f32 is exact)
//
// Operands: table (vocab, d) bf16 row-major; tokens (m) int32 in device memory (the decode
// graph reads its token from there); x (m, d) f32. Ids are checked on the host beforehand.
// Work split: one block of 256 threads per token, bf16 pairs per thread (d is even: it is
// n_heads · head_dim with an even head_dim).
// Limitations: 1. d must be even.
// Verify: build/<preset>/tests/cpp/nibble_tests --gtest_filter='LlmCudaKernels.Embedding*'
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/check.h"
#include "common/cuda_runtime_check.h"
#include "llm/cuda/kernels.h"

namespace nibble::llm::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    embedding_kernel(const __nv_bfloat162* table, const int32_t* tokens, int64_t half_d,
                     float2* x) {
  const int64_t t = blockIdx.x;
  const __nv_bfloat162* row = table + static_cast<int64_t>(tokens[t]) * half_d;
  for (int64_t i = threadIdx.x; i < half_d; i += kThreads) x[t * half_d + i] = __bfloat1622float2(row[i]);
}

}  // namespace

void launch_embedding(const uint16_t* table_bf16, const int32_t* tokens, int64_t m, int64_t d,
                      float* x, Stream stream) {
  if (m <= 0 || d <= 0 || d % 2 != 0)
    nibble::detail::fail(ErrorCode::internal, "launch_embedding: m > 0 and an even d expected");
  embedding_kernel<<<static_cast<unsigned>(m), kThreads, 0, stream>>>(
      reinterpret_cast<const __nv_bfloat162*>(table_bf16), tokens, d / 2,
      reinterpret_cast<float2*>(x));
  NIBBLE_CUDA_CHECK_LAUNCH();
}

}  // namespace nibble::llm::cuda
