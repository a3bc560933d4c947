// add_bias, head_rmsnorm and compact_heads — the attention extras some Llama-like architectures
// need: the first two in place on a linear layer's f32 output (the CPU backend's add_bias and
// per-head rmsnorm), the third for head sizes the attention kernels do not take.
//
//   add_bias:      y[r, i] += bias[i]                 r < m, i < n   (f32, one rounding)
//     Qwen2's q/k/v biases on the fused qkv output (n = qkv_ld, bias = bq | bk | bv) before RoPE;
//     Llama's attention_bias on the o output (the residual delta) before the residual add.
//   head_rmsnorm:  for each token t, each q head h < Hq and each k head h < Hkv, the hd values
//     v of that head in qkv[t] (q | k | v columns):
//       inv  = (float)(1 / sqrt(Σ_i v[i]² / hd + eps))   (sum of exact f32 squares in double)
//       v[i] = (v[i] · inv) · w[i]                       (f32, two roundings, no FMA)
//     with w = q_norm (hd) for q heads and k_norm (hd) for k heads (Qwen3), before RoPE. With
//     padded heads (below) the sum runs over the padded head (its padding is zeros) and the mean
//     divides by the model's head_dim.
//   compact_heads: heads of the model's head_dim h run zero-padded to the kernels' H (64 or 128)
//     — Phi-3's 96, say. The backend pads the q/k/v projection rows so that each head's halves
//     that RoPE pairs (i, i + h/2) sit at [0, h/2) and [H/2, H/2 + h/2): the kernels' pairs
//     (i, i + H/2) are then the model's pairs or two zeros, and q·k and the softmax are the
//     model's (scale 1/√h). The attention's output rows come out padded; compact_heads copies the
//     model's columns out[t, head·h + j] = padded[t, head·H + p(j)], p(j) = j (j < h/2) or
//     j − h/2 + H/2, so that the o projection reads the model's own (m, n_heads·h) input, in the
//     form the attention wrote (f32, bf16, int8 codes: the scale of an int8 row is unchanged,
//     the padding being zeros).
//
// These are the CPU backend's operations rounding point by rounding point (explicit
// __fadd_rn / __fmul_rn so nvcc cannot contract them), so the GPU equals the CPU here up to the
// order of the double sum. They run as their own small launches, between the linear and the
// attention: the linear layers' epilogues take no bias (GpuLinear), and a separate f32 addition
// after the linear is exactly the CPU's order.
//
// Work split: add_bias, a grid-stride loop over the m·n elements (256 threads per block);
// head_rmsnorm, one warp per head (8 per block), each lane summing every 32nd element, a warp
// shuffle reduction of the double partial sums, then a second pass over the (L1-resident) row;
// compact_heads, one block per row, one element per thread and step.
// Limitations: 1. One extra launch per use (a decode step pays a few µs per layer for each);
// folding the bias into the linear's epilogue or the norm into the attention's prologue would
// save it. 2. Padded heads cost their padding in attention work and KV cache (33% for 96 → 128).
// Verify: build/<preset>/tests/cpp/nibble_tests --gtest_filter='LlmCudaKernels.AddBias*:LlmCudaKernels.CompactHeads*'
#include <cuda_runtime.h>

#include <algorithm>

#include "common/check.h"
#include "common/cuda_runtime_check.h"
#include "llm/cuda/kernels.h"

namespace nibble::llm::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__global__ void __launch_bounds__(kThreads)
    add_bias_kernel(float* __restrict__ y, int64_t count, int64_t n,
                    const float* __restrict__ bias) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t e = blockIdx.x * int64_t{kThreads} + threadIdx.x; e < count; e += stride)
    y[e] = __fadd_rn(y[e], bias[e % n]);
}

__global__ void __launch_bounds__(kThreads)
    head_rmsnorm_kernel(float* __restrict__ qkv, int64_t heads_total, AttentionShape s,
                        const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                        double eps) {
  const int lane = threadIdx.x % 32;
  const int64_t job = blockIdx.x * int64_t{kWarps} + threadIdx.x / 32;
  if (job >= heads_total) return;
  const int normed_heads = s.n_heads + s.n_kv_heads;
  const int64_t t = job / normed_heads;
  const int h = static_cast<int>(job % normed_heads);
  const int hd = s.head_dim;
  float* v = qkv + t * s.qkv_ld() + static_cast<int64_t>(h) * hd;
  const float* w = h < s.n_heads ? q_norm : k_norm;
  double ss = 0.0;
  for (int i = lane; i < hd; i += 32) ss += static_cast<double>(v[i]) * v[i];
#pragma unroll
  for (int off = 16; off > 0; off /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, off);
  const auto inv =
      static_cast<float>(1.0 / sqrt(ss / static_cast<double>(s.model_head_dim()) + eps));
  for (int i = lane; i < hd; i += 32) v[i] = __fmul_rn(__fmul_rn(v[i], inv), w[i]);
}

template <class T>
__global__ void __launch_bounds__(kThreads)
    compact_heads_kernel(const T* __restrict__ padded, int64_t padded_ld, T* __restrict__ out,
                         int64_t out_ld, int n_heads, int H, int h) {
  const int64_t t = blockIdx.x;
  const int half = h / 2, width = n_heads * h;
  for (int e = threadIdx.x; e < width; e += kThreads) {
    const int head = e / h, j = e % h;
    const int from = head * H + (j < half ? j : j - half + H / 2);
    out[t * out_ld + e] = padded[t * padded_ld + from];
  }
}

}  // namespace

void launch_compact_heads(const ActOutput& padded, const ActOutput& out, int64_t m,
                          const AttentionShape& s, Stream stream) {
  const int H = s.head_dim, h = s.model_head_dim();
  if (m <= 0 || padded.kind != out.kind || padded.data == nullptr || out.data == nullptr ||
      h % 2 != 0 || h > H || padded.ld < int64_t{s.n_heads} * H || out.ld < int64_t{s.n_heads} * h)
    nibble::detail::fail(ErrorCode::internal, "launch_compact_heads: bad arguments");
  const auto grid = static_cast<unsigned>(m);
  switch (out.kind) {
    case ActKind::f32:
      compact_heads_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const float*>(padded.data),
                                                          padded.ld, static_cast<float*>(out.data),
                                                          out.ld, s.n_heads, H, h);
      break;
    case ActKind::bf16:
      compact_heads_kernel<<<grid, kThreads, 0, stream>>>(
          static_cast<const uint16_t*>(padded.data), padded.ld, static_cast<uint16_t*>(out.data),
          out.ld, s.n_heads, H, h);
      break;
    case ActKind::s8_per_token:
      compact_heads_kernel<<<grid, kThreads, 0, stream>>>(static_cast<const int8_t*>(padded.data),
                                                          padded.ld, static_cast<int8_t*>(out.data),
                                                          out.ld, s.n_heads, H, h);
      break;
  }
  NIBBLE_CUDA_CHECK_LAUNCH();
}

void launch_add_bias(float* y, int64_t m, int64_t n, const float* bias, Stream stream) {
  if (m <= 0 || n <= 0 || y == nullptr || bias == nullptr)
    nibble::detail::fail(ErrorCode::internal, "launch_add_bias: bad arguments");
  const int64_t count = m * n;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((count + kThreads - 1) / kThreads,
                                                              int64_t{4096}));
  add_bias_kernel<<<blocks, kThreads, 0, stream>>>(y, count, n, bias);
  NIBBLE_CUDA_CHECK_LAUNCH();
}

void launch_head_rmsnorm(float* qkv, int64_t m, const AttentionShape& s, const float* q_norm,
                         const float* k_norm, double eps, Stream stream) {
  if (m <= 0 || s.head_dim <= 0 || qkv == nullptr || q_norm == nullptr || k_norm == nullptr)
    nibble::detail::fail(ErrorCode::internal, "launch_head_rmsnorm: bad arguments");
  const int64_t heads_total = m * (s.n_heads + s.n_kv_heads);
  const auto blocks = static_cast<unsigned>((heads_total + kWarps - 1) / kWarps);
  head_rmsnorm_kernel<<<blocks, kThreads, 0, stream>>>(qkv, heads_total, s, q_norm, k_norm, eps);
  NIBBLE_CUDA_CHECK_LAUNCH();
}

}  // namespace nibble::llm::cuda
