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
  /// W4A-FP8: `a` is e4m3 per token (weight_bits 4, per channel or G = 128); the sm90 kernel
  /// only (sm90_w4a8_gemm with kFp8).
  bool a_e4m3 = false;
  sm80::W4A8Epilogue epilogue = sm80::W4A8Epilogue::per_channel;
  int group = 0;  ///< group size for group / two_level
  int64_t m = 0, n = 0, k = 0, n_pad = 0, k_pad = 0;
  const void* a = nullptr;
  int64_t lda = 0;  ///< bytes
  /// Fused quantization (M <= 16, weight_bits 4, not s32): x (M, K) bf16 / f16 instead of a and
  /// a_scales, quantized per token inside the kernel exactly as quantize_activation does.
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
};

/// The tile and split-K choice for a problem (depends only on shape, group and SM count).
struct W4A8Plan {
  int tile = 0, bm = 0, bn = 0, stages = 0, warps = 0, weight_bits = 4;
  bool a4 = false;
  sm80::W4Decode decode = sm80::W4Decode::offset_xor;
  int tiles_m = 0, tiles_n = 0, splits = 1, kblocks_per_split = 0;
};
W4A8Plan plan_sm80_w4a8(int64_t m, int64_t n_pad, int64_t k, int64_t k_pad,
                        sm80::W4A8Epilogue epilogue, int group, int sm_count,
                        int weight_bits = 4, bool a4 = false);
std::string describe(const W4A8Plan& plan);

void launch_sm80_w4a8(const W4A8Launch& launch, Stream stream);

/// Largest M the fused-quantization path (W4A8Launch::x) takes: the thin m16 tile.
constexpr int64_t kFusedQuantMaxTokens = 16;

}  // namespace nibble::cuda
