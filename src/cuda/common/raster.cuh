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

}  // namespace nibble::cuda
