// rope_qkv_store — RoPE for a prompt's q and k, and the KV-cache store (the prefill path; the
// decode step fuses the same into attention_decode_splitkv.cu).
//
//   token t < m at position p = *pos0 + t; per head, for i < hd/2 (rotate-half, Hugging Face):
//     a = v[i], b = v[i + hd/2]
//     v'[i]        = a·cos[p,i] − b·sin[p,i]
//     v'[i + hd/2] = b·cos[p,i] + a·sin[p,i]
//   (f32, each product and sum rounded separately — the CPU backend's rope(), no FMA)
//   q' → q_out (m, Hq·hd) bf16 for the tensor-core prefill attention;
//   k' → k_cache[kv_head, p, :] bf16;  v → v_cache[kv_head, p, :] bf16.
//
// Operands: qkv (m, (Hq + 2·Hkv)·hd) f32, the fused qkv linear's output (q | k | v columns);
// cos, sin (max_ctx, hd/2) f32, computed on the host exactly as the CPU backend does (angles in
// double); caches (Hkv, max_ctx, hd) bf16.
// Work split: one block of 256 threads per token, looping over the (head, pair) indices.
// Limitations: 1. Positions are not checked on the device (the backend checks them on the host).
// Verify: build/<preset>/tests/cpp/nibble_tests --gtest_filter='LlmCudaKernels.Rope*'
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/check.h"
#include "common/cuda_runtime_check.h"
#include "llm/cuda/kernels.h"

namespace nibble::llm::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    rope_qkv_store_kernel(const float* qkv, const int32_t* pos0, AttentionShape s,
                          const float* cos_table, const float* sin_table, __nv_bfloat16* q_out,
                          __nv_bfloat16* k_cache, __nv_bfloat16* v_cache) {
  const int64_t t = blockIdx.x;
  const int64_t p = *pos0 + t;
  const int hd = s.head_dim, half = hd / 2;
  const float* row = qkv + t * s.qkv_ld();
  const float* cs = cos_table + p * half;
  const float* sn = sin_table + p * half;
  const int rotated_heads = s.n_heads + s.n_kv_heads;
  for (int idx = threadIdx.x; idx < rotated_heads * half; idx += kThreads) {
    const int head = idx / half, i = idx % half;
    const float a = row[head * hd + i], b = row[head * hd + i + half];
    const float lo = __fsub_rn(__fmul_rn(a, cs[i]), __fmul_rn(b, sn[i]));
    const float hi = __fadd_rn(__fmul_rn(b, cs[i]), __fmul_rn(a, sn[i]));
    __nv_bfloat16* dst;
    if (head < s.n_heads) {
      dst = q_out + t * s.n_heads * hd + head * hd;
    } else {
      dst = k_cache + ((head - s.n_heads) * s.max_ctx + p) * hd;
    }
    dst[i] = __float2bfloat16_rn(lo);
    dst[i + half] = __float2bfloat16_rn(hi);
  }
  const float* v = row + rotated_heads * hd;
  for (int idx = threadIdx.x; idx < s.n_kv_heads * hd; idx += kThreads) {
    const int head = idx / hd, i = idx % hd;
    v_cache[(head * s.max_ctx + p) * hd + i] = __float2bfloat16_rn(v[idx]);
  }
}

}  // namespace

void launch_rope_qkv_store(const float* qkv, int64_t m, const int32_t* pos0,
                           const AttentionShape& s, const float* cos, const float* sin,
                           uint16_t* q_out, uint16_t* k_cache, uint16_t* v_cache, Stream stream) {
  if (m <= 0 || s.head_dim % 2 != 0)
    nibble::detail::fail(ErrorCode::internal, "launch_rope_qkv_store: bad shape");
  rope_qkv_store_kernel<<<static_cast<unsigned>(m), kThreads, 0, stream>>>(
      qkv, pos0, s, cos, sin, reinterpret_cast<__nv_bfloat16*>(q_out),
      reinterpret_cast<__nv_bfloat16*>(k_cache), reinterpret_cast<__nv_bfloat16*>(v_cache));
  NIBBLE_CUDA_CHECK_LAUNCH();
}

}  // namespace nibble::llm::cuda
