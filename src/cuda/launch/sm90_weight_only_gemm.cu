// Launcher of the sm90_weight_only_gemm family: the instance list, the token-tile and split-K
// choice, and the TMA tensor maps.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/check.h"
#include "common/cuda_runtime_check.h"
#include "common/env.h"
#include "cuda/launch/dynamic_smem.h"
#include "cuda/launch/pdl_launch.h"
#include "cuda/launch/sm90_w4a8_gemm.h"
#include "cuda/launch/sm90_weight_only_gemm.h"
#include "cuda/launch/sm90_tiling.h"
#include "cuda/launch/split_k_workspace.h"
#include "cuda/launch/tensor_map.h"
#include "cuda/sm90/sm90_weight_only_gemm.cuh"
#include "nibble/device.h"

namespace nibble::cuda {

using sm80::WeightOnlyDequant;

namespace {

// Instances: BM tokens per tile; as many stages as fit in the 227 KB of shared memory a Hopper
// block may opt into, at most 6: 4-6 at BM <= 128, 3 at BM = 256 (2 for 4-bit g32 with zeros).
constexpr int kMaxDynamicSmemBytes = 232448;
// S: how the CTAs cover the tiles (cuda/sm90/tile_schedule.cuh); persistent ones have the same
// stages (the epilogue borrows a stage).
template <class T, int kBits, WeightOnlyDequant DQ, int kRows, int BM,
          sm90::TileSchedule S = sm90::TileSchedule::one_tile>
struct Instance {
  static constexpr int kStageBytes =
      sm90::WeightOnlyWgmmaConfig<T, kBits, DQ, kRows, BM, 1>::kStageBytes;
  // Per stage: the stage and its two barriers; 1024 bytes of alignment slack.
  static constexpr int kStages = std::min(6, (kMaxDynamicSmemBytes - 1024) / (kStageBytes + 16));
  using Cfg = sm90::WeightOnlyWgmmaConfig<T, kBits, DQ, kRows, BM, kStages, S>;
};

struct Maps {
  CUtensorMap x, w, s, z;
};

template <class Cfg>
void launch_config(const Maps& m, const sm90::WeightOnlyWgmmaParams& p, dim3 grid,
                   Stream stream) {
  static_assert(Cfg::kSmemBytes <= kMaxDynamicSmemBytes, "the ring and the output tile fit");
  constexpr auto kernel = sm90::sm90_weight_only_gemm_kernel<Cfg>;
  allow_dynamic_smem<kernel>(Cfg::kSmemBytes);
  if (p.cluster_split) {  // the splits of a tile are one cluster: cluster dims (1, 1, splits)
    launch_overlapping(kernel, grid, dim3(Cfg::kThreads), Cfg::kSmemBytes, stream, p.overlap,
                       grid.z, m.x, m.w, m.s, m.z, p);
    return;
  }
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(m.x, m.w, m.s, m.z, p);
  NIBBLE_CUDA_CHECK_LAUNCH();
}

// The instance arguments the plan fixes at run time.
struct Choice {
  int bm = 0;
  sm90::TileSchedule schedule = sm90::TileSchedule::one_tile;
};

template <class T, int kBits, WeightOnlyDequant DQ, int kRows, int BM>
void launch_instance(sm90::TileSchedule schedule, const Maps& m,
                     const sm90::WeightOnlyWgmmaParams& p, dim3 grid, Stream stream) {
  using sm90::TileSchedule;
  using WholeTiles = Instance<T, kBits, DQ, kRows, BM, TileSchedule::whole_tiles>;
  using StreamK = Instance<T, kBits, DQ, kRows, BM, TileSchedule::stream_k>;
  if constexpr (kBits != 8 || BM != 256) {  // no persistent instance there (plan_sm90_weight_only)
    if (schedule == TileSchedule::whole_tiles)
      return launch_config<typename WholeTiles::Cfg>(m, p, grid, stream);
    if (schedule == TileSchedule::stream_k)
      return launch_config<typename StreamK::Cfg>(m, p, grid, stream);
  }
  launch_config<typename Instance<T, kBits, DQ, kRows, BM>::Cfg>(m, p, grid, stream);
}

template <class T, int kBits, WeightOnlyDequant DQ, int kRows>
void launch_bm(Choice c, const Maps& m, const sm90::WeightOnlyWgmmaParams& p, dim3 grid,
               Stream stream) {
  if (c.bm == 64) return launch_instance<T, kBits, DQ, kRows, 64>(c.schedule, m, p, grid, stream);
  if (c.bm == 128)
    return launch_instance<T, kBits, DQ, kRows, 128>(c.schedule, m, p, grid, stream);
  launch_instance<T, kBits, DQ, kRows, 256>(c.schedule, m, p, grid, stream);
}

// Group-wise instances by groups per 128-wide K block: 1 (G = 128, 256), 2 (G = 64), 4 (G = 32).
template <class T, int kBits, WeightOnlyDequant DQ>
void launch_grouped(int group, Choice c, const Maps& m, const sm90::WeightOnlyWgmmaParams& p,
                    dim3 grid, Stream stream) {
  if (group == 32) return launch_bm<T, kBits, DQ, 4>(c, m, p, grid, stream);
  if (group == 64) return launch_bm<T, kBits, DQ, 2>(c, m, p, grid, stream);
  launch_bm<T, kBits, DQ, 1>(c, m, p, grid, stream);
}

template <class T>
void launch_typed(const WeightOnlyLaunch& l, Choice c, const Maps& m,
                  const sm90::WeightOnlyWgmmaParams& p, dim3 grid, Stream stream) {
  const int g = l.group;
  if (l.bits == 8) {
    if (l.dequant == WeightOnlyDequant::per_channel)
      return launch_bm<T, 8, WeightOnlyDequant::per_channel, 0>(c, m, p, grid, stream);
    if (l.dequant == WeightOnlyDequant::group_scale)
      return launch_grouped<T, 8, WeightOnlyDequant::group_scale>(g, c, m, p, grid, stream);
  } else {
    switch (l.dequant) {
      case WeightOnlyDequant::per_channel:
        return launch_bm<T, 4, WeightOnlyDequant::per_channel, 0>(c, m, p, grid, stream);
      case WeightOnlyDequant::group_scale:
        return launch_grouped<T, 4, WeightOnlyDequant::group_scale>(g, c, m, p, grid, stream);
      case WeightOnlyDequant::group_zero:
        return launch_grouped<T, 4, WeightOnlyDequant::group_zero>(g, c, m, p, grid, stream);
      case WeightOnlyDequant::group_fzp:
        return launch_grouped<T, 4, WeightOnlyDequant::group_fzp>(g, c, m, p, grid, stream);
    }
  }
  nibble::detail::fail(ErrorCode::internal, "sm90_weight_only_gemm: no instance for " +
                                                std::to_string(l.bits) + "-bit weights with "
                                                "dequantization " +
                                                std::to_string(static_cast<int>(l.dequant)));
}

}  // namespace

bool use_sm90_weight_only(int device, int64_t m) {
  const int forced = nibble::detail::env_choice(
      "NIBBLE_WEIGHT_ONLY_KERNEL", {"sm80_weight_only_gemm", "sm90_weight_only_gemm"});
  if (!sm90_w4a8_available(device)) return false;  // Hopper with sm_90a code: same condition
  if (forced >= 0) return forced == 1;
  return m >= kSm90WeightOnlyMinTokens;
}

WeightOnlyWgmmaPlan plan_sm90_weight_only(int64_t m, int64_t n_pad, int64_t k_pad,
                                          int weight_bits, int device) {
  // The tile and the cluster split by estimated time (sm90_tiling.h). The costs (µs on the H100
  // at M = 256) were fitted to the 54 (BM, splits) × shape cells of
  // bench/results/h100_weight_only_tiles.log (2026-11-24); the fit picks the fastest cell or one
  // within 5% of it on each of the six shapes. Per K block a 64-token tile costs 0.5, 128 tokens
  // 0.7, 256 tokens 1.3 (the dequantization is the same per block; the MMA grows with the tile);
  // each CTA 4 more (launch, pipeline fill, epilogue) and a cluster reduction 2.
  Sm90TileCosts costs{0.5, 0.7, 1.3, 4.0, 2.0};
  // Measurement knobs: NIBBLE_SM90_WEIGHT_ONLY_BM=64|128|256 forces the token tile,
  // NIBBLE_SM90_WEIGHT_ONLY_SPLITS=1..8 the number of cluster splits of every tile.
  const int forced_bm = forced_sm90_bm("NIBBLE_SM90_WEIGHT_ONLY_BM", 256);
  if (forced_bm != 0) {
    if (forced_bm != 64) costs.kblock_64 = 0;
    if (forced_bm != 128) costs.kblock_128 = 0;
    if (forced_bm != 256) costs.kblock_256 = 0;
  } else if (weight_bits == 8) {
    // 8-bit weights are not given the 256-token tile: only two of its 80 KB stages fit, the
    // costs above were fitted to 4-bit weights, and against the 128-token tile it ran 0.94-1.02x
    // at M = 4096, 1.03-1.07x at M = 1024 unsplit but 0.79-0.80x where split (H100, 2026-11-25,
    // bench/results/h100_weight_only_w8_tiles_ab.json).
    costs.kblock_256 = 0;
  }
  sm90_stream_k_costs(costs);
  const std::array<int, kMaxSm90ClusterSplits + 1> clusters = sm90_gemm_clusters_at_once(device);
  const int forced_splits = forced_sm90_splits("NIBBLE_SM90_WEIGHT_ONLY_SPLITS", clusters);
  const int sm_count = cuda_device_info(device).sm_count;
  Sm90TileChoice t = choose_sm90_tiles_by_cost(m, n_pad, k_pad, sm_count, costs, 8,
                                               {clusters.data(), kMinKBlocksPerSm90ClusterSplit});
  if (forced_splits > 0) {
    set_k_splits(t, static_cast<int>(k_pad / 128), forced_splits);
    t.cluster_split = t.splits > 1;
    t.stream_k = false;
  }
  WeightOnlyWgmmaPlan best;
  best.bm = t.bm;
  best.tiles_m = t.tiles_m;
  best.tiles_n = t.tiles_n;
  best.splits = t.splits;
  best.kblocks_per_split = t.kblocks_per_split;
  best.cluster_split = t.cluster_split;
  best.slots = t.cluster_split ? clusters[static_cast<size_t>(t.splits)] : sm_count;
  // Persistent CTAs on unsplit grids of more tiles than SMs: one CTA per SM walks the tiles,
  // its producer loading the next tile's first stages while the consumers store the last one.
  // Stream-K plans are persistent CTAs too, each taking a range of the tiles' K blocks.
  // 8-bit weights at BM = 256 (only ever forced, see above) have no persistent instance: its
  // consumers spilled 8 bytes.
  const bool has_persistent = weight_bits != 8 || t.bm != 256;
  best.stream_k = t.stream_k && has_persistent;
  best.whole_tiles = best.stream_k ? t.whole_tiles : 0;
  best.persistent = best.stream_k || (has_persistent && t.splits == 1 &&
                                      int64_t{t.tiles_m} * t.tiles_n > sm_count &&
                                      sm90_persistent_allowed());
  best.stages = best.bm == 256
                    ? Instance<__nv_bfloat16, 4, WeightOnlyDequant::per_channel, 0, 256>::kStages
                : best.bm == 128
                    ? Instance<__nv_bfloat16, 4, WeightOnlyDequant::per_channel, 0, 128>::kStages
                    : Instance<__nv_bfloat16, 4, WeightOnlyDequant::per_channel, 0, 64>::kStages;
  return best;
}

std::string describe(const WeightOnlyWgmmaPlan& plan) {
  return "sm90_weight_only_gemm (wgmma + TMA, warp-specialised) tile " + std::to_string(plan.bm) +
         "x128x128 (tokens x channels x K), 3 warpgroups, " + std::to_string(plan.stages) +
         " stages, grid " + std::to_string(plan.tiles_m) + "x" + std::to_string(plan.tiles_n) +
         (plan.splits > 1 ? " with split-K " + std::to_string(plan.splits) +
                                (plan.cluster_split ? " in a cluster" : " through a workspace")
                          : "") +
         ", " + std::to_string(plan.slots) + (plan.cluster_split ? " clusters" : " CTAs") +
         " at once (tile and split chosen by estimated waves x CTA time)" +
         (plan.stream_k ? ", stream-K: " + std::to_string(plan.slots) + " persistent CTAs take " +
                              stream_k_walk_words(plan.whole_tiles, plan.slots)
          : plan.persistent ? ", persistent CTAs (the next tile's loads overlap the epilogue)"
                            : "");
}

void launch_sm90_weight_only(const WeightOnlyLaunch& l, Stream stream) {
  const WeightOnlyWgmmaPlan plan = plan_sm90_weight_only(l.m, l.n_pad, l.k_pad, l.bits, l.device);
  const auto kblocks = static_cast<cuuint64_t>(l.k_pad / 128);
  const char* name = "sm90_weight_only_gemm";
  Maps maps;
  // Activations: (M, K) 16-bit, boxes of 64 elements (128 bytes) × BM rows with the 128-byte
  // swizzle, two per K block; rows ≥ M and columns ≥ K read as zeros.
  maps.x = make_tensor_map<2>(name, l.x_dtype == DType::f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                            : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
                              l.x, {cuuint64_t(l.k), cuuint64_t(l.m)}, {cuuint64_t(l.ldx) * 2},
                              {64u, cuuint32_t(plan.bm)}, CU_TENSOR_MAP_SWIZZLE_128B,
                              "the activations");
  // Weights: 8×128 blocks of 512 (4-bit) or 1024 (8-bit) bytes; block (nb, kb) at
  // (nb·kblocks + kb)·block bytes; 16 blocks (128 channels) per copy.
  const cuuint64_t block_words = l.bits == 8 ? 256u : 128u;
  maps.w = make_tensor_map<3>(name, CU_TENSOR_MAP_DATA_TYPE_UINT32, l.w,
                              {block_words, kblocks, cuuint64_t(l.n_pad / 8)},
                              {block_words * 4, kblocks * block_words * 4},
                              {cuuint32_t(block_words), 1u, 16u}, CU_TENSOR_MAP_SWIZZLE_NONE,
                              "the packed weights");
  // Group tables: (⌈K_pad/G⌉, N_pad) f32; one K block reads 128 columns of 128/G rows (one
  // row for G ≥ 128).
  std::memset(&maps.s, 0, sizeof(maps.s));
  std::memset(&maps.z, 0, sizeof(maps.z));
  if (l.dequant != WeightOnlyDequant::per_channel) {
    const cuuint64_t groups = (cuuint64_t(l.k_pad) + l.group - 1) / l.group;
    const cuuint32_t rows = l.group >= 128 ? 1u : cuuint32_t(128 / l.group);
    maps.s = make_tensor_map<2>(name, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, l.w_scales,
                                {cuuint64_t(l.n_pad), groups}, {cuuint64_t(l.n_pad) * 4},
                                {128u, rows}, CU_TENSOR_MAP_SWIZZLE_NONE, "the group scales");
    if (l.dequant == WeightOnlyDequant::group_zero || l.dequant == WeightOnlyDequant::group_fzp)
      maps.z = make_tensor_map<2>(name, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, l.w_zeros,
                                  {cuuint64_t(l.n_pad), groups}, {cuuint64_t(l.n_pad) * 4},
                                  {128u, rows}, CU_TENSOR_MAP_SWIZZLE_NONE, "the group zeros");
  }

  sm90::WeightOnlyWgmmaParams p;
  p.w_scales = l.w_scales;
  p.bias = l.bias;
  p.bias_dtype = l.bias_dtype;
  p.d = l.d;
  p.ldd = l.ldd;
  p.d_dtype = l.d_dtype;
  p.m = static_cast<int>(l.m);
  p.n = static_cast<int>(l.n);
  p.kblocks = static_cast<int>(kblocks);
  p.group_shift = group_shift(l.group);
  p.kblocks_per_split = plan.kblocks_per_split;
  p.cluster_split = plan.cluster_split;
  p.overlap = overlap_cluster_split_launch(plan.cluster_split);
  p.tiles_m = plan.tiles_m;
  p.tiles_n = plan.tiles_n;
  p.whole_tiles = plan.whole_tiles;
  const SplitKWorkspace ws =
      sm90_tile_workspace(l.device, stream, plan.stream_k, plan.slots, plan.bm, plan.splits,
                          plan.cluster_split, l.m, l.n, int64_t{plan.tiles_m} * plan.tiles_n);
  p.workspace = ws.partials;
  p.counters = ws.counters;
  const dim3 grid = plan.persistent ? dim3(plan.slots) : dim3(plan.tiles_m, plan.tiles_n, plan.splits);
  const Choice choice{plan.bm, plan.stream_k    ? sm90::TileSchedule::stream_k
                               : plan.persistent ? sm90::TileSchedule::whole_tiles
                                                 : sm90::TileSchedule::one_tile};
  if (l.x_dtype == DType::f16) return launch_typed<__half>(l, choice, maps, p, grid, stream);
  launch_typed<__nv_bfloat16>(l, choice, maps, p, grid, stream);
}

}  // namespace nibble::cuda
