// Launcher of the sm90_w4a8_gemm family: the instance list, the token-tile choice, and the TMA
// tensor maps (built per call on the host from the operands' pointers and strides; they travel
// by value as kernel parameters, so CUDA-graph capture records them).
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "common/check.h"
#include "common/env.h"
#include "common/cuda_runtime_check.h"
#include "cuda/launch/sm90_w4a8_gemm.h"
#include "cuda/launch/built_archs.h"
#include "cuda/launch/dynamic_smem.h"
#include "cuda/launch/pdl_launch.h"
#include "cuda/launch/sm90_tiling.h"
#include "cuda/launch/split_k_workspace.h"
#include "cuda/launch/tensor_map.h"
#include "cuda/sm90/sm90_w4a8_gemm.cuh"
#include "nibble/device.h"
#include "nibble/formats.h"

namespace nibble::cuda {

using sm80::W4A8Epilogue;

namespace {

// Instances: BM tokens per tile; stages fill about 200 KB of shared memory (at most 8).
// 8-bit weights (W = 8) double the weight tile: 4, 6 and 8 stages for BM = 256, 128, 64.
// F8: fp8 activations (sm90_w4afp8_gemm), the stage sizes of the int8 ones.
// P: persistent CTAs: as many stages as fit beside the epilogue's buffer
// (W4A8WgmmaConfig::kPersistentStagesMax; 4 at BM = 256 with 40 KB stages, the same as one tile
// per CTA elsewhere). Every format has the instance (the int8-activation f32 group format's
// spilled 12 bytes at BM = 128 until its int4 became 16·v); plan_sm90_w4a8 takes that format's
// for stream-K only.
template <int BM, W4A8Epilogue E, int W = 4, bool F8 = false, bool P = false>
struct Instance {
  using Probe = sm90::W4A8WgmmaConfig<BM, 1, E, W, F8, P>;
  static constexpr int kStages =
      P ? Probe::kPersistentStagesMax : std::min(8, 204800 / Probe::kStageBytes);
  using Cfg = sm90::W4A8WgmmaConfig<BM, kStages, E, W, F8, P>;
};

const char* kernel_name(int weight_bits, bool a_e4m3) {
  return weight_bits == 8 ? "sm90_w8a8_gemm" : a_e4m3 ? "sm90_w4afp8_gemm" : "sm90_w4a8_gemm";
}

template <class Cfg>
void launch_config(const CUtensorMap& a, const CUtensorMap& w, const CUtensorMap& g,
                   const sm90::W4A8WgmmaParams& p, dim3 grid, Stream stream) {
  constexpr auto kernel = sm90::sm90_w4a8_gemm_kernel<Cfg>;
  allow_dynamic_smem<kernel>(Cfg::kSmemBytes);
  // The output for store_tile_by_tma: (N, M) 16-bit values, boxes of one consumer warpgroup's
  // 64 channels × a token range, swizzled like the buffer the consumers fill.
  CUtensorMap d;
  std::memset(&d, 0, sizeof(d));
  if constexpr (Cfg::kPersistent && Cfg::EPI != W4A8Epilogue::s32)
    d = make_tensor_map<2>(kernel_name(Cfg::WBITS, Cfg::kFp8), CU_TENSOR_MAP_DATA_TYPE_UINT16,
                           p.d, {cuuint64_t(p.n), cuuint64_t(p.m)}, {cuuint64_t(p.ldd) * 2},
                           {64u, cuuint32_t(Cfg::BM / Cfg::kStoreRounds)},
                           CU_TENSOR_MAP_SWIZZLE_128B, "the output");
  if (p.cluster_split || p.multicast_a) {
    // Split tiles: clusters of (1, 1, splits). Multicast: CTA pairs (2, 1, 1).
    const dim3 cluster = p.multicast_a ? dim3(2, 1, 1) : dim3(1, 1, grid.z);
    launch_overlapping(kernel, grid, dim3(Cfg::kThreads), Cfg::kSmemBytes, stream, p.overlap,
                       cluster, a, w, g, d, p);
    return;
  }
  kernel<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(a, w, g, d, p);
  NIBBLE_CUDA_CHECK_LAUNCH();
}

template <int BM, W4A8Epilogue E, int W = 4, bool F8 = false>
void launch_instance(const CUtensorMap& a, const CUtensorMap& w, const CUtensorMap& g,
                     const sm90::W4A8WgmmaParams& p, dim3 grid, Stream stream) {
  // No persistent s32 256-token instance (plan_sm90_w4a8 says why).
  if constexpr (E != W4A8Epilogue::s32 || BM != 256)
    if (p.persistent)
      return launch_config<typename Instance<BM, E, W, F8, true>::Cfg>(a, w, g, p, grid, stream);
  launch_config<typename Instance<BM, E, W, F8>::Cfg>(a, w, g, p, grid, stream);
}

template <W4A8Epilogue E>
void launch_epilogue(int bm, const CUtensorMap& a, const CUtensorMap& w, const CUtensorMap& g,
                     const sm90::W4A8WgmmaParams& p, dim3 grid, Stream stream) {
  switch (bm) {
    case 64: return launch_instance<64, E>(a, w, g, p, grid, stream);
    case 128: return launch_instance<128, E>(a, w, g, p, grid, stream);
    case 256:
      if constexpr (E != W4A8Epilogue::group) return launch_instance<256, E>(a, w, g, p, grid, stream);
      break;
  }
  nibble::detail::fail(ErrorCode::internal,
                       "sm90_w4a8_gemm: no instance for a " + std::to_string(bm) + "-token tile");
}

template <W4A8Epilogue E>
void launch_epilogue8(int bm, const CUtensorMap& a, const CUtensorMap& w,
                      const sm90::W4A8WgmmaParams& p, dim3 grid, Stream stream) {
  switch (bm) {
    case 64: return launch_instance<64, E, 8>(a, w, w, p, grid, stream);
    case 128: return launch_instance<128, E, 8>(a, w, w, p, grid, stream);
    case 256: return launch_instance<256, E, 8>(a, w, w, p, grid, stream);
  }
  nibble::detail::fail(ErrorCode::internal,
                       "sm90_w8a8_gemm: no instance for a " + std::to_string(bm) + "-token tile");
}

// fp8 activations: per channel (BM up to 256) or G = 128 group scales (BM ≤ 128: f32 running sums).
template <W4A8Epilogue E>
void launch_epilogue_fp8(int bm, const CUtensorMap& a, const CUtensorMap& w, const CUtensorMap& g,
                         const sm90::W4A8WgmmaParams& p, dim3 grid, Stream stream) {
  switch (bm) {
    case 64: return launch_instance<64, E, 4, true>(a, w, g, p, grid, stream);
    case 128: return launch_instance<128, E, 4, true>(a, w, g, p, grid, stream);
    case 256:
      if constexpr (E == W4A8Epilogue::per_channel)
        return launch_instance<256, E, 4, true>(a, w, g, p, grid, stream);
      break;
  }
  nibble::detail::fail(ErrorCode::internal,
                       "sm90_w4afp8_gemm: no instance for a " + std::to_string(bm) + "-token tile");
}

template <int BM, W4A8Epilogue E, int W = 4, bool F8 = false>
int instance_stages(bool persistent) {
  return persistent ? Instance<BM, E, W, F8, true>::kStages : Instance<BM, E, W, F8>::kStages;
}

template <int BM>
int stages_of(W4A8Epilogue e, int weight_bits, bool a_e4m3, bool persistent) {
  if (weight_bits == 8) {
    if (e == W4A8Epilogue::s32) return instance_stages<BM, W4A8Epilogue::s32, 8>(persistent);
    return instance_stages<BM, W4A8Epilogue::per_channel, 8>(persistent);
  }
  if (a_e4m3) {
    if (e == W4A8Epilogue::per_channel)
      return instance_stages<BM, W4A8Epilogue::per_channel, 4, true>(persistent);
    if constexpr (BM <= 128) return instance_stages<BM, W4A8Epilogue::group, 4, true>(persistent);
    return 0;
  }
  switch (e) {
    case W4A8Epilogue::s32: return instance_stages<BM, W4A8Epilogue::s32>(persistent);
    case W4A8Epilogue::per_channel: return instance_stages<BM, W4A8Epilogue::per_channel>(persistent);
    case W4A8Epilogue::group:
      if constexpr (BM <= 128) return instance_stages<BM, W4A8Epilogue::group>(persistent);
      return 0;
    case W4A8Epilogue::two_level: return instance_stages<BM, W4A8Epilogue::two_level>(persistent);
  }
  return 0;
}

}  // namespace

bool sm90_w4a8_available(int device) {
  if (!cuda_code_built("90a")) return false;
  const DeviceInfo info = cuda_device_info(device);
  return info.cc_major == 9 && info.cc_minor == 0;
}

bool sm90_w4a8_handles(W4A8Epilogue epilogue, int group, bool a_e4m3) {
  if (a_e4m3)
    return epilogue == W4A8Epilogue::per_channel ||
           (epilogue == W4A8Epilogue::group && group == 128);
  switch (epilogue) {
    case W4A8Epilogue::s32:
    case W4A8Epilogue::per_channel: return true;
    case W4A8Epilogue::group:
    case W4A8Epilogue::two_level: return group == 128;
  }
  return false;
}

std::array<int, kMaxSm90ClusterSplits + 1> sm90_gemm_clusters_at_once(int device) {
  static std::mutex mutex;
  static std::map<int, std::array<int, kMaxSm90ClusterSplits + 1>> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  if (const auto it = cache.find(device); it != cache.end()) return it->second;
  std::array<int, kMaxSm90ClusterSplits + 1> counts{};
  using Cfg = Instance<64, W4A8Epilogue::per_channel>::Cfg;
  constexpr auto kernel = sm90::sm90_w4a8_gemm_kernel<Cfg>;
  const detail::DeviceGuard guard(device);
  allow_dynamic_smem<kernel>(Cfg::kSmemBytes);
  for (int size = 2; size <= kMaxSm90ClusterSplits; ++size)
    counts[static_cast<size_t>(size)] = max_active_clusters(
        kernel, dim3(Cfg::kThreads), Cfg::kSmemBytes, static_cast<unsigned>(size));
  cache.emplace(device, counts);
  return counts;
}

namespace {
// The value of environment variable `name` is `value`.
bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}
// Measurement knobs, read per call so that tests can compare the variants on one shape:
// NIBBLE_SM90_MULTICAST=1 asks for CTA pairs, NIBBLE_SM90_PERSISTENT=0 for one tile per CTA.
bool sm90_multicast_requested() { return env_is("NIBBLE_SM90_MULTICAST", "1"); }
}  // namespace

bool sm90_persistent_allowed() { return !env_is("NIBBLE_SM90_PERSISTENT", "0"); }

int forced_sm90_bm(const char* name, int max_bm) {
  const int bm = nibble::detail::env_int(name, 0, 64, 256);
  if (bm != 0 && ((bm != 64 && bm != 128 && bm != 256) || bm > max_bm))
    nibble::detail::fail(ErrorCode::invalid_argument,
                         std::string(name) + "=" + std::to_string(bm) +
                             ": expected 64, 128 or 256 (at most " + std::to_string(max_bm) +
                             " for this format)");
  return bm;
}

int forced_sm90_splits(const char* name,
                       const std::array<int, kMaxSm90ClusterSplits + 1>& clusters) {
  const int splits = nibble::detail::env_int(name, 0, 1, kMaxSm90ClusterSplits);
  if (splits > 1 && clusters[size_t(splits)] == 0)
    nibble::detail::fail(ErrorCode::invalid_argument,
                         std::string(name) + "=" + std::to_string(splits) + ": expected 1.." +
                             std::to_string(kMaxSm90ClusterSplits) +
                             " cluster splits that this GPU can run");
  return splits;
}

void sm90_stream_k_costs(Sm90TileCosts& costs) {
  // Fitted to sm90_weight_only_gemm W4A16 g128 with stream-K forced at BM = 128 and 256 on
  // 6144×4096, 10240×8192 and 4096×14336 at M = 256 and 1024 (H100, 2026-11-25): stream-K ran
  // 1.11–1.18× the K blocks' cost plus 10–14 µs; with the partials' stores and sums left out
  // (wrong results, timing only) 3.4–5.2 µs less at BM = 128 and 7.2–12.6 less at BM = 256.
  costs.stream_k_slowdown = 1.15;
  costs.stream_k_fixup_per_token = 8.0 / 256;
  costs.stream_k_only = env_is("NIBBLE_SM90_STREAM_K", "1");
  // NIBBLE_SM90_STREAM_K_WHOLE_WAVES=n (measurements): a stream-K grid walks n whole waves of
  // tiles before its ranges (clipped to all but the last wave; -1 the most, -2 one less).
  constexpr int kUnset = 1 << 20;
  const int waves = nibble::detail::env_int("NIBBLE_SM90_STREAM_K_WHOLE_WAVES", kUnset, -64, 64);
  if (waves != kUnset) costs.forced_whole_waves = waves;
  if (env_is("NIBBLE_SM90_STREAM_K", "0") || !sm90_persistent_allowed()) {
    costs.stream_k_slowdown = 0;
    costs.stream_k_only = false;
  }
}

W4A8WgmmaPlan plan_sm90_w4a8(int64_t m, int64_t n_pad, int64_t k_pad, W4A8Epilogue epilogue,
                             int device, int weight_bits, bool a_e4m3, bool output_tma_storable) {
  const int sm_count = cuda_device_info(device).sm_count;
  // Split-K through the workspace needs at least 24 K blocks (3072 of K) per split — measured
  // on the H100 at M = 64: 4 splits of K = 4096 lost to no split (15.3 vs 13.2 µs, 4096×4096),
  // 4 of 14336 won (22.7 vs 33.4 µs, 4096×14336); the partial tiles' round trip is the fixed
  // cost. Split tiles that are one cluster reduce over distributed shared memory instead (no
  // round trip, no counter) and pay from 4 K blocks on (below). The f32 group
  // epilogues (int8 or fp8 activations) have no 256-token tile (their second accumulator set,
  // the f32 running sums, would not fit).
  const std::array<int, kMaxSm90ClusterSplits + 1> clusters = sm90_gemm_clusters_at_once(device);
  // Cluster splits keep at least 4 K blocks here, not kMinKBlocksPerSm90ClusterSplit's 8 (which
  // sm90_weight_only_gemm keeps): on the H200 (2026-11-28, bench/results/h200_sm90_short_splits.json)
  // layers of short K at M = 48..64 ran 5-23% faster (2048x2048 W8A8 at M = 64 6.43 us in 4
  // splits against 7.22 in 2; 2560x2560 W4A-FP8 7.34 against 9.55 in 5 against 2), the others
  // kept their plans; 2 blocks gained nothing more. NIBBLE_SM90_SPLIT_MIN_KBLOCKS=n sets it
  // (measurements).
  const int min_kblocks = nibble::detail::env_int("NIBBLE_SM90_SPLIT_MIN_KBLOCKS", 4, 1, 1 << 20);
  const Sm90ClusterSplitK cluster{clusters.data(), min_kblocks};
  // Measurement knobs (read per call, for sweeps): NIBBLE_SM90_BM=64|128|256 forces the token
  // tile, NIBBLE_SM90_SPLITS=1..8 the number of cluster splits of every tile.
  const int max_bm = epilogue == W4A8Epilogue::group ? 128 : 256;
  const int forced_bm = forced_sm90_bm("NIBBLE_SM90_BM", max_bm);
  const int forced_splits = forced_sm90_splits("NIBBLE_SM90_SPLITS", clusters);
  Sm90TileChoice t;
  if (forced_bm != 0)
    t = choose_sm90_tiles(m, n_pad, k_pad, sm_count, {forced_bm}, 24, cluster);
  else if (epilogue == W4A8Epilogue::group)
    t = choose_sm90_tiles(m, n_pad, k_pad, sm_count, {128, 64}, 24, cluster);
  else
    t = choose_sm90_tiles(m, n_pad, k_pad, sm_count, {256, 128, 64}, 24, cluster);
  // Int4 weights on long K: a one-wave grid's tiles doubled in tokens and split in two (each
  // weight block converted for twice the tokens). Not for int8 weights, which convert nothing
  // (W8A8 kept 64-token tiles unsplit on 4096×14336 at M = 256, H100, 2026-11-24).
  if (weight_bits == 4 && forced_bm == 0 && forced_splits == 0)
    t = prefer_doubled_tile_split(t, m, k_pad, sm_count, max_bm, cluster);
  if (forced_splits > 0) {
    set_k_splits(t, static_cast<int>(k_pad / 128), forced_splits);
    t.cluster_split = t.splits > 1;
  }
  Sm90TileCosts stream_k_costs;  // stream_k_slowdown 0: stream-K off (NIBBLE_SM90_STREAM_K=0)
  sm90_stream_k_costs(stream_k_costs);
  const bool stream_k_possible = forced_splits == 0 && stream_k_costs.stream_k_slowdown > 0;
  // NIBBLE_SM90_STREAM_K=1 (measurements) takes stream-K over the cluster splits too.
  if (stream_k_possible && stream_k_costs.stream_k_only && t.splits > 1) {
    set_k_splits(t, static_cast<int>(k_pad / 128), 1);
    t.cluster_split = false;
  }
  // Int4 weights: whole tiles that stream-K would not help traded for tiles of twice the tokens
  // in stream-K ranges where that is estimated faster (prefer_doubled_tile_stream_k), tiles of
  // up to 128 tokens (the 16·v decoding's instances; 256-token ranges ran slower, see
  // sm90::high_nibble_instance). Persistent CTAs must be possible for the doubled tile (below).
  // Int4 weights with int8 activations and no group scales convert their K blocks cheaply, so
  // the ranges' partials and fix-ups (an estimated 7 us on the H100, fitted to the sweep) need
  // long K to pay: 80 tiles of 128 tokens of 5120x5120 (40 K blocks) at M = 256 ran w4a8_pc in
  // 21.0 us in ranges against 17.4 whole, while 80 of 256 tokens of 10240x8192 (64 K blocks)
  // ran 40.8 against 44.6 (H100, 2026-12-07). Not measured between: 48 blocks is the line drawn.
  const bool cheap_kblocks = weight_bits == 4 && !a_e4m3 && epilogue != W4A8Epilogue::group;
  const bool stream_k_pays_for_k = !cheap_kblocks || k_pad / 128 >= 48;
  // The f32 group format with int8 activations, whose K blocks cost about 3.5x per channel's,
  // takes stream-K on fuller grids (sm90_w4a8_stream_k_pays). With fp8 activations not measured.
  const bool heavy_kblocks = epilogue == W4A8Epilogue::group && !a_e4m3;
  if (weight_bits == 4 && forced_bm == 0 && stream_k_possible && !stream_k_costs.stream_k_only &&
      stream_k_pays_for_k && sm90_persistent_allowed() &&
      (epilogue == W4A8Epilogue::s32 || output_tma_storable))
    t = prefer_doubled_tile_stream_k(t, m, k_pad, sm_count, std::min(max_bm, 128), weight_bits,
                                     heavy_kblocks);
  W4A8WgmmaPlan best;
  best.weight_bits = weight_bits;
  best.a_e4m3 = a_e4m3;
  best.bm = t.bm;
  best.tiles_m = t.tiles_m;
  best.tiles_n = t.tiles_n;
  best.splits = t.splits;
  best.kblocks_per_split = t.kblocks_per_split;
  best.cluster_split = t.cluster_split;
  // CTA pairs sharing the activation tile, only on request (NIBBLE_SM90_MULTICAST=1), for
  // 8-bit weights on grids of two waves or more. With one tile per CTA they measured 1.00–1.08×
  // unpaired there (2026-11-24); persistent CTAs unpaired beat them, and persistent pairs too:
  // W8A8 at M = 1024, persistent pairs against persistent alone, 6144×4096 51.2 against 42.7 µs,
  // 10240×8192 147 against 121, 28672×4096 181 against 172; at M = 4096 level (H100,
  // 2026-11-25, docs/kernels.md). Int4 weights measured 0.87–1.04× with pairs.
  best.multicast_a = weight_bits == 8 && t.splits == 1 && t.tiles_n >= 2 &&
                     int64_t{t.tiles_m} * t.tiles_n >= 2 * int64_t{sm_count} && clusters[2] > 0 &&
                     sm90_multicast_requested();
  // Persistent CTAs on unsplit grids of more tiles than SMs: one CTA per SM walks the tiles,
  // and the producer loads the next tile's first stages while the consumers store the last
  // tile, which hides the pipeline fill and the CTA launch of every later tile. Pairs then walk
  // pair tiles: as many pairs as the GPU holds clusters of two at once.
  // Stream-K (cuda/sm90/tile_schedule.cuh) where an unsplit grid leaves many SMs idle: the
  // CTAs then take equal ranges of all the tiles' K blocks. Measured on the H200
  // (2026-11-29, 132 SMs): a stream-K CTA's K blocks cost 1.4-1.5x a whole tile's (partials,
  // fix-up, the persistent instance's fewer stages), so it pays only where the SMs it adds are
  // more than 1.5x those the tiles hold: 80 channel tiles of 10240x8192 ran W4A8 in 0.85-0.94x
  // the time at M = 64, 128 and 256, W4A-FP8 in 0.80-0.87x, W8A8 at M = 256 in 0.93x; 96 tiles
  // of 6144x4096 at M = 256 ran 1.13x (W4A8) and 1.28x (W8A8) slower. Int8 weights only on
  // 256-token tiles: their 64- and 128-token tiles of 10240x8192 ran 1.07x and 1.12x slower
  // (80 CTAs already streamed the weights at 74-80% of the copy ceiling; more SMs add only the
  // partials' traffic), while int4 weights, converted on the way, gain from 64 tokens on.
  // Two-wave grids of at most 2 token tiles whose second wave is at most a third full as well
  // (H100, 2026-12-07, bench/results/h100_sm90_tile_sweep_94f5861.txt): 160 tiles of 128 tokens
  // of 10240x8192 at M = 256 ran w4a8_g128 in 59.3 us against 76.0 whole, w4a8_pc in 42.1
  // against 43.7; grids with more of their last wave filled lost (96 tiles: 1.05x and 1.34x;
  // 320: 1.01x and 1.18x), and so did ranges over 8 token tiles (sm90_w4a8_stream_k_pays).
  // The f32 group format with int8 activations, since the ranges' interiors walk in waves
  // (stream_k_order.h), up to 1 / 1.25 of the slots on grids of more than one wave and any
  // token tiles: 0.90-0.92x the time of whole tiles on three layers (H100, 2026-12-08,
  // bench/results/h100_ab_stream_k_interiors_first_7073a8e.txt).
  // (sm90_w4a8_stream_k_pays; NIBBLE_SM90_STREAM_K=1 takes it wherever the K blocks allow.)
  // Persistent instances store tiles by TMA (16-bit outputs it can address), s32 ones by slab;
  // s32 has none at BM = 256: with the 16-bit outputs' TMA store a compile-time choice (one
  // kernel per persistent format, not both stores behind a run-time flag) it spilled 8 bytes
  // (ptxas 13.0).
  const bool persistent_possible =
      sm90_persistent_allowed() &&
      (epilogue == W4A8Epilogue::s32 ? t.bm != 256 : output_tma_storable);
  const int64_t tiles = int64_t{t.tiles_m} * t.tiles_n;
  // NIBBLE_SM90_STREAM_K_WHOLE_WAVES sets how many whole waves a stream-K grid walks first
  // (sm90_stream_k_costs); the planner's own grids walk none (sm90_tiling.h, Sm90TileCosts).
  const int64_t whole_tiles = stream_k_whole_tiles(stream_k_costs, tiles, sm_count);
  best.stream_k = persistent_possible && stream_k_possible && t.splits == 1 && !best.multicast_a &&
                  (tiles - whole_tiles) * (k_pad / 128) >=
                      int64_t{kMinStreamKBlocksPerCta} * sm_count &&
                  (stream_k_costs.stream_k_only ||
                   (stream_k_pays_for_k &&
                    sm90_w4a8_stream_k_pays(t.tiles_m, t.tiles_n, sm_count, t.bm, weight_bits,
                                            heavy_kblocks)));
  best.whole_tiles = best.stream_k ? static_cast<int>(whole_tiles) : 0;
  best.persistent = best.stream_k || (t.splits == 1 && tiles > sm_count && persistent_possible);
  const int pair_tiles = t.tiles_m * ((t.tiles_n + 1) / 2);
  best.ctas = !best.persistent  ? t.tiles_m * t.tiles_n * t.splits
              : best.multicast_a ? 2 * std::min(pair_tiles, clusters[2])
                                 : sm_count;
  // The 16·v decoding: a shift and one LOP3 for two of a thread's eight int8 registers per word
  // pair, against offset_xor's seven instructions, in the instances sm90::high_nibble_instance
  // names (tiles of at most 128 tokens: 256-token ones gained nothing). Measured on the H200
  // against offset_xor, per channel: 0.84-0.96x the time at M = 64-256 and 0.87-0.89x at
  // M = 1024 with 128-token tiles. The sums are 16× the true ones: per channel and s32 keep them
  // over all of K, so K must keep within the s8×s8 int32 span; the f32 group format folds each
  // block's sums with s/16 (any K). NIBBLE_SM90_W4_DECODE=offset_xor keeps the exact decoding.
  const bool whole_k_sums = epilogue == W4A8Epilogue::per_channel || epilogue == W4A8Epilogue::s32;
  best.high_nibble = sm90::high_nibble_instance(best.bm, epilogue, weight_bits, a_e4m3) &&
                     (!whole_k_sums || k_pad <= max_int32_accumulation_k(DType::s8, DType::s8)) &&
                     !env_is("NIBBLE_SM90_W4_DECODE", "offset_xor");
  best.stages = best.bm == 256   ? stages_of<256>(epilogue, weight_bits, a_e4m3, best.persistent)
                : best.bm == 128 ? stages_of<128>(epilogue, weight_bits, a_e4m3, best.persistent)
                                 : stages_of<64>(epilogue, weight_bits, a_e4m3, best.persistent);
  return best;
}

std::string describe(const W4A8WgmmaPlan& plan) {
  return std::string(kernel_name(plan.weight_bits, plan.a_e4m3)) +
         " (wgmma + TMA, warp-specialised)" + (plan.high_nibble ? " high_nibble" : "") +
         " tile " + std::to_string(plan.bm) +
         "x128x128 (tokens x channels x K), 3 warpgroups, " + std::to_string(plan.stages) +
         " stages, grid " + std::to_string(plan.tiles_m) + "x" + std::to_string(plan.tiles_n) +
         (plan.splits > 1 ? " with split-K " + std::to_string(plan.splits) +
                                (plan.cluster_split ? " in a cluster" : " through a workspace") +
                                " (tiles alone would leave SMs idle)"
          : std::string(plan.multicast_a ? ", CTA pairs share the activation tile (TMA multicast)"
                                         : "") +
                (plan.stream_k ? ", stream-K: " + std::to_string(plan.ctas) +
                                     " persistent CTAs take " +
                                     stream_k_walk_words(plan.whole_tiles, plan.ctas)
                 : plan.persistent ? ", " + std::to_string(plan.ctas) +
                                         " persistent CTAs (the next tile's loads overlap the epilogue)"
                                   : ""));
}

void launch_sm90_w4a8(const W4A8Launch& l, Stream stream) {
  const char* name = kernel_name(l.weight_bits, l.a_e4m3);
  if (!sm90_w4a8_handles(l.epilogue, l.group, l.a_e4m3))
    nibble::detail::fail(ErrorCode::internal, std::string(name) + ": format not implemented here");
  // TMA stores need 16-bit values, a 16-byte aligned base and row pitch.
  const bool output_tma_storable = (l.d_dtype == DType::bf16 || l.d_dtype == DType::f16) &&
                                   reinterpret_cast<uintptr_t>(l.d) % 16 == 0 &&
                                   (l.ldd * 2) % 16 == 0;
  const W4A8WgmmaPlan plan = plan_sm90_w4a8(l.m, l.n_pad, l.k_pad, l.epilogue, l.device,
                                            l.weight_bits, l.a_e4m3, output_tma_storable);
  const auto kblocks = static_cast<cuuint64_t>(l.k_pad / 128);

  // Activations: (M, K) bytes, boxes of 128 bytes × BM rows with the 128-byte swizzle that the
  // wgmma descriptor expects; rows ≥ M and columns ≥ K read as zeros.
  const CUtensorMap map_a = make_tensor_map<2>(
      name, CU_TENSOR_MAP_DATA_TYPE_UINT8, l.a, {cuuint64_t(l.k), cuuint64_t(l.m)},
      {cuuint64_t(l.lda)}, {128u, cuuint32_t(plan.multicast_a ? plan.bm / 2 : plan.bm)},
      CU_TENSOR_MAP_SWIZZLE_128B, "the activations");
  // Weights, int4: 8×128 blocks of 512 bytes = 128 words; block (nb, kb) at
  // (nb·kblocks + kb)·512. int8: the (N, K) matrix, boxes of 128 bytes × 128 rows swizzled
  // like the activations; rows ≥ N and columns ≥ K read as zeros.
  const CUtensorMap map_w =
      l.weight_bits == 8
          ? make_tensor_map<2>(name, CU_TENSOR_MAP_DATA_TYPE_UINT8, l.w,
                               {cuuint64_t(l.k), cuuint64_t(l.n)}, {cuuint64_t(l.ldw)},
                               {128u, 128u}, CU_TENSOR_MAP_SWIZZLE_128B, "the int8 weights")
          : make_tensor_map<3>(name, CU_TENSOR_MAP_DATA_TYPE_UINT32, l.w,
                               {128u, kblocks, cuuint64_t(l.n_pad / 8)}, {512u, kblocks * 512u},
                               {128u, 1u, 16u}, CU_TENSOR_MAP_SWIZZLE_NONE, "the packed weights");
  // Group data: one row of N_pad values per 128-wide K block.
  CUtensorMap map_g;
  std::memset(&map_g, 0, sizeof(map_g));
  if (l.epilogue == W4A8Epilogue::group)
    map_g = make_tensor_map<2>(name, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, l.w_scales,
                               {cuuint64_t(l.n_pad), kblocks}, {cuuint64_t(l.n_pad) * 4},
                               {128u, 1u}, CU_TENSOR_MAP_SWIZZLE_NONE, "the group scales");
  if (l.epilogue == W4A8Epilogue::two_level)
    map_g = make_tensor_map<2>(name, CU_TENSOR_MAP_DATA_TYPE_UINT16, l.w_params,
                               {cuuint64_t(l.n_pad), kblocks}, {cuuint64_t(l.n_pad) * 2},
                               {128u, 1u}, CU_TENSOR_MAP_SWIZZLE_NONE,
                               "the two-level group parameters");

  sm90::W4A8WgmmaParams p;
  p.a_scales = l.a_scales;
  p.a_scale_step = l.a_per_tensor ? 0 : 1;
  p.w_scales = l.w_scales;
  p.bias = l.bias;
  p.bias_dtype = l.bias_dtype;
  p.d = l.d;
  p.ldd = l.ldd;
  p.d_dtype = l.d_dtype;
  p.m = static_cast<int>(l.m);
  p.n = static_cast<int>(l.n);
  p.kblocks = static_cast<int>(kblocks);
  p.kblocks_per_split = plan.kblocks_per_split;
  p.w_scale_dtype = l.w_scale_dtype;
  p.cluster_split = plan.cluster_split;
  p.overlap = overlap_cluster_split_launch(plan.cluster_split);
  p.multicast_a = plan.multicast_a;
  p.persistent = plan.persistent;
  p.tiles_m = plan.tiles_m;
  p.tiles_n = plan.tiles_n;
  p.high_nibble = plan.high_nibble;
  p.stream_k = plan.stream_k;
  p.whole_tiles = plan.whole_tiles;
  const SplitKWorkspace ws =
      sm90_tile_workspace(l.device, stream, plan.stream_k, plan.ctas, plan.bm, plan.splits,
                          plan.cluster_split, l.m, l.n, int64_t{plan.tiles_m} * plan.tiles_n);
  p.workspace = ws.partials;
  p.counters = ws.counters;
  const dim3 grid = plan.persistent    ? dim3(plan.ctas, 1, 1)
                    : plan.multicast_a ? dim3(2 * plan.tiles_m, (plan.tiles_n + 1) / 2, 1)
                                       : dim3(plan.tiles_m, plan.tiles_n, plan.splits);
  if (l.a_e4m3) {
    if (l.epilogue == W4A8Epilogue::group)
      return launch_epilogue_fp8<W4A8Epilogue::group>(plan.bm, map_a, map_w, map_g, p, grid, stream);
    return launch_epilogue_fp8<W4A8Epilogue::per_channel>(plan.bm, map_a, map_w, map_g, p, grid,
                                                          stream);
  }
  if (l.weight_bits == 8) {
    if (l.epilogue == W4A8Epilogue::s32)
      return launch_epilogue8<W4A8Epilogue::s32>(plan.bm, map_a, map_w, p, grid, stream);
    if (l.epilogue == W4A8Epilogue::per_channel)
      return launch_epilogue8<W4A8Epilogue::per_channel>(plan.bm, map_a, map_w, p, grid, stream);
    nibble::detail::fail(ErrorCode::internal,
                         "sm90_w8a8_gemm: int8 weights have per-channel or s32 epilogues only");
  }
  switch (l.epilogue) {
    case W4A8Epilogue::s32:
      return launch_epilogue<W4A8Epilogue::s32>(plan.bm, map_a, map_w, map_g, p, grid, stream);
    case W4A8Epilogue::per_channel:
      return launch_epilogue<W4A8Epilogue::per_channel>(plan.bm, map_a, map_w, map_g, p, grid,
                                                        stream);
    case W4A8Epilogue::group:
      return launch_epilogue<W4A8Epilogue::group>(plan.bm, map_a, map_w, map_g, p, grid, stream);
    case W4A8Epilogue::two_level:
      return launch_epilogue<W4A8Epilogue::two_level>(plan.bm, map_a, map_w, map_g, p, grid,
                                                      stream);
  }
}

}  // namespace nibble::cuda
