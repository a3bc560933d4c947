// int4 → 8-bit tensor-core operands in registers, four values per 32-bit word, for the W4A8 and
// W4A-FP8 tensor-core kernels (sm80_w4a8_gemm, sm90_w4a8_gemm). The packed layout (w4_mma_k128)
// holds unsigned nibbles u: u = v + 8 for s4_sym weights, u = q for two-level weights. The
// functions are host-callable too, so tests/cpp/test_int4_decode.cpp checks every nibble on the
// CPU.
//
// → int8, offset_xor (exact, any weights):
//   x  = word & 0x0F0F0F0F                 (low nibbles → one unsigned value u per byte)
//   b  = (x · g_s + offset·0x01010101) ^ 0x80808080
// Every byte of x·g_s + offset is u·g_s + offset = w8 + 128 ∈ [0, 255], so no carry crosses a
// byte, and XOR 0x80 turns the biased byte into the two's-complement int8 w8. s4_sym weights use
// g_s = 1 and offset = 120 (u + 120 = v + 128); two-level weights their group's g_s and
// 128 − g_s·g_z. Three instructions per 4 values for the low nibbles, four for the high ones
// (one shift more): no per-element shifts (LiquidGEMM's IMAD + XOR).
//
// → e4m3, scaled by 2⁻⁹ (s4_sym weights, for wgmma with fp8 activations):
//   e4m3 codes 0x00..0x0F are exactly c·2⁻⁹ (0x00..0x07 subnormal, 0x08..0x0F the first binade),
//   and the sign is bit 7, so v·2⁻⁹ for v ∈ [−8, 7] is the byte v (v ≥ 0) or 0x80 | −v (v < 0).
//   Per byte, with c = u XOR 8 (= v for v ≥ 0, = v + 16 ≥ 8 for v < 0):
//     v ≥ 0 (bit 3 of u set):  code = c
//     v < 0:                   code = 0x90 − c  (= 0x80 | (8 − u) = 0x80 | −v)
//   0x90909090 − c has no borrow between bytes (c ≤ 15), and the byte mask of bit 3 of u comes
//   from one byte permute in sign-replicate mode. The kernel multiplies its f32 sums by 2⁹
//   (kE4m3WeightScale), which is exact. Five instructions per 4 values.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/host_device.h"

namespace nibble::cuda {

/// The per-byte offset operand `offset·0x01010101` of s4_sym weights (offset 120).
constexpr uint32_t kS4SymOffset4 = 0x78787878u;
/// decode_*_e4m3 give v·2⁻⁹: sums of their products are multiplied by this (exactly).
constexpr float kE4m3WeightScale = 512.0f;

/// PTX prmt (__byte_perm): byte i of the result is byte s_i & 7 of the pair {b, a} (a = bytes
/// 0..3), or, when bit 3 of selector nibble s_i is set, that byte's bit 7 copied to all 8 bits.
NIBBLE_HOST_DEVICE_INLINE uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t s) {
#if defined(__CUDA_ARCH__)
  // prmt itself rather than __byte_perm, whose documented selector has three bits only.
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(s));
  return d;
#else
  const uint64_t pair = (uint64_t{b} << 32) | a;
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t sel = (s >> (4 * i)) & 0xFu;
    uint32_t byte = static_cast<uint32_t>(pair >> (8 * (sel & 7u))) & 0xFFu;
    if (sel & 8u) byte = (byte & 0x80u) ? 0xFFu : 0x00u;
    out |= byte << (8 * i);
  }
  return out;
#endif
}

/// int8 weights of the low nibbles of `word` (bytes b: k = base + b).
NIBBLE_HOST_DEVICE_INLINE uint32_t decode_low_nibbles(uint32_t word, uint32_t gs,
                                                      uint32_t offset4) {
  return ((word & 0x0F0F0F0Fu) * gs + offset4) ^ 0x80808080u;
}

/// int8 weights of the high nibbles of `word` (bytes b: k = base + 16 + b).
NIBBLE_HOST_DEVICE_INLINE uint32_t decode_high_nibbles(uint32_t word, uint32_t gs,
                                                       uint32_t offset4) {
  return (((word >> 4) & 0x0F0F0F0Fu) * gs + offset4) ^ 0x80808080u;
}

/// PTX lop3: the three-input logic function whose truth table is `kLut`, bit by bit. Bit i of
/// kLut is the result where a's bit is i & 4, b's i & 2 and c's i & 1 (so a = 0xF0, b = 0xCC,
/// c = 0xAA, and e.g. (a & b) ^ c is (0xF0 & 0xCC) ^ 0xAA). One instruction where the C
/// expression with two constants costs two LOP3s, since a LOP3 encodes one immediate: the
/// caller keeps one constant in a register.
template <uint8_t kLut>
NIBBLE_HOST_DEVICE_INLINE uint32_t lop3(uint32_t a, uint32_t b, uint32_t c) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, %4;" : "=r"(d) : "r"(a), "r"(b), "r"(c), "n"(kLut));
  return d;
#else
  uint32_t d = 0;  // the OR of the bit positions of every input combination the table selects
  for (int i = 0; i < 8; ++i)
    if ((kLut >> i) & 1)
      d |= ((i & 4) ? a : ~a) & ((i & 2) ? b : ~b) & ((i & 1) ? c : ~c);
  return d;
#endif
}

/// (a & b) ^ c in one LOP3: e.g. a nibble mask and the int8 sign flip (decode_*_16v).
NIBBLE_HOST_DEVICE_INLINE uint32_t and_xor(uint32_t a, uint32_t b, uint32_t c) {
  return lop3<(0xF0 & 0xCC) ^ 0xAA>(a, b, c);
}

/// (a & b) | c in one LOP3: e.g. a nibble mask and a float's magic exponent.
NIBBLE_HOST_DEVICE_INLINE uint32_t and_or(uint32_t a, uint32_t b, uint32_t c) {
  return lop3<(0xF0 & 0xCC) | 0xAA>(a, b, c);
}

/// 16·v as int8 of the low nibbles of `word`, for s4_sym weights stored as u = v + 8 (bytes as
/// decode_low_nibbles): u moved to the high half of its byte is 16u = 16v + 128, and XOR 0x80
/// leaves 16v ∈ [-128, 112] in two's complement — a shift and one LOP3, against offset_xor's
/// three instructions. Sums of these weights are 16× the true ones (multiples of 16, shifted
/// back exactly), so the int32 span is the s8×s8 one: K ≤ max_int32_accumulation_k(s8, s8).
NIBBLE_HOST_DEVICE_INLINE uint32_t decode_low_nibbles_16v(uint32_t word) {
  return and_xor(word << 4, 0xF0F0F0F0u, 0x80808080u);
}

/// 16·v as int8 of the high nibbles of `word` (as decode_low_nibbles_16v; one LOP3).
NIBBLE_HOST_DEVICE_INLINE uint32_t decode_high_nibbles_16v(uint32_t word) {
  return and_xor(word, 0xF0F0F0F0u, 0x80808080u);
}

/// Whether s · 2⁻⁴ is exact in f32: s is ±0, not finite, or |s| ≥ 2⁻¹²² (s/16 stays normal).
/// A group scale that passes folds a block's sums of 16·v weights as s/16 · (16·Σ), the same
/// product as s · Σ, so the same fma (sm90_w4a8_gemm's group format).
NIBBLE_HOST_DEVICE_INLINE bool sixteenth_is_exact(float s) {
#if defined(__CUDA_ARCH__)
  const uint32_t bits = __float_as_uint(s);
#else
  uint32_t bits;
  std::memcpy(&bits, &s, sizeof bits);
#endif
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  return magnitude == 0 || magnitude >= (5u << 23);  // biased exponent 5 is 2^-122
}

/// Four e4m3 codes of v·2⁻⁹ from the unsigned nibbles u = v + 8 in bits 0..3 of each byte of
/// `nibbles` (bits 4..7 ignored); `sign_bytes` has bit 3 of each u at bit 7 of its byte.
NIBBLE_HOST_DEVICE_INLINE uint32_t nibbles_to_e4m3(uint32_t nibbles, uint32_t sign_bytes) {
  const uint32_t c = (nibbles & 0x0F0F0F0Fu) ^ 0x08080808u;
  const uint32_t negative = 0x90909090u - c;
  const uint32_t nonneg_mask = byte_perm(sign_bytes, 0u, 0xBA98u);  // 0xFF where u ≥ 8
  return (c & nonneg_mask) | (negative & ~nonneg_mask);
}

/// e4m3 weights ×2⁻⁹ of the low nibbles of `word` (s4_sym, u = v + 8; bytes as decode_low_nibbles).
NIBBLE_HOST_DEVICE_INLINE uint32_t decode_low_nibbles_e4m3(uint32_t word) {
  return nibbles_to_e4m3(word, word << 4);
}

/// e4m3 weights ×2⁻⁹ of the high nibbles of `word` (bytes as decode_high_nibbles).
NIBBLE_HOST_DEVICE_INLINE uint32_t decode_high_nibbles_e4m3(uint32_t word) {
  return nibbles_to_e4m3(word >> 4, word);
}

/// s4_sym weights as biased f16 bit patterns, for W4A-FP8's f16 MMA route on sm_90 (which has no
/// fp8 mma.sync): `spread` = byte_perm(word, 0, 0x4140), i.e. [byte 0, 0, byte 1, 0] (0x4342 for
/// bytes 2 and 3). `lo`: the f16x2 of 1024 + u for the two bytes' low nibbles (the lower byte's in
/// the low half); `hi`: 1024 + 16u for their high nibbles. (f16 0x6400 is 1024, where the
/// mantissa steps by 1.) s4_pair_to_f16x2 (device) subtracts the bias.
NIBBLE_HOST_DEVICE_INLINE void s4_f16_magic_pair(uint32_t spread, uint32_t& lo, uint32_t& hi) {
  lo = (spread & 0x000F000Fu) | 0x64006400u;
  hi = (spread & 0x00F000F0u) | 0x64006400u;
}

#if defined(__CUDACC__)
/// The int4 values v = u − 8 of s4_f16_magic_pair's halves as f16x2, exactly: lo − 1032 and
/// hi · 1/16 − 72 (= 64 + u − 72; one fused multiply-add of exact values). Five instructions per
/// four values with the byte permute.
__device__ __forceinline__ void s4_pair_to_f16x2(uint32_t spread, uint32_t& lo, uint32_t& hi) {
  uint32_t l, h;
  s4_f16_magic_pair(spread, l, h);
  asm("sub.rn.f16x2 %0, %1, %2;\n" : "=r"(lo) : "r"(l), "r"(0x64086408u));  // 1032
  asm("fma.rn.f16x2 %0, %1, %2, %3;\n"
      : "=r"(hi)
      : "r"(h), "r"(0x2C002C00u), "r"(0xD480D480u));  // 1/16, -72
}
#endif

/// Two-level group parameters `g_s | (128 − g_s·g_z) << 8` → (g_s, offset·0x01010101).
NIBBLE_HOST_DEVICE_INLINE void two_level_operands(uint32_t param, uint32_t& gs,
                                                  uint32_t& offset4) {
  gs = param & 0xFFu;
  offset4 = (param >> 8) * 0x01010101u;
}

}  // namespace nibble::cuda
