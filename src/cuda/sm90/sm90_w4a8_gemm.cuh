// sm90_w4a8_gemm — int4 weights × int8 activations on Hopper's warpgroup MMA (sm_90a):
// TMA loads into a shared-memory ring, one producer and two consumer warpgroups, int4 → int8
// in the consumers' registers feeding wgmma as its register-sourced A operand. With 8-bit
// weights (WBITS = 8) the same kernel is the W8A8 GEMM, reported as sm90_w8a8_gemm: the weight
// tile then comes by TMA from the logical row-major (N, K) s8 matrix with the same 128-byte
// swizzle as the activations, and wgmma reads both operands from shared memory.
//
//   D[m,n] = s_a[m] · s_w[n] · Σ_k a[m,k]·w[n,k]                  (per_channel)
//   D[m,n] = s_a[m] · Σ_g s_w[g,n] · Σ_{k∈g} a[m,k]·w[n,k]        (group, G = 128)
//   D[m,n] = s_a[m] · s_ch[n] · Σ_k a[m,k]·w8[n,k]                 (two_level, G = 128)
//   D[m,n] = Σ_k a[m,k]·w[n,k]  as int32                            (s32)
//   (+ bias[n]; D in f32, f16 or bf16, or s32)
// With fp8 activations (kFp8: a is e4m3 per token, the W4A-FP8 formats w4afp8_pc / _g128) the
// same kernel multiplies e4m3 × e4m3 into f32: the int4 weights become e4m3 codes of v·2⁻⁹
// (cuda/common/int4_decode.cuh) and the tile is multiplied by 2⁹ in the epilogue:
//   D[m,n] = s_a[m] · (s_w[n] · Σ_k a·v)                            (per_channel)
//   D[m,n] = s_a[m] · Σ_g s_w[g,n] · Σ_{k∈g} a·v                   (group, G = 128)
// Per channel sums all of K in the tensor cores' f32 accumulators, as cuBLASLt's "fast
// accumulation" does (the tensor cores add fp8 products with fewer bits than f32 keeps:
// measured relative error against the in-order f32 sum up to 4.7e-4 at K = 14336, against
// 5e-5 when each 128-wide block was folded into f32 on the CUDA cores — which cost 15–40% of
// the speed, and limited the tile to 128 tokens for the second accumulator set). The group
// format must fold every block with its scale (running sums, BM ≤ 128), as the int8 one does.
//
// Operands (the same as sm80_w4a8_gemm's, so one packed weight serves both kernels)
//   a   (M, K) s8 (or e4m3, kFp8) row-major, pitch `lda` bytes; base and pitch 16-byte
//       aligned; K % 32 == 0.
//   w   WBITS 4: layout w4_mma_k128 (include/nibble/layout.h): 8×128 blocks of 512 bytes.
//       WBITS 8: (N, K) s8 row-major, pitch 16-byte aligned, K % 16 == 0; rows ≥ N and
//       columns ≥ K read as zeros (TMA); per-channel scales f32, f16 or bf16.
//   s_a f32 per row (or one per tensor); s_w f32 (N_pad) or (K_pad/128, N_pad); two-level
//       parameters u16 (K_pad/128, N_pad).
//
// Why the weights are wgmma's A operand (the "swap AB" of mixed-input Hopper GEMMs)
//   wgmma takes B only from shared memory, A from shared memory or registers. Converted int4
//   weights in registers can go straight in as A, so no converted copy is written back to shared
//   memory. The MMA therefore computes the transposed tile Dᵀ (weight channels × tokens): the
//   weight channels are wgmma's M (64 per warpgroup), the tokens its N (BM = 64, 128 or 256).
//   The A register fragment of warp w covers channels 16w..16w+15 exactly like mma.m16n8k32's A
//   (see cuda/common/ptx_sm90.cuh), and the w4_mma_k128 layout stores each lane's 4-byte B
//   fragments of mma.m16n8k32; so for one k32 step j:
//     a[0] = low nibbles,  word j of n8 block 2w     (channels g,   k 4c..4c+3)
//     a[1] = low nibbles,  word j of n8 block 2w+1   (channels g+8, k 4c..4c+3)
//     a[2] = high nibbles, word j of n8 block 2w     (channels g,   k 16+4c..)
//     a[3] = high nibbles, word j of n8 block 2w+1   (channels g+8, k 16+4c..)
//   One 16-byte shared-memory load per n8 block gives a lane its words for all four k32 steps.
//   With int8 activations on tiles of at most 128 tokens (p.high_nibble) a word becomes 16·v:
//   a shift and one LOP3 for the low nibbles, one LOP3 for the high ones
//   (decode_*_nibbles_16v), against offset_xor's seven instructions per word. The int32 sums
//   are then 16× the true ones: per channel and s32 shift them back exactly after the main loop
//   (so K ≤ max_int32_accumulation_k(s8, s8)); the f32 group format folds each block's sums
//   with s/16 instead of s (the same products, see the fold; any K). Two-level groups, fp8
//   activations, 256-token tiles and longer K decode with offset_xor, exactly.
//
// Work split
//   grid: one CTA per 128-channel × BM-token output tile (bands of 8 token tiles walk down one
//   channel column, so co-resident CTAs share activations and weights in L2).
//   Warpgroup 0 (producer, one thread): per 128-wide K block, one TMA copy of the activation
//   tile (BM rows × 128 bytes, 128-byte swizzle, rows past M and columns past K zero-filled),
//   one of the weight tile (16 n8 blocks × 512 bytes) and, for grouped formats, one of the
//   block's 128 group scales or parameters, all completing on the stage's `full` barrier.
//   Warpgroups 1 and 2 (consumers): 64 channels each; per K block they read their weight words,
//   convert them (cuda/common/int4_decode.cuh) and issue four wgmma m64nBMk32, wait for them,
//   and release the stage (`empty` barrier, one arrival per consumer warp).
//   setmaxnreg moves registers from the producer (40) to the consumers (232): a consumer holds
//   BM/2 int32 accumulators (+ BM/2 f32 for the group format).
//   Persistent CTAs (Cfg::kPersistent; the launcher's choice for unsplit grids of more tiles
//   than SMs): one CTA per SM walks tiles blockIdx.x, blockIdx.x + gridDim.x, ... in band_raster
//   order. The producer runs on into the next tile's K blocks (the ring position counts over
//   all tiles), so while the consumers store one tile the next one's first stages land. The
//   tile leaves through a buffer after the ring, not the ring: bf16 / f16 outputs by TMA stores
//   (store_tile_by_tma, below), s32 ones through a 32-token slab (store_tile_by_slabs); f32 and
//   outputs TMA cannot address get one tile per CTA (plan_sm90_w4a8).
//   CTA pairs (p.multicast_a; 8-bit weights on grids of two waves or more, only when
//   NIBBLE_SM90_MULTICAST=1 asks: persistent CTAs unpaired measured faster): two CTAs of a
//   (2, 1, 1) cluster take the same token tile and adjacent channel tiles;
//   each producer loads half the activation tile's rows with one TMA multicast into both CTAs'
//   stage, so L2 serves each activation tile once per pair. A stage is then refilled only when
//   the consumers of both CTAs have released it (16 arrivals on `empty`, half of them remote),
//   and neither CTA leaves before the other has finished its main loop (a cluster barrier).
//   Stream-K (p.stream_k, persistent CTAs unpaired): each CTA takes an equal range of the
//   tiles' K blocks instead of whole tiles (after p.whole_tiles whole ones, on request), so a
//   grid of fewer tiles than SMs (or a last wave of a few) keeps every SM busy; a CTA that
//   computes the rest of a tile another CTA owns stores its raw sums (int32, or the f32 running
//   sums) as a partial, and the owner adds them in K order before its epilogue
//   (cuda/sm90/tile_schedule.cuh; int32 partials add exactly).
//
//   ┌──────── CTA tile: 128 channels × BM tokens (computed as Dᵀ) ────────┐
//   │ consumer WG 1: channels  0..63   → wgmma m64 × nBM, A = its weights │
//   │ consumer WG 2: channels 64..127  → wgmma m64 × nBM, B = shared A8   │
//   └──────────────────────────────────────────────────────────────────────┘
//
// Epilogue: the consumers write the raw tile (int32, or the group format's f32 sums, which fold
// their scales in per K block) transposed into shared memory (token rows, padded by 16 bytes so
// the fragment writes hit 32 distinct banks); each warp then takes whole token rows with 16-byte
// loads, reduces split-K partials if any, and applies s_a, s_w and the bias on the way out:
// s_a · (s_w · acc) + bias, as sm80_w4a8_gemm computes it. The tile's s_a are loaded before the
// main loop (one per consumer thread) and shared through shared memory.
// Persistent CTAs with a 16-bit output that TMA can address (16-byte aligned base and row
// pitch) apply the same formula in registers instead, store the values transposed with
// stmatrix .trans into a buffer of 128-byte token rows per consumer warpgroup (the 128-byte
// swizzle, so the stores are free of bank conflicts), and one thread of each warpgroup issues a
// TMA store of it. The consumers then go on to the next tile's main loop while the store runs:
// the tensor cores wait only for the values' arithmetic, not for the stores, which took
// 4096×4096 at M = 4096 from 103.4 to 87.3 µs (H200, 2026-11-29; docs/kernels.md).
//
// Limitations
//   1. sm_90a only (wgmma, setmaxnreg); other GPUs run sm80_w4a8_gemm.
//   2. Grouped formats only with G = 128 (one group per K block); other group sizes run
//      sm80_w4a8_gemm.
//   3. Split-K (gridDim.z > 1): a tile's splits are one thread-block cluster (up to 8, when
//      every tile's cluster fits in one wave; the partial tiles are summed over distributed
//      shared memory), or go through a workspace of splits·M·N 4-byte partials and a per-tile
//      counter, the last CTA of a tile reducing; both sum in split order (deterministic).
//      Cluster-split grids (one tile per CTA) launch to overlap the kernel before them
//      (p.overlap, cuda/launch/pdl_launch.h): the producer issues the weight loads of the first
//      min(STAGES, K blocks) stages before griddepcontrol.wait and their activation loads after
//      it; the consumers wait before reading the per-token scales or writing the output.
//   4. Persistent CTAs (16-bit outputs that TMA can address, and s32 outputs below 256-token
//      tiles; other outputs run one tile per CTA) hide the next tile's pipeline fill and
//      (16-bit outputs) its global stores behind the next main loop, not the epilogue's
//      arithmetic: the consumers hold one accumulator set. The TMA buffer takes the room of
//      one stage at BM = 256 (4 stages, or a tile in two token ranges where 4 would not fit).
//      Split grids keep one tile per CTA.
//   5. 8-bit weights: per-channel and s32 epilogues only.
//   6. fp8 activations: int4 s4_sym weights, per channel or G = 128 (BM ≤ 128: the block sums
//      and the running sums are two accumulator sets, and every K block's wgmma is waited for
//      before it is folded, as in the int8 group format; the next block's conversion overlaps
//      the wait).
// Verify: build/cuda/tests/cpp/nibble_tests --gtest_filter='CudaW4A8*'
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/element.cuh"
#include "cuda/common/int4_decode.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/common/raster.cuh"
#include "cuda/launch/sm80_w4a8_gemm.h"
#include "cuda/sm90/block_pipeline.cuh"
#include "cuda/sm90/overlapped_tma_producer.cuh"
#include "cuda/sm90/tile_schedule.cuh"
#include "cuda/sm90/transposed_tile.cuh"
#include "nibble/types.h"

namespace nibble::cuda::sm90 {

using sm80::W4A8Epilogue;

struct W4A8WgmmaParams {
  const float* a_scales = nullptr;
  int a_scale_step = 1;  // 1 per token, 0 per tensor
  const float* w_scales = nullptr;  // per channel / two-level s_ch (N_pad); unused for group
  const void* bias = nullptr;
  DType bias_dtype = DType::f32;
  void* d = nullptr;
  int64_t ldd = 0;  // elements
  DType d_dtype = DType::bf16;
  int m = 0, n = 0, kblocks = 0;
  int kblocks_per_split = 0;      // K blocks per CTA along gridDim.z (split-K)
  void* workspace = nullptr;      // splits·M·N 4-byte partials (workspace split-K only)
  int* counters = nullptr;        // one per output tile, zero between calls
  bool cluster_split = false;     // the splits of a tile are one cluster (1, 1, gridDim.z)
  // CTA pairs share the activation tile: clusters of (2, 1, 1) over a grid of (2 · tiles_m,
  // ceil(tiles_n / 2)) (pair_band_raster); each CTA loads half the tile's token rows and
  // multicasts them to both, so every stage is released by both CTAs' consumers.
  bool multicast_a = false;
  DType w_scale_dtype = DType::f32;  // WBITS 8: dtype behind w_scales (f32, f16 or bf16)
  // Persistent CTAs (the launcher picks the persistent instance): gridDim.x CTAs walk the
  // tiles_m × tiles_n tiles; the others read the tile grid off gridDim.
  bool persistent = false;
  int tiles_m = 0, tiles_n = 0;
  // Persistent CTAs (not paired) take equal ranges of the tiles' K blocks instead of whole
  // tiles (stream-K, cuda/sm90/tile_schedule.cuh): `workspace` then holds one partial tile per
  // CTA (BM × 128 4-byte sums) and `counters` one flag per CTA, zero between calls. The first
  // whole_tiles tiles (a multiple of gridDim.x) still go whole, the ranges cover the rest.
  bool stream_k = false;
  int whole_tiles = 0;
  // Launched to overlap the kernel before it (cluster-split grids, one tile per CTA, no
  // multicast): the producer issues the first stages' weight loads before griddepcontrol.wait.
  bool overlap = false;
  // int4 s4_sym weights with int8 activations, per channel, s32 or f32 group scales
  // (Cfg::kHighNibbleDecode): the weights become 16·v (decode_*_nibbles_16v); per channel and
  // s32 shift the sums back after the main loop (only where K ≤ max_int32_accumulation_k(s8,
  // s8)), the group format folds them with s/16. Else the exact offset_xor decoding.
  bool high_nibble = false;
};

/// Whether the instance of token tile `bm` can take its weights as 16·v (p.high_nibble): int4
/// s4_sym weights with int8 activations (per channel, s32, f32 group scales; not two-level
/// groups, whose weights are not s4_sym), tiles of at most 128 tokens. 256-token tiles convert
/// each weight word for twice the tokens, so the decoding is not what bounds them: measured on
/// the H200 they gained nothing (M = 1024 of 4096x4096, 3584x3584, 4096x14336: 0.97-1.00x the
/// time) and stream-K's 256-token tiles of 10240x8192 at M = 256 ran 1.17x slower with both
/// loops in the kernel. The planner adds the run-time conditions (K, NIBBLE_SM90_W4_DECODE).
constexpr bool high_nibble_instance(int bm, W4A8Epilogue epi, int weight_bits, bool fp8) {
  return weight_bits == 4 && !fp8 && bm <= 128 &&
         (epi == W4A8Epilogue::per_channel || epi == W4A8Epilogue::s32 ||
          epi == W4A8Epilogue::group);
}

template <int BM_, int STAGES_, W4A8Epilogue EPI_, int WBITS_ = 4, bool FP8_ = false,
          bool PERSISTENT_ = false>
struct W4A8WgmmaConfig {
  /// Weight bits: 4 (packed w4_mma_k128, register-sourced wgmma) or 8 (row-major s8 tile in
  /// shared memory, shared-memory-sourced wgmma).
  static constexpr int WBITS = WBITS_;
  static constexpr bool kW8 = WBITS_ == 8;
  static_assert(WBITS_ == 4 || WBITS_ == 8, "weights are int4 or int8");
  static_assert(!kW8 || EPI_ == W4A8Epilogue::s32 || EPI_ == W4A8Epilogue::per_channel,
                "int8 weights are per channel");
  /// fp8 e4m3 activations (W4A-FP8): e4m3 wgmma with f32 accumulators.
  static constexpr bool kFp8 = FP8_;
  static_assert(!kFp8 || (WBITS_ == 4 && (EPI_ == W4A8Epilogue::per_channel ||
                                          EPI_ == W4A8Epilogue::group)),
                "fp8 activations: int4 s4_sym weights, per channel or G = 128");
  static constexpr int BM = BM_;        // tokens per CTA tile (wgmma N)
  static constexpr int BN = 128;        // weight channels per CTA tile (2 × wgmma M)
  static constexpr int kBK = 128;       // K per stage
  static constexpr int STAGES = STAGES_;
  static constexpr W4A8Epilogue EPI = EPI_;
  static constexpr bool kGroupScales = EPI == W4A8Epilogue::group;
  static constexpr bool kGroupParams = EPI == W4A8Epilogue::two_level;
  /// f32 group scales (int8 or fp8 activations) keep block-by-block f32 running sums; fp8 per
  /// channel sums all of K in the tensor cores' f32 accumulators (see the header).
  /// The raw tile the epilogue parks holds f32 sums (group scales folded in, or fp8), not int32:
  /// split-K partials must then be added as floats.
  static constexpr bool kFloatTile = kGroupScales || kFp8;
  /// 16·v weights possible (high_nibble_instance).
  static constexpr bool kHighNibbleDecode = high_nibble_instance(BM, EPI, WBITS_, FP8_);
  static constexpr int kThreads = 384;  // producer + 2 consumer warpgroups
  static constexpr int kAcc = BM / 2;   // accumulators per consumer thread (int32, or f32 fp8)
  static constexpr int kABytes = BM * kBK;
  static constexpr int kWBytes = BN * kBK * WBITS / 8;
  static constexpr int kGBytes = kGroupScales ? BN * 4 : kGroupParams ? BN * 2 : 0;
  static constexpr int kTxBytes = kABytes + kWBytes + kGBytes;
  // Stages stay 1024-byte aligned: the 128-byte swizzle pattern repeats every 1024 bytes and
  // the wgmma descriptor assumes the tile starts on that boundary.
  static constexpr int kStageBytes = (kTxBytes + 1023) / 1024 * 1024;
  // The output tile in shared memory: 4-byte values (f32 or s32), rows of BN + 4.
  static constexpr int kOutPitch = BN + 4;
  static constexpr int kOutBytes = BM * kOutPitch * 4;
  static constexpr int kRingBytes = STAGES * kStageBytes;
  /// Persistent CTAs (unsplit grids of more tiles than SMs): each CTA walks tiles
  /// blockIdx.x, blockIdx.x + gridDim.x, ... and the producer keeps loading the next tile's
  /// stages while the consumers store the last one, so the epilogue cannot reuse the ring: the
  /// tile leaves through a buffer after it — by TMA stores of 16-bit values (kStoreRounds token
  /// ranges of the tile, each 64 · 2 bytes a token row per consumer warpgroup), or, for s32
  /// outputs, through a slab of kSlabTokens rows of raw 4-byte values. The TMA buffer holds the
  /// whole tile where that leaves room for 4 stages.
  static constexpr bool kPersistent = PERSISTENT_;
  static constexpr int kSlabTokens = 32;
  static constexpr int kSlabBytes = kSlabTokens * kOutPitch * 4;
  static constexpr int kSmemLimit = 227 * 1024;
  static constexpr int kSmemReserve = 1024 + 2 * 8 * 8 + 1024;  // alignment, barriers, static
  static constexpr int kTileBytes16 = BM * BN * 2;
  static constexpr int kStoreRounds =
      4 * kStageBytes + kTileBytes16 + kSmemReserve <= kSmemLimit       ? 1
      : 4 * kStageBytes + kTileBytes16 / 2 + kSmemReserve <= kSmemLimit ? 2
                                                                         : 4;
  static constexpr int kEpiBytes =
      kTileBytes16 / kStoreRounds > kSlabBytes ? kTileBytes16 / kStoreRounds : kSlabBytes;
  /// The most stages a persistent instance can have beside its epilogue buffer (at most 8).
  static constexpr int kPersistentStagesMax =
      (kSmemLimit - kSmemReserve - kEpiBytes) / kStageBytes < 8
          ? (kSmemLimit - kSmemReserve - kEpiBytes) / kStageBytes
          : 8;
  static constexpr int kBarrierOffset = kPersistent             ? kRingBytes + kEpiBytes
                                        : kRingBytes > kOutBytes ? kRingBytes
                                                                 : kOutBytes;
  static constexpr int kSmemBytes = kBarrierOffset + 2 * STAGES * 8 + 1024;  // + alignment
  static_assert(BM == 64 || BM == 128 || BM == 256, "wgmma n is 64, 128 or 256 here");
  static_assert(!kGroupScales || BM <= 128, "f32 running sums need BM/2 more registers");
  // With the kernel's static tile_a_scales[BM] (and store_transposed_tile's flag), which
  // kSmemReserve counts 1 KB for.
  static_assert(kSmemBytes + BM * 4 + 4 <= kSmemLimit,
                "more shared memory than an sm_90 CTA can have");
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    sm90_w4a8_gemm_kernel(const __grid_constant__ CUtensorMap tmap_a,
                          const __grid_constant__ CUtensorMap tmap_w,
                          const __grid_constant__ CUtensorMap tmap_g,
                          const __grid_constant__ CUtensorMap tmap_d,
                          const __grid_constant__ W4A8WgmmaParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int BM = Cfg::BM, BN = Cfg::BN, STAGES = Cfg::STAGES, kAcc = Cfg::kAcc;
  constexpr W4A8Epilogue EPI = Cfg::EPI;
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Cfg::kBarrierOffset);
  uint64_t* empty = full + STAGES;

  constexpr bool kPersistent = Cfg::kPersistent;
  // Persistent CTAs are unsplit (the launcher's plan says so).
  // CTA pairs are planned for int8 weights only, so the int4 instances compile them out: the
  // run-time flag cost the per-channel K loop 23 instructions per two K blocks (160 -> 137 at
  // BM = 128, ptxas 13.0). The f32 group formats keep it: compiled out, they spilled 8-16 bytes.
  const bool multicast = (Cfg::kW8 || Cfg::kGroupScales) && p.multicast_a;
  const int tiles_m = kPersistent ? p.tiles_m : multicast ? gridDim.x / 2 : gridDim.x;
  const int tiles_n = kPersistent ? p.tiles_n : multicast ? 2 * gridDim.y : gridDim.y;
  const int pair_columns = (tiles_n + 1) / 2;
  // The tiles this CTA computes: tile_seq = first_tile, first_tile + tile_stride, ... below
  // tile_count, in band_raster order (one, numbered by the grid, when not persistent).
  // Persistent CTA pairs walk pair tiles (both CTAs the same sequence, so their rings stay in
  // step), and CTA blockIdx.x % 2 of the pair takes the pair tile's channel tile of that parity.
  const int tile_count = !kPersistent ? 1 : multicast ? tiles_m * pair_columns : tiles_m * tiles_n;
  const int first_tile = !kPersistent ? 0 : multicast ? int(blockIdx.x / 2) : int(blockIdx.x);
  const int tile_stride = !kPersistent ? 1 : multicast ? int(gridDim.x / 2) : int(gridDim.x);
  auto tile_at = [&](int tile_seq) -> TileCoord {
    if (kPersistent)
      return multicast ? pair_band_raster(2 * tile_seq + (blockIdx.x & 1), 0, tiles_m, pair_columns)
                       : band_raster(tile_seq, tiles_m, tiles_n);
    return multicast ? pair_band_raster(blockIdx.x, blockIdx.y, tiles_m, pair_columns)
                     : band_raster(blockIdx.y * tiles_m + blockIdx.x, tiles_m, tiles_n);
  };
  const uint32_t pair_rank = multicast ? ptx::cluster_ctarank() : 0u;  // = blockIdx.x % 2
  const int kb_begin = kPersistent ? 0 : blockIdx.z * p.kblocks_per_split;
  const int num_kb = kPersistent ? p.kblocks : min(p.kblocks - kb_begin, p.kblocks_per_split);

  // body(segment) for each piece of work of this CTA (cuda/sm90/tile_schedule.cuh): its tile
  // or split; a persistent CTA's whole tiles first_tile, first_tile + tile_stride, ...; or,
  // with p.stream_k, its range of all the tiles' K blocks. Producer and consumers walk the same.
  auto for_each_tile_segment = [&](auto&& body) {
    if constexpr (kPersistent) {
      if (p.stream_k) {
        StreamKWalk walk;
        for (TileSegment seg; walk.next(seg, tile_count, p.whole_tiles, p.kblocks);) body(seg);
        return;
      }
    }
    for (int tile_seq = first_tile; tile_seq < tile_count; tile_seq += tile_stride)
      body(TileSegment{tile_seq, kb_begin, kb_begin + num_kb});
  };

  const int tid = threadIdx.x, wg = tid / 128;
  // Launched to overlap (p.overlap), the next kernel may start its own prologue now: it waits
  // for this grid before reading anything it writes.
  if (!kPersistent && p.overlap) ptx::griddep_launch_dependents();
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      ptx::mbarrier_init(&full[s], 1);
      // One arrival per consumer warp of every CTA that writes into the stage.
      ptx::mbarrier_init(&empty[s], multicast ? 16 : 8);
    }
    ptx::fence_barrier_init();
    ptx::prefetch_tensor_map(&tmap_a);
    ptx::prefetch_tensor_map(&tmap_w);
    if constexpr (Cfg::kGBytes > 0) ptx::prefetch_tensor_map(&tmap_g);
  }
  // With multicast the other CTA's copies credit this CTA's barriers: both must be initialised
  // before either producer starts.
  if (multicast)
    ptx::cluster_sync();
  else
    __syncthreads();

  if (wg == 0) {
    // ---- producer ------------------------------------------------------------------------------
    ptx::setmaxnreg_dec<40>();
    if (tid == 0) {
      // K block kb of the tile at (m0, n0) into ring stage s: the `parts` of it (StageParts);
      // the weight part makes `full` expect the whole stage.
      auto load_stage = [&](int s, int kb, int m0, int n0, int parts) {
        uint8_t* stage = smem + s * Cfg::kStageBytes;
        if (parts & kStageWeights) ptx::mbarrier_arrive_expect_tx(&full[s], Cfg::kTxBytes);
        if (parts & kStageActivations) {
          if (multicast) {  // this CTA's half of the token rows, into both CTAs' stage
            constexpr int kHalf = BM / 2;  // 1024-byte multiples: the swizzle pattern holds
            ptx::tma_load_2d_multicast(stage + pair_rank * kHalf * Cfg::kBK, &tmap_a, &full[s],
                                       kb * Cfg::kBK, m0 + int(pair_rank) * kHalf, 0x3);
          } else {
            ptx::tma_load_2d(stage, &tmap_a, &full[s], kb * Cfg::kBK, m0);
          }
        }
        if (parts & kStageWeights) {
          if constexpr (Cfg::kW8)
            ptx::tma_load_2d(stage + Cfg::kABytes, &tmap_w, &full[s], kb * Cfg::kBK, n0);
          else
            ptx::tma_load_3d(stage + Cfg::kABytes, &tmap_w, &full[s], 0, kb, n0 / 8);
          if constexpr (Cfg::kGBytes > 0)
            ptx::tma_load_2d(stage + Cfg::kABytes + Cfg::kWBytes, &tmap_g, &full[s], n0, kb);
        }
      };
      if (!kPersistent && p.overlap) {
        // Launched to overlap the kernel before it (one tile per CTA): the first stages'
        // weights load before waiting for that kernel, their activations after.
        const TileCoord tile = tile_at(first_tile);
        const int m0 = tile.m * BM, n0 = tile.n * BN;
        load_tma_tile_overlapped<STAGES>(
            kb_begin, num_kb, empty,
            [&](int s, int kb, int parts) { load_stage(s, kb, m0, n0, parts); });
      } else {
        int it = 0;  // the K blocks loaded over all of this CTA's segments: the ring position
        for_each_tile_segment([&](const TileSegment& seg) {
          const TileCoord tile = tile_at(seg.tile_seq);
          const int m0 = tile.m * BM, n0 = tile.n * BN;
          for (int kb = seg.kb_begin; kb < seg.kb_end; ++kb, ++it) {
            const int s = it % STAGES;
            if (it >= STAGES) ptx::mbarrier_wait(&empty[s], ((it / STAGES) + 1) & 1);
            load_stage(s, kb, m0, n0, kStageAll);
          }
        });
      }
    }
    producer_passes_tile_barriers(p.cluster_split);
    if (multicast) ptx::cluster_sync();  // the consumers' last barrier, below
    return;
  }

  // ---- consumers -------------------------------------------------------------------------------
  ptx::setmaxnreg_inc<232>();
  // Launched to overlap the kernel before it: the per-token scales, and the outputs, are read and
  // written only once that kernel is done (a no-op otherwise).
  if (!kPersistent && p.overlap) ptx::griddep_wait();
  const int cw = wg - 1;                      // consumer warpgroup: channels 64·cw ..
  const int warp = (tid / 32) % 4, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;
  const int ch_local = 64 * cw + 16 * warp + g;  // this thread's channels: ch_local, ch_local + 8
  int kb_done = 0;  // K blocks consumed for this CTA's earlier segments: the ring position
  // The epilogue's per-token scales of the tile (see below).
  __shared__ __align__(8) float tile_a_scales[BM];
  for_each_tile_segment([&](const TileSegment& seg) {
    const int tile_seq = seg.tile_seq, seg_kb = seg.kb_end - seg.kb_begin;
    // Stream-K: the rest of a tile another CTA owns (a partial, stored for the owner), or the
    // start of one this CTA owns and the CTAs after it finished. Decided before the main loop,
    // so that only two predicates stay live across it.
    const bool piece = kPersistent && p.stream_k && seg.kb_begin > 0;
    const bool owns_pieces = kPersistent && p.stream_k && seg.kb_begin == 0 && seg_kb < p.kblocks;
    const TileCoord tile = tile_at(tile_seq);
    const int tile_m = tile.m, tile_n = tile.n;
    const int m0 = tile_m * BM, n0 = tile_n * BN;
    // The per-token scale of token row tid - 128 of the tile, loaded now so that its latency hides
    // behind the main loop; the epilogue shares the BM of them through shared memory.
    const int scale_row = tid - 128;
    float row_a_scale = 0.0f;
    if constexpr (EPI != W4A8Epilogue::s32)
      if (scale_row < BM && m0 + scale_row < p.m)
        row_a_scale = p.a_scales[int64_t(m0 + scale_row) * p.a_scale_step];

    using Acc = std::conditional_t<Cfg::kFp8, float, int32_t>;
    Acc acc[kAcc];
    float facc[Cfg::kGroupScales ? kAcc : 1];  // the f32 running sums
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0;
    if constexpr (Cfg::kGroupScales) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) facc[i] = 0.0f;
    }

    // One K block: wait for its stage and convert this lane's weight words into frag (the A
    // fragments of the block's four k32 steps; int8 weights need none, wgmma reads them from
    // shared memory). Returns the stage.
    // `high_nibble` (std::bool_constant): the weights as 16·v (p.high_nibble), else offset_xor.
    auto decode_block = [&](int it, uint32_t (&frag)[4][4], [[maybe_unused]] auto high_nibble) {
      const int ring_it = kb_done + it;
      const int s = ring_it % STAGES;
      ptx::mbarrier_wait(&full[s], (ring_it / STAGES) & 1);
      if constexpr (!Cfg::kW8) {
        const uint8_t* w_sh = smem + s * Cfg::kStageBytes + Cfg::kABytes;
        const uint4 w0 = ptx::lds128(w_sh + (8 * cw + 2 * warp) * 512 + lane * 16);
        const uint4 w1 = ptx::lds128(w_sh + (8 * cw + 2 * warp + 1) * 512 + lane * 16);
        const uint32_t word0[4] = {w0.x, w0.y, w0.z, w0.w}, word1[4] = {w1.x, w1.y, w1.z, w1.w};
        // The block's A fragments (the layout above) from one decoding: low(word, c) and
        // high(word, c) of channel row c (0: word0, channels g; 1: word1, channels g + 8).
        auto place = [&](auto low, auto high) {
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            frag[j][0] = low(word0[j], 0);
            frag[j][1] = low(word1[j], 1);
            frag[j][2] = high(word0[j], 0);
            frag[j][3] = high(word1[j], 1);
          }
        };
        if constexpr (Cfg::kFp8) {
          place([](uint32_t w, int) { return decode_low_nibbles_e4m3(w); },
                [](uint32_t w, int) { return decode_high_nibbles_e4m3(w); });
        } else if constexpr (decltype(high_nibble)::value) {
          place([](uint32_t w, int) { return decode_low_nibbles_16v(w); },
                [](uint32_t w, int) { return decode_high_nibbles_16v(w); });
        } else {
          uint32_t gs[2] = {1u, 1u}, off[2] = {kS4SymOffset4, kS4SymOffset4};
          if constexpr (Cfg::kGroupParams) {
            const uint16_t* prm = reinterpret_cast<const uint16_t*>(w_sh + Cfg::kWBytes);
            two_level_operands(prm[ch_local], gs[0], off[0]);
            two_level_operands(prm[ch_local + 8], gs[1], off[1]);
          }
          place([&](uint32_t w, int c) { return decode_low_nibbles(w, gs[c], off[c]); },
                [&](uint32_t w, int c) { return decode_high_nibbles(w, gs[c], off[c]); });
        }
      } else {
        (void)frag;
      }
      return s;
    };
    // Issue and commit the block's four wgmma; `restart`: the first overwrites the accumulators
    // (formats with running f32 sums restart them after each fold).
    auto issue = [&](int s, uint32_t (&frag)[4][4], bool restart) {
      const uint8_t* stage = smem + s * Cfg::kStageBytes;
      const uint64_t desc = ptx::smem_desc_k128_sw128(stage);
      // int8 weights: this warpgroup's 64 rows of the weight tile (1024-byte aligned) are A.
      const uint64_t desc_w = ptx::smem_desc_k128_sw128(stage + Cfg::kABytes + 64 * cw * Cfg::kBK);
#pragma unroll
      for (int i = 0; i < kAcc; ++i) ptx::fence_operand(acc[i]);
      ptx::wgmma_fence();
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // +32 bytes (2 descriptor units) per k32 step
        const int accumulate = restart && j == 0 ? 0 : 1;
        if constexpr (Cfg::kW8)
          ptx::wgmma_s8_ss<BM>(acc, desc_w + 2 * j, desc + 2 * j, 1);
        else if constexpr (Cfg::kFp8)
          ptx::wgmma_e4m3_rs<BM>(acc, frag[j], desc + 2 * j, accumulate);
        else
          ptx::wgmma_s8_rs<BM>(acc, frag[j], desc + 2 * j, accumulate);
      }
      ptx::wgmma_commit();
    };
    // wgmma reads its register operands asynchronously: a block's fragments must stay untouched
    // until its group has completed, which is what this fence after the wait records.
    auto keep_until_here = [](uint32_t (&frag)[4][4]) {
      if constexpr (Cfg::kW8) {
        (void)frag;  // no register operands
      } else {
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int r = 0; r < 4; ++r) ptx::fence_operand(frag[j][r]);
      }
    };
    auto release = [&](int s) {
      __syncwarp();
      if (!multicast) {
        if (lane == 0) ptx::mbarrier_arrive(&empty[s]);
      } else if (lane < 2) {  // both CTAs' producers write into this stage
        ptx::mbarrier_arrive_cluster(&empty[s], uint32_t(lane));
      }
    };

    uint32_t frag[2][4][4];
    // The decoding is a runtime choice (p.high_nibble), so each main loop is compiled once per
    // decoding rather than each kernel once per decoding.
    auto with_decoding = [&](auto&& main_loop) {
      if constexpr (Cfg::kHighNibbleDecode) {
        if (p.high_nibble) {
          main_loop(std::true_type{});
          return;
        }
      }
      main_loop(std::false_type{});
    };
    if constexpr (Cfg::kGroupScales) {
      // The running f32 sums need each block's sums before the accumulators restart: wait for
      // the block, fold it in with its group scale, restart.
      with_decoding([&](auto high_nibble) {
        auto fold = [&](int s) {
#pragma unroll
          for (int i = 0; i < kAcc; ++i) ptx::fence_operand(acc[i]);
          // ld.shared: through the generic ring pointer these were LD.E, generic loads.
          const uint8_t* sc = smem + s * Cfg::kStageBytes + Cfg::kABytes + Cfg::kWBytes;
          float s0 = __uint_as_float(ptx::lds32(sc + 4 * ch_local));
          float s1 = __uint_as_float(ptx::lds32(sc + 4 * (ch_local + 8)));
          // (Cfg::kHighNibbleDecode first, on its own: it discards the block for the fp8 group
          // instance, whose sums are f32.)
          if constexpr (Cfg::kHighNibbleDecode) {
            if constexpr (decltype(high_nibble)::value) {
              // The sums of 16·v are 16·Σ, exactly (|Σ| ≤ 2^17 per block, so 16·Σ is exact in f32
              // too): folding them with s/16 gives the same products, hence the same fma, as Σ
              // with s — wherever s/16 is exact, i.e. s is 0, not finite or |s| ≥ 2^-122. Any
              // other scale (a subnormal s/16) shifts the sums back instead.
              if (sixteenth_is_exact(s0) && sixteenth_is_exact(s1)) {
                s0 *= 0.0625f;
                s1 *= 0.0625f;
              } else {
#pragma unroll
                for (int i = 0; i < kAcc; ++i) acc[i] >>= 4;
              }
            }
          }
#pragma unroll
          for (int i = 0; i < kAcc; ++i)
            facc[i] = fmaf((i & 2) ? s1 : s0, float(acc[i]), facc[i]);
        };
        auto decode = [&](int it, uint32_t (&f)[4][4]) { return decode_block(it, f, high_nibble); };
        run_blocks_with_running_sums(seg_kb, frag, decode, issue, keep_until_here, fold, release);
      });
    } else {
      // Per-channel and integer formats keep one block's wgmma in flight while the next block is
      // converted and issued (cuda/sm90/block_pipeline.cuh).
      with_decoding([&](auto high_nibble) {
        auto issue_block = [&](int it, uint32_t (&f)[4][4]) {
          const int s = decode_block(it, f, high_nibble);
          issue(s, f, false);
          return s;
        };
        run_blocks_one_in_flight(seg_kb, frag, issue_block, keep_until_here, release);
      });
    }
    kb_done += seg_kb;
#pragma unroll
    for (int i = 0; i < kAcc; ++i) ptx::fence_operand(acc[i]);
    if constexpr (Cfg::kHighNibbleDecode && !Cfg::kGroupScales) {
      // 16·v weights: every sum is a multiple of 16, shifted back exactly before any partial,
      // reduction or epilogue sees it (the group format folded its blocks' sums already).
      if (p.high_nibble) {
#pragma unroll
        for (int i = 0; i < kAcc; ++i) acc[i] >>= 4;
      }
    }
    if constexpr (kPersistent) {
      // The raw sums a partial carries: the f32 running sums of the group formats, else the
      // accumulators (int32 partials add exactly: a stream-K tile equals the unsplit one).
      // Returns true for a piece: stored, nothing more to do with this segment.
      auto stream_k_fixup = [&](auto& sums) {
        if (piece) {
          stream_k_put_partial(sums, p.workspace, p.counters, blockIdx.x, tid - 128);
          return true;
        }
        if (owns_pieces)
          stream_k_add_partials<false>(sums, p.workspace, p.counters, blockIdx.x, seg_kb,
                                       p.kblocks, gridDim.x,
                                       stream_k_units(tile_count, p.whole_tiles, p.kblocks),
                                       tid - 128);
        return false;
      };
      bool stored_piece;
      if constexpr (Cfg::kGroupScales) stored_piece = stream_k_fixup(facc);
      else stored_piece = stream_k_fixup(acc);
      if (stored_piece) return;  // the next segment
    }
    // Multicast: the other CTA may still arrive on this CTA's `empty` barriers, so neither leaves
    // before both have passed their last main loop (the wait is at the end, after the epilogue).
    if (multicast && tile_seq + tile_stride >= tile_count) ptx::cluster_arrive();

    // ---- epilogue -------------------------------------------------------------------------------
    // The tile's per-token scales go to shared memory (tile_a_scales; loaded before the main
    // loop, one per consumer thread). Read in store_row instead, each row's scale was a global
    // load that could not move above the previous row's store (d and a_scales may alias), so
    // every row a warp stored waited for a round trip to L2: 4096×4096 at M = 4096 ran 122–125
    // µs against 106 (H100, 2026-11-24).
    // The tile goes to shared memory raw (int32 bits, or the group format's f32 sums),
    // transposed to token rows; the scales are applied on the way out, after any split-K
    // reduction, so a split result equals the unsplit one exactly.
    auto raw_of = [&](int i) -> uint32_t {
      // fp8: the weights were v·2⁻⁹; ×2⁹ is exact.
      if constexpr (Cfg::kFp8 && Cfg::kGroupScales)
        return __float_as_uint(facc[i] * kE4m3WeightScale);
      else if constexpr (Cfg::kFp8)
        return __float_as_uint(float(acc[i]) * kE4m3WeightScale);
      else if constexpr (Cfg::kGroupScales)
        return __float_as_uint(facc[i]);
      else
        return uint32_t(acc[i]);
    };
    if constexpr (!kPersistent) {
      // Every consumer has passed its last `full` wait, so every TMA copy has landed and the ring
      // can be reused for the output tile once both consumer warpgroups are done reading it.
      if (scale_row < BM) tile_a_scales[scale_row] = row_a_scale;
      uint32_t raw[kAcc];
#pragma unroll
      for (int i = 0; i < kAcc; ++i) raw[i] = raw_of(i);
      write_transposed_tile<kAcc, Cfg::kOutPitch>(smem, raw, ch_local, c);
    }

    // A channel's weight scale and bias (1 and 0 where there are none, or past N).
    auto channel_scale = [&](int ch) {
      if (ch >= p.n) return 1.0f;
      if constexpr (Cfg::kW8 && EPI == W4A8Epilogue::per_channel)
        return load_float(Operand{p.w_scales, p.w_scale_dtype, 1}, ch, 0);
      else if constexpr (EPI == W4A8Epilogue::per_channel || EPI == W4A8Epilogue::two_level)
        return p.w_scales[ch];
      return 1.0f;
    };
    auto channel_bias = [&](int ch) {
      if constexpr (EPI != W4A8Epilogue::s32)
        if (ch < p.n && p.bias != nullptr) return load_float(Operand{p.bias, p.bias_dtype, 1}, ch, 0);
      return 0.0f;
    };
    // One output value from its raw accumulator: s_a · (s_w · acc) + bias, as sm80_w4a8_gemm
    // computes it (the group format's raw value has its scales folded in already).
    auto out_value = [](uint32_t raw, float s_w, float s_a, float bias) {
      float t;
      if constexpr (Cfg::kGroupScales) t = __uint_as_float(raw);
      else if constexpr (Cfg::kFp8) t = s_w * __uint_as_float(raw);
      else t = s_w * float(int32_t(raw));
      return s_a * t + bias;
    };

    // Persistent instances store their tiles by TMA (a 16-bit output TMA can address, tmap_d:
    // plan_sm90_w4a8 plans one tile per CTA for the others), except the s32 ones (the slab).
    // With both ways behind a run-time flag, ptxas (13.0) moved the persistent main loops' ring
    // position and wgmma descriptors off the uniform datapath: 183 instructions per two K
    // blocks against 151 (per channel, BM = 128), 518 against 487 (f32 group scales).
    if constexpr (kPersistent && EPI != W4A8Epilogue::s32) {
      // This thread's two channels (store_tile_by_tma: accumulator i holds channel ch_local,
      // + 8 when i & 2, and token 8·(i/4) + 2c + (i & 1)).
      const float sw2[2] = {channel_scale(n0 + ch_local), channel_scale(n0 + ch_local + 8)};
      const float bias2[2] = {channel_bias(n0 + ch_local), channel_bias(n0 + ch_local + 8)};
      auto values_of = [&](int tb, float (&v)[4]) {
        const float2 s_a = *reinterpret_cast<const float2*>(&tile_a_scales[8 * tb + 2 * c]);
#pragma unroll
        for (int e = 0; e < 4; ++e)
          v[e] = out_value(raw_of(4 * tb + e), sw2[e >> 1], (e & 1) ? s_a.y : s_a.x, bias2[e >> 1]);
      };
      auto at_start = [&] {
        if (scale_row < BM) tile_a_scales[scale_row] = row_a_scale;
      };
      uint8_t* buf = smem + Cfg::kRingBytes;
      if (p.d_dtype == DType::f16)
        store_tile_by_tma<__half, BM, Cfg::kStoreRounds>(buf, &tmap_d, cw, warp, lane, m0, n0,
                                                         p.m, at_start, values_of);
      else
        store_tile_by_tma<__nv_bfloat16, BM, Cfg::kStoreRounds>(
            buf, &tmap_d, cw, warp, lane, m0, n0, p.m, at_start, values_of);
      return;  // the next segment
    }

    // Each consumer warp takes whole token rows: lane l owns channels 4l..4l+3 of the tile.
    const int col = n0 + 4 * lane;
    const int esize = p.d_dtype == DType::f32 || p.d_dtype == DType::s32 ? 4 : 2;
    const bool vec_ok = col + 3 < p.n && (p.ldd * esize) % 16 == 0 &&
                        (reinterpret_cast<uintptr_t>(p.d) % 16) == 0;
    float sw4[4], bias4[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      sw4[e] = channel_scale(col + e);
      bias4[e] = channel_bias(col + e);
    }

    // Rescale, add the bias, convert and store one token row's four channels.
    auto store_row = [&](int row, const uint32_t (&raw)[4]) {
      const int64_t i0 = int64_t(row) * p.ldd + col;
      if constexpr (EPI == W4A8Epilogue::s32) {
        int32_t* d = static_cast<int32_t*>(p.d) + i0;
        if (vec_ok) {
          *reinterpret_cast<int4*>(d) =
              make_int4(int32_t(raw[0]), int32_t(raw[1]), int32_t(raw[2]), int32_t(raw[3]));
        } else {
          for (int e = 0; e < 4 && col + e < p.n; ++e) d[e] = int32_t(raw[e]);
        }
        return;
      } else {
        const float s_a = tile_a_scales[row - m0];  // visible: write_transposed_tile's barrier
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = out_value(raw[e], sw4[e], s_a, bias4[e]);
        store_float4(p.d, p.d_dtype, i0, v, vec_ok, p.n - col);
      }
    };

    if constexpr (kPersistent) {
      // The producer is filling the ring with the next tile's stages: out through the slab.
      store_tile_by_slabs<BM, kAcc, Cfg::kOutPitch, Cfg::kSlabTokens>(
          smem + Cfg::kRingBytes, tid, ch_local, c, m0, p.m, col < p.n, raw_of,
          [&] {  // the previous tile's rows are stored: its scales may be overwritten
            if (scale_row < BM) tile_a_scales[scale_row] = row_a_scale;
          },
          store_row);
    } else {
      store_transposed_tile<BM, Cfg::kOutPitch, Cfg::kFloatTile>(
          smem, tid, m0, n0, tile_n * tiles_m + tile_m, p.m, p.n, p.workspace, p.counters,
          p.cluster_split, store_row);
    }
  });  // segments
  // store_tile_by_tma: the last stores are done before the CTA's shared memory goes.
  if constexpr (kPersistent && EPI != W4A8Epilogue::s32)
    if (tma_store_issuer(warp, lane)) ptx::bulk_wait_group<0>();
  if (multicast) ptx::cluster_wait();
#else
  // Compiled for a target without wgmma: the launcher never selects this kernel there.
  __trap();
#endif
}

}  // namespace nibble::cuda::sm90
