// Deterministic split-K completion, shared by the split-K GEMM kernels (sm80_w4a8_gemm,
// sm80_weight_only_gemm).
//
// Each CTA of a split tile parks its partial tile (4-byte values, int32 or f32) in its own
// workspace slot s — slot s is the (M, N) row-major matrix at workspace + s·M·N — and arrives at
// the tile's counter. The last CTA to arrive sums the slots in split order (so the result does not
// depend on which CTA finished when), runs the epilogue, and resets the counter to zero for the
// next launch. Workspaces come from cuda/launch/split_k_workspace.h.
//
// On sm_90 a split tile of up to kMaxClusterSplitK splits can instead be one thread-block
// cluster (the splits along the grid's z, cluster dims (1, 1, splits)): each CTA parks its
// partial tile in its own shared memory, and after a cluster barrier every CTA finishes a
// slice of the tile, reading the partials of all splits over distributed shared memory in split
// order (the same sums as the workspace path, bit for bit). No workspace round trip through L2,
// no counter, and the finish is spread over the cluster instead of one CTA.
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/common/ptx.cuh"

namespace nibble::cuda {

/// The most splits split_k_sum handles (the launchers' plans never make more).
constexpr int kMaxSplitK = 16;
/// The most splits a cluster split tile has: 16, the largest cluster the H100 runs. Clusters of
/// more than kMaxPortableClusterSplitK CTAs need the kernel's non-portable cluster attribute
/// (cuda/launch/dynamic_smem.h: allow_nonportable_clusters) and a GPU that runs them (the
/// occupancy calculator says).
constexpr int kMaxClusterSplitK = 16;
/// The cluster size every sm_90+ GPU runs.
constexpr int kMaxPortableClusterSplitK = 8;

/// Call with every thread of the CTA after its partial tile is stored. True, in every thread, in
/// the CTA that arrived last; its loads then see every other CTA's partials.
__device__ __forceinline__ bool split_k_arrive_last(int* counter, int splits) {
  __shared__ int is_last;
  __threadfence();  // this CTA's partials visible device-wide before the counter says so
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(counter, 1) == splits - 1;
  __syncthreads();
  const bool last = is_last != 0;
  if (last) __threadfence();
  return last;
}

/// In the last CTA: finish(row, col, Σ_s slot_s[row, col]) for every element of the BM×BN tile at
/// (m0, n0) inside (M, N), summed in split order as `T` (int32_t or float); then resets the
/// counter. Coalesced and latency-tolerant: each thread takes 4 consecutive columns of one tile
/// row and issues the loads of every split before summing them, so a pass waits for one round
/// trip to L2 instead of one per split.
template <class T, int BM, int BN, int kThreads, class Finish>
__device__ __forceinline__ void split_k_sum(const void* workspace, int* counter, int splits, int M,
                                            int N, int m0, int n0, Finish&& finish) {
  constexpr int kVec = 4;
  const auto* all = static_cast<const uint32_t*>(workspace);
  for (int base = threadIdx.x * kVec; base < BM * BN; base += kThreads * kVec) {
    const int row = m0 + base / BN, col0 = n0 + base % BN;
    if (row >= M || col0 >= N) continue;
    uint32_t part[kMaxSplitK][kVec];
#pragma unroll
    for (int s = 0; s < kMaxSplitK; ++s)
#pragma unroll
      for (int v = 0; v < kVec; ++v)
        if (s < splits && col0 + v < N)
          part[s][v] = __ldcg(all + (int64_t(s) * M + row) * N + col0 + v);
#pragma unroll
    for (int v = 0; v < kVec; ++v) {
      const int col = col0 + v;
      if (col >= N) break;
      T sum = 0;
#pragma unroll
      for (int s = 0; s < kMaxSplitK; ++s) {
        if (s >= splits) break;
        if constexpr (std::is_floating_point_v<T>) sum += __uint_as_float(part[s][v]);
        else sum += int32_t(part[s][v]);
      }
      finish(row, col, sum);
    }
  }
  if (threadIdx.x == 0) *counter = 0;  // ready for the next launch
}

/// Parks a warp's mma.m16n8 accumulator fragments — MT × NT tiles of 4 values: rows
/// row0 + 16·mt + 8·(e/2), columns col0 + 8·nt + e%2, relative to the CTA tile — in the
/// row-major BM×BN tile `tile` (4-byte values; value(mt, nt, e) gives their bits), for
/// split_k_cluster_sum.
template <int MT, int NT, int BN, class Value>
__device__ __forceinline__ void park_mma_fragments(uint32_t* tile, int row0, int col0,
                                                   Value&& value) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        tile[(row0 + mt * 16 + (e >> 1) * 8) * BN + col0 + nt * 8 + (e & 1)] = value(mt, nt, e);
}

/// The elements [begin, end) of a cluster split tile's `total` that CTA `rank` finishes: equal
/// chunks rounded up to a multiple of `align` (the last ranks may get fewer or none).
struct TileSlice {
  int begin, end;
};
__device__ __forceinline__ TileSlice cluster_tile_slice(int total, int splits, int rank,
                                                        int align) {
  const int chunk = ((total + splits - 1) / splits + align - 1) / align * align;
  const int begin = min(total, rank * chunk);
  return {begin, min(total, begin + chunk)};
}

/// Σ_s tile_s[i] in split order as `T`, tile_s being the 4-byte values at shared address
/// `local_tile` in CTA s of the cluster (every split's load in flight at once). `splits` must
/// not exceed kMaxSplits: the loads are unrolled to it, and a cap of 16 where the cluster has at
/// most 8 costs 2-5% of a decode GEMM at M = 16 (sm80_weight_only_gemm, H100, 2026-11-28), so
/// kernels instantiate the 16 only for clusters of more than 8.
template <class T, int kMaxSplits = kMaxPortableClusterSplitK>
__device__ __forceinline__ T cluster_split_sum(uint32_t local_tile, int i, int splits) {
  static_assert(kMaxSplits <= kMaxClusterSplitK);
  uint32_t part[kMaxSplits];
#pragma unroll
  for (int s = 0; s < kMaxSplits; ++s)
    if (s < splits)
      part[s] = ptx::ld_shared_cluster_u32(local_tile + 4u * static_cast<uint32_t>(i),
                                           static_cast<uint32_t>(s));
  T sum = 0;
#pragma unroll
  for (int s = 0; s < kMaxSplits; ++s) {
    if (s >= splits) break;
    if constexpr (std::is_floating_point_v<T>) sum += __uint_as_float(part[s]);
    else sum += int32_t(part[s]);
  }
  return sum;
}

/// Cluster split-K (sm_90+; see the top of this file). `tile` is this CTA's partial BM×BN tile,
/// row-major 4-byte values (int32 or f32) in shared memory at the same offset in every CTA of
/// the cluster, fully written by this CTA's threads. Every thread of every CTA of the cluster
/// calls it; finish(row, col, Σ_s tile_s[row − m0, col − n0]) runs once per element of the tile
/// inside (M, N), summed in split order as `T`. Returns when no CTA reads `tile` any more.
/// `splits` ≤ kMaxSplits; with kMaxSplits past 8, clusters of at most 8 still take the 8-wide
/// sum (see cluster_split_sum).
template <class T, int BM, int BN, int kThreads, int kMaxSplits = kMaxPortableClusterSplitK,
          class Finish>
__device__ __forceinline__ void split_k_cluster_sum(const uint32_t* tile, int splits, int M, int N,
                                                    int m0, int n0, Finish&& finish) {
  if constexpr (kMaxSplits > kMaxPortableClusterSplitK) {
    if (splits <= kMaxPortableClusterSplitK)
      return split_k_cluster_sum<T, BM, BN, kThreads, kMaxPortableClusterSplitK>(
          tile, splits, M, N, m0, n0, static_cast<Finish&&>(finish));
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  ptx::cluster_sync();  // every CTA's partial tile is in its shared memory
  const int rows = M - m0 < BM ? M - m0 : BM;
  const TileSlice slice =
      cluster_tile_slice(rows * BN, splits, static_cast<int>(ptx::cluster_ctarank()), 1);
  const uint32_t local = ptx::smem_addr(tile);
  for (int i = slice.begin + static_cast<int>(threadIdx.x); i < slice.end; i += kThreads) {
    const int col = n0 + i % BN;
    if (col >= N) continue;
    finish(m0 + i / BN, col, cluster_split_sum<T, kMaxSplits>(local, i, splits));
  }
  // No CTA may leave (and free its shared memory) while another still reads its tile.
  ptx::cluster_sync();
#else
  (void)tile, (void)splits, (void)M, (void)N, (void)m0, (void)n0, (void)finish;
  __trap();  // the launchers use cluster split-K on sm_90+ only
#endif
}

}  // namespace nibble::cuda
