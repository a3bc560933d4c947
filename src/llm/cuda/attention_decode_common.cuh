// Device code shared by the two decode-attention kernels (attention_decode_splitkv.cu for
// sm_80+, attention_decode_cluster.cu for sm_90+): their parameters, the fused RoPE and cache
// store of the new token, the per-lane online softmax over bf16 keys and values, and the int8
// output's tail. Both kernels compute the same thing (kernels.h: launch_attention_decode); they
// differ in how the KV length is split and how the splits are combined.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "cuda/common/ptx.cuh"
#include "llm/cuda/activation_store.cuh"
#include "llm/cuda/kernels.h"

namespace nibble::llm::cuda::decode_attention {

/// Query heads per kv head the kernels support (the online-softmax state lives in registers).
constexpr int kMaxGroup = 8;

struct Params {
  const float* qkv;
  const int32_t* pos;
  AttentionShape s;
  const float* cos;
  const float* sin;
  __nv_bfloat16* k_cache;
  __nv_bfloat16* v_cache;
  DecodeAttentionWorkspace ws;
  ActOutput out;
  int splits;  // attention_decode_splitkv: CTAs along the KV length
  int group;   // query heads per kv head
  float scale;  // 1/sqrt(the model's hd)
};

// RoPE's rotate-half pair (a, b) = (x[i], x[i + hd/2]), each product rounded on its own (no FMA)
// as the CPU backend's loop computes it.
__device__ __forceinline__ float rope_lo(float a, float b, float cs, float sn) {
  return __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
}
__device__ __forceinline__ float rope_hi(float a, float b, float cs, float sn) {
  return __fadd_rn(__fmul_rn(b, cs), __fmul_rn(a, sn));
}

/// exp for the softmax weights. kApprox: ex2.approx of x·log2(e) (__expf), a few ulp of expf for
/// the arguments softmax sees (x ≤ 0; exactly 1 at 0 and 0 at −inf) in a third of the
/// instructions, for the cluster kernel, whose key loop is latency-bound on these chains. The
/// split-KV kernel keeps expf (with __expf ptxas spills around a shuffle in its sm_80 code).
template <bool kApprox>
__device__ __forceinline__ float softmax_exp(float x) {
  if constexpr (kApprox)
    return __expf(x);
  else
    return expf(x);
}

__device__ __forceinline__ void unpack8(const uint4& raw, float (&f)[8]) {
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = __bfloat1622float2(h[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
}

/// RoPE's cos and sin at position `pos` for the one pair index this thread rotates, t % (hd/2)
/// (load_step_inputs). The tables do not change: read before griddep_wait.
struct RopeCoefficients {
  float cs, sn;
};
template <int HD>
__device__ __forceinline__ RopeCoefficients load_rope_coefficients(const Params& p, int pos) {
  constexpr int kHalf = HD / 2;
  const int64_t at = static_cast<int64_t>(pos) * kHalf + threadIdx.x % kHalf;
  return {p.cos[at], p.sin[at]};
}

/// The step's inputs from the qkv linear's output (after griddep_wait), all kThreads threads of
/// the block:
///   - the G query heads of `kv_head`, rotated for `pos`, into q_sh;
///   - where `new_row` (the CTA whose keys include pos): the new token's k (rotated) and v,
///     rounded to bf16, to row pos of the caches and to k_new / v_new (shared memory, HD each).
/// Every load is issued before any is used, so the CTA waits for one L2 round trip, not one for
/// the queries and another for the new row (the CTA holding it would reach the combine last).
/// The work is (G + 2)·hd/2 rotate-half pairs — a query head's, k's, or v's (x[i], x[i + hd/2])
/// — and thread t takes pairs t, t + kThreads, ...; as kThreads is a multiple of hd/2, every
/// pair of a thread has index t % (hd/2), the one `rc` holds.
template <int HD, int MAXG, int kThreads>
__device__ __forceinline__ void load_step_inputs(const Params& p, int kv_head, int pos,
                                                 bool new_row, RopeCoefficients rc,
                                                 float (&q_sh)[MAXG][HD],
                                                 __nv_bfloat16* k_new, __nv_bfloat16* v_new) {
  constexpr int kHalf = HD / 2;
  static_assert(kThreads % kHalf == 0, "a thread's pairs must share one rope index");
  constexpr int kPairs = (MAXG + 2) * kHalf;
  constexpr int kPerThread = (kPairs + kThreads - 1) / kThreads;
  const int G = p.group, i = static_cast<int>(threadIdx.x) % kHalf;
  const int q_pairs = G * kHalf, pairs = q_pairs + (new_row ? 2 * kHalf : 0);
  const float* k_in = p.qkv + (p.s.n_heads + kv_head) * HD;
  const float* v_in = p.qkv + (p.s.n_heads + p.s.n_kv_heads + kv_head) * HD;
  float a[kPerThread], b[kPerThread];
#pragma unroll
  for (int n = 0; n < kPerThread; ++n) {
    const int idx = static_cast<int>(threadIdx.x) + n * kThreads;
    if (idx < pairs) {
      const float* row = idx < q_pairs           ? p.qkv + (kv_head * G + idx / kHalf) * HD
                         : idx < q_pairs + kHalf ? k_in
                                                 : v_in;
      a[n] = row[i];
      b[n] = row[i + kHalf];
    }
  }
  const int64_t cache_row = (static_cast<int64_t>(kv_head) * p.s.max_ctx + pos) * HD;
#pragma unroll
  for (int n = 0; n < kPerThread; ++n) {
    const int idx = static_cast<int>(threadIdx.x) + n * kThreads;
    if (idx >= pairs) continue;
    if (idx < q_pairs) {
      q_sh[idx / kHalf][i] = rope_lo(a[n], b[n], rc.cs, rc.sn);
      q_sh[idx / kHalf][i + kHalf] = rope_hi(a[n], b[n], rc.cs, rc.sn);
    } else if (idx < q_pairs + kHalf) {
      const __nv_bfloat16 lo = __float2bfloat16_rn(rope_lo(a[n], b[n], rc.cs, rc.sn));
      const __nv_bfloat16 hi = __float2bfloat16_rn(rope_hi(a[n], b[n], rc.cs, rc.sn));
      p.k_cache[cache_row + i] = k_new[i] = lo;
      p.k_cache[cache_row + i + kHalf] = k_new[i + kHalf] = hi;
    } else {
      const __nv_bfloat16 lo = __float2bfloat16_rn(a[n]), hi = __float2bfloat16_rn(b[n]);
      p.v_cache[cache_row + i] = v_new[i] = lo;
      p.v_cache[cache_row + i + kHalf] = v_new[i + kHalf] = hi;
    }
  }
}

/// A lane's 8 dims (from d0) of the G rotated query heads, zero for heads g ≥ G.
template <int HD, int MAXG>
__device__ __forceinline__ void load_query_slice(const float (&q_sh)[MAXG][HD], int G, int d0,
                                                 float (&q)[MAXG][8]) {
#pragma unroll
  for (int g = 0; g < MAXG; ++g)
#pragma unroll
    for (int e = 0; e < 8; ++e) q[g][e] = g < G ? q_sh[g][d0 + e] : 0.0f;
}

/// One lane's online-softmax state over the keys it has seen, for the G ≤ MAXG query heads of a
/// kv head. HD/8 lanes share a key: each holds 8 of its dims (16 bytes of K and of V), so the
/// dot products are reduced over those lanes with shuffles, and acc holds the lane's 8 dims of
/// Σ exp(s_j − m)·V[j].
template <int HD, int MAXG, bool kApproxExp>
struct OnlineSoftmax {
  static constexpr int kLanesPerKey = HD / 8;
  float m[MAXG], l[MAXG], acc[MAXG][8];

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
      m[g] = -INFINITY;
      l[g] = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;
    }
  }

  /// This lane's state into row `state` of the shared arrays: its 8 dims of acc, and (lanes
  /// holding dim 0) m and l.
  __device__ __forceinline__ void store(float (&acc_sh)[MAXG][HD], float (&ml_sh)[MAXG][2], int G,
                                        int d0) const {
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
      if (g >= G) continue;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc_sh[g][d0 + e] = acc[g][e];
      if (d0 == 0) {
        ml_sh[g][0] = m[g];
        ml_sh[g][1] = l[g];
      }
    }
  }

  /// Adds U keys per lane group (kr, vr: the lane's 16-byte slices; invalid ones are masked).
  /// Every lane of the warp must call it (shuffles).
  template <int U>
  __device__ __forceinline__ void add_keys(const float (&q)[MAXG][8], const uint4 (&kr)[U],
                                           const uint4 (&vr)[U], const bool (&valid)[U], int G,
                                           float scale) {
    float sc[U][MAXG];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float kf[8];
      unpack8(kr[u], kf);
#pragma unroll
      for (int g = 0; g < MAXG; ++g) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) dot += q[g][e] * kf[e];
#pragma unroll
        for (int off = kLanesPerKey / 2; off > 0; off >>= 1)
          dot += __shfl_xor_sync(kFullMask, dot, off);
        sc[u][g] = valid[u] ? dot * scale : -INFINITY;
      }
    }
    float vf[U][8];
#pragma unroll
    for (int u = 0; u < U; ++u) unpack8(vr[u], vf[u]);
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
      if (g >= G) continue;
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < U; ++u) mx = fmaxf(mx, sc[u][g]);
      if (mx == -INFINITY) continue;  // no key of this lane group yet
      const float corr = softmax_exp<kApproxExp>(m[g] - mx);  // 0 when m was −inf
      l[g] *= corr;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] *= corr;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const float pe = softmax_exp<kApproxExp>(sc[u][g] - mx);  // 0 for masked keys
        l[g] += pe;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] += pe * vf[u][e];
      }
      m[g] = mx;
    }
  }
};

/// int8 output: called by every CTA of the grid after it has written its columns of the f32 row
/// to ws.row_f32 and max-ed their |x| into the row maximum (ws.counters[n_kv_heads + 1], float
/// bits). The last of the `arrivals` CTAs to get here (arrival counter ws.counters[n_kv_heads])
/// quantizes the whole row, and leaves both words zero for the next launch.
template <int kThreads>
__device__ __forceinline__ void quantize_row_when_last(const Params& p, int arrivals) {
  __shared__ int last_sh;
  __shared__ float row_amax_sh;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int arrived = atomicAdd(&p.ws.counters[p.s.n_kv_heads], 1);
    last_sh = arrived == arrivals - 1;
    if (last_sh) p.ws.counters[p.s.n_kv_heads] = 0;
  }
  __syncthreads();
  if (!last_sh) return;
  __threadfence();
  // Every CTA's outputs and maxima are in (arrivals are fenced). The row maximum and the first
  // kBatch·kThreads values of the f32 row are loaded together, every load in flight at once: L2
  // round trips are what a one-CTA tail costs (the first version's two passes of one value per
  // trip were ~10 µs).
  constexpr int kBatch = 8;
  const float4* row = reinterpret_cast<const float4*>(p.ws.row_f32);
  const int width4 = p.s.n_heads * p.s.head_dim / 4;
  unsigned* amax_bits = reinterpret_cast<unsigned*>(&p.ws.counters[p.s.n_kv_heads + 1]);
  auto* codes = static_cast<int8_t*>(p.out.data);
  float s = 0.0f;
  nibble::cuda::TokenDivider div{};
  // Block-uniform batches (the first one's barrier needs every thread).
  for (int batch0 = 0; batch0 < width4; batch0 += kBatch * kThreads) {
    float4 v[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = batch0 + threadIdx.x + j * kThreads;
      v[j] = i < width4 ? __ldcg(row + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    if (batch0 == 0) {
      if (threadIdx.x == 0) {
        row_amax_sh = __uint_as_float(__ldcg(amax_bits));
        *amax_bits = 0u;  // for the next launch: every CTA has added its maximum
      }
      __syncthreads();
      s = s8_scale(row_amax_sh);
      if (threadIdx.x == 0) p.out.scales[0] = s;
      div = nibble::cuda::TokenDivider::make(s);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int i = batch0 + threadIdx.x + j * kThreads;
      if (i >= width4) continue;
      codes[4 * i] = s8_quantize(v[j].x, s, div);
      codes[4 * i + 1] = s8_quantize(v[j].y, s, div);
      codes[4 * i + 2] = s8_quantize(v[j].z, s, div);
      codes[4 * i + 3] = s8_quantize(v[j].w, s, div);
    }
  }
}

/// Adds a non-negative maximum to the int8 row's (non-negative floats order as their bits; never
/// NaN: fmaxf drops NaN, as quantize_activation's amax does).
__device__ __forceinline__ void max_into_row_amax(const Params& p, float amax) {
  atomicMax(reinterpret_cast<unsigned*>(&p.ws.counters[p.s.n_kv_heads + 1]),
            __float_as_uint(amax));
}

/// Runs attention_decode_cluster.cu's kernel when the GPU has thread-block clusters (sm_90+) and
/// NIBBLE_DECODE_ATTENTION_KERNEL is unset or `cluster`; false when it did not run (then the
/// caller runs attention_decode_splitkv). NIBBLE_DECODE_ATTENTION_KERNEL=splitkv forces the
/// split-KV kernel everywhere (tests and A/B measurements); `cluster` on a GPU without clusters
/// is an error.
bool launch_cluster(const Params& p, Stream stream);

}  // namespace nibble::llm::cuda::decode_attention
