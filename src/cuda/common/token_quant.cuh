// Per-token symmetric quantization of one value, bit-identical to the CPU reference
// (src/cpu/quantize_ref.cpp; docs/formats.md §6.1): s = amax / qmax, q = clamp(rne(v / s), ±qmax)
// (s = 0 → q = 0). Shared by the activation kernel (generic/act_quant.cu) and the W4A8 GEMM's
// fused quantization of bf16/f16 activations (sm80/sm80_w4a8_gemm.cuh), so both produce the
// same codes and scales.
//
// Every float operation gives the bits of the reference's IEEE operation: the scale is
// f32(f64(amax) · RN64(1/qmax)) (equal to RN32(amax / qmax) for every non-negative f32 amax and
// qmax 7, 127, 448: common/rounded_math.h), and v / s is computed from the scale's reciprocal
// in three operations after both are multiplied by the power of two 2^min(1 − e, 127) that
// brings s into [1, 2) — exact, see divide_by_reciprocal — without an IEEE division, whose
// slow-path subroutine call makes ptxas spill around it.
#pragma once

#include <cstdint>

#include "common/rounded_math.h"

namespace nibble::cuda {

/// e with 2^(e−1) ≤ a < 2^e for finite a > 0 (std::frexp's exponent), from the bits.
__device__ __forceinline__ int frexp_exponent(float a) {
  const uint32_t bits = __float_as_uint(a) & 0x7FFFFFFFu;
  const int biased = static_cast<int>(bits >> 23);
  return biased != 0 ? biased - 126 : (32 - __clz(static_cast<int>(bits))) - 149;
}
/// 2^n as a double, for |n| ≤ 1022.
__device__ __forceinline__ double pow2_f64(int n) {
  return __longlong_as_double(static_cast<long long>(n + 1023) << 52);
}
/// 2^n as a float, for −149 ≤ n ≤ 127.
__device__ __forceinline__ float pow2_f32(int n) {
  return n >= -126 ? __uint_as_float(static_cast<uint32_t>(n + 127) << 23)
                   : __uint_as_float(1u << (n + 149));
}

/// |v| as ordered bits: for non-negative floats the integer order is the float order, and a NaN
/// (0x7FC00000 and above) is larger than +inf, so it survives a max (fmaxf would drop it).
__device__ __forceinline__ uint32_t abs_bits(float v) { return __float_as_uint(v) & 0x7FFFFFFFu; }

/// The dynamic scale amax / qmax from max |v| as abs_bits and inv_qmax = RN64(1 / qmax).
__device__ __forceinline__ float token_scale(uint32_t amax_bits, double inv_qmax) {
  return __double2float_rn(__dmul_rn(double(__uint_as_float(amax_bits)), inv_qmax));
}

/// Division by one scale, prepared once per row.
struct TokenDivider {
  float pow2 = 1.0f;    ///< 2^min(1 − e, 127), e the scale's exponent
  float s_unit = 0.0f;  ///< scale · pow2 ∈ [1, 2) (or [2^-22, 1) for a subnormal scale)
  float s_inv = 0.0f;   ///< RN(1 / s_unit)

  __device__ __forceinline__ static TokenDivider make(float scale) {
    TokenDivider d;
    const int scale_exp = scale > 0.0f && scale < INFINITY ? frexp_exponent(scale) : 0;
    d.pow2 = pow2_f32(min(1 - scale_exp, 127));
    d.s_unit = __fmul_rn(scale, d.pow2);
    d.s_inv = detail::divide_rn(1.0f, d.s_unit, detail::reciprocal_seed(d.s_unit));
    return d;
  }
  /// RN(vs / s_unit) for vs = v · pow2 (already scaled, and clamped by a static caller).
  __device__ __forceinline__ float divide_scaled(float vs) const {
    return detail::divide_by_reciprocal(vs, s_unit, s_inv);
  }
  /// divide_scaled up to the sign of a zero quotient, one operation fewer: for integer codes,
  /// to which ±0 are the same.
  __device__ __forceinline__ float divide_scaled_any_zero_sign(float vs) const {
    return detail::divide_by_reciprocal_any_zero_sign(vs, s_unit, s_inv);
  }
  /// RN(v / scale) for a dynamic scale (|v / scale| ≤ qmax).
  __device__ __forceinline__ float divide(float v) const { return divide_scaled(__fmul_rn(v, pow2)); }
};

/// rne(v / scale) as an integer for a dynamic per-token scale (the quotient is at most qmax, so
/// no clamp); 0 when the scale is 0.
__device__ __forceinline__ int quantize_dynamic(float v, float scale, const TokenDivider& div) {
  if (scale == 0.0f) return 0;
  return static_cast<int>(rintf(div.divide(v)));  // rintf: round half to even
}

}  // namespace nibble::cuda
