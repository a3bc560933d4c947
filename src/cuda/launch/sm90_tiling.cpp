#include "cuda/launch/sm90_tiling.h"

#include <algorithm>
#include <string>
#include <utility>

namespace nibble::cuda {

void set_k_splits(Sm90TileChoice& t, int kblocks, int splits) {
  t.kblocks_per_split = (kblocks + splits - 1) / splits;
  t.splits = (kblocks + t.kblocks_per_split - 1) / t.kblocks_per_split;
}

Sm90TileChoice choose_sm90_tiles(int64_t m, int64_t n_pad, int64_t k_pad, int sm_count,
                                 std::initializer_list<int> bms, int min_kblocks_per_split,
                                 Sm90ClusterSplitK cluster) {
  Sm90TileChoice best;
  int64_t best_cost = 0;
  const int64_t tiles_n = (n_pad + 127) / 128;
  for (int bm : bms) {
    const int64_t tiles_m = (m + bm - 1) / bm;
    const int64_t waves = (tiles_m * tiles_n + sm_count - 1) / sm_count;
    const int64_t cost = waves * (bm + 48);
    if (best.bm == 0 || cost < best_cost) {
      best_cost = cost;
      best.bm = bm;
      best.tiles_m = static_cast<int>(tiles_m);
      best.tiles_n = static_cast<int>(tiles_n);
    }
  }
  const int kblocks = static_cast<int>(k_pad / 128);
  const int tiles = best.tiles_m * best.tiles_n;
  int splits = 1;
  if (2 * tiles <= sm_count && cluster.clusters_at_once != nullptr) {
    const int most = std::min(kMaxSm90ClusterSplits, kblocks / cluster.min_kblocks_per_split);
    for (int s = most; s >= 2 && splits == 1; --s)
      if (tiles <= cluster.clusters_at_once[s]) splits = s;
    best.cluster_split = splits > 1;
  }
  if (2 * tiles <= sm_count && splits == 1)
    splits = std::clamp(std::min(sm_count / tiles, kblocks / min_kblocks_per_split), 1, 16);
  set_k_splits(best, kblocks, splits);
  return best;
}

Sm90TileChoice prefer_doubled_tile_split(const Sm90TileChoice& t, int64_t m, int64_t k_pad,
                                         int sm_count, int max_bm, Sm90ClusterSplitK cluster) {
  const int kblocks = static_cast<int>(k_pad / 128);
  const int bm2 = 2 * t.bm;
  if (t.splits != 1 || t.stream_k || bm2 > max_bm || cluster.clusters_at_once == nullptr ||
      int64_t{t.tiles_m} * t.tiles_n > sm_count || kblocks / 2 < cluster.min_kblocks_per_split)
    return t;
  const int64_t tiles_m2 = (m + bm2 - 1) / bm2;
  if (tiles_m2 * t.tiles_n > cluster.clusters_at_once[2]) return t;
  const int64_t unsplit = int64_t{kblocks} * (t.bm + 48);
  const int64_t doubled = int64_t{(kblocks + 1) / 2} * (bm2 + 48) + 7 * bm2;
  if (doubled >= unsplit) return t;
  Sm90TileChoice d = t;
  d.bm = bm2;
  d.tiles_m = static_cast<int>(tiles_m2);
  set_k_splits(d, kblocks, 2);
  d.cluster_split = d.splits > 1;
  return d;
}

int stream_k_whole_waves(int asked, int64_t tiles, int sm_count) {
  const int most = static_cast<int>(std::max<int64_t>(0, (tiles + sm_count - 1) / sm_count - 1));
  return std::clamp(asked < 0 ? most + 1 + asked : asked, 0, most);
}

std::string stream_k_walk_words(int whole_tiles, int ctas) {
  if (whole_tiles <= 0) return "equal ranges of the tiles' K blocks";
  const int waves = whole_tiles / ctas;
  return std::to_string(waves) + (waves == 1 ? " whole wave" : " whole waves") +
         " of tiles, then equal ranges of the other tiles' K blocks";
}

int64_t stream_k_whole_tiles(const Sm90TileCosts& costs, int64_t tiles, int sm_count) {
  if (!costs.forced_whole_waves) return 0;
  return int64_t{stream_k_whole_waves(*costs.forced_whole_waves, tiles, sm_count)} * sm_count;
}

bool sm90_w4a8_stream_k_pays(int tiles_m, int tiles_n, int sm_count, int bm, int weight_bits,
                             bool heavy_kblocks) {
  const int min_bm = weight_bits == 8 ? 256 : 64;
  const int64_t tiles = int64_t{tiles_m} * tiles_n;
  const bool one_wave = tiles <= sm_count;
  const double slowdown = heavy_kblocks && !one_wave ? 1.25 : 1.5;
  const int64_t tile_slots = (tiles + sm_count - 1) / sm_count * sm_count;
  return static_cast<double>(tiles) * slowdown <= static_cast<double>(tile_slots) &&
         bm >= min_bm && (one_wave || tiles_m <= 2 || heavy_kblocks);
}

Sm90TileChoice prefer_doubled_tile_stream_k(const Sm90TileChoice& t, int64_t m, int64_t k_pad,
                                            int sm_count, int max_bm, int weight_bits,
                                            bool heavy_kblocks) {
  constexpr double kStreamKTileCost = 1.25;
  const int bm2 = 2 * t.bm;
  const int64_t tiles = int64_t{t.tiles_m} * t.tiles_n;
  if (t.splits != 1 || t.stream_k || bm2 > max_bm || tiles <= sm_count ||
      sm90_w4a8_stream_k_pays(t.tiles_m, t.tiles_n, sm_count, t.bm, weight_bits, heavy_kblocks))
    return t;
  const int64_t tiles_m2 = (m + bm2 - 1) / bm2;
  const int64_t tiles2 = tiles_m2 * t.tiles_n;
  if (!sm90_w4a8_stream_k_pays(static_cast<int>(tiles_m2), t.tiles_n, sm_count, bm2,
                               weight_bits, heavy_kblocks) ||
      tiles2 * (k_pad / 128) < int64_t{kMinStreamKBlocksPerCta} * sm_count)
    return t;
  const double whole = static_cast<double>((tiles + sm_count - 1) / sm_count) * (t.bm + 48);
  const double ranges =
      static_cast<double>(tiles2) / sm_count * (bm2 + 48) * kStreamKTileCost;
  if (ranges >= whole) return t;
  Sm90TileChoice d = t;
  d.bm = bm2;
  d.tiles_m = static_cast<int>(tiles_m2);
  return d;
}

Sm90TileChoice choose_sm90_tiles_by_cost(int64_t m, int64_t n_pad, int64_t k_pad, int sm_count,
                                         const Sm90TileCosts& costs, int min_kblocks_per_split,
                                         Sm90ClusterSplitK cluster) {
  const int64_t tiles_n = (n_pad + 127) / 128;
  const int kblocks = static_cast<int>(k_pad / 128);
  Sm90TileChoice best;
  double best_cost = 0;
  bool any_cluster = false;
  // Keeps candidate c (its K split already set) for bm tokens a tile if it costs the least yet.
  const auto consider = [&](Sm90TileChoice c, int bm, int64_t tiles_m, double cost) {
    if (best.bm != 0 && cost >= best_cost) return;
    best_cost = cost;
    c.bm = bm;
    c.tiles_m = static_cast<int>(tiles_m);
    c.tiles_n = static_cast<int>(tiles_n);
    best = c;
  };
  for (const auto& [bm, per_kblock] : {std::pair{256, costs.kblock_256},
                                      std::pair{128, costs.kblock_128},
                                      std::pair{64, costs.kblock_64}}) {
    if (per_kblock <= 0) continue;
    const int64_t tiles_m = (m + bm - 1) / bm;
    const int64_t tiles = tiles_m * tiles_n;
    // Stream-K where whole tiles leave SMs idle and each CTA keeps enough K blocks: over all the
    // tiles, or after the whole waves asked for.
    const int64_t tile_slots = (tiles + sm_count - 1) / sm_count * sm_count;
    const int64_t whole_tiles = stream_k_whole_tiles(costs, tiles, sm_count);
    const int64_t units = (tiles - whole_tiles) * kblocks;
    if (costs.stream_k_slowdown > 0 &&
        static_cast<double>(tile_slots - tiles) >= kStreamKMinIdleShare * tile_slots &&
        units >= int64_t{kMinStreamKBlocksPerCta} * sm_count) {
      Sm90TileChoice c;
      c.kblocks_per_split = kblocks;
      c.stream_k = true;
      c.whole_tiles = static_cast<int>(whole_tiles);
      consider(c, bm, tiles_m,
               static_cast<double>(whole_tiles / sm_count) * kblocks * per_kblock +
                   static_cast<double>((units + sm_count - 1) / sm_count) * per_kblock *
                       costs.stream_k_slowdown +
                   costs.fixed + 2.0 + costs.stream_k_fixup_per_token * bm);
    }
    if (costs.stream_k_only) continue;
    for (int s = 1; s <= kMaxSm90ClusterSplits; ++s) {
      if (s > 1 && (cluster.clusters_at_once == nullptr ||
                    kblocks / s < cluster.min_kblocks_per_split))
        break;
      Sm90TileChoice c;
      set_k_splits(c, kblocks, s);
      if (c.splits != s) continue;  // the same split as a smaller s
      const int64_t slots = s == 1 ? sm_count : cluster.clusters_at_once[s];
      if (slots <= 0) continue;
      any_cluster = any_cluster || s > 1;
      const int64_t waves = (tiles + slots - 1) / slots;
      c.cluster_split = s > 1;
      consider(c, bm, tiles_m,
               static_cast<double>(waves) * (c.kblocks_per_split * per_kblock + costs.fixed +
                                             (s > 1 ? costs.cluster_reduce : 0)));
    }
  }
  if (costs.stream_k_only && best.bm == 0) {  // no stream-K candidate: the other choices
    Sm90TileCosts others = costs;
    others.stream_k_only = false;
    others.stream_k_slowdown = 0;
    return choose_sm90_tiles_by_cost(m, n_pad, k_pad, sm_count, others, min_kblocks_per_split,
                                     cluster);
  }
  if (!any_cluster && best.bm != 0 && !best.stream_k)  // no cluster runs here: the workspace split
    return choose_sm90_tiles(m, n_pad, k_pad, sm_count, {best.bm}, min_kblocks_per_split, {});
  return best;
}

}  // namespace nibble::cuda
