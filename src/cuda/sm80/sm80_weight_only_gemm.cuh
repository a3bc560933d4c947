// sm80_weight_only_gemm — W4A16 and W8A16: int4 or int8 weights × bf16/f16 activations on
// mma.sync.m16n8k16 (sm_80, sm_86, sm_89, sm_90), f32 accumulation. The Marlin class of kernel.
//
//   per_channel   D[m,n] = s[n] · Σ_k x[m,k]·(u[n,k] − c)                c = 8 (4-bit), 128 (8-bit)
//   group_scale   D[m,n] = Σ_k x[m,k]·T((u − c)·s[g,n])
//   group_zero    D[m,n] = Σ_k x[m,k]·T((u − z[g,n])·s[g,n])             (4-bit, u4_asym)
//   group_fzp     D[m,n] = Σ_k x[m,k]·T((u − 8)·s[g,n] + z[g,n])         (4-bit, u4_fzp)
//   (+ bias[n]; D f32, f16 or bf16; T the activations' 16-bit type, g = k / G)
//
// Operands
//   x   (M, K) bf16 or f16, row-major, row pitch `ldx` elements; base 16-byte aligned, ldx and
//       K multiples of 8.
//   w   layout w4_mma16_k128 or w8_mma16_k128 (include/nibble/layout.h): blocks of 8 rows ×
//       128 k, one 16-byte (4-bit) or 32-byte (8-bit) run per lane holding exactly that lane's
//       B fragments for the block's eight k16 steps; values unsigned (u = v + 8 or v + 128).
//   s,z f32, (N_pad) per channel or (⌈K_pad/G⌉, N_pad) per group.
//
// Exactness: u − c and u − z are small integers and exact in T. Group-wise, the weight is
// rounded once to T after its scale (as in Marlin, torch's int4 mm and the AWQ/GPTQ kernels):
// relative error ≤ 2⁻⁹ (bf16) or 2⁻¹² (f16) per weight; products and sums are f32. Per channel
// the integer weight goes in exactly and the scale multiplies the f32 sum.
//
// Work split
//   grid (N/BN, M/BM, splits); a CTA owns a BM×BN tile and a contiguous range of 128-wide K
//   blocks; STAGES-deep cp.async ring (x tile BM×256 bytes, W tile BN×64 or BN×128 bytes, the
//   block's group scales and zeros). Warps tile the CTA as WARPS_M × WARPS_N: MT m16 × NT n8
//   f32 accumulator tiles each. Split-K partials are summed in split order by the tile's last
//   CTA (cuda/common/split_k.cuh): deterministic. On sm_90+ the splits of a decode tile
//   (p.cluster_split, up to 16) are instead one thread-block cluster and reduce over
//   distributed shared memory, in the same order (same results, no workspace round trip).
//
//   x in shared memory: rows of 256 bytes = 16 chunks of 16; chunk c of row r is stored at
//   c ^ (r % 8) (the XOR stays inside each 128-byte half). ldmatrix reads one chunk column of 8
//   consecutive rows; the XOR spreads them over all 32 banks.
//
// Integer → 16-bit float without per-element conversion instructions (the magic-number trick):
//   4-bit:       (word >> 4i) & 0x000F000F | MAGIC  places one nibble in the low mantissa bits of
//                each half: bf16 0x4300 = 128.0 (ulp 1) gives 128 + u, f16 0x6400 = 1024.0 gives
//                1024 + u. One SHF + one LOP3 per pair; then HSUB2 of (MAGIC + c) leaves u − c.
//   8-bit f16:   PRMT the bytes under 0x64 high bytes: 1024 + u (u < 256 < 1024 ulps).
//   8-bit bf16:  bf16 cannot hold 128 + u for u ≥ 128 (7 mantissa bits), so PRMT into f32
//                0x4B0000uu = 2²³ + u, FADD −(2²³ + c) and pack the exact pair with one F2F
//                (|u − c| ≤ 128). Cutting the byte at its top bit instead ((MAGIC | m) − (256 −
//                128·b) = u − c in one HSUB2) measured slower on every shape (H100,
//                2026-11-28, M = 1: 4096×4096 10.9 against 9.7 µs, 10240×8192 35.0 against
//                31.9): LOP3 takes one immediate and ptxas keeps the masks out of registers at
//                this tile's 128-register cap, so it ran six instructions a pair (docs/kernels.md).
//
// Limitations
//   1. mma.sync: at large M on Hopper this reaches roughly 60% of the dense bf16 peak; there
//      sm90_weight_only_gemm (wgmma) takes M >= 33.
//   2. K must be a multiple of 8, rows 16-byte aligned; N and K are padded in the weight layout,
//      M is guarded (zero-filled rows, masked stores).
//   3. Split-K partials go through a workspace of splits·M·N·4 bytes plus one counter per tile.
// Verify: build/cuda/tests/cpp/nibble_tests --gtest_filter='CudaWeightOnly*'
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "cuda/common/element.cuh"
#include "cuda/common/int4_decode.cuh"
#include "cuda/common/overlap_prologue.cuh"
#include "cuda/common/ptx.cuh"
#include "cuda/common/raster.cuh"
#include "cuda/common/split_k.cuh"
#include "cuda/common/thread_chunks.cuh"
#include "cuda/launch/sm80_weight_only_gemm.h"
#include "nibble/types.h"

namespace nibble::cuda::sm80 {

struct WeightOnlyGemmParams {
  const void* x = nullptr;
  int64_t ldx = 0;                // elements
  const uint8_t* w = nullptr;     // w4_mma16_k128 / w8_mma16_k128
  const float* w_scales = nullptr;
  const float* w_zeros = nullptr;
  const void* bias = nullptr;
  DType bias_dtype = DType::f32;
  void* d = nullptr;
  int64_t ldd = 0;                // elements
  DType d_dtype = DType::bf16;
  int m = 0, n = 0, k = 0, n_pad = 0, kblocks = 0;
  int group_shift = 0;            // log2(G) for the group-wise dequantizations
  int splits = 1, kblocks_per_split = 0;
  bool overlap_allowed = false;   // host side: the GPU and settings allow overlapping launches
                                  // (cuda/launch/pdl_launch.h); the kernel does not read it
  int prefetch_blocks = 0;        // overlapping decode tiles: weight blocks per n8 row (or 128-
                                  // byte K blocks per row) asked of L2 before the wait
  int early_weight_stages = 0;    // overlapping decode tiles: ring stages whose weights load
                                  // before the wait (overlap_early_weight_stages)
  void* workspace = nullptr;      // splits·M·N f32 partials
  int* counters = nullptr;        // one per output tile, zero between calls
  bool cluster_split = false;     // the splits of a tile are one cluster (cuda/common/split_k.cuh)
};

/// The 16-bit type's magic number: MAGIC | u (u < one ulp-count of the mantissa) is MAGIC + u.
template <class T>
struct Half2Magic;
template <>
struct Half2Magic<__nv_bfloat16> {
  static constexpr uint32_t kBits2 = 0x43004300u;  // (128.0, 128.0)
  static constexpr float kValue = 128.0f;
};
template <>
struct Half2Magic<__half> {
  static constexpr uint32_t kBits2 = 0x64006400u;  // (1024.0, 1024.0)
  static constexpr float kValue = 1024.0f;
};

template <class T_, int kBits_, WeightOnlyDequant DQ_, int kGroupRows_, int BM_, int BN_,
          int WARPS_M_, int WARPS_N_, int STAGES_, int MIN_BLOCKS_>
struct WeightOnlyGemmConfig {
  using T = T_;
  static constexpr bool kF16 = std::is_same_v<T, __half>;
  static constexpr int kBits = kBits_;
  static constexpr WeightOnlyDequant DQ = DQ_;
  static constexpr int BM = BM_, BN = BN_, WARPS_M = WARPS_M_, WARPS_N = WARPS_N_;
  static constexpr int STAGES = STAGES_;
  /// CTAs per SM the register budget must allow (__launch_bounds__). The main loop is a chain of
  /// dependent loads, conversions and MMAs per warp, so the SM needs several warps per
  /// scheduler to hide it (ncu, H100: 2 warps per scheduler issued once per 5 cycles).
  static constexpr int kMinBlocks = MIN_BLOCKS_;
  static constexpr int kThreads = WARPS_M * WARPS_N * 32;
  static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;
  static constexpr int MT = WM / 16, NT = WN / 8;
  static constexpr int kBK = 128;                       // K elements per stage
  static constexpr int kBlockBytes = 8 * kBK * kBits / 8;  // one 8×128 weight block
  static constexpr int kLaneBytes = kBlockBytes / 32;   // 16 (4-bit) or 32 (8-bit)
  /// The decode tiles (M ≤ 32) are launched to overlap the previous kernel in the stream
  /// (programmatic dependent launch on sm_90+, cuda/launch/pdl_launch.h).
  static constexpr bool kOverlapLaunch = BM <= 32;
  static constexpr bool kGrouped = DQ != WeightOnlyDequant::per_channel;
  static constexpr bool kHasZeros =
      DQ == WeightOnlyDequant::group_zero || DQ == WeightOnlyDequant::group_fzp;
  /// Groups per 128-wide K block: 1 (G ≥ 128), 2 (G = 64), 4 (G = 32); 0 per channel. A
  /// compile-time count keeps the unrolled k16 steps free of branches.
  static constexpr int kGroupRows = kGroupRows_;
  static constexpr int kStepsPerGroup = kGroupRows > 0 ? 8 / kGroupRows : 8;
  static constexpr int kGroupRowsMax = kGroupRows > 0 ? kGroupRows : 1;
  static constexpr int kXBytes = BM * kBK * 2;
  static constexpr int kWBytes = (BN / 8) * kBlockBytes;
  static constexpr int kScaleRegionBytes = kGroupRowsMax * BN * 4;
  static constexpr int kGroupBytes = kGrouped ? kScaleRegionBytes * (kHasZeros ? 2 : 1) : 0;
  static constexpr int kStageBytes = kXBytes + kWBytes + kGroupBytes;
  static constexpr int kSmemBytes = STAGES * kStageBytes;
  /// u − c of the symmetric encodings (u = v + 8, u = v + 128).
  static constexpr int kCenter = kBits == 4 ? 8 : 128;
  /// 4-bit pairs as two LOP3s (mask, then magic; raw_pair): holding the mask in a register for
  /// one LOP3 costs a register these 128-register tiles cannot spare (see the header).
  static constexpr bool kNibbleMaskInRegister = false;

  static_assert(kBits == 4 || kBits == 8, "4- or 8-bit weights");
  static_assert(kGrouped == (kGroupRows > 0) && 8 % kGroupRowsMax == 0,
                "group-wise formats need 1, 2 or 4 groups per K block; per channel none");
  static_assert(kBits == 4 || !kHasZeros, "zero points exist for 4-bit weights only");
  static_assert(WM % 16 == 0 && WN % 8 == 0, "warp tile must be whole m16 × n8 MMA tiles");
  static_assert(kStageBytes % 128 == 0, "stage regions must stay 128-byte aligned");
};

namespace detail {

__device__ __forceinline__ uint32_t as_u32(__nv_bfloat162 v) {
  return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ uint32_t as_u32(__half2 v) { return *reinterpret_cast<uint32_t*>(&v); }

template <class T>
__device__ __forceinline__ auto as_t2(uint32_t v) {
  if constexpr (std::is_same_v<T, __half>) return *reinterpret_cast<__half2*>(&v);
  else return *reinterpret_cast<__nv_bfloat162*>(&v);
}

/// (v, v) as a T pair, rounded to nearest.
template <class T>
__device__ __forceinline__ uint32_t splat(float v) {
  if constexpr (std::is_same_v<T, __half>) return as_u32(__float2half2_rn(v));
  else return as_u32(__float2bfloat162_rn(v));
}

/// The B fragment register `half` (0: k 2c..2c+1, 1: k 8+2c..) of k16 step `step` from a
/// lane's words of the K block, as MAGIC + u pairs — except 8-bit bf16, returned as exact
/// u − c pairs.
template <class Cfg>
__device__ __forceinline__ uint32_t raw_pair(const uint32_t (&words)[Cfg::kLaneBytes / 4],
                                             int step, int half) {
  using T = typename Cfg::T;
  if constexpr (Cfg::kBits == 4) {
    // word step/2, bits [8sp + 4half, +4) and [16 + 8sp + 4half, +4): the two k of the pair.
    const int sp = step & 1;
    const uint32_t shifted = words[step >> 1] >> (8 * sp + 4 * half);
    // A LOP3 encodes one immediate: mask and magic as written are two LOP3s; and_or holds one
    // of them in a register (Cfg::kNibbleMaskInRegister).
    if constexpr (Cfg::kNibbleMaskInRegister)
      return and_or(shifted, 0x000F000Fu, Half2Magic<T>::kBits2);
    else return (shifted & 0x000F000Fu) | Half2Magic<T>::kBits2;
  } else if constexpr (Cfg::kF16) {
    // bytes 2half, 2half+1 of the step's word under 0x64 high bytes
    return __byte_perm(words[step], 0x64646464u, half == 0 ? 0x4140u : 0x4342u);
  } else {
    // Each byte under f32 0x4B00_0000 is 2²³ + u exactly; subtracting 2²³ + c leaves u − c in
    // [−128, 127], which the F2F pack keeps exact (see the header for the measured alternative).
    const uint32_t w = words[step];
    const float lo = __uint_as_float(__byte_perm(w, 0x4B000000u, half == 0 ? 0x7440u : 0x7442u));
    const float hi = __uint_as_float(__byte_perm(w, 0x4B000000u, half == 0 ? 0x7441u : 0x7443u));
    constexpr float kBias = 8388608.0f + Cfg::kCenter;
    return as_u32(__floats2bfloat162_rn(lo - kBias, hi - kBias));
  }
}

/// One channel's group constants as T pairs: the scale s, MAGIC + z (integer zero) or z (float
/// zero); set at the first k16 step of each group.
struct GroupPair {
  uint32_t scale2 = 0, offset2 = 0, zero2 = 0;
};

/// The group constants of channel `col` from a K block's group tables in shared memory: scales
/// at g_sh[row + col], zeros `table_words` further on.
template <class Cfg>
__device__ __forceinline__ GroupPair group_pair(const float* g_sh, int table_words, int row,
                                                int col) {
  using T = typename Cfg::T;
  GroupPair gp;
  // ld.shared: the sm90 kernel's ring pointer is generic (aligned by hand), and a generic load
  // there waits longer in front of the block's first HMUL2.
  gp.scale2 = splat<T>(__uint_as_float(ptx::lds32(g_sh + row + col)));
  if constexpr (Cfg::kHasZeros) {
    const float z = __uint_as_float(ptx::lds32(g_sh + table_words + row + col));
    if constexpr (Cfg::DQ == WeightOnlyDequant::group_zero)
      gp.offset2 = splat<T>(Half2Magic<T>::kValue + z);  // exact: z ≤ 15
    else gp.zero2 = splat<T>(z);
  }
  return gp;
}

/// The 16-bit weight pair from a raw_pair: (u − c) exactly per channel, then the group's scale
/// (and zero) applied in T with one rounding.
template <class Cfg>
__device__ __forceinline__ uint32_t dequant_pair(uint32_t raw, const GroupPair& gp,
                                                 uint32_t center2) {
  using T = typename Cfg::T;
  // 8-bit bf16 pairs come out of raw_pair already as exact u − c.
  constexpr bool kRawIsExact = Cfg::kBits == 8 && !Cfg::kF16;
  if constexpr (Cfg::DQ == WeightOnlyDequant::group_zero) {
    return as_u32(__hmul2(__hsub2(as_t2<T>(raw), as_t2<T>(gp.offset2)), as_t2<T>(gp.scale2)));
  } else {
    const uint32_t exact = kRawIsExact ? raw : as_u32(__hsub2(as_t2<T>(raw), as_t2<T>(center2)));
    if constexpr (Cfg::DQ == WeightOnlyDequant::per_channel) return exact;
    else if constexpr (Cfg::DQ == WeightOnlyDequant::group_scale)
      return as_u32(__hmul2(as_t2<T>(exact), as_t2<T>(gp.scale2)));
    else return as_u32(__hfma2(as_t2<T>(exact), as_t2<T>(gp.scale2), as_t2<T>(gp.zero2)));
  }
}

}  // namespace detail

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    sm80_weight_only_gemm_kernel(const __grid_constant__ WeightOnlyGemmParams p) {
  using ptx::cp_async_16;
  using T = typename Cfg::T;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, MT = Cfg::MT, NT = Cfg::NT, STAGES = Cfg::STAGES;
  constexpr WeightOnlyDequant DQ = Cfg::DQ;
  constexpr int kWords = Cfg::kLaneBytes / 4;  // a lane's words of one K block
  extern __shared__ __align__(128) uint8_t smem[];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / Cfg::WARPS_N, warp_n = warp % Cfg::WARPS_N;
  const int tiles_n = gridDim.x, tiles_m = gridDim.y;
  const TileCoord tile = band_raster(blockIdx.y * tiles_n + blockIdx.x, tiles_m, tiles_n);
  const int m0 = tile.m * BM, n0 = tile.n * BN;
  const int kb_begin = blockIdx.z * p.kblocks_per_split;
  const int kb_end = min(p.kblocks, kb_begin + p.kblocks_per_split);
  const int num_kb = kb_end - kb_begin;
  const T* x = static_cast<const T*>(p.x);

  // Rows of x past M are not loaded: row r of the product depends on row r of x only, and
  // rows past M are never stored, so whatever those shared-memory rows hold is harmless.
  const int x_rows = min(BM, p.m - m0);

  // This thread's weight copies of a stage: the chunks tid + j·kThreads of the tile's BN/8
  // blocks (each block's kBlockBytes are contiguous in the layout), so chunk j is block
  // (tid + j·kThreads) / kWeightChunksPerBlock at the same byte offset in it: consecutive
  // passes are a fixed number of block rows apart.
  constexpr int kWeightChunksPerBlock = Cfg::kBlockBytes / 16;
  constexpr int kWeightChunks = (BN / 8) * kWeightChunksPerBlock;
  static_assert(Cfg::kThreads % kWeightChunksPerBlock == 0 && kWeightChunks % Cfg::kThreads == 0,
                "a pass of copies must cover whole weight blocks");
  constexpr int kWeightPasses = kWeightChunks / Cfg::kThreads;
  const bool w_tile_inside = n0 + BN <= p.n_pad;
  const uint8_t* w_thread =
      p.w + (int64_t((n0 >> 3) + tid / kWeightChunksPerBlock) * p.kblocks) * Cfg::kBlockBytes +
      (tid % kWeightChunksPerBlock) * 16;
  const int64_t w_pass_stride =
      int64_t(Cfg::kThreads / kWeightChunksPerBlock) * p.kblocks * Cfg::kBlockBytes;

  // The K block's group scales (and zeros) of the tile's columns.
  auto load_group_tables = [&](uint8_t* w_sh, int kb) {
    if constexpr (Cfg::kGrouped) {
      uint8_t* g_sh = w_sh + Cfg::kWBytes;
      constexpr int kChunksPerRow = BN * 4 / 16;
      constexpr int kTables = Cfg::kHasZeros ? 2 : 1;
      constexpr int kChunks = Cfg::kGroupRows * kChunksPerRow;
      const int first_group = (kb * Cfg::kBK) >> p.group_shift;
      for_each_thread_chunk<kTables * kChunks, Cfg::kThreads>(tid, [&](int i) {
        const int table = i / kChunks, r = (i % kChunks) / kChunksPerRow, c = i % kChunksPerRow;
        const int col = n0 + c * 4;
        const bool valid = col < p.n_pad;
        const float* src = (table == 0 ? p.w_scales : p.w_zeros) +
                           int64_t(first_group + r) * p.n_pad + (valid ? col : 0);
        cp_async_16(g_sh + table * Cfg::kScaleRegionBytes + r * BN * 4 + c * 16, src, valid);
      });
    }
  };

  // ---- one pipeline stage: x tile, W tile, and this K block's group scales and zeros ---------
  // `parts` picks the activation half (x: an earlier kernel's output), the weight half (W, group
  // scales and zeros: weights only; see the prologue below) or both.
  auto load_stage = [&](int stage, int kb, int parts = kStageAll) {
    uint8_t* x_sh = smem + stage * Cfg::kStageBytes;
    uint8_t* w_sh = x_sh + Cfg::kXBytes;
    if (parts & kStageActivations) {
      // 16-byte chunks (8 elements), 16 a row, rows below x_rows only
      for_each_thread_chunk_below<BM * 16, Cfg::kThreads>(tid, x_rows * 16, [&](int i) {
        const int r = i >> 4, c = i & 15;
        const int gk = kb * Cfg::kBK + c * 8;
        const bool valid = gk < p.k;  // the K tail is zero-filled: it meets padded weights
        const T* src = x + int64_t(m0 + r) * p.ldx + (valid ? gk : 0);
        cp_async_16(x_sh + r * 256 + ((c ^ (r & 7)) << 4), src, valid);
      });
    }
    if (!(parts & kStageWeights)) return;
    if (w_tile_inside) {
      // Every block row of the tile exists: this thread's chunks are w_thread + kb blocks,
      // then w_pass_stride apart. One 64-bit add a copy; the general form below spends about
      // 15 instructions on each copy's address and clamp (W8A16 decode tile, sm_90a SASS: the
      // stage load fell from ~190 to ~30 of the ~575 instructions a K block). H200, 2026-11-28:
      // W8A16 2.6-9.8% faster at M = 1 and 16, W4A16 g128 -0.2..+3.6%
      // (bench/results/h200_weight_only_hoisted_copies_ab.txt). The same hoisting of the x
      // copies, and of sm80_w4a8_gemm's thin-tile weight copies, measured 1-3% slower at M = 1
      // (more registers live across the main loop) and was left out.
      const uint8_t* src = w_thread + int64_t(kb) * Cfg::kBlockBytes;
      uint8_t* dst = w_sh + tid * 16;
#pragma unroll
      for (int j = 0; j < kWeightPasses; ++j) {
        cp_async_16(dst + j * Cfg::kThreads * 16, src, true);
        src += w_pass_stride;
      }
      return load_group_tables(w_sh, kb);
    }
    for_each_thread_chunk<kWeightChunks, Cfg::kThreads>(tid, [&](int i) {
      const int nb = i / kWeightChunksPerBlock, part = i % kWeightChunksPerBlock;
      const int gnb = (n0 >> 3) + nb;
      const bool valid = gnb * 8 < p.n_pad;
      const uint8_t* src =
          p.w + (int64_t(valid ? gnb : 0) * p.kblocks + kb) * Cfg::kBlockBytes + part * 16;
      // No L2 evict-first hint (cp_async_16_stream) here. With the hint and these fully unrolled
      // copies, ptxas 13.0 (V13.0.88) emits LDGSTS with a uniform shared base and descriptor
      // registers that nothing writes: an illegal instruction on the H100 (2026-11-28). Without
      // the hint the W4A16 decode tiles ran 8-20% faster than the looped, hinted copies and
      // W8A16 within -5..+7% (bench/results/h100_weight_only_stage_copies_ab.json);
      // scripts/sass_check.py rejects such instructions in the build.
      cp_async_16(w_sh + nb * Cfg::kBlockBytes + part * 16, src, valid);
    });
    load_group_tables(w_sh, kb);
  };

  float acc[MT][NT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.0f;

  // The thin (decode) tiles are launched to overlap the kernel before them: nothing above has
  // touched global memory. Before waiting for that kernel the CTA lets the next one start, asks
  // L2 for prefetch_blocks weight blocks past the ring stages it loads early, and issues those
  // stages' weight loads into shared memory (early_weight_stages of the prologue's, by default
  // all; weights are no earlier kernel's output: cuda/common/overlap_prologue.cuh). x comes
  // after the wait (load_prologue_stages).
  if constexpr (Cfg::kOverlapLaunch) {
    const int early = min(min(num_kb, STAGES - 1), p.early_weight_stages);
    overlap_prologue_start_blocked(p.w, n0 / 8, BN / 8, p.n_pad / 8, p.kblocks, kb_begin + early,
                                   max(0, min(num_kb - early, p.prefetch_blocks)),
                                   Cfg::kBlockBytes);
    load_prologue_stages<true, STAGES>(kb_begin, num_kb, early, load_stage);
  } else {
    load_prologue_stages<false, STAGES>(kb_begin, num_kb, 0, load_stage);
  }

  // Dequantization constants that do not depend on the group.
  [[maybe_unused]] const uint32_t center2 = detail::splat<T>(Half2Magic<T>::kValue + float(Cfg::kCenter));
  [[maybe_unused]] detail::GroupPair group[NT];  // per group: s, MAGIC + z, z

  for (int it = 0; it < num_kb; ++it) {
    ptx::cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage `it` visible to all; stage `it-1` no longer read by anyone
    {
      const int pf = it + STAGES - 1;
      if (pf < num_kb) load_stage(pf % STAGES, kb_begin + pf);
      ptx::cp_async_commit();
    }
    const uint8_t* x_sh = smem + (it % STAGES) * Cfg::kStageBytes;
    const uint8_t* w_sh = x_sh + Cfg::kXBytes;
    [[maybe_unused]] const float* g_sh = reinterpret_cast<const float*>(w_sh + Cfg::kWBytes);
    const uint8_t* w_lane = w_sh + warp_n * NT * Cfg::kBlockBytes + lane * Cfg::kLaneBytes;

    // x fragments are double-buffered in registers: the next step's ldmatrix is issued before
    // this step's MMAs so its latency hides behind the tensor cores. A lane's weights of the
    // whole K block come in one (4-bit) or two (8-bit) 16-byte loads per n8 tile: conflict-free,
    // where 4-byte loads at a 16-byte lane stride would be 4-way bank conflicts.
    uint32_t af[2][MT][4], wq[NT][kWords];
    auto load_x = [&](int step, uint32_t (&a)[MT][4]) {
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int r = warp_m * Cfg::WM + mt * 16 + (lane & 15);
        const int c = 2 * step + (lane >> 4);
        ptx::ldmatrix_x4(a[mt], x_sh + r * 256 + ((c ^ (r & 7)) << 4));
      }
    };
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int v = 0; v < kWords / 4; ++v) {
        const uint4 q = ptx::lds128(w_lane + nt * Cfg::kBlockBytes + v * 16);
        wq[nt][4 * v] = q.x;
        wq[nt][4 * v + 1] = q.y;
        wq[nt][4 * v + 2] = q.z;
        wq[nt][4 * v + 3] = q.w;
      }
    load_x(0, af[0]);

#pragma unroll
    for (int step = 0; step < 8; ++step) {
      const int cur = step & 1;
      if (step < 7) load_x(step + 1, af[cur ^ 1]);
      if constexpr (Cfg::kGrouped) {
        // A new group starts at this step: its scale (and zero) for each of this lane's columns.
        if (step % Cfg::kStepsPerGroup == 0) {
          const int grow = step / Cfg::kStepsPerGroup;
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
            group[nt] = detail::group_pair<Cfg>(g_sh, Cfg::kScaleRegionBytes / 4, grow * BN,
                                                warp_n * Cfg::WN + nt * 8 + (lane >> 2));
        }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        uint32_t b[2];
#pragma unroll
        for (int half = 0; half < 2; ++half)
          b[half] = detail::dequant_pair<Cfg>(detail::raw_pair<Cfg>(wq[nt], step, half),
                                              group[nt], center2);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) ptx::mma_16816<Cfg::kF16>(acc[mt][nt], af[cur][mt], b);
      }
    }
  }
  ptx::cp_async_wait<0>();

  // ---- epilogue: channel scale, bias, convert, store (split-K: the tile's last CTA) ----------
  auto finish = [&](int col, float v) {
    if constexpr (DQ == WeightOnlyDequant::per_channel) v *= p.w_scales[col];
    if (p.bias != nullptr) v += load_float(Operand{p.bias, p.bias_dtype, 1}, col, 0);
    return v;
  };
  const int row_base = m0 + warp_m * Cfg::WM + (lane >> 2);
  const int col_base = n0 + warp_n * Cfg::WN + (lane & 3) * 2;
  if (p.splits > 1) {
    auto finish_split = [&](int row, int col, float sum) {
      store_float(p.d, p.d_dtype, int64_t(row) * p.ldd + col, finish(col, sum));
    };
    if constexpr (Cfg::kOverlapLaunch) {
      if (p.cluster_split) {  // the splits are one cluster: reduce over distributed smem
        static_assert(BM * BN * 4 <= Cfg::kSmemBytes,
                      "a cluster split-K tile reuses the start of the ring");
        __syncthreads();  // every warp is done with the ring: the tile reuses its start
        uint32_t* tile = reinterpret_cast<uint32_t*>(smem);
        park_mma_fragments<MT, NT, BN>(tile, row_base - m0, col_base - n0,
                                       [&](int mt, int nt, int e) {
                                         return __float_as_uint(acc[mt][nt][e]);
                                       });
        split_k_cluster_sum<float, BM, BN, Cfg::kThreads, kMaxClusterSplitK>(
            tile, p.splits, p.m, p.n, m0, n0, finish_split);
        return;
      }
    }
    auto* slot = static_cast<float*>(p.workspace) + int64_t(blockIdx.z) * p.m * p.n;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = row_base + mt * 16 + (e >> 1) * 8, col = col_base + nt * 8 + (e & 1);
          if (row < p.m && col < p.n) slot[int64_t(row) * p.n + col] = acc[mt][nt][e];
        }
    int* counter = &p.counters[tile.m * tiles_n + tile.n];
    if (!split_k_arrive_last(counter, p.splits)) return;
    split_k_sum<float, BM, BN, Cfg::kThreads>(p.workspace, counter, p.splits, p.m, p.n, m0, n0,
                                              finish_split);
    return;
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = row_base + mt * 16 + half * 8;
      if (row >= p.m) continue;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int col = col_base + nt * 8;
        if (col >= p.n) continue;
        const bool two = col + 1 < p.n;
        const float v0 = finish(col, acc[mt][nt][half * 2]);
        const float v1 = two ? finish(col + 1, acc[mt][nt][half * 2 + 1]) : 0.0f;
        store_float_pair(p.d, p.d_dtype, int64_t(row) * p.ldd + col, v0, v1, two);
      }
    }
}

}  // namespace nibble::cuda::sm80
