// int4 → int8 in registers, four values per 32-bit word, for the W4A8 tensor-core kernels
// (sm80_w4a8_gemm, sm90_w4a8_gemm). The packed layout (w4_mma_k128) holds unsigned nibbles u:
// u = v + 8 for s4_sym weights, u = q for two-level weights.
//
// offset_xor (exact, any weights):
//   x  = word & 0x0F0F0F0F                 (low nibbles → one unsigned value u per byte)
//   b  = (x · g_s + offset·0x01010101) ^ 0x80808080
// Every byte of x·g_s + offset is u·g_s + offset = w8 + 128 ∈ [0, 255], so no carry crosses a
// byte, and XOR 0x80 turns the biased byte into the two's-complement int8 w8. s4_sym weights use
// g_s = 1 and offset = 120 (u + 120 = v + 128); two-level weights their group's g_s and
// 128 − g_s·g_z. Three instructions per 4 values for the low nibbles, four for the high ones
// (one shift more): no per-element shifts (LiquidGEMM's IMAD + XOR).
#pragma once

#include <cstdint>

namespace nibble::cuda {

/// The per-byte offset operand `offset·0x01010101` of s4_sym weights (offset 120).
constexpr uint32_t kS4SymOffset4 = 0x78787878u;

/// int8 weights of the low nibbles of `word` (bytes b: k = base + b).
__device__ __forceinline__ uint32_t decode_low_nibbles(uint32_t word, uint32_t gs,
                                                       uint32_t offset4) {
  return ((word & 0x0F0F0F0Fu) * gs + offset4) ^ 0x80808080u;
}

/// int8 weights of the high nibbles of `word` (bytes b: k = base + 16 + b).
__device__ __forceinline__ uint32_t decode_high_nibbles(uint32_t word, uint32_t gs,
                                                        uint32_t offset4) {
  return (((word >> 4) & 0x0F0F0F0Fu) * gs + offset4) ^ 0x80808080u;
}

/// Two-level group parameters `g_s | (128 − g_s·g_z) << 8` → (g_s, offset·0x01010101).
__device__ __forceinline__ void two_level_operands(uint32_t param, uint32_t& gs,
                                                   uint32_t& offset4) {
  gs = param & 0xFFu;
  offset4 = (param >> 8) * 0x01010101u;
}

}  // namespace nibble::cuda
