// sm80_w4a8_gemm — int4 (or int8) weights × int8 activations on mma.sync.m16n8k32 (sm_80,
// sm_86, sm_89, sm_90), int32 accumulation, fused rescale. With 8-bit weights (WBITS = 8) the
// same kernel is the W8A8 GEMM, reported as sm80_w8a8_gemm; with int4 activations W4A4
// (sm80_w4a4_gemm), with e4m3 activations W4A-FP8's decode tiles (sm80_w4afp8_gemm; below).
//
//   D[m,n] = s_a[m] · s_w[n] · Σ_k a[m,k]·w[n,k]                  (per_channel)
//   D[m,n] = s_a[m] · Σ_g s_w[g,n] · Σ_{k∈g} a[m,k]·w[n,k]        (group: f32 rescale per group)
//   D[m,n] = s_a[m] · s_ch[n] · Σ_k a[m,k]·w8[n,k]                 (two_level: integer groups)
//   D[m,n] = Σ_k a[m,k]·w[n,k]  as int32                            (s32)
//   (+ bias[n]; D in f32, f16 or bf16, or s32)
//
// Operands
//   a   (M, K) s8, row-major, row pitch `lda` bytes; base and pitch 16-byte aligned; K % 32 == 0.
//   w   WBITS 4: layout w4_mma_k128 (include/nibble/layout.h): 8×128 blocks of 512 bytes, one
//       16-byte load per lane holds that lane's B fragments for four k32 steps; nibbles unsigned.
//       WBITS 8: the logical (N, K) s8 matrix itself, row-major, row pitch `ldw` bytes (base and
//       pitch 16-byte aligned, K % 16 == 0): no packing. Its tiles are stored in shared memory
//       like A's (128-byte rows, XOR-swizzled 16-byte chunks) and read with ldmatrix, whose
//       8×16-byte matrices are exactly mma.m16n8k32's B fragments (row = channel, lane l gets
//       bytes 4(l%4).. of row l/4). Per-channel scales may be f32, f16 or bf16.
//   s_a f32 per row (or one per tensor); s_w f32 (N_pad) or (K_pad/G, N_pad); two-level group
//       parameters u16 (K_pad/G, N_pad) = g_s | (128 − g_s·g_z) << 8.
//
// Work split
//   grid (N/BN, M/BM, splits). A CTA owns a BM×BN tile and a contiguous range of 128-wide K
//   blocks; STAGES-deep cp.async ring (A tile BM×128 bytes, W tile BN×64 bytes, the block's
//   scales/parameters). Warps tile the CTA as WARPS_M × WARPS_N; a warp owns (BM/WARPS_M) ×
//   (BN/WARPS_N), i.e. MT m16 tiles × NT n8 tiles of int32 accumulators.
//   With splits > 1 each CTA writes its partial tile to a workspace slot and the last CTA to
//   arrive (per-tile counter) sums the slots in split order and runs the epilogue, so results do
//   not depend on CTA timing (deterministic run to run); it then resets the counter. On sm_90
//   the thin int4-weight tiles (p.cluster_split) instead launch each tile's splits as one
//   thread-block cluster and reduce the partials over distributed shared memory, in the same
//   order (cuda/common/split_k.cuh).
//
//   A in shared memory: rows of 128 bytes = 8 chunks of 16; chunk c of row r is stored at chunk
//   c ^ (r % 8). ldmatrix reads one chunk column of 8 consecutive rows; without the XOR all 8
//   would sit in the same 4 banks (8-way conflict), with it they cover all 32 banks.
//
//   int4 → int8: the offset_xor decoding of cuda/common/int4_decode.cuh (exact, 7 instructions
//   per 8 values). The high_nibble decoding (s4_sym only) is cheaper still: b = (nibbles in the high half of
//   each byte) XOR 0x80808080 = 16·v, 3 instructions per 8 values; the int32 sums are then 16×
//   the true ones and are shifted back exactly, which limits the int32 span to the s8×s8
//   bound (131071). The launcher picks it whenever that bound holds.
//
// Limitations
//   1. mma.sync reaches about 63% of Hopper's dense int8 peak (shared/research §9); the sm_90a
//      wgmma kernel (sm90/) is the prefill path there.
//   2. K must be a multiple of 32; rows of `a` 16-byte aligned. N and K are padded in the
//      weight layout, M is guarded (zero-filled A rows, masked stores).
//   3. Epilogue stores are 2-element vectors straight from the accumulator fragments.
//   4. Split-K partials go through a workspace of splits·M·N·4 bytes plus one counter per tile.
//   5. 8-bit weights: per-channel and s32 epilogues only (w8_pc is the only int8 weight format).
//
// W4A4 (A4 = true, reported as sm80_w4a4_gemm): int4 activations × int4 weights, both the logical
//   row-major packed matrices (two values per byte, the lower k in the low nibble; pitches
//   16-byte aligned, K % 32 == 0), tiles stored and read exactly like the int8 ones — a 128-byte
//   K block is 256 values and each 32-byte step 64. On sm_80/86/89 a step is one native
//   mma.m16n8k64.s4 (its fragments are the s8 instruction's bytes). sm_90 has no int4 tensor
//   cores (the instruction is emulated, measured 23× slower than s8), so there each register of
//   8 nibbles becomes two of 4 bytes — (r << 4) & 0xF0F0F0F0 and r & 0xF0F0F0F0, 16·v as
//   int8, 2 instructions per 8 values — and a step is two mma.m16n8k32.s8 with the same k
//   permutation on both operands; the sums are then 256× the true ones and shifted back
//   exactly, which bounds K by the s8×s8 limit (131071) there. Per-channel and s32 epilogues.
//
// W4A-FP8 (FP8 = true, reported as sm80_w4afp8_gemm): per-token e4m3 activations (quantized by
//   the caller) × packed s4_sym weights, per channel or g128, f32 sums; the 16- and 32-token
//   tiles only (the decode path: the wgmma kernel sm90_w4afp8_gemm takes larger M on Hopper).
//   A tiles are loaded exactly like int8 ones (a byte per value). On sm_89 a k32 step is one
//   mma.m16n8k32.e4m3 per n8 tile with the weights decoded to e4m3 codes of v·2⁻⁹
//   (int4_decode.cuh; the sums are multiplied by 2⁹ on the way out). sm_90 has no fp8 mma.sync
//   (ptxas emulates it with f16 MMAs, re-converting both operands for every one and adding
//   each result separately), so there the kernel converts each operand once — e4m3 → f16 with
//   cvt (8 per k32 step and m16 tile), int4 → f16 with the 1024-bias trick (5 instructions per 4
//   values, s4_pair_to_f16x2) — and issues two f16 m16n8k16 MMAs per k32 step into the f32
//   accumulators: every value and product exact, only the f32 summation order differs from the
//   reference. Split-K partials are f32 (summed in split order), group sums folded per 128 K.
//
// Fused activation quantization (X = f32, bf16 or f16; the decode path, one launch per linear)
//   The activations come in as x (M, K) floats, pitch `ldx` elements, and are quantized per
//   token inside the kernel exactly as quantize_activation does (cuda/common/token_quant.cuh:
//   the same codes and scales, so the result equals quantize + linear bit for bit). The m16
//   tile only, and only where the CTA's rows of its K range fit the resident A region
//   (fused_quant_fits, cuda/launch/sm80_w4a8_gemm.h):
//   - prologue, after the first weight stages are in flight: the threads reduce each row's
//     max |x|, giving the row's scale; when the splits of a tile are one cluster (sm_90), each
//     CTA reduces its own split's K range and the cluster combines the maxima over distributed
//     shared memory (one cluster barrier), otherwise every CTA reduces the full rows. Then the
//     CTA quantizes its own K range of every row once into a resident int8 A (row pitch
//     p.resident_pitch = K range + 16 bytes, so the 8 rows of a fragment load fall in 8
//     different bank quads);
//   - main loop: the ring carries weights only; each lane reads its A fragment words straight
//     from the resident rows (rows past M give zeros), with no per-stage conversion or barrier;
//   - the epilogue takes s_a from shared memory.
//   Where the resident A would not fit (long K ranges at larger M) the caller quantizes first
//   (two launches). History: a first version converted a staged 16-bit x tile per K block behind
//   a second barrier and measured 1.3-3.8x the int8-in kernel (docs/kernels.md).
// Verify: build/cuda/tests/cpp/nibble_tests --gtest_filter='CudaW4A8*'
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
#include "cuda/common/residual_norm.cuh"
#include "cuda/common/split_k.cuh"
#include "cuda/common/thread_chunks.cuh"
#include "cuda/common/token_quant.cuh"
#include "cuda/launch/sm80_w4a8_gemm.h"
#include "nibble/types.h"

namespace nibble::cuda::sm80 {

struct W4A8GemmParams {
  const int8_t* a = nullptr;
  int64_t lda = 0;                // bytes
  const float* a_scales = nullptr;
  int a_scale_step = 1;           // 1 per token, 0 per tensor
  const uint8_t* w = nullptr;     // w4_mma_k128
  const float* w_scales = nullptr;
  const uint16_t* w_params = nullptr;
  const void* bias = nullptr;
  DType bias_dtype = DType::f32;
  void* d = nullptr;
  int64_t ldd = 0;                // elements
  DType d_dtype = DType::bf16;
  int m = 0, n = 0, k = 0, n_pad = 0, kblocks = 0;
  int splits = 1, kblocks_per_split = 0;
  bool overlap_allowed = false;   // host side: the GPU and settings allow overlapping launches
                                  // (cuda/launch/pdl_launch.h); the kernel does not read it
  int prefetch_blocks = 0;        // overlapping decode tiles: weight blocks per n8 row (or 128-
                                  // byte K blocks per row) asked of L2 before the wait
  int early_weight_stages = 0;    // overlapping decode tiles: ring stages whose weights load
                                  // before the wait (overlap_early_weight_stages)
  bool cluster_split = false;     // the splits of a tile are one cluster (cuda/common/split_k.cuh)
  void* workspace = nullptr;      // splits·M·N 4-byte partials
  int* counters = nullptr;        // one per output tile, zero between calls
  int64_t ldw = 0;                // WBITS 8: bytes between weight rows
  DType w_scale_dtype = DType::f32;  // WBITS 8: dtype behind w_scales (f32, f16 or bf16)
  const void* x = nullptr;        // fused quantization: (M, K) f32 / bf16 / f16 activations
  int64_t ldx = 0;                // elements
  int resident_pitch = 0;         // fused quantization: bytes per row of the resident int8 A
  // The residual-stream fusions (LinearFusion; the kResidual instances only, whose d is f32).
  // In: RMSNorm of x from its rows' granule sums (nullptr: none), RN64(1/K), eps, weights (K).
  const double* in_sumsq = nullptr;
  int64_t in_sumsq_ld = 0;        // elements between rows
  int in_granules = 0;            // ceil(K / 16)
  double norm_inv_k = 0.0;
  float norm_eps = 0.0f;
  const float* norm_weight = nullptr;
  // Out: d += the result; the granule sums of the stored d (nullptr: not written).
  bool accumulate = false;
  double* out_sumsq = nullptr;
  int64_t out_sumsq_ld = 0;
};

template <int BM_, int BN_, int WARPS_M_, int WARPS_N_, int STAGES_, W4A8Epilogue EPI_, int GROUP_,
          int MIN_BLOCKS_ = 1, W4Decode DECODE_ = W4Decode::offset_xor, int WBITS_ = 4,
          class X_ = int8_t, bool A4_ = false, bool RESIDUAL_ = false, bool FP8_ = false>
struct W4A8GemmConfig {
  /// e4m3 activations (W4A-FP8, reported as sm80_w4afp8_gemm): e4m3 × e4m3 MMAs into f32.
  static constexpr bool kFp8 = FP8_;
  static_assert(!FP8_ || (WBITS_ == 4 && !A4_ && !RESIDUAL_ && std::is_same_v<X_, int8_t> &&
                          DECODE_ == W4Decode::offset_xor &&
                          (EPI_ == W4A8Epilogue::per_channel ||
                           (EPI_ == W4A8Epilogue::group && GROUP_ == 128))),
                "W4A-FP8: packed s4_sym weights, e4m3 activations quantized by the caller, per "
                "channel or g128");
  /// int4 activations and row-major int4 weights (W4A4).
  static constexpr bool kA4 = A4_;
  /// The activations' type in global memory: int8 (quantized by the caller), or f32 / bf16 /
  /// f16 quantized per token inside the kernel (fused quantization).
  using X = X_;
  static constexpr bool kFusedQuant = !std::is_same_v<X_, int8_t>;
  static_assert(!kFusedQuant || std::is_same_v<X_, float> || std::is_same_v<X_, __nv_bfloat16> ||
                    std::is_same_v<X_, __half>,
                "fused quantization reads f32, bf16 or f16 activations");
  static_assert(!kFusedQuant || EPI_ != W4A8Epilogue::s32, "the s32 mode takes int8 activations");
  static_assert(!kFusedQuant || (BM_ == 16 && WARPS_M_ == 1),
                "the resident A fragments are built for one m16 tile per warp");
  /// The residual-stream fusions (LinearFusion, see the header): f32 x quantized in the kernel,
  /// float epilogues, f32 d.
  static constexpr bool kResidual = RESIDUAL_;
  static_assert(!kResidual || (std::is_same_v<X_, float> && EPI_ != W4A8Epilogue::s32 &&
                               WBITS_ == 4 && !A4_),
                "the residual fusions take f32 x, int4 weights and a float epilogue");
  static constexpr W4Decode DECODE = DECODE_;
  /// Weight bits: 4 (packed w4_mma_k128) or 8 (row-major s8, loaded like A).
  static constexpr int WBITS = WBITS_;
  static constexpr bool kW8 = WBITS_ == 8;
  /// Weights stored as the logical row-major matrix and loaded like A (int8, or W4A4's int4).
  static constexpr bool kRowMajorW = kW8 || A4_;
  static_assert(!A4_ || (WBITS_ == 4 && std::is_same_v<X_, int8_t> &&
                         (EPI_ == W4A8Epilogue::s32 || EPI_ == W4A8Epilogue::per_channel ||
                          (EPI_ == W4A8Epilogue::group && GROUP_ == 128)) &&
                         DECODE_ == W4Decode::offset_xor),
                "W4A4: int4 activations in, per channel, g128 or s32, no decoding");
  /// K values per 32-byte MMA step and per 128-byte K block (int4 activations: twice as many).
  static constexpr int kKPerStep = A4_ ? 64 : 32;
  static constexpr int kKPerBlock = 4 * kKPerStep;
  static_assert(WBITS_ == 4 || WBITS_ == 8, "weights are int4 or int8");
  static_assert(!kW8 || EPI_ == W4A8Epilogue::s32 || EPI_ == W4A8Epilogue::per_channel,
                "int8 weights are per channel");
  static_assert(!kW8 || DECODE_ == W4Decode::offset_xor, "int8 weights are not decoded");
  /// high_nibble decoding multiplies every weight by 16; the accumulators are shifted back.
  static constexpr int kAccShift = DECODE_ == W4Decode::high_nibble ? 4 : 0;
  static_assert(!(DECODE_ == W4Decode::high_nibble && EPI_ == W4A8Epilogue::two_level),
                "two-level weights need the exact offset_xor decoding");
  static constexpr int BM = BM_, BN = BN_, WARPS_M = WARPS_M_, WARPS_N = WARPS_N_;
  /// CTAs per SM the register budget must allow (__launch_bounds__): the tensor pipe needs
  /// several warps per scheduler to stay busy, so large tiles trade registers for occupancy.
  static constexpr int kMinBlocks = MIN_BLOCKS_;
  static constexpr int STAGES = STAGES_, GROUP = GROUP_;
  static constexpr W4A8Epilogue EPI = EPI_;
  static constexpr int kThreads = WARPS_M * WARPS_N * 32;
  static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;
  static constexpr int MT = WM / 16, NT = WN / 8;
  static constexpr int kBK = 128;  // K elements (bytes of A) per stage
  /// The decode tiles (M ≤ 32) are launched to overlap the previous kernel in the stream
  /// (programmatic dependent launch on sm_90+, cuda/launch/pdl_launch.h): their grids are one
  /// wave of short weight streams, whose launch and first HBM round trip are worth hiding.
  static constexpr bool kOverlapLaunch = BM <= 32;
  static constexpr bool kGrouped = EPI == W4A8Epilogue::group || EPI == W4A8Epilogue::two_level;
  // Rows of group data one 128-wide K block needs (a 256 group spans two blocks).
  static constexpr int kGroupRows =
      kGrouped ? (GROUP >= kKPerBlock ? 1 : kKPerBlock / GROUP) : 0;
  static constexpr int kABytes = BM * kBK;
  static constexpr int kWBytes = kRowMajorW ? BN * kBK : BN * kBK / 2;  // kBK bytes of A per row
  static constexpr int kScaleBytes = EPI == W4A8Epilogue::group ? kGroupRows * BN * 4 : 0;
  static constexpr int kParamBytes = EPI == W4A8Epilogue::two_level ? kGroupRows * BN * 2 : 0;
  // A stage holds the int8 A tile, or nothing with fused quantization (A is resident then).
  static constexpr int kXStageBytes = kFusedQuant ? 0 : kABytes;
  static constexpr int kStageBytes = kXStageBytes + kWBytes + kScaleBytes + kParamBytes;
  // Fused quantization, after the ring: the resident int8 A, then per row the quantizer (scale,
  // pow2, s_unit, s_inv: 16 bytes) and the CTA's max |x| bits (4 bytes, read by the other CTAs
  // of a cluster split-K tile), then the warps' partial maxima.
  static constexpr int kResidentBytes = kFusedQuant ? kFusedResidentBytes : 0;
  // The kResidual instances add each row's RMSNorm inv (4 bytes).
  static constexpr int kRowQuantBytes =
      kFusedQuant ? BM * (kResidual ? 24 : 20) + (kThreads / 32) * BM * 4 : 0;
  static constexpr int kSmemBytes = STAGES * kStageBytes + kResidentBytes + kRowQuantBytes;

  static_assert(WM % 16 == 0 && WN % 8 == 0, "warp tile must be whole m16 × n8 MMA tiles");
  static_assert(!kRowMajorW || NT % 2 == 0, "row-major weight fragments come two n8 tiles per ldmatrix.x4");
  static_assert(!kGrouped || (GROUP == 32 || GROUP == 64 || GROUP == 128 || GROUP == 256),
                "group size must be 32, 64, 128 or 256");
  static_assert(kStageBytes % 16 == 0, "stage regions must stay 16-byte aligned");
  static_assert(!kOverlapLaunch || BM * BN * 4 <= kSmemBytes,
                "a cluster split-K tile reuses the start of the ring");
};

namespace detail {

/// The output value of one element before conversion: s_a · (s_w · acc) per channel and
/// two-level, s_a · Σ_g per group (that sum is accumulated with FMA, so it differs from the
/// reference's separate multiply and add by rounding only), then the bias. `acc` is the integer
/// sum as a float, or W4A-FP8's f32 sum.
template <W4A8Epilogue EPI, bool kAnyScaleDtype = false>
__device__ __forceinline__ float finish(const W4A8GemmParams& p, float s_a, int col, float acc,
                                        float facc) {
  float s_w = 0.0f;
  if constexpr (EPI != W4A8Epilogue::group) {
    if constexpr (kAnyScaleDtype) s_w = load_float(Operand{p.w_scales, p.w_scale_dtype, 1}, col, 0);
    else s_w = p.w_scales[col];
  }
  float v = EPI == W4A8Epilogue::group ? s_a * facc : s_a * (s_w * acc);
  if (p.bias != nullptr) v += load_float(Operand{p.bias, p.bias_dtype, 1}, col, 0);
  return v;
}

}  // namespace detail

template <class Cfg>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    sm80_w4a8_gemm_kernel(const __grid_constant__ W4A8GemmParams p) {
  using ptx::cp_async_16;
  constexpr int BM = Cfg::BM, BN = Cfg::BN, MT = Cfg::MT, NT = Cfg::NT, STAGES = Cfg::STAGES;
  constexpr W4A8Epilogue EPI = Cfg::EPI;
  extern __shared__ __align__(128) uint8_t smem[];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / Cfg::WARPS_N, warp_n = warp % Cfg::WARPS_N;
  const int tiles_n = gridDim.x, tiles_m = gridDim.y;
  const TileCoord tile = band_raster(blockIdx.y * tiles_n + blockIdx.x, tiles_m, tiles_n);
  const int tile_m = tile.m, tile_n = tile.n;
  const int m0 = tile_m * BM, n0 = tile_n * BN;
  const int kb_begin = blockIdx.z * p.kblocks_per_split;
  const int kb_end = min(p.kblocks, kb_begin + p.kblocks_per_split);
  const int num_kb = kb_end - kb_begin;
  const uint64_t weight_policy = ptx::evict_first_policy();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr bool kS4ViaS8 = Cfg::kA4;  // no int4 tensor cores: two s8 MMAs on 16·v (see above)
#else
  constexpr bool kS4ViaS8 = false;
#endif
  constexpr int kAccShift = Cfg::kAccShift + (kS4ViaS8 ? 8 : 0);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
  // W4A-FP8 on sm_90, which has no fp8 mma.sync (ptxas expands it into f16 MMAs that start
  // from zero, an f32 add per accumulator after each, and both operands converted again for
  // every MMA): the kernel converts instead, once per operand — e4m3 activations and int4
  // weights to f16, both exact — and runs f16 MMAs into its accumulators (see the main loop).
  constexpr bool kFp8ViaF16 = Cfg::kFp8;
#else
  constexpr bool kFp8ViaF16 = false;
#endif
  // W4A-FP8's f32 sums are of v·2⁻⁹ weights on the e4m3 MMA (×2⁹ on the way out, exact) and of
  // v itself on the f16 route.
  [[maybe_unused]] constexpr float kFp8SumScale = kFp8ViaF16 ? 1.0f : kE4m3WeightScale;
  // K in bytes of a row (W4A4: two values per byte).
  const int k_bytes = Cfg::kA4 ? p.k / 2 : p.k;

  // Fused quantization: the resident int8 A and the rows' quantizers, after the ring.
  [[maybe_unused]] uint8_t* const a_resident = smem + STAGES * Cfg::kStageBytes;
  [[maybe_unused]] float* const row_quant =
      reinterpret_cast<float*>(a_resident + Cfg::kResidentBytes);
  [[maybe_unused]] uint32_t* const row_amax = reinterpret_cast<uint32_t*>(row_quant + 4 * BM);
  using X = typename Cfg::X;

  // ---- one pipeline stage: A tile, W tile, and this K block's group data --------------------
  // The thin (decode) tiles copy a compile-time count of chunks per thread, so the copies unroll
  // completely (cuda/common/thread_chunks.cuh says what the loop from tid cost). The large tiles
  // keep the loop from tid: unrolled completely, their 2-CTA/SM instances spill at 128 registers.
  // `parts` picks the activation half (the A or x tile: an earlier kernel's output), the weight
  // half (the W tile and the K block's group data: weights only, which no kernel that lets its
  // dependents start early ever writes; see the prologue below) or both.
  // Their weight copies go without the L2 evict-first hint: with it, ptxas 13.0 compiles the
  // unrolled copies into LDGSTS that read uniform registers nothing writes, an illegal
  // instruction on the GPU (docs/kernels.md, sm80_weight_only_gemm; scripts/sass_check.py).
  // Except the per-channel tiles with the fused quantization: unrolled, they measured no faster
  // at M = 1 and up to 6.5% slower (28672x4096 25.5 -> 27.2 us; H100, 2026-11-28,
  // bench/results/h100_w4a8_thread_chunks_ab.json), so they keep the loop and the hint.
  constexpr bool kFixedCopyTrips =
      BM <= 32 && !(Cfg::kFusedQuant && EPI == W4A8Epilogue::per_channel);
  auto copy_weights = [&](void* dst, const void* src, bool valid) {
    if constexpr (kFixedCopyTrips) cp_async_16(dst, src, valid);
    else ptx::cp_async_16_stream(dst, src, valid, weight_policy);
  };
  auto load_stage = [&](int stage, int kb, int parts = kStageAll) {
    uint8_t* base = smem + stage * Cfg::kStageBytes;
    [[maybe_unused]] uint8_t* a_sh = base;
    uint8_t* w_sh = base + Cfg::kXStageBytes;
    if constexpr (!Cfg::kFusedQuant) {  // fused quantization: A is resident, not staged
      if (parts & kStageActivations) {
        constexpr int kChunks = BM * 8;  // 16-byte chunks of A
#pragma unroll
        for (int i = tid, j = 0; kFixedCopyTrips ? j < thread_chunk_passes(kChunks, Cfg::kThreads)
                                               : i < kChunks;
             i += Cfg::kThreads, ++j) {
          if (kFixedCopyTrips && kChunks % Cfg::kThreads != 0 && i >= kChunks) break;
          const int r = i >> 3, c = i & 7;
          const int gm = m0 + r, gk = kb * 128 + c * 16;
          const bool valid = gm < p.m && gk < k_bytes;
          const int8_t* src = p.a + int64_t(valid ? gm : 0) * p.lda + (valid ? gk : 0);
          cp_async_16(a_sh + r * 128 + ((c ^ (r & 7)) << 4), src, valid);
        }
      }
    }
    if (!(parts & kStageWeights)) return;
    if constexpr (Cfg::kRowMajorW) {
      constexpr int kChunks = BN * 8;  // 16-byte chunks of W rows, as A
#pragma unroll
      for (int i = tid, j = 0; kFixedCopyTrips ? j < thread_chunk_passes(kChunks, Cfg::kThreads)
                                             : i < kChunks;
           i += Cfg::kThreads, ++j) {
        if (kFixedCopyTrips && kChunks % Cfg::kThreads != 0 && i >= kChunks) break;
        const int r = i >> 3, c = i & 7;
        const int gn = n0 + r, gk = kb * 128 + c * 16;
        const bool valid = gn < p.n && gk < k_bytes;
        const uint8_t* src = p.w + int64_t(valid ? gn : 0) * p.ldw + (valid ? gk : 0);
        copy_weights(w_sh + r * 128 + ((c ^ (r & 7)) << 4), src, valid);
      }
    } else {
      constexpr int kChunks = BN * 4;  // 16-byte chunks of W (32 per n8 block)
#pragma unroll
      for (int i = tid, j = 0; kFixedCopyTrips ? j < thread_chunk_passes(kChunks, Cfg::kThreads)
                                             : i < kChunks;
           i += Cfg::kThreads, ++j) {
        if (kFixedCopyTrips && kChunks % Cfg::kThreads != 0 && i >= kChunks) break;
        const int nb = i >> 5, part = i & 31;
        const int gnb = (n0 >> 3) + nb;
        const bool valid = gnb * 8 < p.n_pad;
        const uint8_t* src = p.w + (int64_t(valid ? gnb : 0) * p.kblocks + kb) * 512 + part * 16;
        copy_weights(w_sh + nb * 512 + part * 16, src, valid);
      }
    }
    if constexpr (Cfg::kA4 && Cfg::kScaleBytes > 0) {
      // W4A4 g128: the logical (N, K/128) scale table in its own dtype; a K block's two groups
      // of one row are adjacent (4 or 8 bytes, aligned since K % 256 == 0), stored as row r's
      // 8-byte slot.
      uint8_t* g_sh = w_sh + Cfg::kWBytes;
      const int groups = p.k / Cfg::GROUP, esize = p.w_scale_dtype == DType::f32 ? 4 : 2;
      for (int r = tid; r < BN; r += Cfg::kThreads) {
        const int gn = n0 + r;
        const bool valid = gn < p.n;
        const uint8_t* src = reinterpret_cast<const uint8_t*>(p.w_scales) +
                             (int64_t(valid ? gn : 0) * groups + 2 * kb) * esize;
        if (esize == 4) ptx::cp_async_small<8>(g_sh + r * 8, src, valid);
        else ptx::cp_async_small<4>(g_sh + r * 8, src, valid);
      }
    } else if constexpr (Cfg::kScaleBytes > 0 || Cfg::kParamBytes > 0) {
      constexpr int kElemBytes = EPI == W4A8Epilogue::group ? 4 : 2;
      constexpr int kChunksPerRow = BN * kElemBytes / 16;
      uint8_t* g_sh = w_sh + Cfg::kWBytes;
      const uint8_t* g_src = EPI == W4A8Epilogue::group
                                 ? reinterpret_cast<const uint8_t*>(p.w_scales)
                                 : reinterpret_cast<const uint8_t*>(p.w_params);
      const int first_group = kb * 128 / Cfg::GROUP;
      constexpr int kChunks = Cfg::kGroupRows * kChunksPerRow;
      for (int i = tid, j = 0; kFixedCopyTrips ? j < thread_chunk_passes(kChunks, Cfg::kThreads)
                                             : i < kChunks;
           i += Cfg::kThreads, ++j) {
        if (kFixedCopyTrips && kChunks % Cfg::kThreads != 0 && i >= kChunks) break;
        const int r = i / kChunksPerRow, c = i % kChunksPerRow;
        const int col = n0 + c * (16 / kElemBytes);
        const bool valid = col < p.n_pad;
        const uint8_t* src =
            g_src + (int64_t(first_group + r) * p.n_pad + (valid ? col : 0)) * kElemBytes;
        cp_async_16(g_sh + r * BN * kElemBytes + c * 16, src, valid);
      }
    }
  };

  // W4A-FP8 sums in f32 (×kFp8SumScale on the way out, exact).
  using Acc = std::conditional_t<Cfg::kFp8, float, int32_t>;
  Acc acc[MT][NT][4];
  float facc[EPI == W4A8Epilogue::group ? MT : 1][EPI == W4A8Epilogue::group ? NT : 1][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0;
  if constexpr (EPI == W4A8Epilogue::group) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) facc[mt][nt][e] = 0.0f;
  }

  // The thin (decode) tiles are launched to overlap the kernel before them: nothing above has
  // touched global memory. Before waiting for that kernel the CTA lets the next kernel start,
  // asks L2 for prefetch_blocks weight blocks past the ring stages it loads early, and issues
  // those stages' weight loads into shared memory (early_weight_stages of the prologue's, by
  // default all): weights are no earlier kernel's output, so their HBM latency and transfer
  // overlap the previous kernel's tail (cuda/common/overlap_prologue.cuh). Everything that
  // reads an earlier kernel's output (A, x, scales) comes after the wait (load_prologue_stages).
  if constexpr (Cfg::kOverlapLaunch) {
    const int early = min(min(num_kb, STAGES - 1), p.early_weight_stages);
    const int beyond = max(0, min(num_kb - early, p.prefetch_blocks));
    if constexpr (Cfg::kRowMajorW) {
      const int k0 = (kb_begin + early) * 128;
      const int bytes = max(0, min(beyond * 128, k_bytes - k0)) & ~15;
      overlap_prologue_start(p.w + int64_t(n0) * p.ldw + k0, p.ldw, min(BN, p.n - n0), bytes);
    } else {
      overlap_prologue_start_blocked(p.w, n0 / 8, BN / 8, p.n_pad / 8, p.kblocks,
                                     kb_begin + early, beyond, 512);
    }
    load_prologue_stages<true, STAGES>(kb_begin, num_kb, early, load_stage);
  } else {
    load_prologue_stages<false, STAGES>(kb_begin, num_kb, 0, load_stage);
  }

  if constexpr (Cfg::kFusedQuant) {
    // Row scales, while the first weight stages stream in. The threads split into one group
    // per valid row (G threads each, a power of two: the whole CTA for one row, 8 threads each
    // for 16), so every row's loads are in flight at once; a group strides through its row 16
    // bytes per load with up to 8 loads in flight (one L2 round trip per 8·16·G bytes), then
    // reduces over shuffles and, for groups wider than a warp, over the warps' partial maxima
    // in shared memory. Rows past M get scale 0. A CTA reduces max |x| over all of K, except
    // when the splits of the tile are one cluster (p.cluster_split): together they cover K, so
    // each reduces its own split's K range and the cluster combines the maxima over distributed
    // shared memory.
    constexpr int kVec = 16 / int(sizeof(X));  // elements per 16-byte load
    uint32_t* partial = row_amax + BM;         // [warps][BM]
    const int rows = min(BM, p.m - m0);
    const bool cluster = Cfg::kOverlapLaunch && p.cluster_split;
    const int own_lo = kb_begin * 128, own_hi = min(p.k, kb_end * 128);
    const int k_lo = cluster ? own_lo : 0;
    const int k_hi = cluster ? own_hi : p.k;
    auto row_of = [&](int r) { return static_cast<const X*>(p.x) + int64_t(m0 + r) * p.ldx; };
    const int group = Cfg::kThreads >> (rows <= 1 ? 0 : 32 - __clz(rows - 1));  // G
    const int row = tid / group, gl = tid % group;  // this thread's row, its lane in the group
    // The kResidual instances with p.in_sumsq normalize x first (cuda/common/residual_norm.cuh):
    // y = RN(RN(x·inv)·w), inv from the row's granule sums, and the scale is max |y|'s. Each
    // warp finds its row's inv itself (a group is whole warps: M ≤ 4 rows, 4 warps) after the
    // loads of its first x and w chunks are in flight, so both wait for one L2 round trip.
    [[maybe_unused]] float* const row_inv = reinterpret_cast<float*>(partial + (Cfg::kThreads / 32) * BM);
    [[maybe_unused]] const bool norm = Cfg::kResidual && p.in_sumsq != nullptr;
    {
      uint32_t amax = 0;  // over this thread's values of its row (of y with the norm)
      if constexpr (Cfg::kResidual) {
        static_assert(Cfg::kThreads / 32 >= kFusedQuantMaxTokens, "a group per row is whole warps");
        if (norm) {
          const int stride = group * kVec;
          const X* x_row = row_of(row < rows ? row : 0);
          float4 xs[8], ws[8];
          auto load = [&](int k0) {
#pragma unroll
            for (int u = 0; u < 8; ++u) {
              const int k = k0 + u * stride;
              const bool inside = row < rows && k < k_hi;  // outside: 0, no effect on the maximum
              xs[u] = inside ? __ldg(reinterpret_cast<const float4*>(x_row + k)) : float4{};
              ws[u] = inside ? __ldg(reinterpret_cast<const float4*>(p.norm_weight + k)) : float4{};
            }
          };
          int k0 = k_lo + gl * kVec;
          load(k0);
          const float inv = warp_rms_inverse(
              row < rows ? p.in_sumsq + int64_t(m0 + row) * p.in_sumsq_ld : nullptr,
              p.in_granules, p.norm_inv_k, p.norm_eps);
          if (row < rows && gl == 0) row_inv[row] = inv;
          while (k0 < k_hi) {
#pragma unroll
            for (int u = 0; u < 8; ++u) {
              amax = max(amax, abs_bits(rms_apply(xs[u].x, inv, ws[u].x)));
              amax = max(amax, abs_bits(rms_apply(xs[u].y, inv, ws[u].y)));
              amax = max(amax, abs_bits(rms_apply(xs[u].z, inv, ws[u].z)));
              amax = max(amax, abs_bits(rms_apply(xs[u].w, inv, ws[u].w)));
            }
            k0 += 8 * stride;
            if (k0 < k_hi) load(k0);
          }
        }
    }
    if (!norm && row < rows) {
      const X* x_row = row_of(row);
      const int stride = group * kVec;
      for (int k0 = k_lo + gl * kVec; k0 < k_hi; k0 += 8 * stride) {
        uint4 raw[8];
#pragma unroll
        for (int u = 0; u < 8; ++u)
          raw[u] = k0 + u * stride < k_hi
                       ? __ldg(reinterpret_cast<const uint4*>(x_row + k0 + u * stride))
                       : make_uint4(0, 0, 0, 0);  // +0: no effect on the maximum
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const X* v = reinterpret_cast<const X*>(&raw[u]);
#pragma unroll
          for (int e = 0; e < kVec; ++e) amax = max(amax, abs_bits(float(v[e])));
        }
      }
    }
    // Groups are aligned powers of two, so an XOR within min(G, 32) lanes stays in the group.
    for (int o = min(group, 32) >> 1; o > 0; o >>= 1)
      amax = max(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
    if (row < rows && (gl & 31) == 0) partial[(gl >> 5) * BM + row] = amax;
    }
    __syncthreads();
    auto set_row_quant = [&](int r, uint32_t amax) {
      const float scale = token_scale(amax, 1.0 / 127.0);
      const TokenDivider div = TokenDivider::make(scale);
      row_quant[4 * r] = scale;
      row_quant[4 * r + 1] = div.pow2;
      row_quant[4 * r + 2] = div.s_unit;
      row_quant[4 * r + 3] = div.s_inv;
    };
    if (tid < BM) {
      uint32_t amax = 0;
      if (tid < rows)
        for (int w = 0; w < max(1, group >> 5); ++w) amax = max(amax, partial[w * BM + tid]);
      if (cluster) row_amax[tid] = amax;
      else set_row_quant(tid, amax);
    }
    if (cluster) {
      // row_amax is never overwritten, and no CTA leaves before the cluster barriers of the
      // split-K reduction, so one barrier suffices here.
      ptx::cluster_sync();
      if (tid < BM) {
        const uint32_t local = ptx::smem_addr(row_amax + tid);
        uint32_t amax = 0;
        for (int s = 0; s < p.splits; ++s)
          amax = max(amax, ptx::ld_shared_cluster_u32(local, static_cast<uint32_t>(s)));
        set_row_quant(tid, amax);
      }
    }
    __syncthreads();  // row_quant visible to every thread
    // Quantize this CTA's K range of every valid row once into the resident A: kVec codes per
    // 16-byte load (the loads hit L1, which the maxima just filled, or L2). Columns past K (the
    // last K block's padding) get code 0; K % 32 == 0, so a load is all inside or all past K.
    const int chunks = (kb_end - kb_begin) * 128 / kVec;  // per row
#pragma unroll 4
    for (int i = tid; i < rows * chunks; i += Cfg::kThreads) {
      const int r = i / chunks, c = i - r * chunks;
      const int k = own_lo + c * kVec;
      const uint4 raw = k < own_hi ? __ldg(reinterpret_cast<const uint4*>(row_of(r) + k))
                                   : make_uint4(0, 0, 0, 0);
      const float scale = row_quant[4 * r];
      const TokenDivider div{row_quant[4 * r + 1], row_quant[4 * r + 2], row_quant[4 * r + 3]};
      const X* v = reinterpret_cast<const X*>(&raw);
      float f[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e) f[e] = float(v[e]);
      if constexpr (Cfg::kResidual) {
        if (norm && k < own_hi) {
          const float inv = row_inv[r];
          const float4 w4 = __ldg(reinterpret_cast<const float4*>(p.norm_weight + k));
          f[0] = rms_apply(f[0], inv, w4.x);
          f[1] = rms_apply(f[1], inv, w4.y);
          f[2] = rms_apply(f[2], inv, w4.z);
          f[3] = rms_apply(f[3], inv, w4.w);
        }
      }
      uint32_t q[kVec / 4];
#pragma unroll
      for (int w = 0; w < kVec / 4; ++w) {
        uint32_t packed = 0;
#pragma unroll
        for (int e = 0; e < 4; ++e)
          packed |= (uint32_t(quantize_dynamic(f[4 * w + e], scale, div)) & 0xFFu) << (8 * e);
        q[w] = packed;
      }
      uint8_t* dst = a_resident + r * p.resident_pitch + c * kVec;
      if constexpr (kVec == 8) *reinterpret_cast<uint2*>(dst) = make_uint2(q[0], q[1]);
      else *reinterpret_cast<uint32_t*>(dst) = q[0];
    }
    // The main loop's first barrier publishes the resident A.
  }
  // The residual epilogue's first element of d (this thread's, in its first pass), loaded now so
  // that its L2 round trip overlaps the main loop. d is an earlier kernel's output: read after
  // the prologue's wait.
  [[maybe_unused]] float first_d = 0.0f;
  [[maybe_unused]] TileSlice residual_slice{0, 0};
  if constexpr (Cfg::kResidual) {
    const int total = min(BM, p.m - m0) * BN;
    // A split tile is one cluster along z here (the launcher's residual_fusion_fits): rank = z.
    residual_slice = p.splits > 1 ? cluster_tile_slice(total, p.splits, int(blockIdx.z), 16)
                                  : TileSlice{0, total};
    if (p.accumulate)
      first_d = first_residual<BN>(static_cast<const float*>(p.d), p.ldd, p.n,
                                   residual_slice.begin, residual_slice.end, m0, n0);
  }
  // The per-token scale of output row `row` (inside this tile).
  auto a_scale = [&](int row) {
    if constexpr (Cfg::kFusedQuant) return row_quant[4 * (row - m0)];
    else return p.a_scales[row * p.a_scale_step];
  };

  // Fused quantization: this lane's A fragment words in the resident rows, and which of its two
  // rows (lane/4 and lane/4 + 8) hold tokens.
  [[maybe_unused]] const uint8_t* const res_lane =
      a_resident + (lane >> 2) * p.resident_pitch + (lane & 3) * 4;
  [[maybe_unused]] const bool res_lo = (lane >> 2) < p.m - m0;
  [[maybe_unused]] const bool res_hi = (lane >> 2) + 8 < p.m - m0;

  for (int it = 0; it < num_kb; ++it) {
    ptx::cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage `it` visible to all; stage `it-1` no longer read by anyone
    {
      const int pf = it + STAGES - 1;
      if (pf < num_kb) load_stage(pf % STAGES, kb_begin + pf);
      ptx::cp_async_commit();
    }
    const int kb = kb_begin + it;
    const uint8_t* base = smem + (it % STAGES) * Cfg::kStageBytes;
    [[maybe_unused]] const uint8_t* a_sh = base;
    const uint8_t* w_sh = base + Cfg::kXStageBytes;
    const uint8_t* g_sh = w_sh + Cfg::kWBytes;

    // This lane's 16 bytes of each n8 block hold its B fragments for the block's 4 k32 steps;
    // they are read one 4-byte word per step (not all 16 at once) to keep registers for the
    // 64×64 warp tiles. Fragments are double-buffered in registers: step j+1's shared-memory
    // loads are issued before step j's MMAs, so their latency hides behind the tensor cores
    // (the asm statements are volatile and keep their program order).
    // With int8 weights, one ldmatrix.x4 gives two n8 tiles' B fragments for one k32 step:
    // lanes 8q..8q+7 address the rows of matrix q = (tile nt + q/2, 16-byte chunk 2j + q%2).
    const uint8_t* w_lane = w_sh + warp_n * NT * 512 + lane * 16;
    uint32_t af[2][MT][4], bw[2][NT], prm[2][NT];
    uint32_t bw8[2][Cfg::kRowMajorW ? NT : 1][2];
    auto load_fragments = [&](int j, uint32_t (&a_frag)[MT][4], uint32_t (&b_word)[NT],
                              uint32_t (&b_param)[NT],
                              uint32_t (&b_frag8)[Cfg::kRowMajorW ? NT : 1][2]) {
      if constexpr (Cfg::kRowMajorW) {
        (void)b_word;
#pragma unroll
        for (int nt = 0; nt < NT; nt += 2) {
          const int r = warp_n * Cfg::WN + (nt + (lane >> 4)) * 8 + (lane & 7);
          const int c = 2 * j + ((lane >> 3) & 1);
          uint32_t q[4];
          ptx::ldmatrix_x4(q, w_sh + r * 128 + ((c ^ (r & 7)) << 4));
          b_frag8[nt][0] = q[0];
          b_frag8[nt][1] = q[1];
          b_frag8[nt + 1][0] = q[2];
          b_frag8[nt + 1][1] = q[3];
        }
      } else {
        (void)b_frag8;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) b_word[nt] = ptx::lds32(w_lane + nt * 512 + j * 4);
      }
      if constexpr (EPI == W4A8Epilogue::two_level) {
        const int grow = Cfg::GROUP >= 128 ? 0 : (j * 32) / Cfg::GROUP;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          b_param[nt] = reinterpret_cast<const uint16_t*>(
              g_sh)[grow * BN + warp_n * Cfg::WN + nt * 8 + (lane >> 2)];
      }
      if constexpr (Cfg::kFusedQuant) {
        // Straight from the resident rows: register 0 is row lane/4, bytes 4(lane%4).. of the
        // k32 step, register 1 the same 8 rows down, registers 2 and 3 the step's second half.
        const int kofs = it * 128 + j * 32;
        a_frag[0][0] = res_lo ? ptx::lds32(res_lane + kofs) : 0u;
        a_frag[0][2] = res_lo ? ptx::lds32(res_lane + kofs + 16) : 0u;
        a_frag[0][1] = res_hi ? ptx::lds32(res_lane + 8 * p.resident_pitch + kofs) : 0u;
        a_frag[0][3] = res_hi ? ptx::lds32(res_lane + 8 * p.resident_pitch + kofs + 16) : 0u;
      } else {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const int r = warp_m * Cfg::WM + mt * 16 + (lane & 15);
          const int c = 2 * j + (lane >> 4);
          ptx::ldmatrix_x4(a_frag[mt], a_sh + r * 128 + ((c ^ (r & 7)) << 4));
        }
      }
    };
    load_fragments(0, af[0], bw[0], prm[0], bw8[0]);

#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int cur = j & 1;
      if (j < 3) load_fragments(j + 1, af[cur ^ 1], bw[cur ^ 1], prm[cur ^ 1], bw8[cur ^ 1]);
      // Group row of this k32 step inside the block's group data.
      const int grow =
          Cfg::kGrouped ? (Cfg::GROUP >= Cfg::kKPerBlock ? 0 : (j * Cfg::kKPerStep) / Cfg::GROUP)
                        : 0;
      uint32_t b[NT][2];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        if constexpr (Cfg::kRowMajorW) {
          b[nt][0] = bw8[cur][nt][0];
          b[nt][1] = bw8[cur][nt][1];
        } else {
          uint32_t gs = 1u, offset4 = kS4SymOffset4;
          if constexpr (EPI == W4A8Epilogue::two_level)
            two_level_operands(prm[cur][nt], gs, offset4);
          const uint32_t word = bw[cur][nt];
          if constexpr (Cfg::kFp8) {
            (void)gs;
            (void)offset4;
            if constexpr (kFp8ViaF16) {  // the word itself: the MMAs below convert it to f16
              b[nt][0] = word;
              b[nt][1] = 0u;
            } else {  // e4m3 codes of v·2⁻⁹ (cuda/common/int4_decode.cuh), bytes as below
              b[nt][0] = decode_low_nibbles_e4m3(word);
              b[nt][1] = decode_high_nibbles_e4m3(word);
            }
          } else if constexpr (Cfg::DECODE == W4Decode::high_nibble) {
            (void)gs;
            (void)offset4;
            b[nt][0] = decode_low_nibbles_16v(word);
            b[nt][1] = decode_high_nibbles_16v(word);
          } else {
            b[nt][0] = decode_low_nibbles(word, gs, offset4);
            b[nt][1] = decode_high_nibbles(word, gs, offset4);
          }
        }
      }
      if constexpr (kS4ViaS8) {
        // Each 32-bit register of 8 nibbles → low nibbles (even k) and high nibbles (odd k) as
        // 16·v bytes; k 8c.. of a[0]/a[1]/b[0] go to the first MMA, k 32+8c.. to the second,
        // the even k to the s8 fragment's first half and the odd k to its second — the same
        // permutation of k on both operands, so the sum is unchanged (×256).
        auto lo = [](uint32_t r) { return (r << 4) & 0xF0F0F0F0u; };
        auto hi = [](uint32_t r) { return r & 0xF0F0F0F0u; };
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const uint32_t(&a)[4] = af[cur][mt];
          const uint32_t a0[4] = {lo(a[0]), lo(a[1]), hi(a[0]), hi(a[1])};
          const uint32_t a1[4] = {lo(a[2]), lo(a[3]), hi(a[2]), hi(a[3])};
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const uint32_t b0[2] = {lo(b[nt][0]), hi(b[nt][0])};
            const uint32_t b1[2] = {lo(b[nt][1]), hi(b[nt][1])};
            ptx::mma_s8_16832(acc[mt][nt], a0, b0);
            ptx::mma_s8_16832(acc[mt][nt], a1, b1);
          }
        }
      } else if constexpr (Cfg::kA4) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) ptx::mma_s4_16864(acc[mt][nt], af[cur][mt], b[nt]);
      } else if constexpr (kFp8ViaF16) {
        // Two f16 m16n8k16 MMAs per k32 step, on f16 operands permuted in k the same way: the
        // s8-layout registers hold k 4c..4c+3 (a[0], a[1], b[0]) and k 16+4c.. (a[2], a[3], b[1]);
        // their bytes 0, 1 become the f16 MMA's k slots 2c, 2c+1 and bytes 2, 3 its slots 8+2c,
        // 9+2c, the first MMA taking k 0..15 and the second k 16..31. The weights' low nibbles
        // are k 4c.. and their high nibbles k 16+4c.. (the packed layout's bytes).
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const uint32_t(&a)[4] = af[cur][mt];
          uint32_t a16[2][4];
          ptx::e4m3x4_to_f16x2x2(a[0], a16[0][0], a16[0][2]);
          ptx::e4m3x4_to_f16x2x2(a[1], a16[0][1], a16[0][3]);
          ptx::e4m3x4_to_f16x2x2(a[2], a16[1][0], a16[1][2]);
          ptx::e4m3x4_to_f16x2x2(a[3], a16[1][1], a16[1][3]);
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const uint32_t word = b[nt][0];
            uint32_t b16[2][2];  // [MMA][register]
            s4_pair_to_f16x2(byte_perm(word, 0u, 0x4140u), b16[0][0], b16[1][0]);
            s4_pair_to_f16x2(byte_perm(word, 0u, 0x4342u), b16[0][1], b16[1][1]);
            ptx::mma_16816<true>(acc[mt][nt], a16[0], b16[0]);
            ptx::mma_16816<true>(acc[mt][nt], a16[1], b16[1]);
          }
        }
      } else if constexpr (Cfg::kFp8) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) ptx::mma_e4m3_16832(acc[mt][nt], af[cur][mt], b[nt]);
      } else {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) ptx::mma_s8_16832(acc[mt][nt], af[cur][mt], b[nt]);
      }
      if constexpr (EPI == W4A8Epilogue::group) {
        // End of a group: fold the exact int32 partial sums into f32 with the group's scale.
        if (((kb * 4 + j + 1) % (Cfg::GROUP / Cfg::kKPerStep)) == 0) {
          const float* sc = reinterpret_cast<const float*>(g_sh) + grow * BN;
          // W4A4: row r's two group scales in its 8-byte slot, in the table's dtype.
          auto a4_scale = [&](int r) {
            const uint8_t* slot = g_sh + r * 8;
            if (p.w_scale_dtype == DType::f32) return reinterpret_cast<const float*>(slot)[grow];
            const uint16_t bits = reinterpret_cast<const uint16_t*>(slot)[grow];
            return p.w_scale_dtype == DType::f16
                       ? __half2float(__ushort_as_half(bits))
                       : __bfloat162float(__ushort_as_bfloat16(bits));
          };
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const int col = warp_n * Cfg::WN + nt * 8 + (lane & 3) * 2;
            float s0, s1;
            if constexpr (Cfg::kA4) {
              s0 = a4_scale(col);
              s1 = a4_scale(col + 1);
            } else if constexpr (Cfg::kFp8) {
              s0 = sc[col] * kFp8SumScale;  // exact: a power of two
              s1 = sc[col + 1] * kFp8SumScale;
            } else {
              s0 = sc[col];
              s1 = sc[col + 1];
            }
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
              // exact: the integer sums are multiples of 2^kAccShift
              auto sum_of = [&](int e) {
                if constexpr (Cfg::kFp8) return acc[mt][nt][e];
                else return float(acc[mt][nt][e] >> kAccShift);
              };
              facc[mt][nt][0] = fmaf(s0, sum_of(0), facc[mt][nt][0]);
              facc[mt][nt][1] = fmaf(s1, sum_of(1), facc[mt][nt][1]);
              facc[mt][nt][2] = fmaf(s0, sum_of(2), facc[mt][nt][2]);
              facc[mt][nt][3] = fmaf(s1, sum_of(3), facc[mt][nt][3]);
#pragma unroll
              for (int e = 0; e < 4; ++e) acc[mt][nt][e] = Acc(0);
            }
          }
        }
      }
    }
  }
  ptx::cp_async_wait<0>();

  // ---- split-K: park the partial tile, let the last CTA of the tile finish it ---------------
  const int row_base = m0 + warp_m * Cfg::WM + (lane >> 2);
  const int col_base = n0 + warp_n * Cfg::WN + (lane & 3) * 2;
  // The tile's partial sums as 4-byte values (int32, or f32 with the group epilogue and with
  // e4m3 activations), and the output value of a summed one (the float epilogues), for the split
  // and residual epilogues.
  using Sum = std::conditional_t<EPI == W4A8Epilogue::group || Cfg::kFp8, float, int32_t>;
  auto partial = [&](int mt, int nt, int e) {
    if constexpr (EPI == W4A8Epilogue::group) return __float_as_uint(facc[mt][nt][e]);
    else if constexpr (Cfg::kFp8) return __float_as_uint(acc[mt][nt][e]);
    else return uint32_t(acc[mt][nt][e]);
  };
  [[maybe_unused]] auto sum_value = [&](int row, int col, Sum sum) {
    if constexpr (EPI == W4A8Epilogue::group)
      return detail::finish<EPI>(p, a_scale(row), col, 0.0f, sum);
    else if constexpr (Cfg::kFp8)
      return detail::finish<EPI>(p, a_scale(row), col, sum * kFp8SumScale, 0.0f);
    else
      return detail::finish<EPI, Cfg::kRowMajorW>(p, a_scale(row), col, float(sum >> kAccShift),
                                                  0.0f);
  };
  if constexpr (Cfg::kResidual) {
    // The residual epilogue (LinearFusion's output side): the raw tile is parked in shared
    // memory (the start of the ring, as for a cluster split-K tile), then finished one element
    // per thread per pass, so that a granule's 16 columns are 16 lanes of a half-warp for its
    // sum (store_residual_tile). Split tiles are clusters here (the launcher takes the unfused
    // path for a workspace split): each CTA finishes whole granules of the tile.
    __syncthreads();  // every warp is done with the ring
    uint32_t* tile = reinterpret_cast<uint32_t*>(smem);
    park_mma_fragments<MT, NT, BN>(tile, row_base - m0, col_base - n0, partial);
    auto store = [&](int begin, int end, auto&& sum_at) {
      store_residual_tile<BN, Cfg::kThreads>(
          static_cast<float*>(p.d), p.ldd, p.n, p.accumulate, first_d, p.out_sumsq,
          p.out_sumsq_ld, begin, end, m0, n0,
          [&](int i, int row, int col) { return sum_value(row, col, sum_at(i)); });
    };
    if (p.splits > 1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      ptx::cluster_sync();  // every CTA's partial tile is in its shared memory
      const uint32_t local = ptx::smem_addr(tile);
      store(residual_slice.begin, residual_slice.end,
            [&](int i) { return cluster_split_sum<Sum>(local, i, p.splits); });
      ptx::cluster_sync();  // no CTA leaves while another reads its tile
#else
      __trap();  // cluster split tiles exist on sm_90+ only
#endif
    } else {
      __syncthreads();
      store(residual_slice.begin, residual_slice.end, [&](int i) {
        if constexpr (EPI == W4A8Epilogue::group) return __uint_as_float(tile[i]);
        else return int32_t(tile[i]);
      });
    }
    return;
  }
  if (p.splits > 1) {
    auto finish_split = [&](int row, int col, Sum sum) {
      if constexpr (EPI == W4A8Epilogue::s32)  // the split sums are multiples of 2^shift: exact
        static_cast<int32_t*>(p.d)[int64_t(row) * p.ldd + col] = sum >> kAccShift;
      else
        store_float(p.d, p.d_dtype, int64_t(row) * p.ldd + col, sum_value(row, col, sum));
    };
    if constexpr (Cfg::kOverlapLaunch) {
      if (p.cluster_split) {  // the splits are one cluster: reduce over distributed smem
        __syncthreads();  // every warp is done with the ring: the tile reuses its start
        uint32_t* tile = reinterpret_cast<uint32_t*>(smem);
        park_mma_fragments<MT, NT, BN>(tile, row_base - m0, col_base - n0, partial);
        split_k_cluster_sum<Sum, BM, BN, Cfg::kThreads>(tile, p.splits, p.m, p.n, m0, n0,
                                                        finish_split);
        return;
      }
    }
    auto* slot = static_cast<uint32_t*>(p.workspace) + int64_t(blockIdx.z) * p.m * p.n;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = row_base + mt * 16 + (e >> 1) * 8, col = col_base + nt * 8 + (e & 1);
          if (row < p.m && col < p.n) slot[int64_t(row) * p.n + col] = partial(mt, nt, e);
        }
    int* counter = &p.counters[tile_m * tiles_n + tile_n];
    if (!split_k_arrive_last(counter, p.splits)) return;
    split_k_sum<Sum, BM, BN, Cfg::kThreads>(p.workspace, counter, p.splits, p.m, p.n, m0, n0,
                                            finish_split);
    return;
  }

  // ---- epilogue: rescale, bias, convert, store -------------------------------------------------
  auto facc_of = [&](int mt, int nt, int e) {
    if constexpr (EPI == W4A8Epilogue::group) return facc[mt][nt][e];
    else return 0.0f;
  };
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
        if constexpr (EPI == W4A8Epilogue::s32) {
          int32_t* d = static_cast<int32_t*>(p.d) + int64_t(row) * p.ldd + col;
          d[0] = acc[mt][nt][half * 2] >> kAccShift;
          if (two) d[1] = acc[mt][nt][half * 2 + 1] >> kAccShift;
        } else {
          // Accumulator e's sum as a float: the integer sum shifted back (exactly: a multiple
          // of 2^kAccShift), or W4A-FP8's f32 sum (times 2⁹ on the e4m3 MMA, exact).
          auto sum_of = [&](int e) {
            if constexpr (Cfg::kFp8) return acc[mt][nt][e] * kFp8SumScale;
            else return float(acc[mt][nt][e] >> kAccShift);
          };
          const float s_a = a_scale(row);
          const float v0 = detail::finish<EPI, Cfg::kRowMajorW>(p, s_a, col, sum_of(half * 2),
                                                                facc_of(mt, nt, half * 2));
          const float v1 =
              two ? detail::finish<EPI, Cfg::kRowMajorW>(p, s_a, col + 1, sum_of(half * 2 + 1),
                                                         facc_of(mt, nt, half * 2 + 1))
                  : 0.0f;
          store_float_pair(p.d, p.d_dtype, int64_t(row) * p.ldd + col, v0, v1, two);
        }
      }
    }
}

}  // namespace nibble::cuda::sm80
