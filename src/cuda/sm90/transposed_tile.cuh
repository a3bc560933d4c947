// The epilogue shared by the swap-AB wgmma kernels (sm90_w4a8_gemm, sm90_weight_only_gemm).
//
// Those kernels compute the transposed tile Dᵀ (weight channels × tokens) with two consumer
// warpgroups of 64 channels each; a thread's accumulator i holds channel ch_local (+8 when
// i & 2) and token 8·(i/4) + 2c + (i & 1) (c = lane % 4), for int32 or f32 accumulators alike.
// The output D is row-major (tokens × channels), so the tile goes through shared memory:
//
//   write_transposed_tile   raw 4-byte accumulators → token rows of `kOutPitch` words (BN + 4:
//                           the fragment writes then hit 32 distinct banks);
//   store_transposed_tile   each consumer warp takes whole token rows, lane l channels
//                           4l..4l+3 (one 16-byte shared load), and calls
//                           store_row(row, raw[4]); with split-K (gridDim.z > 1) the splits'
//                           partial tiles are summed in split order (int32 wrap-around or f32),
//                           so results do not depend on CTA timing: when the splits are one
//                           cluster, each CTA sums its share of the token rows from every CTA's
//                           shared memory (distributed shared memory, between two cluster
//                           barriers); otherwise each CTA parks its raw tile in a workspace slot
//                           and the tile's last CTA sums the slots, then resets the counter.
//
// Both run on the 256 consumer threads only (named barrier 1) after the main loop; the ring is
// reused for the tile, which is safe once every consumer has passed its last `full` wait.
// Persistent CTAs, whose producer is already filling the ring with the next tile, use
// store_tile_by_slabs instead: the unsplit tile leaves a slab of token rows at a time through a
// buffer the caller names (after the ring, or the tile's own last stage) — or, for 16-bit
// outputs that TMA can address, store_tile_by_tma: the output values go transposed into a
// buffer by stmatrix and leave by TMA stores that run on while the next tile's main loop starts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/common/element.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/launch/sm90_tiling.h"
#include "nibble/types.h"

namespace nibble::cuda::sm90 {

template <int kAcc, int kOutPitch>
__device__ __forceinline__ void write_transposed_tile(uint8_t* smem, const uint32_t (&raw)[kAcc],
                                                      int ch_local, int c) {
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
  uint32_t* out_sh = reinterpret_cast<uint32_t*>(smem);
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    const int tok = 8 * (i / 4) + 2 * c + (i & 1);
    const int ch = ch_local + ((i & 2) ? 8 : 0);
    out_sh[tok * kOutPitch + ch] = raw[i];
  }
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
}

/// The persistent kernels' epilogue (sm90_w4a8_gemm with Cfg::kPersistent): the ring keeps
/// filling with the next tile's stages, so the unsplit tile leaves through `slab`, a buffer of
/// kSlab token rows (pitch kOutPitch words) after the ring, kSlab tokens at a time: the 256
/// consumer threads write the slab's accumulators (raw_of(i), the ones whose token falls in it)
/// between two barriers, then each warp stores whole token rows as store_transposed_tile does.
/// at_start() runs after the first barrier, when every consumer has stored the previous tile.
template <int BM, int kAcc, int kOutPitch, int kSlab, class RawOf, class AtStart, class StoreRow>
__device__ __forceinline__ void store_tile_by_slabs(uint8_t* slab, int tid, int ch_local, int c,
                                                    int m0, int m, bool col_ok, RawOf&& raw_of,
                                                    AtStart&& at_start, StoreRow&& store_row) {
  static_assert(BM % kSlab == 0 && kSlab % 8 == 0, "slabs of whole 8-token accumulator rows");
  constexpr int kAccPerSlab = kAcc * kSlab / BM;  // accumulators i with 8·(i/4) in the slab
  uint32_t* out_sh = reinterpret_cast<uint32_t*>(slab);
  const int lane = tid % 32, cwarp = (tid - 128) / 32;  // 0..7
#pragma unroll
  for (int sl = 0; sl < BM / kSlab; ++sl) {
    if (m0 + sl * kSlab >= m) break;  // the same for every consumer thread
    asm volatile("bar.sync 1, 256;\n" ::: "memory");  // the slab's last rows are stored
    if (sl == 0) at_start();
#pragma unroll
    for (int j = 0; j < kAccPerSlab; ++j) {
      const int i = sl * kAccPerSlab + j;
      const int tok = 8 * (j / 4) + 2 * c + (i & 1);
      const int ch = ch_local + ((i & 2) ? 8 : 0);
      out_sh[tok * kOutPitch + ch] = raw_of(i);
    }
    asm volatile("bar.sync 1, 256;\n" ::: "memory");
    for (int r = cwarp; r < kSlab && m0 + sl * kSlab + r < m; r += 8) {
      if (!col_ok) continue;
      const uint4 t = *reinterpret_cast<const uint4*>(out_sh + r * kOutPitch + 4 * lane);
      store_row(m0 + sl * kSlab + r, {t.x, t.y, t.z, t.w});
    }
  }
}

/// The thread of a consumer warpgroup that issues its TMA stores (store_tile_by_tma) and so
/// must wait for them (lane 0 of the warpgroup's warp 0).
__device__ __forceinline__ bool tma_store_issuer(int warp, int lane) { return warp == 0 && lane == 0; }

/// The persistent kernels' epilogue for 16-bit outputs (T = __nv_bfloat16 or __half) through a
/// TMA tensor map of the output (tmap_d: dims (N, M), boxes of 64 channels × BM / kRounds tokens,
/// the 128-byte swizzle). Each consumer warpgroup (cw) owns its 64 channels of the tile: it
/// turns its accumulators into output values in registers (values_of(tb, v): the four values of
/// token block tb, in accumulator order), stores them with stmatrix .trans into its half of
/// `buf` as token rows of 128 bytes, swizzled as TMA expects (the eight rows of an 8×8 matrix
/// then fall in eight distinct 16-byte bank groups), and one thread of the warpgroup issues the
/// TMA store of the range. Nothing waits for the stores to reach global memory: the consumers
/// go on to the next tile's main loop, and only before they write the buffer again does the
/// issuing thread wait for the stores to have read it. kRounds > 1 when a whole tile's buffer
/// would take too many stages from the ring: the tile then goes out in kRounds token ranges,
/// each waiting for the previous one to be read. Rows ≥ M and channels ≥ N are not written
/// (TMA clips them).
///   at_start() runs between two barriers of the 256 consumer threads, when every consumer has
///   finished the previous tile's epilogue (for the per-token scales values_of reads).
///   The issuing thread (tma_store_issuer) must bulk_wait_group<0>() before the CTA exits.
template <class T, int BM, int kRounds, class AtStart, class ValuesOf>
__device__ __forceinline__ void store_tile_by_tma(uint8_t* buf, const void* tmap_d, int cw,
                                                  int warp, int lane, int m0, int n0, int m,
                                                  AtStart&& at_start, ValuesOf&& values_of) {
  constexpr int kRoundTokens = BM / kRounds;
  constexpr int kPairsPerRound = kRoundTokens / 16;  // pairs of 8-token blocks: one stmatrix.x4
  static_assert(BM % kRounds == 0 && kRoundTokens % 16 == 0, "rounds of whole block pairs");
  const bool issuer = tma_store_issuer(warp, lane);
  // Named barriers 2 and 3: one warpgroup's 128 threads (immediate ids, so that ptxas counts
  // the barriers the kernel uses).
  auto sync_warpgroup = [cw] {
    if (cw == 0) asm volatile("bar.sync 2, 128;\n" ::: "memory");
    else asm volatile("bar.sync 3, 128;\n" ::: "memory");
  };
  uint8_t* half = buf + cw * kRoundTokens * 128;
  // stmatrix .x4: lane 8k + j addresses row j of matrix k; matrix k is token block (k >> 1) of
  // the pair and channel block 2·warp + (k & 1) of the warpgroup's eight. Token row t of the
  // range holds its 64 channels in 16-byte chunks, chunk q at position q ^ (t % 8).
  const int mk = lane >> 3, j = lane & 7;
  const uint32_t lane_at = ptx::smem_addr(half) +
                           uint32_t((8 * (mk >> 1) + j) * 128 + (((2 * warp + (mk & 1)) ^ j) << 4));
  if (issuer) ptx::bulk_wait_group_read<0>();  // the previous tile's stores have read the buffer
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
  at_start();
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
#pragma unroll
  for (int rd = 0; rd < kRounds; ++rd) {
    if (m0 + rd * kRoundTokens >= m) break;  // the same for every consumer thread
    if (rd > 0) {
      if (issuer) ptx::bulk_wait_group_read<0>();
      sync_warpgroup();
    }
#pragma unroll
    for (int q = 0; q < kPairsPerRound; ++q) {
      const int tb = rd * 2 * kPairsPerRound + 2 * q;
      float v0[4], v1[4];
      values_of(tb, v0);
      values_of(tb + 1, v1);
      ptx::stmatrix_x4_trans(lane_at + uint32_t(q * 16 * 128), pack2_rn<T>(v0[0], v0[1]),
                             pack2_rn<T>(v0[2], v0[3]), pack2_rn<T>(v1[0], v1[1]),
                             pack2_rn<T>(v1[2], v1[3]));
    }
    ptx::fence_proxy_async_shared();  // the stmatrix writes, before the TMA store reads them
    sync_warpgroup();
    if (issuer) {
      ptx::tma_store_2d(tmap_d, half, n0 + 64 * cw, m0 + rd * kRoundTokens);
      ptx::bulk_commit_group();
    }
  }
}

/// Stores four adjacent outputs i0..i0+3 (only the first `count` when fewer remain): one
/// 8- or 16-byte vector when `vec_ok`.
__device__ __forceinline__ void store_float4(void* d, DType dtype, int64_t i0, const float (&v)[4],
                                             bool vec_ok, int count) {
  if (vec_ok && dtype == DType::bf16) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v[0], v[1]);
    const __nv_bfloat162 hi = __floats2bfloat162_rn(v[2], v[3]);
    *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(d) + i0) =
        make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  } else if (vec_ok && dtype == DType::f16) {
    const __half2 lo = __floats2half2_rn(v[0], v[1]);
    const __half2 hi = __floats2half2_rn(v[2], v[3]);
    *reinterpret_cast<uint2*>(static_cast<__half*>(d) + i0) =
        make_uint2(*reinterpret_cast<const uint32_t*>(&lo), *reinterpret_cast<const uint32_t*>(&hi));
  } else if (vec_ok) {
    *reinterpret_cast<float4*>(static_cast<float*>(d) + i0) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    for (int e = 0; e < 4 && e < count; ++e) store_float(d, dtype, i0 + e, v[e]);
  }
}

/// Four columns' raw partials of the first `splits` splits summed in split order, into `sum`:
/// f32 when kFloatSum, else int32 with wrap-around (exact, like the accumulators).
template <bool kFloatSum, int kMax>
__device__ __forceinline__ void sum_in_split_order(const uint4 (&part)[kMax], int splits,
                                                   uint32_t (&sum)[4]) {
  sum[0] = sum[1] = sum[2] = sum[3] = 0u;
#pragma unroll
  for (int sp = 0; sp < kMax; ++sp) {
    if (sp >= splits) break;
    const uint32_t v[4] = {part[sp].x, part[sp].y, part[sp].z, part[sp].w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if constexpr (kFloatSum)
        sum[e] = __float_as_uint(__uint_as_float(sum[e]) + __uint_as_float(v[e]));
      else
        sum[e] += v[e];
    }
  }
}

/// The producer warpgroup's side of store_transposed_tile's cluster barriers: with cluster
/// split-K every thread of the cluster passes both, so the producers take them before they leave.
__device__ __forceinline__ void producer_passes_tile_barriers(bool cluster_split) {
  if (cluster_split) {
    ptx::cluster_sync();  // store_transposed_tile: every CTA's raw tile is in shared memory
    ptx::cluster_sync();  // store_transposed_tile: every CTA has read the tiles it sums
  }
}

template <int BM, int kOutPitch, bool kFloatSum, class StoreRow>
__device__ __forceinline__ void store_transposed_tile(uint8_t* smem, int tid, int m0, int n0,
                                                      int tile_id, int m, int n, void* workspace,
                                                      int* counters, bool cluster_split,
                                                      StoreRow&& store_row) {
  const uint32_t* out_sh = reinterpret_cast<const uint32_t*>(smem);
  const int lane = tid % 32;
  const int cwarp = (tid - 128) / 32;  // 0..7
  const int col = n0 + 4 * lane;
  const bool col_ok = col < n;
  if (gridDim.z == 1) {
    for (int r = cwarp; r < BM && m0 + r < m; r += 8) {
      if (!col_ok) continue;
      const uint4 t = *reinterpret_cast<const uint4*>(out_sh + r * kOutPitch + 4 * lane);
      store_row(m0 + r, {t.x, t.y, t.z, t.w});
    }
    return;
  }

  if (cluster_split) {
    // ---- cluster split-K: CTA s of the cluster holds split s's raw tile at the same offset.
    // CTA q sums token rows 8q .. 8q + 7 (and every 8·splits-th after them), one row per warp,
    // reading each split's 16 bytes of the row with every split's load in flight at once.
    ptx::cluster_sync();  // every CTA's raw tile is in its shared memory
    const int splits = gridDim.z, rank = static_cast<int>(ptx::cluster_ctarank());
    const uint32_t local = ptx::smem_addr(out_sh);
    for (int r = cwarp + 8 * rank; r < BM && m0 + r < m; r += 8 * splits) {
      if (!col_ok) continue;
      const uint32_t at = local + 4u * static_cast<uint32_t>(r * kOutPitch + 4 * lane);
      uint4 part[kMaxSm90ClusterSplits];
#pragma unroll
      for (int sp = 0; sp < kMaxSm90ClusterSplits; ++sp)
        if (sp < splits)
          part[sp] = ptx::ld_shared_cluster_v4(ptx::map_shared_cluster(at, uint32_t(sp)));
      uint32_t sum[4];
      sum_in_split_order<kFloatSum>(part, splits, sum);
      store_row(m0 + r, sum);
    }
    ptx::cluster_sync();  // no CTA leaves (freeing its tile) while another still reads it
    return;
  }

  // ---- split-K: park the raw partial tile; the last CTA of the tile sums the slots in split
  // order (deterministic run to run) and finishes the tile, then resets the tile's counter.
  __shared__ int is_last;
  const int splits = gridDim.z;
  uint32_t* slots = static_cast<uint32_t*>(workspace);
  uint32_t* slot = slots + int64_t(blockIdx.z) * m * n;
  // 16-byte partial accesses when every row of the workspace starts 16-byte aligned.
  const bool part_vec = n % 4 == 0 && col_ok;
  for (int r = cwarp; r < BM && m0 + r < m; r += 8) {
    const int64_t base = int64_t(m0 + r) * n + col;
    const uint4 t = *reinterpret_cast<const uint4*>(out_sh + r * kOutPitch + 4 * lane);
    if (part_vec) {
      *reinterpret_cast<uint4*>(slot + base) = t;
    } else {
      const uint32_t v[4] = {t.x, t.y, t.z, t.w};
      for (int e = 0; e < 4 && col + e < n; ++e) slot[base + e] = v[e];
    }
  }
  __threadfence();  // partials visible device-wide before the counter says so
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
  if (tid == 128) is_last = atomicAdd(&counters[tile_id], 1) == splits - 1;
  asm volatile("bar.sync 1, 256;\n" ::: "memory");
  if (!is_last) return;
  __threadfence();
  // Every split's loads are issued before any is summed, so a row costs one round trip to L2
  // rather than one per split.
  constexpr int kMaxSplits = 16;  // the sm90 planners never make more
  for (int r = cwarp; r < BM && m0 + r < m; r += 8) {
    if (!col_ok) continue;
    const int64_t base = int64_t(m0 + r) * n + col;
    uint4 part[kMaxSplits];
#pragma unroll
    for (int sp = 0; sp < kMaxSplits; ++sp) {
      if (sp >= splits) break;
      const uint32_t* src = slots + int64_t(sp) * m * n + base;
      if (part_vec) {
        part[sp] = __ldcg(reinterpret_cast<const uint4*>(src));
      } else {
        part[sp].x = __ldcg(src);
        part[sp].y = col + 1 < n ? __ldcg(src + 1) : 0u;
        part[sp].z = col + 2 < n ? __ldcg(src + 2) : 0u;
        part[sp].w = col + 3 < n ? __ldcg(src + 3) : 0u;
      }
    }
    uint32_t sum[4];
    sum_in_split_order<kFloatSum>(part, splits, sum);
    store_row(m0 + r, sum);
  }
  if (tid == 128) counters[tile_id] = 0;  // ready for the next launch
}

}  // namespace nibble::cuda::sm90
