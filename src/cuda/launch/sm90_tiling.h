// The grid of the swap-AB wgmma kernels (sm90_w4a8_gemm, sm90_weight_only_gemm): BM tokens ×
// 128 weight channels per CTA, one output tile (or one K range of it) per CTA.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

namespace nibble::cuda {

struct Sm90TileChoice {
  int bm = 0, tiles_m = 0, tiles_n = 0, splits = 1, kblocks_per_split = 0;
  bool cluster_split = false;  ///< the splits of a tile are one thread-block cluster along z
  /// sm_count persistent CTAs take equal ranges of the tiles' K blocks (cuda/sm90/
  /// tile_schedule.cuh); splits is then 1. The first whole_tiles tiles (whole waves: a multiple
  /// of sm_count) go whole first, the ranges cover the rest.
  bool stream_k = false;
  int whole_tiles = 0;
};

/// The whole waves a stream-K grid of `tiles` tiles on sm_count SMs walks before its ranges:
/// `asked` clipped to 0..⌈tiles / sm_count⌉ − 1 (the ranges keep the last wave at least);
/// a negative `asked` counts from that most (−1: the most, −2: one less).
int stream_k_whole_waves(int asked, int64_t tiles, int sm_count);

/// How a stream-K grid of `ctas` CTAs walks, for the plans' descriptions: "equal ranges of the
/// tiles' K blocks", after "<whole_tiles / ctas> whole waves of tiles" where there are some.
std::string stream_k_walk_words(int whole_tiles, int ctas);

/// Cuts `kblocks` K blocks into `splits` ranges of equal length (rounded up): sets
/// t.kblocks_per_split and t.splits, which is smaller than asked where the rounded-up ranges
/// cover K sooner (32 blocks in 7: 5 of 5 and one of 2, so 7 — but 32 in 9: 4 × 8, so 8).
void set_k_splits(Sm90TileChoice& t, int kblocks, int splits);

/// The most splits of a cluster split tile (the portable cluster size).
constexpr int kMaxSm90ClusterSplits = 8;
/// K blocks (128 of K) each split of a cluster split tile keeps at least: with 3 splits of
/// K = 4096 (10–11 blocks each) sm90_w4a8_gemm ran 9.6–9.8 µs on 4096×4096 at M = 64 against
/// 13.2 unsplit (H100, 2026-11-24); shorter ranges were not measured.
constexpr int kMinKBlocksPerSm90ClusterSplit = 8;

/// Cluster split-K, for kernels that can reduce a tile's partials over distributed shared
/// memory: clusters_at_once[s] (s = 2..kMaxSm90ClusterSplits) is how many clusters of s CTAs the
/// GPU runs at once, and each split keeps at least min_kblocks_per_split K blocks.
struct Sm90ClusterSplitK {
  const int* clusters_at_once = nullptr;
  int min_kblocks_per_split = 0;
};

/// The token tile among `bms` with the least estimated time — waves of CTAs × the time of one
/// tile, its tokens plus a fixed part (the weight tile's stream and conversion, pipeline fill
/// and epilogue: about 48 tokens' worth of MMA) — and split-K when the tiles alone leave half
/// the SMs idle: as many splits as fit in one wave, at most 16, each at least
/// `min_kblocks_per_split` 128-wide K blocks. With `cluster` (clusters_at_once not null) the
/// splits are preferably one cluster per tile: the most splits (2..8) whose clusters all run in
/// one wave and keep cluster.min_kblocks_per_split blocks each; the workspace split applies
/// where no cluster split does.
Sm90TileChoice choose_sm90_tiles(int64_t m, int64_t n_pad, int64_t k_pad, int sm_count,
                                 std::initializer_list<int> bms, int min_kblocks_per_split,
                                 Sm90ClusterSplitK cluster = {});

/// A one-wave unsplit grid `t` (from choose_sm90_tiles) traded for tiles of twice the tokens
/// with K cut in two, the two halves of a tile one cluster: as many CTAs, each converting half
/// as many weight blocks for twice the tokens. For kernels whose per-block cost beyond the MMA
/// is mostly the weights' stream and conversion (int4 weights). Taken where choose_sm90_tiles'
/// estimate — (BM + 48) a K block — says so with the cluster reduction counted as 7 K blocks'
/// worth of tokens per token of the doubled tile (kblocks · (BM + 48) against ⌈kblocks / 2⌉ ·
/// (2·BM + 48) + 7 · 2·BM): K of at least 38 blocks at BM = 64. Fitted to the H100's forced
/// tiles at M = 256 (bench/results/h100_sm90_token_tile_ab_646796c.json): 4096×14336 ran 27.4 µs
/// as 128 tokens × 2 splits against 33.8 as 64 unsplit, 4096×4096 13.9 against 13.6. Measured
/// on the H200 (bench/results/h200_sm90_w4a8_doubled_split_tile_ab.txt, per channel): 4096×14336
/// M = 256 35.3 → 26.9 µs, 5120×13824 M = 128 34.2 → 26.1, 8192×28672 M = 128 65.9 → 47.1;
/// the other cells of M = 128–512 on five layers level or better. Returns
/// `t` unchanged where the doubled tile would exceed max_bm, its clusters would not all run at
/// once, or a split would keep fewer than cluster.min_kblocks_per_split blocks.
Sm90TileChoice prefer_doubled_tile_split(const Sm90TileChoice& t, int64_t m, int64_t k_pad,
                                         int sm_count, int max_bm, Sm90ClusterSplitK cluster);

/// The time of one CTA of a kernel, in any unit: kblock_<bm> per 128-wide K block of a bm-
/// token tile (bm = 64, 128, 256; 0 where the kernel has no such tile), plus `fixed` per CTA
/// (launch, pipeline fill, epilogue) and `cluster_reduce` per split tile's reduction.
/// stream_k_slowdown > 0 makes stream-K a candidate: sm_count CTAs of ceil(tiles · K blocks /
/// sm_count) K blocks each at stream_k_slowdown times the K block's cost (a CTA's segments
/// each drain the pipeline), plus `fixed` and the fix-up: stream_k_fixup_per_token · bm (a
/// partial tile of bm × 128 f32 stored to L2 and read back by its owner, which the owners all
/// do at the end) and 2 more. forced_whole_waves (measurements): the stream-K grids walk that
/// many whole waves of tiles first (stream_k_whole_tiles; each kblocks · the K block's cost) and
/// cut only the rest into ranges. Unforced they take none: walking the most whole waves first,
/// the fastest token tile ran 0.98–1.45× the time of the fastest other schedule on 20 cells of
/// W4A8 and W4A16 (H100, 2026-12-07, bench/results/h100_sm90_tile_sweep_94f5861.txt), faster on
/// two only (0.98×, 0.99×). stream_k_only leaves only the stream-K candidates.
struct Sm90TileCosts {
  double kblock_64 = 0, kblock_128 = 0, kblock_256 = 0, fixed = 0, cluster_reduce = 0;
  double stream_k_slowdown = 0, stream_k_fixup_per_token = 0;
  bool stream_k_only = false;
  std::optional<int> forced_whole_waves = std::nullopt;
};

/// The tiles a stream-K grid of `tiles` tiles on sm_count SMs walks whole before its ranges:
/// the whole waves costs.forced_whole_waves asks for (stream_k_whole_waves), else none.
int64_t stream_k_whole_tiles(const Sm90TileCosts& costs, int64_t tiles, int sm_count);

/// Stream-K is a candidate where whole tiles would leave at least this share of the SMs' tile
/// slots idle (3% at 512 tiles on 132 SMs: the fix-ups would cost about what balance gains),
/// with ranges of at least kMinStreamKBlocksPerCta K blocks.
constexpr double kStreamKMinIdleShare = 0.1;
constexpr int kMinStreamKBlocksPerCta = 4;

/// Whether sm90_w4a8_gemm's planner trades an unsplit grid of tiles_m × tiles_n whole tiles of
/// `bm` tokens (weights of `weight_bits`) for stream-K on sm_count SMs: only where the tiles
/// fill at most 1 / 1.5 of the SMs' tile slots (their waves, the last one whole: a one-wave grid
/// of at most 88 tiles on 132 SMs, or a two-wave one of 133 to 176), and for int8 weights only
/// 256-token tiles (their smaller tiles already stream the weights near the copy ceiling). A
/// grid of more than one wave only with at most 2 token tiles: more token tiles read each
/// channel tile's weight blocks from DRAM more often in ranges than whole tiles in band_raster
/// order do (w4a8_pc 4096×14336 at M = 1024, 8 token tiles of 128, ran 89 µs in ranges on an
/// H100, 2026-12-08, against 72.2 whole the day before).
/// heavy_kblocks: K blocks that cost several times per channel's (the f32 group format with
/// int8 activations folds each block's sums into f32: 443 instructions per two K blocks against
/// 128), so the SMs a grid leaves idle cost more than the ranges' fix-ups: a grid of more than
/// one wave takes stream-K where its tiles fill at most 1 / 1.25 of the slots, whatever its
/// token tiles (H100, 2026-12-08, bench/results/h100_ab_stream_k_interiors_first_7073a8e.txt:
/// 192 tiles of 128 tokens ran 0.90× the time of whole tiles on 6144×4096 at M = 512 and 0.92×
/// on 12288×4096 at M = 256, 296 0.92× on 18944×3584 at M = 256; fuller grids lost, 216 tiles
/// 1.04×, 448 1.03×, or gained less than 5%, 320 0.95×, 432 0.97×). One wave keeps 1 / 1.5
/// (96 tiles of 6144×4096 at M = 256 ran 1.05× in ranges).
/// The measurements are in plan_sm90_w4a8; the caller checks that every CTA keeps
/// kMinStreamKBlocksPerCta K blocks.
bool sm90_w4a8_stream_k_pays(int tiles_m, int tiles_n, int sm_count, int bm, int weight_bits,
                             bool heavy_kblocks);

/// An unsplit grid `t` of whole tiles in more than one wave traded for tiles of twice the tokens
/// (at most max_bm) in stream-K ranges, where stream-K pays for the doubled grid but not for
/// `t`, and the estimate of choose_sm90_tiles ((BM + 48) per K block) says so with the ranges'
/// K blocks at 1.25×: ⌈tiles / sm_count⌉ · (BM + 48) against tiles₂ / sm_count · (2·BM + 48) ·
/// 1.25. On 132 SMs, 320 tiles of 64 tokens (3 waves) against 160 of 128 in ranges: w4a8_g128
/// 10240×8192 at M = 256 ran 59.3 µs against 84.4 (H100, 2026-12-07,
/// bench/results/h100_sm90_tile_sweep_94f5861.txt); with heavy_kblocks, 384 tiles of 64 tokens
/// of 12288×4096 at M = 256 against 192 of 128 in ranges, 40.9 µs against 44.5 (H100,
/// 2026-12-08). One-wave grids are left as they are (not measured).
Sm90TileChoice prefer_doubled_tile_stream_k(const Sm90TileChoice& t, int64_t m, int64_t k_pad,
                                            int sm_count, int max_bm, int weight_bits,
                                            bool heavy_kblocks);

/// The token tile and cluster split count (1..kMaxSm90ClusterSplits, each split at least
/// cluster.min_kblocks_per_split K blocks) with the least estimated time: waves × the time of a
/// CTA, where a wave is sm_count CTAs unsplit and clusters_at_once[s] clusters of s splits, so
/// a last wave filled by a few CTAs costs a whole one (wave quantization). Without a cluster
/// split that fits at all (clusters_at_once all 0), the unsplit tiles fall back to
/// choose_sm90_tiles' workspace split.
Sm90TileChoice choose_sm90_tiles_by_cost(int64_t m, int64_t n_pad, int64_t k_pad, int sm_count,
                                         const Sm90TileCosts& costs, int min_kblocks_per_split,
                                         Sm90ClusterSplitK cluster);

}  // namespace nibble::cuda
