// The stream-K walk of the sm90 wgmma kernels (src/cuda/sm90/stream_k_order.h), checked on the
// CPU: the segments of all CTAs cover every unit (tile, K block) exactly once, each CTA walks
// whole tiles, interior, piece, owned start in that order, and the owner's fix-up
// (stream_k_add_partials in tile_schedule.cuh: the ranges after the owner's, in K order) finds
// each tile's pieces where the walk put them.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "cuda/sm90/stream_k_order.h"

namespace {

using nibble::cuda::sm90::stream_k_segment;
using nibble::cuda::sm90::stream_k_range_of;
using nibble::cuda::sm90::stream_k_start;
using nibble::cuda::sm90::stream_k_tile;
using nibble::cuda::sm90::stream_k_units;
using nibble::cuda::sm90::TileSegment;

std::vector<TileSegment> walk(int cta, int ctas, int tiles, int whole_tiles, int kblocks) {
  std::vector<TileSegment> segs;
  TileSegment s;
  for (int step = 0; stream_k_segment(cta, ctas, step, tiles, whole_tiles, kblocks, s); ++step) {
    segs.push_back(s);
    if (segs.size() > size_t(tiles) + 2) break;  // a runaway walk fails below, not forever
  }
  return segs;
}

/// The segments of range `cta` in unit order: the definition the walk reorders (tiles placed
/// by stream_k_tile).
std::vector<TileSegment> unit_order(int cta, int ctas, int tiles, int whole_tiles, int kblocks) {
  std::vector<TileSegment> segs;
  for (int t = cta; t < whole_tiles; t += ctas) segs.push_back({t, 0, kblocks});
  const int units = stream_k_units(tiles, whole_tiles, kblocks);
  const int begin = stream_k_start(cta, ctas, units), end = stream_k_start(cta + 1, ctas, units);
  for (int u = begin; u < end;) {
    const int tile = u / kblocks, kb = u % kblocks;
    const int kb_end = std::min(kblocks, kb + (end - u));
    segs.push_back({whole_tiles + stream_k_tile(tile, ctas, units, kblocks), kb, kb_end});
    u += kb_end - kb;
  }
  return segs;
}

void check(int ctas, int tiles, int whole_waves, int kblocks) {
  SCOPED_TRACE(testing::Message() << "ctas " << ctas << " tiles " << tiles << " whole waves "
                                  << whole_waves << " kblocks " << kblocks);
  const int whole_tiles = whole_waves * ctas;
  ASSERT_LE(whole_tiles, tiles);
  const int units = stream_k_units(tiles, whole_tiles, kblocks);
  // stream_k_tile permutes the ranges' tiles, and range c's i-th tile started goes to i·ctas + c
  // while every range starts more than i.
  const int range_tiles = tiles - whole_tiles, n = units / ctas / kblocks;
  std::vector<int> placed(size_t(range_tiles), 0);
  for (int v = 0; v < range_tiles; ++v) {
    const int t = stream_k_tile(v, ctas, units, kblocks);
    ASSERT_TRUE(t >= 0 && t < range_tiles) << "tile " << v << " placed at " << t;
    ++placed[size_t(t)];
    const int c = stream_k_range_of(v * kblocks, ctas, units);
    ASSERT_TRUE(stream_k_start(c, ctas, units) <= v * kblocks &&
                v * kblocks < stream_k_start(c + 1, ctas, units));
    const int i = v - (stream_k_start(c, ctas, units) + kblocks - 1) / kblocks;
    if (i < n) {
      EXPECT_EQ(t, i * ctas + c);
    }
  }
  for (int t = 0; t < range_tiles; ++t) ASSERT_EQ(placed[size_t(t)], 1) << "position " << t;
  std::vector<int> covered(size_t(tiles) * kblocks, 0);
  // Per tile: its owner and the length it computes, and each CTA's piece.
  std::map<int, std::pair<int, int>> owner;
  std::map<int, TileSegment> piece_of;
  for (int c = 0; c < ctas; ++c) {
    const auto segs = walk(c, ctas, tiles, whole_tiles, kblocks);
    auto sorted = segs, expected = unit_order(c, ctas, tiles, whole_tiles, kblocks);
    auto by_unit = [](const TileSegment& a, const TileSegment& b) {
      return std::tie(a.tile_seq, a.kb_begin) < std::tie(b.tile_seq, b.kb_begin);
    };
    std::sort(sorted.begin(), sorted.end(), by_unit);
    std::sort(expected.begin(), expected.end(), by_unit);
    ASSERT_EQ(sorted.size(), expected.size()) << "cta " << c;
    for (size_t i = 0; i < sorted.size(); ++i) {
      EXPECT_EQ(sorted[i].tile_seq, expected[i].tile_seq) << "cta " << c;
      EXPECT_EQ(sorted[i].kb_begin, expected[i].kb_begin) << "cta " << c;
      EXPECT_EQ(sorted[i].kb_end, expected[i].kb_end) << "cta " << c;
    }
    // The order: whole tiles (whole waves, then the interior), the piece, the owned start.
    int phase = 0;  // 0 whole, 1 piece, 2 owned start
    for (const TileSegment& s : segs) {
      ASSERT_LT(s.kb_begin, s.kb_end) << "cta " << c << ": an empty segment";
      ASSERT_LE(s.kb_end, kblocks);
      ASSERT_LT(s.tile_seq, tiles);
      const bool whole = s.kb_begin == 0 && s.kb_end == kblocks;
      const int this_phase = whole ? 0 : s.kb_begin > 0 ? 1 : 2;
      EXPECT_GE(this_phase, phase) << "cta " << c << " tile " << s.tile_seq;
      EXPECT_TRUE(this_phase == 0 || this_phase > phase) << "cta " << c << ": two parts";
      phase = this_phase;
      if (this_phase == 0 && s.tile_seq < whole_tiles) {
        EXPECT_EQ(s.tile_seq % ctas, c);
      }
      if (this_phase == 1) piece_of[c] = s;
      if (this_phase == 2) owner[s.tile_seq] = {c, s.kb_end};
      for (int kb = s.kb_begin; kb < s.kb_end; ++kb) ++covered[size_t(s.tile_seq) * kblocks + kb];
    }
  }
  for (size_t u = 0; u < covered.size(); ++u)
    ASSERT_EQ(covered[u], 1) << "tile " << u / kblocks << " K block " << u % kblocks;
  // The owner's fix-up walks the ranges after its own, as stream_k_add_partials does.
  size_t pieces_found = 0;
  for (const auto& [tile, own] : owner) {
    int k = own.second;
    for (int c = own.first + 1; k < kblocks && c < ctas; ++c) {
      ASSERT_TRUE(piece_of.count(c)) << "tile " << tile << ": CTA " << c << " has no piece";
      const TileSegment& p = piece_of.at(c);
      EXPECT_EQ(p.tile_seq, tile);
      EXPECT_EQ(p.kb_begin, k);
      const int len = stream_k_start(c + 1, ctas, units) - stream_k_start(c, ctas, units);
      EXPECT_EQ(p.kb_end, std::min(kblocks, k + len));
      k += len;
      ++pieces_found;
    }
    EXPECT_GE(k, kblocks) << "tile " << tile;
  }
  EXPECT_EQ(pieces_found, piece_of.size()) << "a piece that no owner adds";
}

TEST(Sm90StreamKOrder, CoversEveryUnitOnceInteriorsFirst) {
  // Shapes of the planners' picks (10240×8192 at M = 256 in 128-token tiles: 160 tiles of 64
  // K blocks on 132 SMs; 5120×5120: 80 of 40), ranges shorter than a tile, exact fits.
  check(132, 160, 0, 64);
  check(132, 80, 0, 40);
  check(132, 172, 0, 32);
  check(132, 296, 0, 28);
  check(132, 320, 2, 64);
  check(132, 264, 0, 16);  // two tiles per CTA exactly: no pieces
  check(132, 133, 0, 4);
  check(114, 1024, 0, 112);
  check(7, 3, 0, 5);  // ranges of 2 units: several pieces per tile
}

TEST(Sm90StreamKOrder, RandomShapes) {
  std::mt19937 rng(std::random_device{}());
  for (int i = 0; i < 300; ++i) {
    const int ctas = 1 + int(rng() % 140);
    const int kblocks = 1 + int(rng() % 130);
    const int waves = int(rng() % 3);
    const int tiles = waves * ctas + 1 + int(rng() % 400);
    check(ctas, tiles, waves, kblocks);
    if (testing::Test::HasFailure()) break;
  }
}

}  // namespace
