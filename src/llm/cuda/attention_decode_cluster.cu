// attention_decode_cluster — one decode step of grouped-query attention on sm_90+: a
// thread-block cluster per kv head splits the KV length, and its CTAs combine their partial
// softmax states through distributed shared memory. It computes what attention_decode_splitkv
// computes (kernels.h: launch_attention_decode), with the same RoPE and KV-cache store of the
// new token fused in front:
//
//   p = *pos; per query head h (kv head h / G):
//     q' = rope(q_h, p), k' = rope(k, p); K[p] = bf16(k'), V[p] = bf16(v)
//     out[h] = Σ_{j ≤ p} softmax_j(q'·K[j]ᵀ / √hd) · V[j]
//
// Operands: as attention_decode_splitkv.cu — qkv (1, (Hq + 2·Hkv)·hd) f32, cos/sin
// (max_ctx, hd/2) f32, caches (Hkv, max_ctx, hd) bf16, out (1, ld) bf16, f32 or int8 per token;
// of the workspace only row_f32 and the int8 row's counters are used (int8 output).
//
// Work split
//   grid (Hkv, 1, C), cluster (1, 1, C): C = 16 CTAs per kv head (8 where the GPU cannot hold
//   Hkv clusters of 16 at once), 8 warps each (launch(): why 8). With len = p + 1
//   keys, CTA r owns keys [r·n, min((r + 1)·n, len)), n = ceil(len / C), decided at run time from
//   p, so every step runs on all C·Hkv CTAs whatever the context. (The split-KV kernel's fixed
//   64-key chunks put short contexts on a few SMs and give long ones dozens of partials per
//   head, combined through L2 behind a fence and an arrival counter.)
//   Keys stream through a ring of STAGES stages of 32 K and V rows in shared memory
//   (cp.async). Before griddepcontrol.wait a CTA issues every ring stage and asks L2 for the
//   rest of its share (cp.async.bulk.prefetch.L2), so its part of the cache is on its way while
//   the qkv linear still runs, and the refills after the wait are L2 hits.
//
//     ring stage ─► lane group (hd/8 lanes) per key: 16-byte K, V slices
//     ─► online softmax per lane group (decode_attention::OnlineSoftmax)
//     ─► warp combine (shuffle tree) ─► CTA combine (shared memory, warp order)
//     ─► each accumulator column and each head's (max, sum) stored into the shared memory of
//        the CTA that combines that column (distributed shared memory, st.shared::cluster)
//     ─► one cluster barrier ─► CTA r combines its slice of the G·hd columns, rank order ─► out
//     int8 output: every CTA max-es its outputs' |o| into the row's maximum and counts itself
//     in; the last of the C·Hkv CTAs quantizes the row (decode_attention::quantize_row_when_last).
//
//   The states are pushed, not pulled: remote stores need no round trip, and after the one
//   barrier no CTA reads another's shared memory, so none waits for the others to exit. Every
//   combine runs in a fixed order (lane tree, warp order, rank order): the result does not
//   depend on timing.
//
//   Overlap with the qkv linear (programmatic dependent launch) as in the split-KV kernel: p and
//   the cached rows below p are read before the wait (earlier steps wrote them); q, k and v
//   after it; the o linear is let go after the wait.
//
// Limitations
//   1. sm_90+ (clusters); hd ∈ {64, 128}; G ≤ 8.
//   2. One token per launch (batch 1 decode).
//   3. Beyond C·STAGES·32 keys the rest of a CTA's share reaches shared memory after the wait,
//      STAGES stages ahead of the math (from L2, where it was prefetched).
// Verify: build/<preset>/tests/cpp/nibble_tests --gtest_filter='LlmCudaKernels.AttentionDecode*'
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "common/check.h"
#include "common/cuda_runtime_check.h"
#include "cuda/common/ptx.cuh"
#include "cuda/launch/dynamic_smem.h"
#include "cuda/launch/pdl_launch.h"
#include "llm/cuda/activation_store.cuh"
#include "llm/cuda/attention_decode_common.cuh"
#include "llm/cuda/kernels.h"
#include "nibble/device.h"

namespace nibble::llm::cuda::decode_attention {

namespace {

namespace ptx = nibble::cuda::ptx;

// WARPS warps a CTA, STAGES ring stages (all issued before the wait).
template <int HD, int MAXG, int C, int WARPS, int STAGES>
struct ClusterConfig {
  static constexpr int kWarps = WARPS;
  static constexpr int kStages = STAGES;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kLanesPerKey = HD / 8;                // each lane holds 8 dims (16 bytes)
  static constexpr int kKeysPerWarp = 32 / kLanesPerKey;     // keys a warp covers per step
  static constexpr int kKeysPerStep = kWarps * kKeysPerWarp;  // keys the CTA covers per step
  static constexpr int kUnroll = kKeysPerStep >= 32 ? 1 : 32 / kKeysPerStep;
  static constexpr int kStageRows = kKeysPerStep * kUnroll;   // a stage is one step of each warp
  static constexpr int kSlotElems = kStageRows * HD;  // K (then V) of one ring slot, bf16
  // The ring; after the key loop the same bytes hold the warps' states for the CTA combine.
  static constexpr int kRingBytes = kStages * 2 * kSlotElems * 2;
  static constexpr int kStateBytes = kWarps * MAXG * HD * 4;
  static constexpr int kSmemBytes = kRingBytes > kStateBytes ? kRingBytes : kStateBytes;
  // Output columns (of the G·hd) each CTA of the cluster combines.
  static constexpr int kPer = (MAXG * HD + C - 1) / C;
  static_assert(kPer <= kThreads, "one output column a thread");
};

// kFloatOut: bf16 / f32 outputs only (no int8 tail compiled in; see launch()).
template <int HD, int MAXG, int C, int WARPS, int STAGES, bool kFloatOut = false>
__global__ void __launch_bounds__(WARPS * 32, 1) attention_decode_cluster_kernel(Params p) {
  using Cfg = ClusterConfig<HD, MAXG, C, WARPS, STAGES>;
  constexpr int kWarps = Cfg::kWarps, kThreads = Cfg::kThreads, kRows = Cfg::kStageRows;
  constexpr int kStages = Cfg::kStages;
  constexpr int T = Cfg::kLanesPerKey, KPW = Cfg::kKeysPerWarp, U = Cfg::kUnroll;
  extern __shared__ __align__(16) unsigned char ring_sh[];
  __shared__ float q_sh[MAXG][HD];
  __shared__ __align__(16) __nv_bfloat16 k_new_sh[HD];  // the new token's row (position p)
  __shared__ __align__(16) __nv_bfloat16 v_new_sh[HD];
  __shared__ float warp_ml_sh[kWarps][MAXG][2];  // per warp state: (max, sum)
  __shared__ float warp_weight_sh[kWarps][MAXG];  // exp(m_warp − m_cta)
  // Written by every CTA of the cluster (distributed shared memory): rank s's state of this
  // CTA's output columns, and of every head's (max, sum).
  __shared__ float recv_acc_sh[C][Cfg::kPer];
  __shared__ float recv_ml_sh[C][MAXG][2];
  __shared__ float max_scratch[kWarps];
  auto& warp_acc_sh = *reinterpret_cast<float(*)[kWarps][MAXG][HD]>(ring_sh);

  const int kv_head = static_cast<int>(blockIdx.x), G = p.group;
  const int rank = static_cast<int>(ptx::cluster_ctarank());
  // p and the cached rows below it were written before this graph replay began (by the host or
  // the previous step's argmax, and by earlier steps): read before the wait for the qkv linear.
  const int pos = *p.pos, len = pos + 1;
  const int share = (len + C - 1) / C;
  const int j0 = min(rank * share, len), j1 = min(j0 + share, len);
  const int n_stages = (j1 - j0 + kRows - 1) / kRows;
  const __nv_bfloat16* kc = p.k_cache + static_cast<int64_t>(kv_head) * p.s.max_ctx * HD;
  const __nv_bfloat16* vc = p.v_cache + static_cast<int64_t>(kv_head) * p.s.max_ctx * HD;
  const auto slot_k = [&](int stage) {
    return reinterpret_cast<__nv_bfloat16*>(ring_sh) + (stage % kStages) * 2 * Cfg::kSlotElems;
  };
  // Stage `stage`'s rows below p into its slot (row p is this launch's: k_new_sh, v_new_sh);
  // one commit group per stage, empty past the last, so that "group s is complete" is always
  // cp.async.wait_group(kStages − 1) at the top of iteration s.
  const auto load_stage = [&](int stage) {
    if (stage < n_stages) {
      const int r0 = j0 + stage * kRows;
      const int pieces = (min(min(r0 + kRows, j1), pos) - r0) * (HD / 8);
      __nv_bfloat16* ks = slot_k(stage);
      __nv_bfloat16* vs = ks + Cfg::kSlotElems;
      for (int i = threadIdx.x; i < pieces; i += kThreads) {
        ptx::cp_async_16(ks + i * 8, kc + int64_t{r0} * HD + i * 8, true);
        ptx::cp_async_16(vs + i * 8, vc + int64_t{r0} * HD + i * 8, true);
      }
    }
    ptx::cp_async_commit();
  };
#pragma unroll 1
  for (int stage = 0; stage < kStages; ++stage) load_stage(stage);
  // The share's rows past the ring (below p) are asked of L2 now, one bulk prefetch each for K
  // and V, so that the refills after the wait are L2 hits.
  if (threadIdx.x == 0) {
    const int r0 = j0 + kStages * kRows, r1 = min(j1, pos);
    if (r1 > r0) {
      const auto bytes = static_cast<uint32_t>((r1 - r0) * HD * 2);
      ptx::prefetch_l2(kc + int64_t{r0} * HD, bytes);
      ptx::prefetch_l2(vc + int64_t{r0} * HD, bytes);
    }
  }

  const RopeCoefficients rc = load_rope_coefficients<HD>(p, pos);

  ptx::griddep_wait();
  // The o linear, launched to overlap this kernel, may now start loading its weights (it waits
  // for this kernel before reading its output); not earlier (attention_decode_splitkv.cu).
  ptx::griddep_launch_dependents();
  load_step_inputs<HD, MAXG, kThreads>(p, kv_head, pos, j0 <= pos && pos < j1, rc, q_sh,
                                       k_new_sh, v_new_sh);
  __syncthreads();  // q_sh and the new row ready for the whole CTA

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int key_group = lane / T, d0 = (lane % T) * 8;
  float q[MAXG][8];
  load_query_slice<HD, MAXG>(q_sh, G, d0, q);
  OnlineSoftmax<HD, MAXG, true> st;
  st.init();

#pragma unroll 1
  for (int stage = 0; stage < n_stages; ++stage) {
    ptx::cp_async_wait<kStages - 1>();
    __syncthreads();  // every thread's copies of this stage have landed
    const __nv_bfloat16* ks = slot_k(stage);
    const __nv_bfloat16* vs = ks + Cfg::kSlotElems;
    const int r0 = j0 + stage * kRows, r1 = min(r0 + kRows, j1);
    uint4 kr[U], vr[U];
    bool valid[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = r0 + u * Cfg::kKeysPerStep + warp * KPW + key_group;
      valid[u] = j < r1;
      if (valid[u]) {
        const __nv_bfloat16* krow = j == pos ? k_new_sh : ks + (j - r0) * HD;
        const __nv_bfloat16* vrow = j == pos ? v_new_sh : vs + (j - r0) * HD;
        kr[u] = *reinterpret_cast<const uint4*>(krow + d0);
        vr[u] = *reinterpret_cast<const uint4*>(vrow + d0);
      } else {
        kr[u] = vr[u] = make_uint4(0, 0, 0, 0);
      }
    }
    st.add_keys<U>(q, kr, vr, valid, G, p.scale);
    __syncthreads();  // the slot is read: refill it
    load_stage(stage + kStages);
  }

  // Warp combine: the KPW lane groups of a warp hold states over different keys for the same
  // dims; a fixed shuffle tree merges them into lane group 0.
#pragma unroll
  for (int off = T; off < 32; off <<= 1) {
#pragma unroll
    for (int g = 0; g < MAXG; ++g) {
      if (g >= G) continue;
      const float m2 = __shfl_xor_sync(kFullMask, st.m[g], off);
      const float l2 = __shfl_xor_sync(kFullMask, st.l[g], off);
      float a2[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) a2[e] = __shfl_xor_sync(kFullMask, st.acc[g][e], off);
      const float mx = fmaxf(st.m[g], m2);
      if (mx == -INFINITY) continue;  // neither has seen a key
      const float w1 = softmax_exp<true>(st.m[g] - mx);  // 0 for an empty state
      const float w2 = softmax_exp<true>(m2 - mx);
      st.l[g] = w1 * st.l[g] + w2 * l2;
#pragma unroll
      for (int e = 0; e < 8; ++e) st.acc[g][e] = w1 * st.acc[g][e] + w2 * a2[e];
      st.m[g] = mx;
    }
  }
  // (The ring is free: the key loop ended with a barrier, and no copy is in flight.)
  if (key_group == 0) st.store(warp_acc_sh[warp], warp_ml_sh[warp], G, d0);
  __syncthreads();
  // CTA combine, in warp order: one thread per head finds the CTA's (max, sum) and the warps'
  // weights, and sends (max, sum) to every CTA of the cluster. A CTA without keys (len < C)
  // sends m = −inf, l = 0, and zero accumulators.
  const int width = G * HD;
  if (static_cast<int>(threadIdx.x) < G) {
    const int g = static_cast<int>(threadIdx.x);
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, warp_ml_sh[w][g][0]);
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float wt = mx == -INFINITY ? 0.0f : softmax_exp<true>(warp_ml_sh[w][g][0] - mx);
      warp_weight_sh[w][g] = wt;
      sum += wt * warp_ml_sh[w][g][1];
    }
    const uint32_t ml_at = ptx::smem_addr(&recv_ml_sh[rank][g][0]);
#pragma unroll 1
    for (int r = 0; r < C; ++r) {
      const uint32_t to = ptx::map_shared_cluster(ml_at, static_cast<uint32_t>(r));
      ptx::st_shared_cluster_u32(to, __float_as_uint(mx));
      ptx::st_shared_cluster_u32(to + 4, __float_as_uint(sum));
    }
  }
  __syncthreads();
  // Each accumulator column goes to the CTA that combines it: column c to rank c / kPer.
  for (int c = threadIdx.x; c < width; c += kThreads) {
    const int g = c / HD, d = c % HD;
    float a = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) a += warp_weight_sh[w][g] * warp_acc_sh[w][g][d];
    const uint32_t at = ptx::smem_addr(&recv_acc_sh[rank][c % Cfg::kPer]);
    ptx::st_shared_cluster_u32(ptx::map_shared_cluster(at, static_cast<uint32_t>(c / Cfg::kPer)),
                               __float_as_uint(a));
  }
  // Every CTA's states have arrived (release/acquire); after this no CTA touches another's
  // shared memory, so none has to wait for the others before it exits.
  ptx::cluster_sync();

  // Cluster combine of this CTA's columns, in rank order. Rank 0 always holds key 0, so the
  // maximum is finite; ranks without keys weigh 0.
  const int t = static_cast<int>(threadIdx.x), col = rank * Cfg::kPer + t;
  const bool mine = t < Cfg::kPer && col < width;
  float o = 0.0f;
  if (mine) {
    const int g = col / HD;
    float mx = -INFINITY;
#pragma unroll
    for (int r = 0; r < C; ++r) mx = fmaxf(mx, recv_ml_sh[r][g][0]);
    float sum = 0.0f, a = 0.0f;
#pragma unroll
    for (int r = 0; r < C; ++r) {
      const float wt = softmax_exp<true>(recv_ml_sh[r][g][0] - mx);
      sum += wt * recv_ml_sh[r][g][1];
      a += wt * recv_acc_sh[r][t];
    }
    o = a * (1.0f / sum);
  }

  const int out_col = kv_head * G * HD + col;  // heads of kv head h are h·G .. h·G + G − 1
  if (kFloatOut || p.out.kind != ActKind::s8_per_token) {
    if (mine) store_float_act(p.out, 0, out_col, o);
    return;
  }
  if constexpr (!kFloatOut) {
    if (mine) p.ws.row_f32[out_col] = o;
    // max |o| from 0 (fmaxf drops NaN), as quantize_activation's amax
    const float amax = block_max<kThreads>(mine ? fmaxf(0.0f, fabsf(o)) : 0.0f, max_scratch);
    if (threadIdx.x == 0) max_into_row_amax(p, amax);
    quantize_row_when_last<kThreads>(p, p.s.n_kv_heads * C);
  }
}

// 8 warps and 2 ring stages (32 KB at hd = 128), the rest of a CTA's share prefetched to L2.
// Measured in the Llama-3-8B W4A8 decode step (bench-model, H100, 2026-11-24, tokens/s at a
// 2048-token context / at 16 tokens, two rounds): 8 warps, 2 stages 354.2 / 388.1 and 350.7 /
// 386.5; 8 warps, 5 stages 348.0 / 387.8 and 345.7 / 385.9; 16 warps, 5 stages 345.9 / 388.0 and
// 342.1 / 385.9; 4 warps, 2 stages 350.5 / 383.2; the split-KV kernel 352.1 / 369.2 and
// 350.6 / 369.2. Alone (runner_ops_bench) 16 warps were faster per stage, but a lighter CTA
// shares SMs with the qkv linear, so more of the kernel runs before the wait.
constexpr int kDefaultWarps = 8;
constexpr int kDefaultStages = 2;

template <int HD, int MAXG, int C, bool kFloatOut>
void launch_kernel(const Params& p, bool overlap, Stream stream) {
  using Cfg = ClusterConfig<HD, MAXG, C, kDefaultWarps, kDefaultStages>;
  constexpr auto kernel =
      attention_decode_cluster_kernel<HD, MAXG, C, kDefaultWarps, kDefaultStages, kFloatOut>;
  nibble::cuda::allow_dynamic_smem<kernel>(Cfg::kSmemBytes);
  if constexpr (C > 8) nibble::cuda::allow_nonportable_clusters<kernel>();
  nibble::cuda::launch_overlapping(kernel, dim3(static_cast<unsigned>(p.s.n_kv_heads), 1, C),
                                   dim3(Cfg::kThreads), Cfg::kSmemBytes, stream, overlap, C, p);
}

// Float outputs (bf16, or f32 for a linear that quantizes its own input) run an instance without
// the int8 tail: 2344 instead of 3184 SASS instructions at hd 128, G 4 (sm_90a). In the
// Llama-3-8B W4A8 decode step it measured 392.7, 393.1 and 388.6 tokens/s against 384.3, 385.6
// and 388.1 with the tail compiled in (same build, alternating; H100, 2026-11-24): the code a
// step's kernels carry costs time even where it does not run (docs/runner.md).
template <int HD, int MAXG, int C>
void launch(const Params& p, bool overlap, Stream stream) {
  if (p.out.kind != ActKind::s8_per_token)
    return launch_kernel<HD, MAXG, C, true>(p, overlap, stream);
  launch_kernel<HD, MAXG, C, false>(p, overlap, stream);
}

// How many clusters of 16 the GPU holds at once (0 when it cannot launch them): 16 CTAs per kv
// head only when all Hkv clusters fit in one wave, else 8 (the portable size).
template <int HD, int MAXG>
int clusters_of_16_at_once() {
  static const int count = [] {
    using Cfg = ClusterConfig<HD, MAXG, 16, kDefaultWarps, kDefaultStages>;
    constexpr auto kernel =
        attention_decode_cluster_kernel<HD, MAXG, 16, kDefaultWarps, kDefaultStages>;
    nibble::cuda::allow_dynamic_smem<kernel>(Cfg::kSmemBytes);
    nibble::cuda::allow_nonportable_clusters<kernel>();
    return nibble::cuda::max_active_clusters(kernel, dim3(Cfg::kThreads), Cfg::kSmemBytes, 16);
  }();
  return count;
}

template <int HD, int MAXG>
void launch_sized(const Params& p, bool overlap, Stream stream) {
  if (clusters_of_16_at_once<HD, MAXG>() >= p.s.n_kv_heads)
    return launch<HD, MAXG, 16>(p, overlap, stream);
  launch<HD, MAXG, 8>(p, overlap, stream);
}

template <int HD>
void launch_group(const Params& p, bool overlap, Stream stream) {
  if (p.group <= 1) return launch_sized<HD, 1>(p, overlap, stream);
  if (p.group <= 2) return launch_sized<HD, 2>(p, overlap, stream);
  if (p.group <= 4) return launch_sized<HD, 4>(p, overlap, stream);
  launch_sized<HD, 8>(p, overlap, stream);
}

}  // namespace

bool launch_cluster(const Params& p, Stream stream) {
  const char* forced = std::getenv("NIBBLE_DECODE_ATTENTION_KERNEL");
  const bool want_splitkv = forced != nullptr && std::strcmp(forced, "splitkv") == 0;
  const bool want_cluster = forced != nullptr && std::strcmp(forced, "cluster") == 0;
  if (forced != nullptr && forced[0] != '\0' && !want_splitkv && !want_cluster)
    nibble::detail::fail(ErrorCode::invalid_argument,
                         std::string("NIBBLE_DECODE_ATTENTION_KERNEL: expected splitkv or cluster, "
                                     "got '") + forced + "'");
  if (want_splitkv) return false;
  int device = 0;
  NIBBLE_CUDA_CHECK(cudaGetDevice(&device));
  const int cc_major = nibble::cuda_device_info(device).cc_major;
  if (cc_major < 9) {
    if (want_cluster)
      nibble::detail::fail(ErrorCode::unsupported,
                           "NIBBLE_DECODE_ATTENTION_KERNEL=cluster needs sm_90 or newer");
    return false;
  }
  // Launched to overlap the qkv linear (programmatic dependent launch; see the header).
  const bool overlap = nibble::cuda::overlapping_launch_allowed(cc_major);
  if (p.s.head_dim == 64)
    launch_group<64>(p, overlap, stream);
  else
    launch_group<128>(p, overlap, stream);
  return true;
}

}  // namespace nibble::llm::cuda::decode_attention
