// sm90_weight_only_gemm — W4A16 and W8A16 on Hopper's warpgroup MMA (sm_90a): int4 or int8
// weights × bf16/f16 activations, f32 accumulation. TMA loads into a shared-memory ring, one
// producer and two consumer warpgroups; the consumers dequantize the weights in registers and
// feed them to wgmma as its register-sourced A operand (the Machete arrangement).
//
//   per_channel   D[m,n] = s[n] · Σ_k x[m,k]·(u[n,k] − c)                c = 8 (4-bit), 128 (8-bit)
//   group_scale   D[m,n] = Σ_k x[m,k]·T((u − c)·s[g,n])
//   group_zero    D[m,n] = Σ_k x[m,k]·T((u − z[g,n])·s[g,n])             (4-bit, u4_asym)
//   group_fzp     D[m,n] = Σ_k x[m,k]·T((u − 8)·s[g,n] + z[g,n])         (4-bit, u4_fzp)
//   (+ bias[n]; D f32, f16 or bf16; T the activations' 16-bit type, g = k / G)
// The same numbers as sm80_weight_only_gemm: the dequantization is that kernel's (shared code,
// sm80/sm80_weight_only_gemm.cuh), only the MMA and the data movement differ.
//
// Operands (the same as sm80_weight_only_gemm's, so one packed weight serves both kernels)
//   x   (M, K) bf16 or f16, row-major, pitch `ldx` elements; base 16-byte aligned, ldx and K
//       multiples of 8.
//   w   layout w4_mma16_k128 / w8_mma16_k128: blocks of 8 channels × 128 k, each lane's B
//       fragments of mma.m16n8k16 for the block's eight k16 steps in one 16- (32-) byte run.
//   s,z f32, (N_pad) per channel or (⌈K_pad/G⌉, N_pad) per group.
//
// Why the weights are wgmma's A operand (as in sm90_w4a8_gemm)
//   wgmma takes B only from shared memory, A from registers: dequantized weights go straight in
//   as A, and the MMA computes Dᵀ (weight channels × tokens). wgmma's A fragment of warp w
//   (channels 16w..16w+15) is mma.m16n8k16's A, whose halves are the B fragments of the two
//   n8 blocks 2w and 2w+1 that the layout stores per lane; for k16 step s:
//     a[0] = block 2w,   k 2c..2c+1 of step s     a[1] = block 2w+1, the same k
//     a[2] = block 2w,   k 8+2c..                 a[3] = block 2w+1, the same k
//
// Work split
//   grid: one CTA per 128-channel × BM-token output tile (bands of 8 token tiles walk down one
//   channel column), or one persistent CTA per SM walking those tiles in that order or taking
//   an equal stream-K range of all tiles' K blocks (cuda/sm90/tile_schedule.cuh: a tile's owner
//   adds the other CTAs' partial tiles in K order), split-K along gridDim.z where the
//   planner's estimate of waves × CTA time says so: a tile's splits are one thread-block
//   cluster (partials summed over distributed shared memory), or, where the GPU runs no
//   clusters, go through a workspace. Cluster-split grids launch to overlap the kernel before
//   them (p.overlap, cuda/launch/pdl_launch.h): the producer issues the weight loads of the
//   first min(STAGES, K blocks) stages before griddepcontrol.wait and their activation loads
//   after it; the consumers wait before writing the output.
//   Producer (one thread): per 128-wide K block, two TMA copies of the activation tile (BM rows ×
//   64 elements each, 128-byte swizzle, zero-filled past M and K), one of the weight tile (16 n8
//   blocks) and, for group-wise formats, one of the block's group scales (and one of its zeros).
//   Consumers (two warpgroups, 64 channels each): per unit — a K block, or half of one at
//   BM = 256 — dequantize their weights for the unit's k16 steps and issue its wgmma m64nBMk16;
//   one unit stays in flight while the next is dequantized (fragments alternate between two
//   register sets: 2 × 32 registers for whole blocks, 2 × 16 for halves, which is what fits
//   beside a 256-token tile's 128 accumulators in the 168 registers of a 384-thread CTA).
//   Epilogue: cuda/sm90/transposed_tile.cuh (transposed through shared memory, split-K summed in
//   split order: deterministic); the channel scale (per channel) and the bias on the way out.
//
// Limitations
//   1. sm_90a only (wgmma, setmaxnreg); other GPUs run sm80_weight_only_gemm.
//   2. BM ∈ {64, 128, 256}. Persistent CTAs (unsplit grids of more tiles than SMs, see
//      WeightOnlyWgmmaConfig::kPersistent) hide the next tile's pipeline fill behind the
//      epilogue, not the epilogue itself; split grids keep one tile (or split) per CTA, and the
//      planner weighs each CTA's fixed cost against wave quantization (sm90_tiling.h). Stream-K
//      pays a partial tile's round trip through L2 per CTA (3–13 µs a call on the H100), so
//      the planner takes it only where the balance gains more. 8-bit weights at BM = 256 (only
//      ever forced) have no persistent instance: its consumers spilled.
//   3. BM = 256 has 3 stages (2 for 8-bit weights or 4-bit g32 with zeros) in the 227 KB.
//   4. Group sizes 32–256 as the layout allows (1, 2 or 4 groups per K block; G = 256 spans two).
// Verify: build/cuda/tests/cpp/nibble_tests --gtest_filter='CudaWeightOnly*'
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/element.cuh"
#include "cuda/common/ptx_sm90.cuh"
#include "cuda/common/raster.cuh"
#include "cuda/launch/sm80_weight_only_gemm.h"
#include "cuda/sm80/sm80_weight_only_gemm.cuh"
#include "cuda/sm90/block_pipeline.cuh"
#include "cuda/sm90/overlapped_tma_producer.cuh"
#include "cuda/sm90/tile_schedule.cuh"
#include "cuda/sm90/transposed_tile.cuh"
#include "nibble/types.h"

namespace nibble::cuda::sm90 {

using sm80::WeightOnlyDequant;

struct WeightOnlyWgmmaParams {
  const float* w_scales = nullptr;  // per channel (N_pad): applied in the epilogue
  const void* bias = nullptr;
  DType bias_dtype = DType::f32;
  void* d = nullptr;
  int64_t ldd = 0;  // elements
  DType d_dtype = DType::bf16;
  int m = 0, n = 0, kblocks = 0;
  int group_shift = 0;            // log2(G) for the group-wise dequantizations
  int kblocks_per_split = 0;      // K blocks per CTA along gridDim.z (split-K)
  void* workspace = nullptr;      // splits·M·N f32 partials (workspace split-K only)
  int* counters = nullptr;        // one per output tile, zero between calls
  bool cluster_split = false;     // the splits of a tile are one cluster (1, 1, gridDim.z)
  // Persistent instances (WeightOnlyWgmmaConfig::kSchedule whole_tiles or stream_k): gridDim.x
  // CTAs walk the tiles_m × tiles_n tiles; one-tile instances read the tile grid off gridDim.
  // Stream-K (cuda/sm90/tile_schedule.cuh): workspace holds gridDim.x partial tiles, counters
  // gridDim.x flags, and the first whole_tiles tiles (a multiple of gridDim.x) go whole.
  int tiles_m = 0, tiles_n = 0;
  int whole_tiles = 0;
  // Launched to overlap the kernel before it (cluster-split grids, one tile or split per CTA):
  // the producer issues the first stages' weight loads before griddepcontrol.wait.
  bool overlap = false;
};

template <class T_, int kBits_, WeightOnlyDequant DQ_, int kGroupRows_, int BM_, int STAGES_,
          TileSchedule SCHEDULE_ = TileSchedule::one_tile>
struct WeightOnlyWgmmaConfig {
  // The names sm80::detail::raw_pair and dequant_pair read:
  using T = T_;
  static constexpr bool kF16 = std::is_same_v<T, __half>;
  static constexpr int kBits = kBits_;
  static constexpr WeightOnlyDequant DQ = DQ_;
  static constexpr int kBlockBytes = 8 * 128 * kBits / 8;  // one 8×128 weight block
  static constexpr int kLaneBytes = kBlockBytes / 32;       // 16 (4-bit) or 32 (8-bit)
  static constexpr int kCenter = kBits == 4 ? 8 : 128;
  // 4-bit pairs as one LOP3 (mask | magic, sm80::detail::raw_pair): at BM = 128 a consumer
  // warp issues about 235 instructions per K block, more than its share of the block's 1024
  // tensor-core cycles hides at the ~6 cycles each it ran at (ncu, H200), so every conversion
  // instruction cut is time the tensor cores wait less. Not in BM = 256 per-channel instances:
  // with the constant in a register their persistent instance spilled (8 bytes, ptxas 13.0).
  static constexpr bool kNibbleMaskInRegister =
      !(BM_ == 256 && DQ_ == WeightOnlyDequant::per_channel);
  static constexpr bool kGrouped = DQ != WeightOnlyDequant::per_channel;
  static constexpr bool kHasZeros =
      DQ == WeightOnlyDequant::group_zero || DQ == WeightOnlyDequant::group_fzp;
  static constexpr int kGroupRows = kGroupRows_;  // groups per K block (0 per channel)
  static constexpr int kStepsPerGroup = kGroupRows > 0 ? 8 / kGroupRows : 8;

  static constexpr int BM = BM_;        // tokens per CTA tile (wgmma N)
  static constexpr int BN = 128;        // weight channels per CTA tile (2 × wgmma M)
  static constexpr int kBK = 128;       // K per stage
  static constexpr int STAGES = STAGES_;
  static constexpr int kThreads = 384;  // producer + 2 consumer warpgroups
  static constexpr int kAcc = BM / 2;   // f32 accumulators per consumer thread
  // The consumers' unit of work: a whole K block (eight k16 steps) or, at BM = 256, half of
  // one. Two units' fragments are held at once (one in flight, one being converted), and a
  // 256-token consumer's 128 accumulators leave room for two half blocks (2 × 16 registers),
  // not two whole ones, within the 168 registers of a 384-thread CTA.
  static constexpr int kUnitsPerBlock = BM == 256 ? 2 : 1;
  static constexpr int kUnitSteps = 8 / kUnitsPerBlock;
  static constexpr int kXHalfBytes = BM * 128;  // 64 elements of K per row: one swizzle atom
  static constexpr int kXBytes = 2 * kXHalfBytes;
  static constexpr int kWBytes = (BN / 8) * kBlockBytes;
  static constexpr int kTableBytes = kGroupRows * BN * 4;  // one group table (scales or zeros)
  static constexpr int kGBytes = kTableBytes * (kHasZeros ? 2 : 1);
  static constexpr int kTxBytes = kXBytes + kWBytes + kGBytes;
  // 1024-byte aligned stages: the 128-byte swizzle repeats every 1024 bytes and the wgmma
  // descriptor assumes each activation half-tile starts on that boundary.
  static constexpr int kStageBytes = (kTxBytes + 1023) / 1024 * 1024;
  static constexpr int kOutPitch = BN + 4;
  static constexpr int kOutBytes = BM * kOutPitch * 4;
  static constexpr int kRingBytes = STAGES * kStageBytes;
  static constexpr int kBarrierOffset = kRingBytes > kOutBytes ? kRingBytes : kOutBytes;
  /// Persistent CTAs walk tiles blockIdx.x, blockIdx.x + gridDim.x, ...; the producer runs on
  /// into the next tile's K blocks while the consumers store a tile, so the tile cannot leave
  /// through the ring: it leaves through the stage of its own last K block, which the consumers
  /// keep until they have stored it, kSlabTokens token rows at a time (the most whole rows of
  /// kOutPitch words that a stage holds: half the tile at every BM).
  static constexpr TileSchedule kSchedule = SCHEDULE_;
  static constexpr bool kPersistent = SCHEDULE_ != TileSchedule::one_tile;
  static constexpr bool kStreamK = SCHEDULE_ == TileSchedule::stream_k;
  static constexpr int kSlabTokens = kStageBytes >= BM * kOutPitch * 4       ? BM
                                     : kStageBytes >= BM / 2 * kOutPitch * 4 ? BM / 2
                                                                             : BM / 4;
  static constexpr int kSmemBytes = kBarrierOffset + 2 * STAGES * 8 + 1024;  // + alignment

  static_assert(kBits == 4 || kBits == 8, "4- or 8-bit weights");
  static_assert(kBits == 4 || !kHasZeros, "zero points exist for 4-bit weights only");
  static_assert(kGrouped == (kGroupRows > 0) && 8 % (kGroupRows > 0 ? kGroupRows : 1) == 0,
                "group-wise formats need 1, 2 or 4 groups per K block; per channel none");
  static_assert(BM == 64 || BM == 128 || BM == 256, "wgmma n is 64, 128 or 256 here");
  static_assert(kSlabTokens * kOutPitch * 4 <= kStageBytes, "a slab fits in a stage");
};

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, 1)
    sm90_weight_only_gemm_kernel(const __grid_constant__ CUtensorMap tmap_x,
                                 const __grid_constant__ CUtensorMap tmap_w,
                                 const __grid_constant__ CUtensorMap tmap_s,
                                 const __grid_constant__ CUtensorMap tmap_z,
                                 const __grid_constant__ WeightOnlyWgmmaParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using T = typename Cfg::T;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, STAGES = Cfg::STAGES, kAcc = Cfg::kAcc;
  constexpr int kWords = Cfg::kLaneBytes / 4;  // a lane's words of one weight block
  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + Cfg::kBarrierOffset);
  uint64_t* empty = full + STAGES;

  constexpr bool kPersistent = Cfg::kPersistent;  // whole tiles or stream-K ranges
  const int tiles_m = kPersistent ? p.tiles_m : gridDim.x;
  const int tiles_n = kPersistent ? p.tiles_n : gridDim.y;
  // The segments (K ranges of tiles, tile_seq in band_raster order) this CTA computes: one tile
  // or split numbered by the grid, or a persistent CTA's tiles or stream-K range.
  const int tile_count = kPersistent ? tiles_m * tiles_n : 1;
  const int split_kb = blockIdx.z * p.kblocks_per_split;
  const TileSegment one_tile{0, split_kb, min(p.kblocks, split_kb + p.kblocks_per_split)};
  auto tile_at = [&](int tile_seq) {
    return band_raster(kPersistent ? tile_seq : blockIdx.y * tiles_m + blockIdx.x, tiles_m,
                       tiles_n);
  };

  const int tid = threadIdx.x, wg = tid / 128;
  // Launched to overlap (p.overlap), the next kernel may start its own prologue now: it waits
  // for this grid before reading anything it writes.
  if (!kPersistent && p.overlap) ptx::griddep_launch_dependents();
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) {
      ptx::mbarrier_init(&full[s], 1);
      ptx::mbarrier_init(&empty[s], 8);  // one arrival per consumer warp
    }
    ptx::fence_barrier_init();
    ptx::prefetch_tensor_map(&tmap_x);
    ptx::prefetch_tensor_map(&tmap_w);
    if constexpr (Cfg::kGrouped) ptx::prefetch_tensor_map(&tmap_s);
    if constexpr (Cfg::kHasZeros) ptx::prefetch_tensor_map(&tmap_z);
  }
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
          ptx::tma_load_2d(stage, &tmap_x, &full[s], kb * Cfg::kBK, m0);
          ptx::tma_load_2d(stage + Cfg::kXHalfBytes, &tmap_x, &full[s], kb * Cfg::kBK + 64, m0);
        }
        if (parts & kStageWeights) {
          uint8_t* w_sh = stage + Cfg::kXBytes;
          ptx::tma_load_3d(w_sh, &tmap_w, &full[s], 0, kb, n0 / 8);
          if constexpr (Cfg::kGrouped) {
            const int first_group = (kb * Cfg::kBK) >> p.group_shift;
            ptx::tma_load_2d(w_sh + Cfg::kWBytes, &tmap_s, &full[s], n0, first_group);
            if constexpr (Cfg::kHasZeros)
              ptx::tma_load_2d(w_sh + Cfg::kWBytes + Cfg::kTableBytes, &tmap_z, &full[s], n0,
                               first_group);
          }
        }
      };
      if (!kPersistent && p.overlap) {
        // Launched to overlap the kernel before it (one tile or split per CTA): the first
        // stages' weights load before waiting for that kernel, their activations after.
        const TileCoord tile = tile_at(0);
        const int m0 = tile.m * BM, n0 = tile.n * BN;
        load_tma_tile_overlapped<STAGES>(
            one_tile.kb_begin, one_tile.kb_end - one_tile.kb_begin, empty,
            [&](int s, int kb, int parts) { load_stage(s, kb, m0, n0, parts); });
      } else {
        // `it` counts the K blocks loaded over all of this CTA's segments: the ring position.
        int it = 0;
        for_each_segment<Cfg::kSchedule>(one_tile, tile_count, p.whole_tiles, p.kblocks,
                                      [&](const TileSegment& seg) {
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
    return;
  }

  // ---- consumers -------------------------------------------------------------------------------
  ptx::setmaxnreg_inc<232>();
  // Launched to overlap the kernel before it: the output is written only once that kernel is
  // done (a no-op otherwise).
  if (!kPersistent && p.overlap) ptx::griddep_wait();
  const int cw = wg - 1;                      // consumer warpgroup: channels 64·cw ..
  const int warp = (tid / 32) % 4, lane = tid % 32;
  const int g = lane / 4, c = lane % 4;
  const int ch_local = 64 * cw + 16 * warp + g;  // this thread's channels: ch_local, ch_local + 8
  int kb_done = 0;  // K blocks consumed for this CTA's earlier segments: the ring position
  for_each_segment<Cfg::kSchedule>(one_tile, tile_count, p.whole_tiles, p.kblocks,
                                [&](const TileSegment& seg) {
    const TileCoord tile = tile_at(seg.tile_seq);
    const int m0 = tile.m * BM, n0 = tile.n * BN;
    const int num_kb = seg.kb_end - seg.kb_begin;
    // Stream-K: the rest of a tile another CTA owns, or the start of one this CTA owns and the
    // CTAs after it finished (its K blocks [0, num_kb)). Decided before the main loop, so that
    // only two predicates stay live across it.
    const bool piece = Cfg::kStreamK && seg.kb_begin > 0;
    const bool owns_pieces = Cfg::kStreamK && seg.kb_begin == 0 && num_kb < p.kblocks;

    float acc[kAcc];
#pragma unroll
    for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
    [[maybe_unused]] const uint32_t center2 =
        sm80::detail::splat<T>(sm80::Half2Magic<T>::kValue + float(Cfg::kCenter));

    // One unit (a K block, or half of one at BM = 256): wait for the block's stage, dequantize
    // this lane's weights of the two n8 blocks of its warp for the unit's k16 steps into frag (A
    // fragments) and issue the unit's wgmma. Returns the stage when the unit ends its block (the
    // stage may be released once the unit's group has completed), -1 otherwise.
    constexpr int kUnits = Cfg::kUnitsPerBlock, kUnitSteps = Cfg::kUnitSteps;
    using Frag = uint32_t[kUnitSteps][4];
    auto issue_unit = [&](int it, Frag& frag) {
      const int kb_it = kb_done + it / kUnits, unit = it % kUnits, step0 = unit * kUnitSteps;
      const int s = kb_it % STAGES;
      if (unit == 0) ptx::mbarrier_wait(&full[s], (kb_it / STAGES) & 1);
      const uint8_t* stage = smem + s * Cfg::kStageBytes;
      const uint8_t* w_sh = stage + Cfg::kXBytes;
      [[maybe_unused]] const float* g_sh = reinterpret_cast<const float*>(w_sh + Cfg::kWBytes);
      // A lane's words of a block are 8 k16 steps in order (4-bit: two steps a word, 8-bit: one),
      // so the unit's steps are one contiguous run of them.
      uint32_t wq[2][kWords];
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int v = 0; v < kWords / 4; ++v) {
          if (kWords / 4 == kUnits && v != unit) continue;  // 8-bit halves: only the unit's 16 B
          const uint4 q =
              ptx::lds128(w_sh + (8 * cw + 2 * warp + b) * Cfg::kBlockBytes +
                          lane * Cfg::kLaneBytes + v * 16);
          wq[b][4 * v] = q.x;
          wq[b][4 * v + 1] = q.y;
          wq[b][4 * v + 2] = q.z;
          wq[b][4 * v + 3] = q.w;
        }
      [[maybe_unused]] sm80::detail::GroupPair group[2];  // this thread's two channels
#pragma unroll
      for (int j = 0; j < kUnitSteps; ++j) {
        const int step = step0 + j;
        if constexpr (Cfg::kGrouped) {
          if (j == 0 || step % Cfg::kStepsPerGroup == 0) {  // the unit's or a new group's constants
            const int grow = step / Cfg::kStepsPerGroup;
#pragma unroll
            for (int b = 0; b < 2; ++b)
              group[b] = sm80::detail::group_pair<Cfg>(g_sh, Cfg::kTableBytes / 4, grow * BN,
                                                       ch_local + 8 * b);
          }
        }
        // a[0], a[1]: k 2c.. of blocks 2w, 2w+1; a[2], a[3]: k 8+2c..
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int b = r & 1, half = r >> 1;
          frag[j][r] = sm80::detail::dequant_pair<Cfg>(
              sm80::detail::raw_pair<Cfg>(wq[b], step, half), group[b], center2);
        }
      }
      // Activation half-tile step/4, +32 bytes (2 descriptor units) per k16 step inside it.
      const uint64_t desc0 = ptx::smem_desc_k128_sw128(stage);
      const uint64_t desc1 = ptx::smem_desc_k128_sw128(stage + Cfg::kXHalfBytes);
#pragma unroll
      for (int i = 0; i < kAcc; ++i) ptx::fence_operand(acc[i]);
      ptx::wgmma_fence();
#pragma unroll
      for (int j = 0; j < kUnitSteps; ++j) {
        const int step = step0 + j;
        ptx::wgmma_f32_rs<BM, Cfg::kF16>(acc, frag[j], (step < 4 ? desc0 : desc1) + 2 * (step & 3),
                                         1);
      }
      ptx::wgmma_commit();
      return unit == kUnits - 1 ? s : -1;
    };
    auto keep_until_here = [](Frag& frag) {
#pragma unroll
      for (int j = 0; j < kUnitSteps; ++j)
#pragma unroll
        for (int r = 0; r < 4; ++r) ptx::fence_operand(frag[j][r]);
    };
    auto release = [&](int s) {
      __syncwarp();
      if (lane == 0) ptx::mbarrier_arrive(&empty[s]);
    };
    // One unit's wgmma stay in flight while the next unit is dequantized and issued
    // (cuda/sm90/block_pipeline.cuh); a stage is released after its block's last unit.
    Frag frag[2];
    // Persistent: the last K block's stage stays with the consumers for the epilogue.
    const int last_stage = run_blocks_one_in_flight<kPersistent>(num_kb * kUnits, frag, issue_unit,
                                                                 keep_until_here, release);
    kb_done += num_kb;
#pragma unroll
    for (int i = 0; i < kAcc; ++i) ptx::fence_operand(acc[i]);
    if constexpr (Cfg::kStreamK) {
      if (piece) {
        stream_k_put_partial(acc, p.workspace, p.counters, blockIdx.x, tid - 128);
        release(last_stage);
        return;
      }
      if (owns_pieces)
        stream_k_add_partials<true>(acc, p.workspace, p.counters, blockIdx.x, num_kb, p.kblocks,
                                    gridDim.x,
                                    stream_k_units(tile_count, p.whole_tiles, p.kblocks),
                                    tid - 128);
    }

    // ---- epilogue: f32 sums through shared memory; channel scale and bias on the way out -------
    if constexpr (!kPersistent) {
      uint32_t raw[kAcc];
#pragma unroll
      for (int i = 0; i < kAcc; ++i) raw[i] = __float_as_uint(acc[i]);
      write_transposed_tile<kAcc, Cfg::kOutPitch>(smem, raw, ch_local, c);
    }
    const int col = n0 + 4 * lane;
    const int esize = p.d_dtype == DType::f32 ? 4 : 2;
    const bool vec_ok = col + 3 < p.n && (p.ldd * esize) % 16 == 0 &&
                        (reinterpret_cast<uintptr_t>(p.d) % 16) == 0;
    float sw4[4] = {1.0f, 1.0f, 1.0f, 1.0f}, bias4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (col + e >= p.n) break;
      if constexpr (!Cfg::kGrouped) sw4[e] = p.w_scales[col + e];
      if (p.bias != nullptr) bias4[e] = load_float(Operand{p.bias, p.bias_dtype, 1}, col + e, 0);
    }
    auto store_row = [&](int row, const uint32_t (&raw)[4]) {
      float v[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        // s · sum + bias, as sm80_weight_only_gemm computes it (group formats: s = 1).
        v[e] = Cfg::kGrouped ? __uint_as_float(raw[e]) + bias4[e]
                             : __uint_as_float(raw[e]) * sw4[e] + bias4[e];
      }
      store_float4(p.d, p.d_dtype, int64_t(row) * p.ldd + col, v, vec_ok, p.n - col);
    };
    if constexpr (kPersistent) {
      store_tile_by_slabs<BM, kAcc, Cfg::kOutPitch, Cfg::kSlabTokens>(
          smem + last_stage * Cfg::kStageBytes, tid, ch_local, c, m0, p.m, col < p.n,
          [&](int i) { return __float_as_uint(acc[i]); }, [] {}, store_row);
      // The stage goes back to TMA: the slab's st.shared writes are ordered before its next
      // copies, and this warp has read its rows of the last slab.
      ptx::fence_proxy_async_shared();
      release(last_stage);
    } else {
      store_transposed_tile<BM, Cfg::kOutPitch, true>(smem, tid, m0, n0, tile.n * tiles_m + tile.m,
                                                      p.m, p.n, p.workspace, p.counters,
                                                      p.cluster_split, store_row);
    }
  });  // segments
#else
  // Compiled for a target without wgmma: the launcher never selects this kernel there.
  __trap();
#endif
}

}  // namespace nibble::cuda::sm90
