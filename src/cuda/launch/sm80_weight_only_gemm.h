// Host interface of the sm80_weight_only_gemm family (kernel: cuda/sm80/sm80_weight_only_gemm.cuh):
// W4A16 and W8A16 on 16-bit tensor cores.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "nibble/types.h"

namespace nibble::cuda {

namespace sm80 {
/// How the main loop turns stored unsigned integers u into 16-bit weights (see the kernel).
///   per_channel  w = u − c exactly (c = 8 or 128), the channel scale multiplies the f32 sum
///   group_scale  w = (u − c) · s[g]          symmetric group-wise
///   group_zero   w = (u − z[g]) · s[g]       asymmetric, integer zero (4-bit only)
///   group_fzp    w = (u − 8) · s[g] + z[g]   float zero, tinygemm style (4-bit only)
enum class WeightOnlyDequant : int { per_channel, group_scale, group_zero, group_fzp };
}  // namespace sm80

/// One validated call: raw pointers of the operands (see the kernel header for layouts).
struct WeightOnlyLaunch {
  int device = 0;
  DType x_dtype = DType::bf16;  ///< bf16 or f16: the tensor-core input type
  int bits = 4;                 ///< 4 (w4_mma16_k128) or 8 (w8_mma16_k128)
  sm80::WeightOnlyDequant dequant = sm80::WeightOnlyDequant::per_channel;
  int group = 0;                ///< group size (0 per channel)
  int64_t m = 0, n = 0, k = 0, n_pad = 0, k_pad = 0;
  const void* x = nullptr;
  int64_t ldx = 0;              ///< elements
  const void* w = nullptr;
  const float* w_scales = nullptr;
  const float* w_zeros = nullptr;
  const void* bias = nullptr;
  DType bias_dtype = DType::f32;
  void* d = nullptr;
  int64_t ldd = 0;              ///< elements
  DType d_dtype = DType::bf16;
};

/// log2 of a group size (a power of two), 0 per channel: the kernels' group index is k >> it.
constexpr int group_shift(int group) {
  int s = 0;
  while (group > 0 && (1 << s) < group) ++s;
  return s;
}

/// What the split-K choice knows of the GPU for the planned tile's instance: its SM count, how
/// many CTAs of the instance one SM holds (registers and shared memory, from the occupancy
/// calculator) and how many clusters of s of its CTAs run at once (clusters_at_once[s],
/// s = 2..16; 0 for the sizes the GPU does not run, whose split tiles use the workspace).
struct WeightOnlyOccupancy {
  int sm_count = 0;
  int ctas_per_sm = 0;
  std::array<int, 17> clusters_at_once{};  // 16 = kMaxClusterSplitK (cuda/common/split_k.cuh)
};

/// The occupancy of the sm80_weight_only_gemm instance of tile `tile` for `weight_bits`-bit
/// weights on `device` (queried once per device, tile and width, then cached).
WeightOnlyOccupancy sm80_weight_only_occupancy(int device, int tile, int weight_bits);

/// The tile and split-K choice.
struct WeightOnlyPlan {
  int tile = 0, bm = 0, bn = 0, stages = 0, warps = 0;
  int tiles_m = 0, tiles_n = 0, splits = 1, kblocks_per_split = 0;
  bool cluster_split = false;  ///< the splits of a tile are one cluster (sm_90+, <= 16 splits)
  int resident_ctas = 0;       ///< CTAs (of this plan's grid) the GPU runs at once
};
/// The tile for M, its grid, and the split count: split K only when the output tiles leave SMs
/// idle, as many splits as fill the GPU's planned CTA slots but never more than run at once
/// (`occ`: a second wave of a few CTAs costs a whole CTA's time). NIBBLE_SM80_SPLITS=1..16
/// forces the split count (a measurement knob, read per call).
WeightOnlyPlan plan_sm80_weight_only(int64_t m, int64_t n_pad, int64_t k_pad,
                                     const WeightOnlyOccupancy& occ);
/// plan_sm80_weight_only with the occupancy of `device`.
WeightOnlyPlan plan_sm80_weight_only(int64_t m, int64_t n_pad, int64_t k_pad, int weight_bits,
                                     int device);
std::string describe(const WeightOnlyPlan& plan);

void launch_sm80_weight_only(const WeightOnlyLaunch& launch, Stream stream);

}  // namespace nibble::cuda
