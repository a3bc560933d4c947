// The order in which a GEMM grid's CTAs visit output tiles.
#pragma once

namespace nibble::cuda {

struct TileCoord {
  int m, n;
};

/// Grouped rasterization: CTA `linear` (launch order) takes tile (m, n) such that consecutive
/// CTAs walk a band of 8 M tiles down one N column before moving to the next column, so the
/// CTAs resident at one time share their activation rows and weight columns in L2.
__device__ __forceinline__ TileCoord band_raster(int linear, int tiles_m, int tiles_n) {
  constexpr int kBand = 8;
  const int band = linear / (kBand * tiles_n), band_m0 = band * kBand;
  const int band_rows = min(kBand, tiles_m - band_m0);
  const int in_band = linear - band * kBand * tiles_n;
  return {band_m0 + in_band % band_rows, in_band / band_rows};
}

/// band_raster for a grid of CTA pairs (thread-block clusters of (2, 1, 1)) whose two CTAs share
/// an M tile and take adjacent N tiles: the grid is (2 · tiles_m, ceil(tiles_n / 2)); pair
/// y · tiles_m + x / 2 takes band_raster's tile (m, n') over the pair columns, and CTA x % 2 of
/// it N tile 2n' + x % 2 (which is tiles_n itself, past the last tile, when tiles_n is odd).
__device__ __forceinline__ TileCoord pair_band_raster(unsigned x, unsigned y, int tiles_m,
                                                      int pair_columns) {
  const TileCoord pair = band_raster(static_cast<int>(y) * tiles_m + static_cast<int>(x / 2),
                                     tiles_m, pair_columns);
  return {pair.m, 2 * pair.n + static_cast<int>(x % 2)};
}

}  // namespace nibble::cuda
