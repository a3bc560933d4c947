// Host interface of the sm90_w4a8_gemm family (kernel: cuda/sm90/sm90_w4a8_gemm.cuh): the
// wgmma + TMA W4A8 GEMM for Hopper, fed by the same W4A8Launch as sm80_w4a8_gemm.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "cuda/launch/sm80_w4a8_gemm.h"
#include "cuda/launch/sm90_tiling.h"
#include "nibble/types.h"

namespace nibble::cuda {

/// The tile choice for a problem: BM tokens × 128 channels per CTA, one tile (or one K range of
/// it, with split-K) per CTA. weight_bits 8 is the W8A8 GEMM (sm90_w8a8_gemm) on the logical
/// row-major s8 weights of a W4A8Launch with weight_bits = 8.
struct W4A8WgmmaPlan {
  int bm = 0, stages = 0, tiles_m = 0, tiles_n = 0, splits = 1, kblocks_per_split = 0;
  bool cluster_split = false;  ///< split-K tiles are thread-block clusters (reduced over DSMEM)
  /// CTA pairs (clusters of 2) share the activation tile, each loading half of it by TMA
  /// multicast, which halves its L2 traffic: unsplit 8-bit-weight plans of two or more waves
  /// with two or more channel tiles (plan_sm90_w4a8 says why).
  bool multicast_a = false;
  /// Persistent CTAs: `ctas` (one per SM) walk the tiles of an unsplit, unpaired grid of more
  /// tiles than SMs; otherwise one CTA per tile (per split).
  bool persistent = false;
  /// Stream-K: the persistent CTAs take equal ranges of the tiles' K blocks (plan_sm90_w4a8
  /// says where); partial tiles go through a workspace of one tile per CTA. The first
  /// whole_tiles tiles (whole waves of `ctas`) go whole before the ranges.
  bool stream_k = false;
  int whole_tiles = 0;
  int ctas = 0;
  int weight_bits = 4;
  bool a_e4m3 = false;  ///< fp8 activations (sm90_w4afp8_gemm)
  /// int4 weights decoded as 16·v (W4A8Params::high_nibble): int8 activations, tiles of at most
  /// 128 tokens, per channel and s32 where K ≤ max_int32_accumulation_k(s8, s8), f32 group
  /// scales at any K; else the exact offset_xor.
  bool high_nibble = false;
};

/// True when `device` is a Hopper GPU (sm_90) and this build carries sm_90a code.
bool sm90_w4a8_available(int device);
/// True for the weight formats the kernel implements: per channel, s32, and G = 128 groups
/// (f32 group scales or two-level); with fp8 activations (a_e4m3) per channel and G = 128
/// group scales.
bool sm90_w4a8_handles(sm80::W4A8Epilogue epilogue, int group, bool a_e4m3 = false);
/// How many thread-block clusters of s CTAs (element s, for s = 2..kMaxSm90ClusterSplits) of a
/// wgmma GEMM kernel `device` runs at once. Every instance of sm90_w4a8_gemm and
/// sm90_weight_only_gemm holds one CTA per SM (its ring fills ~130–200 KB of shared memory), so
/// this is the GPU's answer for both: how many clusters of s SMs its GPCs hold. Cached.
std::array<int, kMaxSm90ClusterSplits + 1> sm90_gemm_clusters_at_once(int device);

/// False when NIBBLE_SM90_PERSISTENT=0 is set (a measurement knob, read per call): the wgmma
/// GEMMs (this family and sm90_weight_only_gemm) then run one tile per CTA everywhere.
bool sm90_persistent_allowed();

/// The token tile measurement knob `name` forces on a wgmma planner (NIBBLE_SM90_BM,
/// NIBBLE_SM90_WEIGHT_ONLY_BM; read per call): 0 when unset, else 64, 128 or 256 up to `max_bm`;
/// any other value is an invalid_argument error naming the knob.
int forced_sm90_bm(const char* name, int max_bm);
/// The cluster splits knob `name` forces (NIBBLE_SM90_SPLITS, NIBBLE_SM90_WEIGHT_ONLY_SPLITS):
/// 0 when unset, else 1..kMaxSm90ClusterSplits of a size this GPU runs (`clusters`, from
/// sm90_gemm_clusters_at_once); any other value is an invalid_argument error naming the knob.
int forced_sm90_splits(const char* name,
                       const std::array<int, kMaxSm90ClusterSplits + 1>& clusters);

/// Makes stream-K a candidate of choose_sm90_tiles_by_cost (sets costs.stream_k_slowdown and
/// stream_k_fixup_per_token). Only sm90_weight_only_gemm has stream-K so far; it sits beside
/// the persistent knob both families read. Measurement knobs, read per call:
/// NIBBLE_SM90_STREAM_K=0 leaves it out (so does NIBBLE_SM90_PERSISTENT=0),
/// NIBBLE_SM90_STREAM_K=1 takes it wherever it applies.
void sm90_stream_k_costs(Sm90TileCosts& costs);

/// The plan on `device` (its SM count, and how many clusters of the kernel it runs at once).
/// output_tma_storable: the output is 16-bit with a 16-byte aligned base and row pitch, which
/// persistent plans need (their tiles leave by TMA stores) except with the s32 epilogue; other
/// outputs get one tile per CTA.
W4A8WgmmaPlan plan_sm90_w4a8(int64_t m, int64_t n_pad, int64_t k_pad,
                             sm80::W4A8Epilogue epilogue, int device, int weight_bits = 4,
                             bool a_e4m3 = false, bool output_tma_storable = true);
std::string describe(const W4A8WgmmaPlan& plan);

void launch_sm90_w4a8(const W4A8Launch& launch, Stream stream);

}  // namespace nibble::cuda
