// Host interface of the sm90_weight_only_gemm family (kernel: cuda/sm90/sm90_weight_only_gemm.cuh):
// the wgmma + TMA W4A16 / W8A16 GEMM for Hopper, fed by the same WeightOnlyLaunch as
// sm80_weight_only_gemm (one packed weight serves both).
#pragma once

#include <cstdint>
#include <string>

#include "cuda/launch/sm80_weight_only_gemm.h"
#include "nibble/types.h"

namespace nibble::cuda {

/// BM tokens × 128 channels per CTA, one tile (or one K range of it, with split-K) per CTA.
struct WeightOnlyWgmmaPlan {
  int bm = 0, stages = 0, tiles_m = 0, tiles_n = 0, splits = 1, kblocks_per_split = 0;
  bool cluster_split = false;  ///< split-K tiles are thread-block clusters (reduced over DSMEM)
  int slots = 0;               ///< CTAs (or split clusters) the GPU runs at once: one wave
  /// Persistent CTAs: `slots` CTAs walk the tiles of an unsplit grid of more tiles than SMs,
  /// or (stream_k) take equal ranges of the tiles' K blocks after whole_tiles whole tiles
  /// (whole waves of `slots`).
  bool persistent = false;
  bool stream_k = false;
  int whole_tiles = 0;
};
/// The plan for 4- or 8-bit weights on `device` (its SM count, and how many clusters of the
/// kernel it runs at once).
WeightOnlyWgmmaPlan plan_sm90_weight_only(int64_t m, int64_t n_pad, int64_t k_pad,
                                          int weight_bits, int device);
std::string describe(const WeightOnlyWgmmaPlan& plan);

/// Whether a weight-only call runs on sm90_weight_only_gemm: a Hopper GPU with sm_90a code, at
/// M ≥ kSm90WeightOnlyMinTokens (below it the call is a weight stream that sm80's thin split-K
/// tiles serve). NIBBLE_WEIGHT_ONLY_KERNEL=sm80_weight_only_gemm|sm90_weight_only_gemm forces
/// one where it can run.
bool use_sm90_weight_only(int device, int64_t m);
constexpr int64_t kSm90WeightOnlyMinTokens = 33;

void launch_sm90_weight_only(const WeightOnlyLaunch& launch, Stream stream);

}  // namespace nibble::cuda
