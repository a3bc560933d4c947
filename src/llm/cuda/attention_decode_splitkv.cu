// attention_decode_splitkv — one decode step of grouped-query attention, split over the KV length
// (flash decoding), with RoPE and the KV-cache store of the new token fused in front and a
// deterministic combine at the end: one launch per layer. The decode attention of sm_80/86/89;
// on sm_90+ launch_attention_decode runs attention_decode_cluster.cu instead (its thread-block
// clusters combine the splits without L2 round trips); NIBBLE_DECODE_ATTENTION_KERNEL=splitkv
// forces this kernel there too.
//
//   p = *pos (the new token's position, read from device memory: one CUDA graph serves every
//   step); per head h (kv head h / G, G = Hq/Hkv):
//     q' = rope(q_h, p), k' = rope(k, p)   (rotate-half, f32, no FMA: as rope_qkv_store)
//     K[p] = bf16(k'), V[p] = bf16(v)       (stored by the CTA whose chunk holds p)
//     out[h] = Σ_{j ≤ p} softmax_j(q'·K[j]ᵀ / √hd) · V[j]
//
// Operands: qkv (1, (Hq + 2·Hkv)·hd) f32 (the fused qkv linear's output, unrotated); cos/sin
// (max_ctx, hd/2) f32; caches (Hkv, max_ctx, hd) bf16; out (1, ld) bf16, f32 or int8 per
// token (the o projection's input form); workspace (kernels.h) for partial states, the f32 row
// (int8 output) and arrival counters.
//
// Work split
//   grid (splits = ceil(max_ctx / 64), Hkv), 4 warps. CTA (s, kv head) owns positions
//   [64s, 64s + 64) ∩ [0, p] for all G query heads of its kv head, so each key and value row is
//   read once per step. CTAs past p exit at once (the grid is sized for max_ctx so the graph
//   never changes). Within a CTA, hd/8 lanes share a key (16 bytes of K and of V per lane, from
//   shared memory), so a warp covers 256/hd keys per step.
//
//     chunk of K, V → shared memory (before the wait) ─► lane group (hd/8 lanes) ─► key j:
//     16-byte K, V slices ─► dot per head (shuffle-reduced)
//     ─► online softmax (m, l, acc per head) ─► CTA combine in shared memory (fixed order)
//     ─► partial (acc[hd], m, l) per (head, split) ─► last CTA of the kv head combines the
//        splits in split order, a warp per query head, 4 columns a lane ─► out
//     (int8 output: each kv head's last CTA also adds its heads' max |o| to the row's maximum
//      with an atomic max, so the last kv head's CTA quantizes the whole row in one pass)
//
//   Overlap with the qkv linear (sm_90, programmatic dependent launch): the CTAs start while
//   the linear streams its weights, read p and copy their chunk's cached rows (below p, written
//   by earlier steps) into shared memory (cp.async), and only then wait for the linear
//   (griddepcontrol.wait) to read q, k and v. The new row goes to the cache and to the shared
//   copy. The o linear after this kernel is let go after the wait, not before (launch()).
//
//   "Last CTA" is decided by an atomic arrival counter per kv head (as the split-K GEMMs do):
//   partials are written, fenced, then counted; the CTA that sees count = active − 1 reads
//   them all (L2, __ldcg) in split order, so the result does not depend on CTA timing, and
//   resets the counter for the next launch.
//
// Limitations
//   1. hd ∈ {64, 128}, G ≤ 8, max_ctx ≤ 65536 (the combine's weights live in shared memory).
//   2. One token per launch (batch 1 decode); prompts go through sm80_attention_prefill.
//   3. The q heads' RoPE is recomputed by every CTA of a kv head (G·hd values: negligible).
// Verify: build/<preset>/tests/cpp/nibble_tests --gtest_filter='LlmCudaKernels.AttentionDecode*'
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>

#include "common/check.h"
#include "common/cuda_runtime_check.h"
#include "cuda/common/ptx.cuh"
#include "cuda/launch/pdl_launch.h"
#include "llm/cuda/activation_store.cuh"
#include "llm/cuda/attention_decode_common.cuh"
#include "llm/cuda/kernels.h"

namespace nibble::llm::cuda {

namespace {

using decode_attention::kMaxGroup;
using decode_attention::OnlineSoftmax;
using decode_attention::Params;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kChunk = kDecodeAttentionChunk;
constexpr int kMaxCtx = 65536;

template <int HD, int MAXG>
struct DecodeConfig {
  static constexpr int kLanesPerKey = HD / 8;             // each lane holds 8 dims (16 bytes)
  static constexpr int kKeysPerWarp = 32 / kLanesPerKey;  // keys a warp covers per step
  static constexpr int kStates = kWarps * kKeysPerWarp;   // partial softmax states per CTA
  static constexpr int kKeysPerStep = kStates;            // keys the CTA covers per step
  // Loads issued ahead: 4 steps (8 KB of K and V per CTA in flight at hd = 128); 2 with G = 8,
  // whose per-head accumulators leave fewer registers.
  static constexpr int kUnroll = MAXG >= 8 ? 2 : 4;
  // A partial state record: acc[HD], then m and l, padded to a 16-byte multiple so that the
  // combine reads acc as float4 (kernels.h: decode_attention_partial_floats).
  static constexpr int kRecord = HD + 4;
  // The shared buffer: the chunk's K and V rows (bf16), then the states' accumulators, then the
  // split weights of the combine.
  static constexpr int kKvBytes = 2 * kChunk * HD * 2;
  static constexpr int kStateBytes = kStates * MAXG * HD * 4;
  static constexpr int kBufBytes = kKvBytes > kStateBytes ? kKvBytes : kStateBytes;
  static_assert(kMaxCtx / kChunk * MAXG * 4 <= kBufBytes, "combine weights must fit");
};

template <int HD, int MAXG>
__global__ void __launch_bounds__(kThreads) attention_decode_splitkv_kernel(Params p) {
  using Cfg = DecodeConfig<HD, MAXG>;
  constexpr int T = Cfg::kLanesPerKey, KPW = Cfg::kKeysPerWarp, S = Cfg::kStates;
  constexpr int U = Cfg::kUnroll, R = Cfg::kRecord;
  __shared__ float q_sh[MAXG][HD];
  // The CTA's chunk of K and V (bf16), loaded before the wait; after the key loop the same bytes
  // hold the per-state accumulators, and in the split combine the split weights.
  __shared__ __align__(16) unsigned char buf_sh[Cfg::kBufBytes];
  __shared__ float ml_sh[S][MAXG][2];      // per-state (max, sum)
  __shared__ int last_sh;
  auto* k_sh = reinterpret_cast<__nv_bfloat16*>(buf_sh);
  __nv_bfloat16* v_sh = k_sh + kChunk * HD;
  auto& state_sh = *reinterpret_cast<float(*)[S][MAXG][HD]>(buf_sh);

  const int split = blockIdx.x, kv_head = blockIdx.y, G = p.group;
  // The position and the cached rows below it were written before this graph replay began (by
  // the host or the previous step's argmax, and by earlier steps), so they are read before the
  // wait for the qkv linear; everything the linear writes is read after it.
  const int pos = *p.pos;
  const int len = pos + 1;
  const int n_active = (len + kChunk - 1) / kChunk;
  if (split >= n_active) return;
  const int j0 = split * kChunk, j1 = min(j0 + kChunk, len);
  __nv_bfloat16* kc = p.k_cache + static_cast<int64_t>(kv_head) * p.s.max_ctx * HD;
  __nv_bfloat16* vc = p.v_cache + static_cast<int64_t>(kv_head) * p.s.max_ctx * HD;
  {
    const int pieces = (min(j1, pos) - j0) * (HD / 8);  // 16-byte pieces of rows j0 .. pos − 1
    for (int i = threadIdx.x; i < pieces; i += kThreads) {
      nibble::cuda::ptx::cp_async_16(k_sh + i * 8, kc + int64_t{j0} * HD + i * 8, true);
      nibble::cuda::ptx::cp_async_16(v_sh + i * 8, vc + int64_t{j0} * HD + i * 8, true);
    }
    nibble::cuda::ptx::cp_async_commit();
  }
  const decode_attention::RopeCoefficients rc =
      decode_attention::load_rope_coefficients<HD>(p, pos);
  nibble::cuda::ptx::griddep_wait();
  // The o linear, launched to overlap this kernel, may now start loading its weights (it waits
  // for this kernel before reading its output). Not earlier: it would let the linears after it
  // start too, all of them competing with the qkv linear for memory (see launch()).
  nibble::cuda::ptx::griddep_launch_dependents();
  // The last active chunk holds the new position: it stores the new k and v too.
  decode_attention::load_step_inputs<HD, MAXG, kThreads>(p, kv_head, pos, split == n_active - 1,
                                                         rc, q_sh, k_sh + (pos - j0) * HD,
                                                         v_sh + (pos - j0) * HD);
  nibble::cuda::ptx::cp_async_wait<0>();
  __syncthreads();  // q_sh, the cached rows and the new row ready for the whole CTA

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int key_group = lane / T, d0 = (lane % T) * 8;
  float q[MAXG][8];
  decode_attention::load_query_slice<HD, MAXG>(q_sh, G, d0, q);
  OnlineSoftmax<HD, MAXG, false> st;
  st.init();

  // `base` is warp-uniform (the shuffles below need every lane); each lane group's key is
  // base + key_group + u·(keys per CTA step).
  for (int base = j0 + warp * KPW; base < j1; base += Cfg::kKeysPerStep * U) {
    uint4 kr[U], vr[U];
    bool valid[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = base + u * Cfg::kKeysPerStep + key_group;
      valid[u] = j < j1;
      if (valid[u]) {
        kr[u] = *reinterpret_cast<const uint4*>(k_sh + (j - j0) * HD + d0);
        vr[u] = *reinterpret_cast<const uint4*>(v_sh + (j - j0) * HD + d0);
      } else {
        kr[u] = vr[u] = make_uint4(0, 0, 0, 0);
      }
    }
    st.add_keys<U>(q, kr, vr, valid, G, p.scale);
  }

  // CTA combine: the S = warps × keys-per-warp states, in state order (in the K/V buffer, once
  // every warp is past its last key).
  __syncthreads();
  const int state = warp * KPW + key_group;
  st.store(state_sh[state], ml_sh[state], G, d0);
  __syncthreads();
  for (int idx = threadIdx.x; idx < G * HD; idx += kThreads) {
    const int g = idx / HD, d = idx % HD;
    float mx = -INFINITY;
    for (int t = 0; t < S; ++t) mx = fmaxf(mx, ml_sh[t][g][0]);  // finite: key j0 is valid
    float sum = 0.0f, a = 0.0f;
    for (int t = 0; t < S; ++t) {
      const float mt = ml_sh[t][g][0];
      if (mt == -INFINITY) continue;
      const float w = expf(mt - mx);
      sum += w * ml_sh[t][g][1];
      a += w * state_sh[t][g][d];
    }
    float* part = p.ws.partials + (static_cast<int64_t>(kv_head * G + g) * p.splits + split) * R;
    part[d] = a;
    if (d == 0) {
      part[HD] = mx;
      part[HD + 1] = sum;
    }
  }

  // Arrival: the last active CTA of this kv head combines the splits.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int arrived = atomicAdd(&p.ws.counters[kv_head], 1);
    last_sh = arrived == n_active - 1;
    if (last_sh) p.ws.counters[kv_head] = 0;  // all active CTAs have counted
  }
  __syncthreads();
  if (!last_sh) return;
  __threadfence();

  // Split combine, one warp per query head g (in split order, so the result does not depend on
  // CTA timing): M = max_s m_s, w_s = exp(m_s − M), out = Σ_s w_s·acc_s / Σ_s w_s·l_s. Each
  // lane owns 4 of the HD columns (float4 loads of the records; with HD = 64 the two half-warps
  // take the even and the odd splits and are added at the end), and every split's load is issued
  // before the weighted sum needs it: the records are L2 hits, and one round trip per split (the
  // first version: 4 columns a thread, one at a time) made this tail most of the kernel's time
  // at long contexts.
  auto* w_sh = reinterpret_cast<float*>(buf_sh);  // (G, n_active) split weights exp(m_s − M)
  const bool to_int8 = p.out.kind == ActKind::s8_per_token;
  constexpr int kColLanes = HD / 4, kSplitLanes = 32 / kColLanes;
  for (int g = warp; g < G; g += kWarps) {
    const float* part0 = p.ws.partials + static_cast<int64_t>(kv_head * G + g) * p.splits * R;
    float mx = -INFINITY;
    for (int s = lane; s < n_active; s += 32) mx = fmaxf(mx, __ldcg(part0 + s * R + HD));
    for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kFullMask, mx, off));
    float sum = 0.0f;
    for (int s = lane; s < n_active; s += 32) {
      const float2 ml = __ldcg(reinterpret_cast<const float2*>(part0 + s * R + HD));
      const float w = expf(ml.x - mx);
      w_sh[g * n_active + s] = w;
      sum += w * ml.y;
    }
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(kFullMask, sum, off);
    __syncwarp();  // w_sh of this head, written by the warp's lanes, read by all of them below
    const int c = (lane % kColLanes) * 4;
    float4 a = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 16
    for (int s = lane / kColLanes; s < n_active; s += kSplitLanes) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(part0 + s * R + c));
      const float w = w_sh[g * n_active + s];
      a.x += w * v.x;
      a.y += w * v.y;
      a.z += w * v.z;
      a.w += w * v.w;
    }
    if constexpr (kSplitLanes == 2) {
      a.x += __shfl_down_sync(kFullMask, a.x, kColLanes);
      a.y += __shfl_down_sync(kFullMask, a.y, kColLanes);
      a.z += __shfl_down_sync(kFullMask, a.z, kColLanes);
      a.w += __shfl_down_sync(kFullMask, a.w, kColLanes);
    }
    float amax = 0.0f;  // of this head's outputs, for the int8 row's scale
    if (lane < kColLanes) {
      const float inv = 1.0f / sum;
      const float o[4] = {a.x * inv, a.y * inv, a.z * inv, a.w * inv};
      const int col = (kv_head * G + g) * HD + c;
      if (to_int8) {
        *reinterpret_cast<float4*>(p.ws.row_f32 + col) = make_float4(o[0], o[1], o[2], o[3]);
#pragma unroll
        for (int e = 0; e < 4; ++e) amax = fmaxf(amax, fabsf(o[e]));
      } else {
#pragma unroll
        for (int e = 0; e < 4; ++e) store_float_act(p.out, 0, col + e, o[e]);
      }
    }
    for (int off = 16; off > 0; off >>= 1)
      amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, off));
    if (to_int8 && lane == 0) decode_attention::max_into_row_amax(p, amax);
  }
  // int8 output: the row's scale spans every head, so the last kv head to finish quantizes it.
  if (to_int8) decode_attention::quantize_row_when_last<kThreads>(p, p.s.n_kv_heads);
}

template <int HD, int MAXG>
void launch(const Params& p, Stream stream) {
  const dim3 grid(static_cast<unsigned>(p.splits), static_cast<unsigned>(p.s.n_kv_heads));
  // Launched to overlap the qkv linear (sm_90+): the CTAs load their chunk of the cache while
  // the linear streams its weights, and wait for it only before reading q, k and v. A first
  // try (commit 44934cc: an L2 prefetch before the wait, and the dependents let go at the
  // kernel's start) made the W4A8 step 8% slower; letting them go only after the wait keeps
  // the o linear and the kernels after it from starting during the qkv linear.
  const bool overlap = nibble::cuda::overlapping_launch_allowed_here();
  nibble::cuda::launch_overlapping(attention_decode_splitkv_kernel<HD, MAXG>, grid,
                                   dim3(kThreads), 0, stream, overlap, 1u, p);
}

template <int HD>
void launch_group(const Params& p, Stream stream) {
  if (p.group <= 1) return launch<HD, 1>(p, stream);
  if (p.group <= 2) return launch<HD, 2>(p, stream);
  if (p.group <= 4) return launch<HD, 4>(p, stream);
  return launch<HD, 8>(p, stream);
}

}  // namespace

int64_t decode_attention_partial_floats(const AttentionShape& s) {
  // Records of hd + 4 floats (DecodeConfig::kRecord): acc, m, l, padding.
  return int64_t{s.n_heads} * decode_attention_splits(s.max_ctx) * (s.head_dim + 4);
}

void launch_attention_decode(const float* qkv, const int32_t* pos, const AttentionShape& s,
                             const float* cos, const float* sin, uint16_t* k_cache,
                             uint16_t* v_cache, const DecodeAttentionWorkspace& ws,
                             const ActOutput& out, Stream stream) {
  if (s.n_kv_heads <= 0 || s.n_heads % s.n_kv_heads != 0 || s.n_heads / s.n_kv_heads > kMaxGroup)
    nibble::detail::fail(ErrorCode::unsupported,
                         "nibble::llm: the CUDA decode attention supports up to " +
                             std::to_string(kMaxGroup) + " query heads per kv head, got " +
                             std::to_string(s.n_heads) + "/" + std::to_string(s.n_kv_heads));
  if (s.max_ctx < 1 || s.max_ctx > kMaxCtx)
    nibble::detail::fail(ErrorCode::unsupported,
                         "nibble::llm: the CUDA decode attention supports contexts up to " +
                             std::to_string(kMaxCtx) + " tokens, got " +
                             std::to_string(s.max_ctx));
  if (out.ld < int64_t{s.n_heads} * s.head_dim || out.data == nullptr)
    nibble::detail::fail(ErrorCode::internal, "launch_attention_decode: bad output");
  Params p;
  p.qkv = qkv;
  p.pos = pos;
  p.s = s;
  p.cos = cos;
  p.sin = sin;
  p.k_cache = reinterpret_cast<__nv_bfloat16*>(k_cache);
  p.v_cache = reinterpret_cast<__nv_bfloat16*>(v_cache);
  p.ws = ws;
  p.out = out;
  p.splits = decode_attention_splits(s.max_ctx);
  p.group = s.n_heads / s.n_kv_heads;
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(s.model_head_dim())));
  if ((s.head_dim == 64 || s.head_dim == 128) && decode_attention::launch_cluster(p, stream))
    return;
  switch (s.head_dim) {
    case 64: return launch_group<64>(p, stream);
    case 128: return launch_group<128>(p, stream);
  }
  nibble::detail::fail(ErrorCode::unsupported,
                       "nibble::llm: the CUDA attention supports head_dim 64 and 128, got " +
                           std::to_string(s.head_dim));
}

}  // namespace nibble::llm::cuda
