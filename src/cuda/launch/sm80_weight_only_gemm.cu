// Launcher of the sm80_weight_only_gemm family: the instance list, the tile choice per M bucket,
// the split-K choice from the device's SM count, and the workspace for split-K partials.
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "common/check.h"
#include "common/cuda_runtime_check.h"
#include "cuda/launch/dynamic_smem.h"
#include "cuda/launch/pdl_launch.h"
#include "cuda/launch/sm80_weight_only_gemm.h"
#include "cuda/launch/split_k_workspace.h"
#include "cuda/sm80/sm80_weight_only_gemm.cuh"
#include "nibble/device.h"

namespace nibble::cuda {

using sm80::WeightOnlyDequant;
using sm80::WeightOnlyGemmParams;

namespace {

// Tile shapes, by M bucket. The main loop is a latency-bound chain per warp (load, convert,
// MMA), so every tile is sized for at least 12 warps per SM (ncu on the H100: with 8 the
// schedulers issued once per 5 cycles). Small M is a weight stream: a thin 16-row tile, 3
// stages (bytes in flight are plenty at 3-4 CTAs per SM) and split-K to put every SM to work;
// warps split N only, so no two warps dequantize the same weights. Up to 64 rows: 8 warps at
// 2 CTAs per SM; larger M: 128×128 tiles of 16 warps (32×32 warp tiles), one CTA per SM.
enum class Tile : int { m16, m32, m64, m128 };
constexpr bool thin(Tile t) { return t == Tile::m16 || t == Tile::m32; }

template <Tile kTile, class T, int kBits, WeightOnlyDequant DQ, int kRows>
struct Instance;
// The 16-row tile's launch bound asks for 4 CTAs per SM, which caps it at 128 registers: left
// at 3, ptxas took 130 (since 21b8aac split the stage loads), the SM held 3 CTAs of 4-bit
// weights instead of 4, and W4A16 at M = 1 ran 93-95 µs on 8192×28672 against 66 (28.6 -> 38
// on 10240×8192; H100, 2026-11-25, bench/results/h100_weight_only_decode_occupancy.log). The
// split-K planner still counts 3 per SM (kM16PlannedCtasPerSm), the rule those 66 µs were
// measured with; 8-bit weights' stages fit 3 per SM in shared memory anyway.
constexpr int kM16PlannedCtasPerSm = 3;
template <class T, int kBits, WeightOnlyDequant DQ, int kRows>
struct Instance<Tile::m16, T, kBits, DQ, kRows> {
  using Cfg = sm80::WeightOnlyGemmConfig<T, kBits, DQ, kRows, 16, 128, 1, 4, 3, 4>;
};
template <class T, int kBits, WeightOnlyDequant DQ, int kRows>
struct Instance<Tile::m32, T, kBits, DQ, kRows> {
  using Cfg = sm80::WeightOnlyGemmConfig<T, kBits, DQ, kRows, 32, 128, 2, 4, 3, 2>;
};
// The float-zero (fzp) dequantization keeps one more value per column live; at 128 registers
// it spills on sm_80, so its larger tiles run 8 warps with the full register file.
constexpr bool kFzp(WeightOnlyDequant dq) { return dq == WeightOnlyDequant::group_fzp; }
template <class T, int kBits, WeightOnlyDequant DQ, int kRows>
struct Instance<Tile::m64, T, kBits, DQ, kRows> {
  using Cfg = sm80::WeightOnlyGemmConfig<T, kBits, DQ, kRows, 64, 128, 2, 4, 3, kFzp(DQ) ? 1 : 2>;
};
template <class T, int kBits, WeightOnlyDequant DQ, int kRows>
struct Instance<Tile::m128, T, kBits, DQ, kRows> {
  using Cfg = sm80::WeightOnlyGemmConfig<T, kBits, DQ, kRows, 128, 128, kFzp(DQ) ? 2 : 4, 4, 3, 1>;
};

struct TileInfo {
  int bm, bn, warps, stages, ctas_per_sm;
};

template <Tile kTile>
TileInfo tile_info() {
  // Every instance of a tile shares its shape; the 4-bit bf16 per-channel one stands for all.
  using Cfg = typename Instance<kTile, __nv_bfloat16, 4, WeightOnlyDequant::per_channel, 0>::Cfg;
  if constexpr (kTile == Tile::m16)
    return {Cfg::BM, Cfg::BN, Cfg::kThreads / 32, Cfg::STAGES, kM16PlannedCtasPerSm};
  else
    return {Cfg::BM, Cfg::BN, Cfg::kThreads / 32, Cfg::STAGES, Cfg::kMinBlocks};
}

TileInfo tile_info(Tile t) {
  switch (t) {
    case Tile::m16: return tile_info<Tile::m16>();
    case Tile::m32: return tile_info<Tile::m32>();
    case Tile::m64: return tile_info<Tile::m64>();
    case Tile::m128: return tile_info<Tile::m128>();
  }
  return {};
}

template <Tile kTile, class T, int kBits, WeightOnlyDequant DQ, int kRows>
void launch_instance(const WeightOnlyGemmParams& p, dim3 grid, Stream stream) {
  using Cfg = typename Instance<kTile, T, kBits, DQ, kRows>::Cfg;
  constexpr auto kernel = sm80::sm80_weight_only_gemm_kernel<Cfg>;
  allow_dynamic_smem<kernel>(Cfg::kSmemBytes);
  if (p.cluster_split && p.splits > kMaxPortableClusterSplitK) allow_nonportable_clusters<kernel>();
  launch_overlapping(kernel, grid, Cfg::kThreads, Cfg::kSmemBytes, stream,
                     Cfg::kOverlapLaunch && p.overlap_allowed,
                     p.cluster_split ? static_cast<unsigned>(p.splits) : 1u, p);
}

// The decode tiles' (M ≤ 32) splits reduce in one cluster on sm_90+, up to 16 (the H100's
// largest, non-portable cluster) where the GPU runs clusters of that size; other split tiles go
// through the workspace. Capping the splits at 8 had slowed 4096x14336 at M = 1 from 22.9 to
// 30.4 us (H100, 2026-11-24), and the workspace's round trip costs 5-10 us at M = 16 (5120x5120
// W4A16 in 10 splits 18.2 us, in a cluster of 8 12.4; H100, 2026-11-28, docs/kernels.md).
bool cluster_split(Tile t, int splits, const WeightOnlyOccupancy& occ) {
  return thin(t) && splits > 1 && splits <= kMaxClusterSplitK &&
         occ.clusters_at_once[static_cast<size_t>(splits)] > 0;
}

// The occupancy of tile kTile's instances for kBits-bit weights. The instance with the most
// shared memory per stage (four rows of group scales, and of zeros for 4-bit weights) stands
// for every dequantization of its width: all share the launch bound, and the others' stages are
// at most 4 KB smaller, so they hold at least as many CTAs per SM.
template <Tile kTile, int kBits>
WeightOnlyOccupancy query_occupancy(int device) {
  static_assert(kMaxClusterSplitK + 1 ==
                std::tuple_size_v<decltype(WeightOnlyOccupancy::clusters_at_once)>);
  constexpr WeightOnlyDequant kDq =
      kBits == 4 ? WeightOnlyDequant::group_zero : WeightOnlyDequant::group_scale;
  using Cfg = typename Instance<kTile, __nv_bfloat16, kBits, kDq, 4>::Cfg;
  constexpr auto kernel = sm80::sm80_weight_only_gemm_kernel<Cfg>;
  const detail::DeviceGuard guard(device);
  allow_dynamic_smem<kernel>(Cfg::kSmemBytes);
  const DeviceInfo dev = cuda_device_info(device);
  WeightOnlyOccupancy occ;
  occ.sm_count = dev.sm_count;
  NIBBLE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ.ctas_per_sm, kernel,
                                                                  Cfg::kThreads, Cfg::kSmemBytes));
  if (dev.cc_major >= 9 && thin(kTile)) {
    allow_nonportable_clusters<kernel>();
    for (int s = 2; s <= kMaxClusterSplitK; ++s)
      occ.clusters_at_once[static_cast<size_t>(s)] = max_active_clusters(
          kernel, dim3(Cfg::kThreads), Cfg::kSmemBytes, static_cast<unsigned>(s));
  }
  return occ;
}

template <int kBits>
WeightOnlyOccupancy query_occupancy(int device, Tile t) {
  switch (t) {
    case Tile::m16: return query_occupancy<Tile::m16, kBits>(device);
    case Tile::m32: return query_occupancy<Tile::m32, kBits>(device);
    case Tile::m64: return query_occupancy<Tile::m64, kBits>(device);
    case Tile::m128: return query_occupancy<Tile::m128, kBits>(device);
  }
  return {};
}

Tile tile_for(int64_t m) {
  return m <= 16 ? Tile::m16 : m <= 32 ? Tile::m32 : m <= 64 ? Tile::m64 : Tile::m128;
}

// Group-wise instances by groups per 128-wide K block: 1 (G = 128, 256), 2 (G = 64), 4 (G = 32).
template <Tile kTile, class T, int kBits, WeightOnlyDequant DQ>
void launch_grouped(int group, const WeightOnlyGemmParams& p, dim3 grid, Stream stream) {
  if (group == 32) return launch_instance<kTile, T, kBits, DQ, 4>(p, grid, stream);
  if (group == 64) return launch_instance<kTile, T, kBits, DQ, 2>(p, grid, stream);
  launch_instance<kTile, T, kBits, DQ, 1>(p, grid, stream);
}

template <Tile kTile, class T>
void launch_typed(const WeightOnlyLaunch& l, const WeightOnlyGemmParams& p, dim3 grid,
                  Stream stream) {
  const int g = l.group;
  if (l.bits == 8) {
    if (l.dequant == WeightOnlyDequant::per_channel)
      return launch_instance<kTile, T, 8, WeightOnlyDequant::per_channel, 0>(p, grid, stream);
    if (l.dequant == WeightOnlyDequant::group_scale)
      return launch_grouped<kTile, T, 8, WeightOnlyDequant::group_scale>(g, p, grid, stream);
  } else {
    switch (l.dequant) {
      case WeightOnlyDequant::per_channel:
        return launch_instance<kTile, T, 4, WeightOnlyDequant::per_channel, 0>(p, grid, stream);
      case WeightOnlyDequant::group_scale:
        return launch_grouped<kTile, T, 4, WeightOnlyDequant::group_scale>(g, p, grid, stream);
      case WeightOnlyDequant::group_zero:
        return launch_grouped<kTile, T, 4, WeightOnlyDequant::group_zero>(g, p, grid, stream);
      case WeightOnlyDequant::group_fzp:
        return launch_grouped<kTile, T, 4, WeightOnlyDequant::group_fzp>(g, p, grid, stream);
    }
  }
  nibble::detail::fail(ErrorCode::internal, "sm80_weight_only_gemm: no instance for " +
                                                std::to_string(l.bits) + "-bit weights with "
                                                "dequantization " +
                                                std::to_string(static_cast<int>(l.dequant)));
}

template <Tile kTile>
void launch_tile(const WeightOnlyLaunch& l, const WeightOnlyGemmParams& p, dim3 grid,
                 Stream stream) {
  if (l.x_dtype == DType::f16) return launch_typed<kTile, __half>(l, p, grid, stream);
  launch_typed<kTile, __nv_bfloat16>(l, p, grid, stream);
}

}  // namespace

WeightOnlyOccupancy sm80_weight_only_occupancy(int device, int tile, int weight_bits) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int>, WeightOnlyOccupancy> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device, tile, weight_bits);
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  const Tile t = static_cast<Tile>(tile);
  const WeightOnlyOccupancy occ =
      weight_bits == 8 ? query_occupancy<8>(device, t) : query_occupancy<4>(device, t);
  cache.emplace(key, occ);
  return occ;
}

WeightOnlyPlan plan_sm80_weight_only(int64_t m, int64_t n_pad, int64_t k_pad,
                                     const WeightOnlyOccupancy& occ) {
  WeightOnlyPlan plan;
  const Tile tile = tile_for(m);
  plan.tile = static_cast<int>(tile);
  const TileInfo t = tile_info(tile);
  plan.bm = t.bm;
  plan.bn = t.bn;
  plan.stages = t.stages;
  plan.warps = t.warps;
  plan.tiles_m = static_cast<int>((m + t.bm - 1) / t.bm);
  plan.tiles_n = static_cast<int>((n_pad + t.bn - 1) / t.bn);
  const int kblocks = static_cast<int>(k_pad / 128);
  const int64_t tiles = int64_t{plan.tiles_m} * plan.tiles_n;
  // CTAs of a grid of `s` splits that the GPU runs at once: clusters of s at once (cluster
  // splits), else the instance's CTAs per SM on every SM (0 when unknown: no limit).
  const int64_t per_sm_slots = int64_t{occ.ctas_per_sm} * occ.sm_count;
  auto resident = [&](int s) -> int64_t {
    const int64_t ctas = tiles * s;
    if (cluster_split(tile, s, occ))
      return std::min(ctas, int64_t{occ.clusters_at_once[static_cast<size_t>(s)]} * s);
    return per_sm_slots > 0 ? std::min(ctas, per_sm_slots) : ctas;
  };
  // Splits that cut kblocks into equal ranges of per_split blocks (the last may be shorter).
  auto even = [&](int s) {
    const int per_split = (kblocks + s - 1) / s;
    return (kblocks + per_split - 1) / per_split;
  };
  // Split K only when the output tiles alone cannot occupy the GPU: aim for the tile's planned
  // CTAs per SM and keep at least 2 K blocks (256 of K) per split. Weights are scaled in the
  // main loop (or per channel in the epilogue), so a split may cut a group anywhere. 2, not 4
  // (before 2026-11-28): on the H200 the one-wave plans of 2-3 blocks a split ran 1.13-1.35x
  // faster on the small layers at M = 1 and 16 (W4A16 g128 3584x3584 6.33 us in 14 splits
  // against 8.55 in 7, 3072x3072 5.88 against 7.66, 2048x2048 4.00 against 4.51; W8A16 alike
  // where its 3 CTAs per SM hold the wave), bench/results/h200_weight_only_split_sweep_*_4076885.txt.
  const int64_t slots = int64_t{t.ctas_per_sm} * occ.sm_count;
  constexpr int kMinKBlocksPerSplit = 2;
  int splits = 1;
  if (tiles < slots) {
    const int want = static_cast<int>((slots + tiles - 1) / tiles);
    splits = even(std::clamp(std::min(want, kblocks / kMinKBlocksPerSplit), 1, kMaxSplitK));
  }
  // Fewer splits while the grid would not run in one wave: the last CTAs would start only when
  // the first ones end, and a few CTAs streaming alone run at a fraction of the bandwidth.
  // 8-bit weights' 16-row tiles hold 3 CTAs per SM (shared memory) and fewer clusters of 8 than
  // 6144x4096 has tiles, so W8A16 ran second waves at M = 1 (H100, 2026-11-27, docs/kernels.md:
  // 28672x4096 61.4 -> 49.9 us unsplit, 8192x28672 111.1 -> 93.4 in 5 splits instead of 7).
  while (splits > 1 && resident(splits) < tiles * splits) splits = even(splits - 1);
  if (const int forced = forced_sm80_splits(); forced >= 0)
    splits = even(std::clamp(forced, 1, std::min(kMaxSplitK, std::max(kblocks, 1))));
  const int per_split = (kblocks + splits - 1) / splits;
  plan.splits = (kblocks + per_split - 1) / per_split;
  plan.kblocks_per_split = per_split;
  plan.cluster_split = cluster_split(tile, plan.splits, occ);
  plan.resident_ctas = static_cast<int>(resident(plan.splits));
  return plan;
}

WeightOnlyPlan plan_sm80_weight_only(int64_t m, int64_t n_pad, int64_t k_pad, int weight_bits,
                                     int device) {
  return plan_sm80_weight_only(
      m, n_pad, k_pad,
      sm80_weight_only_occupancy(device, static_cast<int>(tile_for(m)), weight_bits));
}

std::string describe(const WeightOnlyPlan& plan) {
  const int64_t ctas = int64_t{plan.tiles_n} * plan.tiles_m * plan.splits;
  return "sm80_weight_only_gemm tile " + std::to_string(plan.bm) + "x" + std::to_string(plan.bn) +
         "x128, " + std::to_string(plan.warps) + " warps, " + std::to_string(plan.stages) +
         " stages, grid " + std::to_string(plan.tiles_n) + "x" + std::to_string(plan.tiles_m) +
         (plan.splits > 1 ? " with split-K " + std::to_string(plan.splits) +
                                (plan.cluster_split ? " in a cluster" : " through a workspace") +
                                " (tiles alone would leave SMs idle)"
                          : "") +
         ", " + std::to_string(ctas) + " CTAs (" + std::to_string(plan.resident_ctas) +
         " at once)";
}

void launch_sm80_weight_only(const WeightOnlyLaunch& l, Stream stream) {
  const DeviceInfo dev = cuda_device_info(l.device);
  const WeightOnlyPlan plan = plan_sm80_weight_only(l.m, l.n_pad, l.k_pad, l.bits, l.device);
  WeightOnlyGemmParams p;
  p.x = l.x;
  p.ldx = l.ldx;
  p.w = static_cast<const uint8_t*>(l.w);
  p.w_scales = l.w_scales;
  p.w_zeros = l.w_zeros;
  p.bias = l.bias;
  p.bias_dtype = l.bias_dtype;
  p.d = l.d;
  p.ldd = l.ldd;
  p.d_dtype = l.d_dtype;
  p.m = static_cast<int>(l.m);
  p.n = static_cast<int>(l.n);
  p.k = static_cast<int>(l.k);
  p.n_pad = static_cast<int>(l.n_pad);
  p.kblocks = static_cast<int>(l.k_pad / 128);
  p.group_shift = group_shift(l.group);
  p.splits = plan.splits;
  p.kblocks_per_split = plan.kblocks_per_split;
  p.overlap_allowed = overlap_split_k_launch(dev.cc_major, plan.splits);
  p.prefetch_blocks = overlap_prefetch_blocks(p.overlap_allowed);
  p.early_weight_stages = overlap_early_weight_stages(p.overlap_allowed);
  // sm_90+: the splits of a decode tile are one thread-block cluster and reduce over
  // distributed shared memory (cuda/common/split_k.cuh) instead of through the workspace.
  p.cluster_split = plan.cluster_split;
  if (plan.splits > 1 && !p.cluster_split) {
    SplitKWorkspace ws = split_k_workspace(l.device, stream, size_t(plan.splits) * l.m * l.n * 4,
                                           size_t(plan.tiles_m) * plan.tiles_n);
    p.workspace = ws.partials;
    p.counters = ws.counters;
  }
  const dim3 grid(plan.tiles_n, plan.tiles_m, plan.splits);
  switch (static_cast<Tile>(plan.tile)) {
    case Tile::m16: return launch_tile<Tile::m16>(l, p, grid, stream);
    case Tile::m32: return launch_tile<Tile::m32>(l, p, grid, stream);
    case Tile::m64: return launch_tile<Tile::m64>(l, p, grid, stream);
    case Tile::m128: return launch_tile<Tile::m128>(l, p, grid, stream);
  }
}

}  // namespace nibble::cuda
