// Host interface of the sm80_w4a8_gemm family (kernel: cuda/sm80/sm80_w4a8_gemm.cuh).
#pragma once

#include <cstdint>
#include <string>

#include "nibble/types.h"

namespace nibble::cuda {

namespace sm80 {
enum class W4A8Epilogue : int { s32, per_channel, group, two_level };

/// How the main loop turns packed nibbles into int8 B fragments (see the kernel header):
///   offset_xor   ((u · g_s) + offset) XOR 0x80 per byte, exact int8 weights; 7 instructions
///                per 8 values; any K; the only choice for two-level weights.
///   high_nibble  the nibble in the high half of each byte, (u << 4) XOR 0x80 = 16·v; 3
///                instructions per 8 values; the accumulator holds 16× the sum and is shifted
///                back exactly, so the int32 span must stay within the s8×s8 limit (131071).
enum class W4Decode : int { offset_xor, high_nibble };
}  // namespace sm80

/// One validated call: raw pointers of the operands (see the kernel header for layouts). With
/// weight_bits = 8 it is a W8A8 call: `w` is the logical (N, K) s8 matrix, row pitch `ldw`
/// bytes, with per-channel scales of dtype `w_scale_dtype`; n_pad = n, k_pad = K rounded up to 128.
struct W4A8Launch {
  int device = 0;
  int weight_bits = 4;  ///< 4: packed w4_mma_k128; 8: row-major s8
  /// W4A4: a and w both row-major packed int4 (lda, ldw in bytes; k_pad = K/2 rounded up to 128:
  /// bytes, like every K block of this kernel); per-channel or s32; the sm80 kernel only.
  bool a4 = false;
  /// W4A-FP8: `a` is e4m3 per token (weight_bits 4, s4_sym, per channel or G = 128, no fused
  /// quantization): sm90_w4a8_gemm with kFp8, or this family's thin tiles (sm80_w4afp8_gemm,
  /// where sm80_w4afp8_available).
  bool a_e4m3 = false;
  sm80::W4A8Epilogue epilogue = sm80::W4A8Epilogue::per_channel;
  int group = 0;  ///< group size for group / two_level
  int64_t m = 0, n = 0, k = 0, n_pad = 0, k_pad = 0;
  const void* a = nullptr;
  int64_t lda = 0;  ///< bytes
  /// Fused quantization (where fused_quant_fits; not s32): x (M, K) f32 / bf16 / f16 instead of
  /// a and a_scales, quantized per token inside the kernel exactly as quantize_activation does.
  const void* x = nullptr;
  int64_t ldx = 0;  ///< elements
  DType x_dtype = DType::bf16;
  const float* a_scales = nullptr;
  bool a_per_tensor = false;
  const void* w = nullptr;
  int64_t ldw = 0;  ///< bytes, weight_bits 8 only
  const float* w_scales = nullptr;  ///< f32, or the dtype w_scale_dtype (weight_bits 8)
  DType w_scale_dtype = DType::f32;
  const void* w_params = nullptr;
  const void* bias = nullptr;
  DType bias_dtype = DType::f32;
  void* d = nullptr;
  int64_t ldd = 0;  ///< elements
  DType d_dtype = DType::bf16;
  /// The residual-stream fusions (LinearFusion, include/nibble/gemm.h), where
  /// residual_fusion_fits: f32 x quantized in the kernel, f32 d. In: RMSNorm of x from its rows'
  /// granule sums (nullptr: none). Out: d += result; the stored d's granule sums (nullptr: none).
  const double* in_sumsq = nullptr;
  int64_t in_sumsq_ld = 0;  ///< elements
  const float* norm_weight = nullptr;
  float norm_eps = 0.0f;
  bool accumulate = false;
  double* out_sumsq = nullptr;
  int64_t out_sumsq_ld = 0;  ///< elements
  bool residual_fusion() const { return in_sumsq != nullptr || accumulate || out_sumsq != nullptr; }
};

/// The tile and split-K choice for a problem (depends only on shape, group and SM count).
struct W4A8Plan {
  int tile = 0, bm = 0, bn = 0, stages = 0, warps = 0, weight_bits = 4;
  bool a4 = false;
  bool a_e4m3 = false;  ///< W4A-FP8: the 16- or 32-token tile
  sm80::W4Decode decode = sm80::W4Decode::offset_xor;
  int tiles_m = 0, tiles_n = 0, splits = 1, kblocks_per_split = 0;
  bool cluster_split = false;  ///< the splits of a tile are one thread-block cluster (sm_90+)
};
/// `clusters`: the GPU runs thread-block clusters (sm_90+), so the thin int4-weight tiles'
/// splits reduce in a cluster instead of through the workspace.
W4A8Plan plan_sm80_w4a8(int64_t m, int64_t n_pad, int64_t k, int64_t k_pad,
                        sm80::W4A8Epilogue epilogue, int group, int sm_count, bool clusters,
                        int weight_bits = 4, bool a4 = false, bool a_e4m3 = false);
std::string describe(const W4A8Plan& plan);

/// Whether sm80_w4afp8_gemm (W4A8Launch::a_e4m3) runs on `device`: e4m3 mma.sync needs sm_89+,
/// and the build must hold code for the GPU itself (the sm_90a code on sm_90, sm_89 code on
/// sm_89: the sm_80 code would load there too, but traps at the fp8 instruction).
bool sm80_w4afp8_available(int device);

void launch_sm80_w4a8(const W4A8Launch& launch, Stream stream);

/// Largest M the fused-quantization path (W4A8Launch::x) takes. Its prologue (max |x| per row,
/// then the quantization into the resident A) is latency that grows with the rows; measured on
/// the H100 (2026-11-24, w4a8_pc, bf16 x) it beat the two launches (activation kernel + int8
/// GEMM) up to M = 4 on 4096x4096, 6144x4096 and 4096x14336 (e.g. 8.5 against 9.4 us at M = 1,
/// 9.2 against 9.5 at M = 4 on 4096x4096) and lost from M = 8 (9.6 against 9.7 there, but
/// 19.8 against 19.3 on 4096x14336; 11.4 against 10.2 at M = 16).
constexpr int64_t kFusedQuantMaxTokens = 4;
/// Shared memory of the fused-quantization tile's resident int8 A: its rows of the CTA's K range.
constexpr int kFusedResidentBytes = 16384;
/// Bytes per row of the resident A: the split's K range plus 16, so that the 8 rows one
/// fragment load touches start in 8 different 4-bank groups.
inline int fused_resident_pitch(const W4A8Plan& plan) { return plan.kblocks_per_split * 128 + 16; }
/// Whether the fused-quantization path runs this plan at M: packed int4 weights on the m16
/// tile, M ≤ kFusedQuantMaxTokens, with M rows of the K range resident (M = 1: K ranges up to
/// 16368 bytes; M = 4: up to 4080).
inline bool fused_quant_fits(const W4A8Plan& plan, int64_t m) {
  return plan.tile == 0 && plan.weight_bits == 4 && !plan.a4 && m >= 1 &&
         m <= kFusedQuantMaxTokens && m * fused_resident_pitch(plan) <= kFusedResidentBytes;
}
/// Whether the residual-stream fusions run inside that kernel: the fused-quantization tile,
/// unsplit or split in a thread-block cluster (sm_90+); the epilogue that finishes a tile from
/// the split-K workspace has no residual variant (the caller runs the fusions around it then).
inline bool residual_fusion_fits(const W4A8Plan& plan, int64_t m, int cc_major) {
  return fused_quant_fits(plan, m) && (plan.splits == 1 || cc_major >= 9);
}

}  // namespace nibble::cuda
