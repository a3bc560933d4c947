// The grid of the swap-AB wgmma kernels (sm90_w4a8_gemm, sm90_weight_only_gemm): BM tokens ×
// 128 weight channels per CTA, one output tile (or one K range of it) per CTA.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace nibble::cuda {

struct Sm90TileChoice {
  int bm = 0, tiles_m = 0, tiles_n = 0, splits = 1, kblocks_per_split = 0;
};

/// The token tile among `bms` with the least estimated time — waves of CTAs × the time of one
/// tile, its tokens plus a fixed part (the weight tile's stream and conversion, pipeline fill
/// and epilogue: about 48 tokens' worth of MMA) — and split-K when the tiles alone leave half
/// the SMs idle: as many splits as fit in one wave, at most 16, each at least
/// `min_kblocks_per_split` 128-wide K blocks.
Sm90TileChoice choose_sm90_tiles(int64_t m, int64_t n_pad, int64_t k_pad, int sm_count,
                                 std::initializer_list<int> bms, int min_kblocks_per_split);

}  // namespace nibble::cuda
