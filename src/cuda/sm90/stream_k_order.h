// The order in which a stream-K CTA of the swap-AB wgmma kernels (sm90_w4a8_gemm,
// sm90_weight_only_gemm) computes its segments (the schedule itself: tile_schedule.cuh), as plain
// functions of the CTA and the kernel's parameters, so that the host tests check the same code.
//
// CTA c of C walks, in this order:
//   1. its whole tiles below whole_tiles: c, c + C, ... (whole waves; usually none);
//   2. the interior of its range: the tiles the range covers from K block 0 to the last;
//   3. its piece: the end of the tile its range starts inside, stored as a partial;
//   4. its owned start: K blocks [0, e) of the tile its range ends inside, to which it adds the
//      partials of the CTAs after it before storing the tile.
//
// Why the interiors first ("deferred" pieces). Walked in unit order (piece, interior, owned
// start), CTA c reads K block (x_c + t) mod kblocks at step t, x_c its range's offset into its
// first tile: CTAs on token tiles of one channel tile read each weight block at different times,
// up to a whole tile's K blocks apart, and at M = 1024 on an H200 each weight block came from
// DRAM about twice (Nsight Compute: 88 MB against 49 as whole tiles, w4a8_pc 4096×14336;
// docs/kernels.md). With the interiors first, every CTA starts at K block 0 and the interiors
// advance in waves, in step, as whole tiles do, and stream_k_tile numbers the tiles so that
// those of one wave are neighbours in band_raster order, as whole tiles' are. The piece then
// comes late, shortly before its owner needs it, and the owner should seldom wait for it: the
// ranges are of equal length (± 1 unit), a CTA finishes its piece before its range ends, and
// the owner's range ends with its owned start (not timed on its own).
//
// Everything here is a function of blockIdx.x, gridDim.x, the step and the kernel parameters:
// uniform across the CTA, so ptxas keeps the walks' ring and wgmma descriptor arithmetic on the
// uniform datapath. (A list of segments in shared memory lost it: the f32 group kernel's K loop
// went from 481 to 514 instructions per two K blocks, docs/kernels.md.)
#pragma once

#include "common/host_device.h"

namespace nibble::cuda::sm90 {

/// K blocks [kb_begin, kb_end) of the output tile at position tile_seq in band_raster order.
struct TileSegment {
  int tile_seq = 0, kb_begin = 0, kb_end = 0;
};

/// The first unit of stream-K range `cta` of `ctas` over `units` units (the first units % ctas
/// ranges one unit longer).
NIBBLE_HOST_DEVICE_INLINE int stream_k_start(int cta, int ctas, int units) {
  const int q = units / ctas, r = units % ctas;
  return cta * q + (cta < r ? cta : r);
}

/// The units (tile, K block) cut into stream-K ranges: those of all tiles after whole_tiles.
NIBBLE_HOST_DEVICE_INLINE int stream_k_units(int tile_count, int whole_tiles, int kblocks) {
  return (tile_count - whole_tiles) * kblocks;
}

/// The stream-K range (CTA) that holds unit u: the inverse of stream_k_start.
NIBBLE_HOST_DEVICE_INLINE int stream_k_range_of(int u, int ctas, int units) {
  const int q = units / ctas, r = units % ctas, long_units = r * (q + 1);
  return u < long_units ? u / (q + 1) : r + (u - long_units) / q;
}

/// The band_raster position (among the ranges' tiles) of the tile whose first K block is unit
/// v · kblocks of the ranges. Each range starts n or n + 1 tiles (n = units / ctas / kblocks);
/// the i-th tile that range c starts goes to position i · ctas + c for i < n, as whole tiles
/// would in wave i, and the (n + 1)-th ones follow in range order. So the CTAs' interiors at step
/// i are neighbours in band_raster order, token tiles of the same channel tiles, which each
/// weight block is read for at about the same time, as whole tiles are.
NIBBLE_HOST_DEVICE_INLINE int stream_k_tile(int v, int ctas, int units, int kblocks) {
  const int c = stream_k_range_of(v * kblocks, ctas, units);
  // The first tile that range c starts; as many tiles start in the ranges before it.
  const int first = (stream_k_start(c, ctas, units) + kblocks - 1) / kblocks;
  const int n = units / ctas / kblocks, i = v - first;
  return i < n ? i * ctas + c : n * ctas + (first - n * c);
}

/// Segment number `step` (0, 1, ...) of stream-K CTA `cta` of `ctas`, in the order above; false
/// past the CTA's last. whole_tiles is a multiple of ctas.
NIBBLE_HOST_DEVICE_INLINE bool stream_k_segment(int cta, int ctas, int step, int tile_count,
                                                int whole_tiles, int kblocks, TileSegment& s) {
  const int whole_steps = whole_tiles / ctas;
  if (step < whole_steps) {
    s = TileSegment{cta + step * ctas, 0, kblocks};
    return true;
  }
  step -= whole_steps;
  const int units = stream_k_units(tile_count, whole_tiles, kblocks);
  const int begin = stream_k_start(cta, ctas, units), end = stream_k_start(cta + 1, ctas, units);
  // The range's interior: tiles [first, last) in unit order, whole.
  const int first = (begin + kblocks - 1) / kblocks, last = end / kblocks;
  const int interiors = last > first ? last - first : 0;
  int v = -1, kb_begin = 0, kb_end = kblocks;
  if (step < interiors) {
    v = first + step;
  } else {
    step -= interiors;
    const int piece_kb = begin % kblocks;
    if (piece_kb != 0 && begin < end) {  // the range starts inside a tile: the piece
      if (step == 0) {
        v = begin / kblocks;
        kb_begin = piece_kb;
        kb_end = piece_kb + (end - begin) < kblocks ? piece_kb + (end - begin) : kblocks;
      }
      --step;
    }
    // The range ends inside a tile whose start it covers: the owned start.
    if (end % kblocks != 0 && last >= first && step == 0) {
      v = last;
      kb_end = end % kblocks;
    }
  }
  if (v < 0) return false;
  s = TileSegment{whole_tiles + stream_k_tile(v, ctas, units, kblocks), kb_begin, kb_end};
  return true;
}

}  // namespace nibble::cuda::sm90
